"""Accuracy of the scaling models on published large-language-model training throughput.

Data: ``benchmarks/data/llm_training_throughput.tsv``, a copy of
``shared/data/llm_training_throughput.tsv`` (torchtitan, NVIDIA NeMo / Megatron-Bridge and
Megatron-LM's 2024 H100 table; its header cites each source and commit). Not used, by design:
MosaicML llm-foundry tables, Megatron-LM's 2020/2021 README tables, Narayanan et al. 2021 and
Korthikanti et al. 2022 tables (kept for an independent check).

Derivation set vs report set. ``perfmodel.compute.GENERATION_MFU`` (tensor-core efficiency per
GPU generation and precision) was derived from these rows, which are therefore never scored
here nor used as references:
  - ``megatron_readme_2024_h100`` (every row: Hopper bf16);
  - ``nemo_24.07_perf`` (every row: Hopper fp8);
  - ``torchtitan_2024_08_a100`` rows of Llama 2 models (Ampere bf16).
Everything else is the report set: Megatron-Bridge (H100 and B200, FP8), torchtitan 2024-12
and 2025-06 (H100 96 GB, bf16 and FP8), torchtitan 2024-08's Llama 3 rows (A100) and its
Llama 3.1 405B rows (H100 95 GB).

Each row becomes the workload file a user would write for the model (``workload_doc``: only
keys docs/metrics.md marks user-supplied; ``tests/test_benchmark_workloads.py`` checks it),
and every prediction is ``mlflow gpuopt predict`` on it, invoked in-process
(``cli_path.run_predict``), with an observations CSV of the reference rows where a task has
them. The file: FLOPs per token ``6·N + 12·L·h·s`` (PaLM's model FLOPs, attention included, as
torchtitan counts them) and the published architecture (layers, hidden, heads, FFN width,
SwiGLU, vocabulary 128,256, no dropout for Llama 3: ``ARCHITECTURES``; its 8 key/value heads
where the attention kernel takes them as they are: Megatron / NeMo, not torchtitan, which
expands them), SDPA attention, the recomputation the source states, the FP8 recipe and, with
tensor parallelism, whether its collectives overlap the GEMMs (``Row.tp_comm_overlap``); DRAM
traffic, kernels per micro-step, largest layer and activations are the model's defaults from
that architecture (docs/models.md#defaults).
torchtitan's "selective" is its per-op policy (``selective_ac_option = 'op'``, saving every
other matmul output: recompute ``selective-op``); its "selective-layer" (checkpoint every
n-th block) is not modelled and kept as Megatron's selective. FP8: Transformer Engine for
NVIDIA's rows (recipe ``te``), torchao tensor-wise for torchtitan's "fp8-linear"/
"fp8-tensorwise" and row-wise for "fp8-rowwise": their scale-and-cast traffic per linear layer
from the GEMM shapes (``compute.fp8_cast_time_s``, the ``fp8_casts`` operator class) and what is
left of each recipe's cost as ``compute.FP8_RECIPE_EFFICIENCY``, derived with the casts in
place from torchao's README, not from these rows (``--derive-fp8`` prints the solution and the
casts' share of that setup's micro-step). AdamW.
Layouts (``--strategy``): tp × pp × the data-parallel strategy as the source gives them;
FSDP for torchtitan and Megatron-FSDP rows, ZeRO-1 (Megatron's distributed optimizer) for
the rest; Megatron's interleaved ``vp`` from the notes (``--virtual-stages``). torchtitan's
pipeline splits the local batch into pp × (stages per rank) micro-batches (1 stage per rank
for 1F1B, 2 for interleaved: torchtitan ``pipeline_llama.py`` defaults, 2024-12), so 405B's
local batch 32 runs as 8 micro-batches of 4 (1F1B) or 16 of 2 (interleaved). Context
parallelism (the notes' cp) is ``cpN`` in the layout, the table's dp counting the replicas
(tp × pp × cp × dp = GPUs); torchtitan exchanges keys and values with its default
all-gather rotate method (torchtitan ``config_manager.py``,
``--experimental.context_parallel_rotate_method``: "The default value is 'allgather'"),
NVIDIA's stacks with Megatron's default ring (``cp_comm_type = p2p``): workload key
``cp_exchange``. Networks
(``--inter-node-gbps``): 8 × 400 Gbit/s per node (DGX H100/B200 InfiniBand, Grand Teton
RDMA), 8 × 200 Gbit/s for the A100 cluster (not stated in the source: DGX A100's HCAs). The
Grand Teton H100 (96 GB HBM2e at 2.4 TB/s, 700 W TDP held at a 500 W default limit; the 95 GB
"lower TDP" part of the 2024-08 page is the same platform) is named as a user would,
``--gpu "NVIDIA H100 96GB"`` (the catalog's ``H100-SXM5-96GB``, pricing/README.md), predicted
with ``--power-limit-w 500``, and its measured rows say ``power_limit_w = 500`` in the
observations CSV; the runs on the target's GPU type ran on the network the target is given.
A TFLOP/s row whose tokens/s row is in the table (the same configuration) is dropped, as it
would be a duplicate in another FLOPs convention.

Tasks (median and p90 absolute % error of tokens/s per GPU, and coverage of the 90%
interval):
  1. scaling: within a config group (source, model, GPU, precision, layout per node, micro-
     batch, recompute, variant), predict every GPU count from the smallest;
  2. across GPU types: the same model shape and precision measured on another GPU type;
  3. across micro-batches: the same config at another micro-batch;
  4. bf16 -> FP8: the same config measured in bf16;
  5. no measurement: every report row from its workload alone (goal: median <= 25 %).
Each task prints its median interval width (high / low). Then the number of published
(report-set) configurations the model calls infeasible (does not fit in GPU memory; goal 0),
from the workload alone. Task 3 has no pair in the report set (no two report rows differ only
in micro-batch); it prints n = 0 rather than borrowing derivation rows.

Derivation set vs report set, for every constant the model takes from published LLM data:
``compute.GENERATION_MFU`` and ``uncertainty.TRANSFORMER_MFU_SPREAD`` come from the derivation
rows above; ``compute.FP8_RECIPE_EFFICIENCY`` from torchao's README (not in this table);
``uncertainty.SIGMA_TRANSFORMER_GENERATION_PAIR`` (the same model's spread carried to another
GPU type) from pairs outside this table (DeepLearningExamples' BERT-large on V100 and A100;
dgxc-benchmarking's NeMo BF16/FP8 tables, ``llm_pairs.py``, are checked the same way for a
precision change and not used); nothing is set from a report row.

Mixture-of-experts rows (``llm_moe.py``, ``data/moe_training_throughput.tsv``: Megatron-Bridge,
NeMo AutoModel and torchtitan's DeepEP page, each model's Hugging Face config.json as the
workload) print after the dense ones, with their own summary; ``--moe`` runs them alone.

Run: ``python benchmarks/bench_llm.py`` (minutes, CPU only); ``--tasks 2,5`` runs only
those tasks (seconds; no infeasible count, no MoE rows); ``--moe``, ``--derive-fp8`` and
``--derive-prior-width`` print the derivations of ``compute.FP8_RECIPE_EFFICIENCY`` and
``uncertainty.SIGMA_PRIOR_TRANSFORMER``; ``--derive-transfer-width`` (seconds) that of the pair
spreads above (:func:`derive_transfer_width` states the method), then the check of the MoE
layers' piece on MoE pairs no task scores (``llm_moe.derive_transfer_width``).
``--derive-gemm-efficiency`` inverts the whole model on the derivation rows for the GEMMs' own
efficiency per GPU generation and precision (the rate at which the predicted step reproduces
each published whole-step MFU), scores task 5 with it and leaves one source out at a time;
``--derived-gemm`` runs every task with that prior (docs/accuracy.md, "Large-language-model
training", says what it changes).
``--explain-width`` prints, per task, the pieces each interval combines (``predict --json``'s
``width_terms``) grouped by which were assumed, with each group's RMS log error and coverage.
``--shape-gemm`` (also on ``bench_accuracy.py`` and ``bench_proxy.py``) runs any of these with
the shape-dependent GEMM prior of ``gemm_shape.py``, a prototype not in the model.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from llm_table import DATA, attention_kernel, note, num, tp_comm_overlap, tp_overlap
from scores import explain_widths, summary_line

from cli_path import PredictError, observations_args, run_predict

from mlflow_gpuopt.perfmodel.layout import with_degree


DERIVATION_SOURCES = ("megatron_readme_2024_h100", "nemo_24.07_perf")
#: tsv GPU -> (the ``--gpu`` name a user gives, memory GB, node network Gbit/s, board power
#: limit W or None for the TDP)
GPUS = {
    "H100-SXM-80GB": ("NVIDIA H100 80GB HBM3", 80, 3200.0, None),
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md (and the 2025-06 async-TP page):
    # "96GB HBM2e with 2.4 TB/sec peak memory bandwidth", "the default 500W power limit"
    # (the catalog's H100-SXM5-96GB, pricing/README.md).
    "H100-SXM-96GB-HBM2e-500W": ("NVIDIA H100 96GB", 96, 3200.0, 500.0),
    # torchtitan docs/performance.md @3faaa1a: "HBM2e-based SXM H100 with lower TDP", the same
    # Grand Teton part; its limit is taken as the later page's default 500 W.
    "H100-HBM2e-95GB-lowTDP": ("NVIDIA H100 96GB", 95, 3200.0, 500.0),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", 80, 1600.0, None),
    "B200": ("NVIDIA B200", 180, 3200.0, None),
}
#: Architecture of the models in the report set, from their published configurations
#: (Llama 3: torchtitan ``torchtitan/models/llama/__init__.py`` llama3_configs and Meta's model
#: card: dim, n_layers, n_heads, n_kv_heads (grouped-query attention, 8 in all three), FFN
#: width from ffn_dim_multiplier/multiple_of; vocabulary 128,256). Keyed by (layers, hidden):
#: (heads, ffn hidden, vocabulary, mlp, dropout, key/value heads).
ARCHITECTURES = {
    (32, 4096): (32, 14336, 128256, "swiglu", 0.0, 8),   # Llama 3 / 3.1 8B
    (80, 8192): (64, 28672, 128256, "swiglu", 0.0, 8),   # Llama 3 / 3.1 70B
    (126, 16384): (128, 53248, 128256, "swiglu", 0.0, 8),  # Llama 3.1 405B
}


GOALS = "goal with a measurement: median <= 10%, p90 <= 25%, coverage >= 80%; none: median <= 25%"


@dataclass(frozen=True)
class Row:
    source: str
    model: str
    params: float
    layers: int
    hidden: int
    seq: int
    gpu: str
    gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int | None
    precision: str  # bf16 | fp8
    recompute: str  # none | selective | full
    tokens_per_s_per_gpu: float
    variant: str
    cp: int

    @property
    def derivation(self) -> bool:
        return self.source in DERIVATION_SOURCES or (
            self.source == "torchtitan_2024_08_a100" and self.model.lower().startswith("llama2"))

    @property
    def flops_per_token(self) -> float:
        return 6.0 * self.params + 12.0 * self.layers * self.hidden * self.seq

    @property
    def dp_strategy(self) -> str:
        shard = note(self.variant_notes, "fsdp")
        fsdp = self.source.startswith("torchtitan") or shard not in (None, "NA", "0")
        return "fsdp" if fsdp else "zero1"

    variant_notes: str = ""
    grad_accum: int | None = None  # where the source says (else from the global batch)
    vocab: int | None = None
    fp8_recipe: str | None = None  # tensorwise | rowwise, where the source names it
    vp: int = 1  # virtual pipeline stages per rank (interleaved schedules)

    @property
    def architecture(self) -> tuple[int, int, int | None, str, float | None, int | None]:
        """(heads, ffn hidden, vocabulary, mlp, dropout, key/value heads) as the model's
        configuration states it; a model not in ``ARCHITECTURES`` (derivation set only) gets
        heads from the notes or hidden / 128, multi-head attention and a GELU MLP of
        4 × hidden, dropout unknown."""
        if self.model.lower().startswith("llama3") and (self.layers, self.hidden) in \
                ARCHITECTURES:
            heads, ffn, vocab, mlp, dropout, kv_heads = ARCHITECTURES[(self.layers, self.hidden)]
            if self.family == "torchtitan":
                # torchtitan's Attention expands K and V to every query head (repeat_kv) before
                # SDPA, which then saves the expanded copies: what is held is multi-head width.
                # Megatron / NeMo (Transformer Engine) attend over the 8 K/V heads directly.
                kv_heads = None
            return heads, ffn, vocab, mlp, dropout, kv_heads
        heads = int(note(self.variant_notes, "heads") or max(1, self.hidden // 128))
        return heads, 4 * self.hidden, self.vocab, "gelu", None, None

    @property
    def tp_comm_overlap(self) -> bool | None:
        """Whether the source's runs overlap tensor-parallel communication with the GEMMs
        (``llm_table.tp_comm_overlap``)."""
        return tp_comm_overlap(self.source, self.variant_notes, self.tp)

    @property
    def tp_overlap(self) -> str | None:
        """How the source builds that overlap (``llm_table.tp_overlap``)."""
        return tp_overlap(self.source, self.variant_notes, self.tp)

    @property
    def attention_kernel(self) -> str | None:
        """The fused attention kernel the source runs (``llm_table.attention_kernel``)."""
        return attention_kernel(self.source)

    @property
    def cp_exchange(self) -> str | None:
        """How the source's context-parallel runs exchange keys and values (None without
        cp): torchtitan's default all-gather rotate method, Megatron's default ring (p2p)."""
        if self.cp <= 1:
            return None
        return "allgather" if self.family == "torchtitan" else "ring"

    @property
    def fp8_all_gather(self) -> bool | None:
        """Whether FSDP gathers the FP8 weights in FP8: false for torchtitan's tensor-wise
        rows (the 2025-06 async-TP commands set no ``--float8.enable_fsdp_float8_all_gather``
        and ``llama3_70b.toml``'s ``[float8]`` has it false, torchtitan's default); not stated
        otherwise."""
        return False if self.fp8_recipe == "tensorwise" else None

    @property
    def family(self) -> str:
        """Software family: a user's runs on two GPU types use the same stack."""
        return "torchtitan" if self.source.startswith("torchtitan") else "nvidia"






def load_rows() -> tuple[list[Row], int]:
    """Report and derivation rows as tokens/s per GPU, and the number skipped (tp/pp unknown,
    or degrees that do not multiply to the GPU count)."""
    lines = [ln for ln in DATA.read_text().splitlines() if ln and not ln.startswith("#")]
    reader = csv.DictReader(lines, delimiter="\t")
    raw = list(reader)
    out, skipped = [], 0
    def config_key(r):
        # The notes of a TFLOP/s row and of its tokens/s row differ in the alternative value
        # the source gives in parentheses; the configuration is the same.
        notes = ";".join(p for p in (r["notes"] or "").split(";")
                         if not p.strip().startswith("alt value"))
        return (r["source"], r["model"], r["gpu"], r["gpus"], r["precision"], notes,
                r["micro_batch"], r["activation_recompute"], r["seq_len"])

    seen_tokens = {config_key(r) for r in raw if r["metric"] == "tokens_per_s_per_gpu"}
    for r in raw:
        metric = r["metric"]
        if metric == "tflops_per_gpu" and config_key(r) in seen_tokens:
            continue  # the same configuration's tokens/s is in the table
        if metric not in ("tokens_per_s_per_gpu", "tflops_per_gpu"):
            continue
        tp, pp, dp = num(r["tp"]), num(r["pp"]), num(r["dp"])
        notes = r.get("notes") or ""
        cp = int(num(note(notes, "cp") or "1") or 1)
        if r["gpu"] not in GPUS or tp is None or pp is None:
            skipped += 1
            continue
        gpus = int(float(r["gpus"]))
        dp = dp if dp is not None else gpus / (tp * pp * cp)
        if int(tp * pp * cp * dp) != gpus:
            skipped += 1
            continue
        prec = "fp8" if r["precision"].lower().startswith("fp8") else "bf16"
        recipe = None
        if prec == "fp8" and r["source"].startswith("torchtitan"):
            # torchao float8: its rowwise recipe where named, else tensor-wise dynamic scaling
            # (torchtitan docs/float8.md: "we currently support tensor-wise scaling with
            # dynamic scales"). NVIDIA's rows run Transformer Engine (recipe te, the default).
            recipe = "rowwise" if "rowwise" in r["precision"].lower() else "tensorwise"
        rc = r["activation_recompute"].lower()
        # torchtitan's "selective" is its per-op policy (selective_ac_option = 'op' in the
        # llama3 tomls; the async-TP page says "selective(per-op)"); "selective-layer"
        # (checkpoint every n-th block) is not modelled and kept as Megatron's selective,
        # which with SDPA stores what no recomputation stores.
        if rc.startswith("full"):
            recompute = "full"
        elif rc.startswith("selective") and "layer" not in rc and \
                r["source"].startswith("torchtitan"):
            recompute = "selective-op"
        elif rc.startswith("selective"):
            recompute = "selective"
        else:
            recompute = "none"
        params, layers, hidden, seq = (float(r["params"]), int(r["layers"]), int(r["hidden"]),
                                       int(r["seq_len"]))
        value = float(r["value"])
        mb = num(r["micro_batch"])
        accum = None
        # Megatron's interleaved schedule: the notes' vp (virtual stages per pipeline rank)
        vp = int(num(note(notes, "vp") or "1") or 1) if (pp or 1) > 1 else 1
        if r["source"].startswith("torchtitan") and tp is not None and pp is not None and pp > 1:
            # torchtitan's column is the local batch; its pipeline splits it into
            # ``experimental.pipeline_parallel_microbatches`` micro-batches, by default the
            # number of stages: pp × stages per rank, 1 for 1F1B and 2 for the looped
            # (interleaved) schedules (torchtitan parallelisms/pipeline_llama.py,
            # generate_split_points and build_pipeline_schedule, 2024-12).
            vp = 2 if "interleaved" in notes.lower() else 1
            accum = int(pp) * vp
            mb = max(1, int(mb or 1) // accum)
        row = Row(source=r["source"], model=r["model"], params=params, layers=layers,
                  hidden=hidden, seq=seq, gpu=r["gpu"], gpus=gpus, tp=int(tp), pp=int(pp),
                  dp=int(dp), micro_batch=int(mb) if mb else 1,
                  global_batch=int(num(r["global_batch"])) if num(r["global_batch"]) else None,
                  precision=prec, recompute=recompute, tokens_per_s_per_gpu=value,
                  grad_accum=accum,
                  variant=notes.split(";")[0].replace("+Float8", "").strip(), cp=cp,
                  variant_notes=notes, vocab=int(num(r["vocab"])) if num(r["vocab"]) else None,
                  fp8_recipe=recipe, vp=vp)
        if metric == "tflops_per_gpu":
            row = replace(row, tokens_per_s_per_gpu=value * 1e12 / row.flops_per_token)
        out.append(row)
    return out, skipped


def workload_doc(row: Row) -> dict:
    """The workload file a user writes for this model from its card / ``config.json`` and how
    the job runs: only keys docs/metrics.md lists as user-supplied
    (``tests/test_benchmark_workloads.py`` checks it). The published architecture (layers,
    hidden, heads, key/value heads, FFN width, MLP kind, vocabulary, dropout), SDPA attention,
    the recomputation the source states, the FP8 recipe, the attention kernel and the
    tensor-parallel overlap the source runs; everything derived (DRAM traffic,
    kernels per micro-step, largest layer, activations) is the model's own default."""
    heads, ffn, vocab, mlp, dropout, kv_heads = row.architecture
    doc = {"name": row.model, "params": int(row.params),
           "flops_per_sample": row.flops_per_token * row.seq, "precision": "bf16",
           "optimizer": "AdamW", "micro_batch": row.micro_batch, "tokens_per_sample": row.seq,
           "num_layers": row.layers, "hidden_size": row.hidden, "num_heads": heads,
           "num_kv_heads": kv_heads, "ffn_hidden_size": ffn, "vocab_size": vocab, "mlp": mlp,
           "attention": "sdpa", "dropout": dropout, "recompute": row.recompute,
           "fp8_recipe": row.fp8_recipe, "tp_comm_overlap": row.tp_comm_overlap,
           "tp_overlap": row.tp_overlap,
           "attention_kernel": row.attention_kernel, "cp_exchange": row.cp_exchange,
           "fp8_all_gather": row.fp8_all_gather}
    return {k: v for k, v in doc.items() if v is not None}


def catalog_gpu(row: Row) -> str:
    """The ``--gpu`` name a user gives for the row's GPU (as nvidia-smi or the source says
    it; the command resolves it to the catalog's)."""
    return GPUS[row.gpu][0]


def strategy(row: Row) -> str:
    """The ``--strategy`` layout string of the row (tp × pp × the data-parallel strategy ×
    cp)."""
    if row.gpus == 1:
        return "single"
    parts = ([f"tp{row.tp}"] if row.tp > 1 else []) + ([f"pp{row.pp}"] if row.pp > 1 else [])
    return "x".join(parts + [row.dp_strategy] + ([f"cp{row.cp}"] if row.cp > 1 else []))


def observed_strategy(row: Row) -> str:
    """The observations CSV's ``strategy`` of a measured row: :func:`strategy` with the
    interleaved schedule's virtual stages (``vpN``), which the command takes as
    ``--virtual-stages`` for the target but the CSV only in the layout string."""
    return with_degree(strategy(row), "vp", row.vp) if row.vp > 1 else strategy(row)


def grad_accum(row: Row) -> int:
    if row.grad_accum:
        return row.grad_accum
    if row.global_batch:
        return max(1, round(row.global_batch / (row.dp * row.micro_batch)))
    return 1


def nodes(row: Row) -> int:
    return max(1, row.gpus // min(8, row.gpus))


def cli_args(row: Row) -> list[str]:
    """``mlflow gpuopt predict`` flags for the row's configuration."""
    args = ["--gpu", catalog_gpu(row), "--gpus", str(row.gpus), "--nodes", str(nodes(row)),
            "--strategy", strategy(row), "--micro-batch", str(row.micro_batch),
            "--grad-accum", str(grad_accum(row)), "--precision", row.precision,
            "--recompute", row.recompute, "--inter-node-gbps", str(GPUS[row.gpu][2])]
    if row.vp > 1:
        args += ["--virtual-stages", str(row.vp)]
    limit = GPUS[row.gpu][3]
    if limit:
        args += ["--power-limit-w", str(limit)]
    return args


def observation_line(row: Row) -> list:
    """One observations-CSV row (docs/metrics.md#the-observations-csv) of a published row."""
    samples = row.tokens_per_s_per_gpu * row.gpus / row.seq
    return [catalog_gpu(row), row.gpus, nodes(row), row.micro_batch, samples,
            observed_strategy(row),
            row.precision, grad_accum(row), row.recompute, GPUS[row.gpu][3] or ""]


def predict(target: Row, refs: list[Row], tmp: Path):
    """(predicted tokens/s/GPU, low, high, fits) for ``target`` from ``refs``, through
    ``mlflow gpuopt predict`` with the workload file and observations CSV a user writes."""
    out = predict_json(target, refs, tmp)
    k = target.seq / target.gpus
    return (out["throughput_samples_per_s"] * k, out["low"] * k, out["high"] * k, out["fits"])


def predict_json(target: Row, refs: list[Row], tmp: Path) -> dict:
    """``mlflow gpuopt predict --json``'s answer for ``target`` from ``refs``."""
    wl = tmp / "workload.json"
    wl.write_text(json.dumps(workload_doc(target)))
    args = ["--workload", str(wl)]
    if refs:
        args += observations_args(tmp / "observations.csv", map(observation_line, refs))
    return run_predict(args + cli_args(target))


def same_shape(a: Row, b: Row) -> bool:
    return (a.layers, a.hidden, a.seq) == (b.layers, b.hidden, b.seq)


def group_key(r: Row, *, gpus=False, mb=False, prec=False, gpu=False):
    key = [r.layers, r.hidden, r.seq, r.recompute, r.tp, r.pp, r.cp, r.variant]
    if not gpu:
        key += [r.source, r.gpu]
    if not prec:
        key.append(r.precision)
    if not mb:
        key.append(r.micro_batch)
    if not gpus:
        key.append(r.gpus)
    return tuple(key)


TASKS = ("1 scaling, from the smallest GPU count", "2 across GPU types",
         "3 across micro-batches", "4 bf16 -> FP8", "5 no measurement (workload alone)")


def tasks(rows: list[Row]):
    report = [r for r in rows if not r.derivation]
    out: dict[str, list[tuple[Row, list[Row]]]] = {name: [] for name in TASKS}
    groups = defaultdict(list)
    for r in report:
        groups[group_key(r, gpus=True)].append(r)
    for members in groups.values():
        counts = sorted({m.gpus for m in members})
        if len(counts) < 2:
            continue
        base = [m for m in members if m.gpus == counts[0]]
        for m in members:
            if m.gpus != counts[0]:
                out["1 scaling, from the smallest GPU count"].append((m, base))
    for t in report:
        others = [r for r in report if r.gpu != t.gpu and GPUS[r.gpu][0] != GPUS[t.gpu][0]
                  and same_shape(r, t) and r.precision == t.precision
                  and r.family == t.family]
        if others:
            smallest = min(o.gpus for o in others)
            out["2 across GPU types"].append((t, [o for o in others if o.gpus == smallest][:1]))
    mb_groups = defaultdict(list)
    for r in report:
        mb_groups[group_key(r, mb=True)].append(r)
    for members in mb_groups.values():
        for t in members:
            refs = [m for m in members if m.micro_batch != t.micro_batch]
            if refs:
                out["3 across micro-batches"].append((t, refs[:1]))
    prec_groups = defaultdict(list)
    for r in report:
        prec_groups[group_key(r, prec=True)].append(r)
    for members in prec_groups.values():
        bf16 = [m for m in members if m.precision == "bf16"]
        for t in members:
            if t.precision == "fp8" and bf16:
                out["4 bf16 -> FP8"].append((t, bf16[:1]))
    for t in report:
        out["5 no measurement (workload alone)"].append((t, []))
    return out


def summarise(name: str, results: list[tuple[float, bool, float]]) -> str:
    """One summary line (:func:`scores.summary_line`)."""
    return summary_line(name, results, "(no pairs in the report set)")


#: torchao float8 README ("e2e training benchmarks", NVIDIA H100): Llama 3 8B, 8 × H100,
#: torchtitan, FSDP2, per-op SAC, batch 1, seq 8192: tokens/s per recipe. Not a scored row.
TORCHAO_README_TPS = {"bf16": 6150.0, "tensorwise": 7689.5, "rowwise": 6768.0}


#: torchao's README setup as a row (its configuration, no throughput: never scored).
TORCHAO_README_ROW = Row(source="torchao_readme", model="Llama3-8B", params=8e9, layers=32,
                         hidden=4096, seq=8192, gpu="H100-SXM-80GB", gpus=8, tp=1, pp=1, dp=8,
                         micro_batch=1, global_batch=8, precision="bf16",
                         recompute="selective-op", tokens_per_s_per_gpu=0.0, variant="FSDP",
                         cp=1, variant_notes="fsdp=8")


def derive_fp8_recipe_efficiency() -> dict[str, float]:
    """The ``compute.FP8_RECIPE_EFFICIENCY`` that makes the model's FP8 / bf16 speed-up on
    torchao's README setup equal the published one, per recipe (bisection on the factor)."""
    from mlflow_gpuopt.perfmodel import compute

    row = TORCHAO_README_ROW
    tmp = Path(tempfile.mkdtemp(prefix="bench_llm_fp8_"))

    def speedup(recipe: str, factor: float) -> float:
        table = dict(compute.FP8_RECIPE_EFFICIENCY)
        compute.FP8_RECIPE_EFFICIENCY[recipe] = factor
        try:
            fp8 = predict(replace(row, precision="fp8", fp8_recipe=recipe), [], tmp)[0]
            bf16 = predict(row, [], tmp)[0]
        finally:
            compute.FP8_RECIPE_EFFICIENCY.clear()
            compute.FP8_RECIPE_EFFICIENCY.update(table)
        return fp8 / bf16

    out = {}
    for recipe in ("tensorwise", "rowwise"):
        target = TORCHAO_README_TPS[recipe] / TORCHAO_README_TPS["bf16"]
        lo, hi = 0.05, 1.5
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if speedup(recipe, mid) < target else (lo, mid)
        out[recipe] = 0.5 * (lo + hi)
    return out


def fp8_cast_line(recipe: str) -> str:
    """The FP8 casts of torchao's README setup (Llama 3 8B, one 8,192-token micro-batch per
    H100, tp 1) against its linear layers' FP8 GEMM time at the shipped factor, in words."""
    from mlflow_gpuopt.catalog import load_gpus
    from mlflow_gpuopt.hardware import hardware_for_gpu
    from mlflow_gpuopt.perfmodel import compute
    from mlflow_gpuopt.workload_files import workload_from_dict

    row = replace(TORCHAO_README_ROW, precision="fp8", fp8_recipe=recipe)
    w = workload_from_dict(workload_doc(row))
    hw = hardware_for_gpu(load_gpus()["H100-SXM5-80GB"], gpus_per_node=8)
    casts = compute.fp8_cast_time_s(w, hw, "fp8", row.seq)
    linear = compute._tensor_time_s(
        w.flops_per_sample * (1.0 - compute.attention_flops_share(w)), hw, "fp8"
    ) / compute.fp8_recipe_efficiency(recipe)
    return (f"casts {1e3 * casts:.1f} ms per micro-step against {1e3 * linear:.1f} ms of FP8 "
            "linear-layer GEMMs")


def derive_prior_width(rows: list[Row]) -> None:
    """``uncertainty.SIGMA_PRIOR_TRANSFORMER``: the root-mean-square of log(published /
    predicted) over the derivation rows, each from its workload file alone (the CLI path)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_llm_width_"))
    logs: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.derivation:
            logs[r.source].append(math.log(r.tokens_per_s_per_gpu / predict(r, [], tmp)[0]))
    every = [x for v in logs.values() for x in v]
    for source, v in logs.items():
        print(f"  {source:28s} {len(v):3d} rows  mean {statistics.fmean(v):+.3f}  "
              f"rms {math.sqrt(statistics.fmean(x * x for x in v)):.3f}")
    print(f"SIGMA_PRIOR_TRANSFORMER = {math.sqrt(statistics.fmean(x * x for x in every)):.3f} "
          f"(rms over {len(every)} derivation rows)")



def fit_sigma(out: dict) -> float:
    """The fit's own piece of a ``predict --json`` answer (0 where it has none)."""
    from mlflow_gpuopt.perfmodel import uncertainty as unc

    return next((w["log_sigma"] for w in out["width_terms"] if w["term"] == unc.TERM_FIT), 0.0)


def generation_pair_errors() -> dict[str, list[tuple[float, float]]]:
    """Per described transformer of ``bench_accuracy.py`` (BERT-large: pre-training at
    sequence 128 and 512, SQuAD fine-tuning), (log(published / predicted), the fit's piece)
    of one V100's amp row predicted from one A100's and back, through ``predict`` as
    ``bench_accuracy.py``'s task 2 runs it (each table's own micro-batch on each GPU type)."""
    import bench_accuracy as acc

    rows, wl = acc.load_rows(), acc.workloads()
    singles = [r for r in rows if r.gpus == 1 and not r.multinode_table
               and acc.FAMILY[r.precision] == "amp"]
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for src in singles:
        path, units, workload = wl[src.model]
        if not acc.described(workload):
            continue
        for t in singles:
            if t.model == src.model and t.gpu[:4] != src.gpu[:4]:
                p = acc.cli_predict(path, units, [src], t)
                out[t.model].append((math.log(t.throughput / p["throughput_samples_per_s"]),
                                     fit_sigma(p)))
    return out


def dgxc_rows() -> list[tuple[Row, Row]]:
    """(bf16 row, fp8 row) of each configuration of ``llm_pairs.DGXC_H100_BF16_FP8`` as this
    benchmark's rows (NVIDIA's stack: Transformer Engine, its attention kernel, overlapped
    tensor-parallel communication; the distributed optimizer; recomputation not stated, so
    none, as for the NeMo rows of the table)."""
    from llm_pairs import DGXC_H100_BF16_FP8

    out = []
    for (model, params, layers, hidden, seq, vocab, heads, tp, pp, vp, mb, ga, gpus, bf16,
         fp8) in DGXC_H100_BF16_FP8:
        base = Row(source="dgxc_benchmarking", model=model, params=params, layers=layers,
                   hidden=hidden, seq=seq, gpu="H100-SXM-80GB", gpus=gpus, tp=tp, pp=pp,
                   dp=gpus // (tp * pp), micro_batch=mb, global_batch=None, precision="bf16",
                   recompute="none", tokens_per_s_per_gpu=bf16 / gpus, variant="", cp=1,
                   variant_notes=f"heads={heads}", grad_accum=ga, vocab=vocab, vp=vp)
        out.append((base, replace(base, precision="fp8", tokens_per_s_per_gpu=fp8 / gpus)))
    return out


def spread_of(logs: dict[str, list[tuple[float, float]]]) -> float:
    """The larger of the root-mean-square log error over the rows and over the models (each
    model's own RMS, weighted equally)."""
    every = rms([e for v in logs.values() for e, _ in v])
    return max(every, rms([rms([e for e, _ in v]) for v in logs.values()]))


def pair_spread(name: str, logs: dict[str, list[tuple[float, float]]]) -> float:
    """Print each model's log errors, the RMS over the rows and over the models, and the
    leave-one-model-out check (each model's rows against the piece from the others with the
    row's own fit piece beside it, ±1.645 σ); return the piece (:func:`spread_of`)."""
    from mlflow_gpuopt.perfmodel.uncertainty import Z90

    for model, v in logs.items():
        print(f"  {model:28s} {len(v):2d} rows  log(published/predicted) "
              + " ".join(f"{e:+.3f}" for e, _ in v))
    every = rms([e for v in logs.values() for e, _ in v])
    per_model = rms([rms([e for e, _ in v]) for v in logs.values()])
    print(f"  {name}: RMS {every:.3f} over the rows, {per_model:.3f} over the {len(logs)} "
          "models")
    covered = 0
    for held, rows_ in logs.items():
        piece = spread_of({m: v for m, v in logs.items() if m != held})
        inside = sum(abs(e) <= Z90 * math.hypot(piece, f) for e, f in rows_)
        covered += inside
        print(f"    without {held:24s} piece {piece:.3f}, covers {inside}/{len(rows_)}")
    n = sum(len(v) for v in logs.values())
    print(f"    leave-one-model-out coverage {100 * covered / n:.1f}% of {n} rows")
    return max(every, per_model)


def derive_transfer_width() -> None:
    """``--derive-transfer-width``: the same transformer's pair spreads, behind
    ``uncertainty.SIGMA_TRANSFORMER_GENERATION_PAIR`` (another GPU type) and the check of a
    precision change. Method: a pair is one model, one software stack, measured on two GPU
    types at one precision (or at two precisions on one GPU type); the second is predicted
    from the first through ``predict`` with the first as its observation, and the piece is
    the root-mean-square of log(published / predicted), over the rows or over the models
    weighted equally, whichever is larger; gross, since the fit's own piece stands beside it
    in the intervals. A piece is used only where, picked leave-one-model-out, it covers at
    least 80 % of the held-out models' rows (the benchmarks' coverage goal). Neither set is
    scored here: the generation pairs are DeepLearningExamples' BERT-large on V100 and A100
    (bench_accuracy's rows), the precision pairs dgxc-benchmarking's NeMo tables
    (``llm_pairs.py``; no Llama 3). Then the correlation ``rho`` each implies between the
    groups of ``TRANSFORMER_MFU_SPREAD``: sd_A² + sd_B² - 2·rho·sd_A·sd_B = piece²."""
    from mlflow_gpuopt.perfmodel import uncertainty as unc

    print("Same model, another GPU type, same precision (DeepLearningExamples BERT-large, "
          "amp, V100 <-> A100, 1 GPU):")
    generation = pair_spread("generation pair", generation_pair_errors())
    print("Same model, same GPU type, bf16 -> fp8 (dgxc-benchmarking, NeMo + Transformer "
          "Engine on H100, the bf16 row of the same layout and GPU count as the observation):")
    tmp = Path(tempfile.mkdtemp(prefix="bench_llm_pairs_"))
    logs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for base, target in dgxc_rows():
        out = predict_json(target, [base], tmp)
        got = out["throughput_samples_per_s"] * target.seq / target.gpus
        logs[target.model].append((math.log(target.tokens_per_s_per_gpu / got),
                                   fit_sigma(out)))
    precision = pair_spread("precision pair", logs)
    spread = unc.TRANSFORMER_MFU_SPREAD
    for piece, pairs in ((generation, ((("ampere", "bf16"), ("hopper", "bf16")),
                                       (("hopper", "fp8"), ("blackwell", "fp8")))),
                         (precision, ((("hopper", "bf16"), ("hopper", "fp8")),))):
        for a, b in pairs:
            sa, sb = spread[a], spread[b]
            rho = (sa * sa + sb * sb - piece * piece) / (2 * sa * sb)
            print(f"  {a[0]} {a[1]} <-> {b[0]} {b[1]}: independent "
                  f"{math.hypot(sa, sb):.3f}, pair {piece:.3f}, rho {rho:.2f}")
    print(f"SIGMA_TRANSFORMER_GENERATION_PAIR = {generation:.3f} (shipped "
          f"{unc.SIGMA_TRANSFORMER_GENERATION_PAIR})")
    print(f"precision pair {precision:.3f}: not used (the bound stays) unless its "
          "leave-one-model-out coverage reaches 80 %")


#: The GEMM-efficiency groups ``derive_gemm_efficiency`` solves, in order: Hopper fp8 after
#: Hopper bf16, whose figure its rows' bf16 parts take.
GEMM_GROUPS = (("ampere", "bf16"), ("hopper", "bf16"), ("hopper", "fp8"))


def gemm_group(row: Row) -> tuple[str, str]:
    """The (architecture, precision) group a row's matmuls belong to (Blackwell: Hopper's)."""
    from mlflow_gpuopt.perfmodel import compute

    return compute.transformer_mfu_group((compute.architecture(row.gpu), row.precision))


@contextmanager
def gemm_table(table: dict[tuple[str, str], float]):
    """Run the model with the matmuls of each group in ``table`` at that share of the dense
    peak (the GEMMs' own rate), in place of ``compute.tensor_efficiency``'s whole-step-MFU
    ratio; groups not in ``table`` keep the shipped figure."""
    from mlflow_gpuopt.perfmodel import compute
    from mlflow_gpuopt.perfmodel.precision import normalize_precision

    shipped = compute.tensor_efficiency

    def efficiency(gpu: str, precision: str) -> float:
        p = normalize_precision(precision)
        key = compute.transformer_mfu_group((compute.architecture(gpu),
                                             "bf16" if p == "fp16" else p))
        return table[key] if key in table else shipped(gpu, precision)

    compute.tensor_efficiency = efficiency
    try:
        yield
    finally:
        compute.tensor_efficiency = shipped


def solve_gemm_efficiency(row: Row, table: dict[tuple[str, str], float],
                          key: tuple[str, str], tmp: Path) -> float:
    """The GEMM efficiency of group ``key`` (the others as in ``table``) at which the whole
    predicted step of ``row`` (its workload file alone, the CLI path) equals its published
    tokens/s: bisection in log over 0.1-1.0 (1.0 where even that predicts too slow)."""
    lo, hi = math.log(0.1), math.log(1.0)
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        with gemm_table({**table, key: math.exp(mid)}):
            got = predict(row, [], tmp)[0]
        lo, hi = (mid, hi) if got < row.tokens_per_s_per_gpu else (lo, mid)
    return math.exp(0.5 * (lo + hi))


def derive_gemm_efficiency(rows: list[Row], without: str | None = None,
                           verbose: bool = True) -> dict[tuple[str, str], float]:
    """Per group (``GEMM_GROUPS``, in order, each solved with the earlier ones set) the median
    over the derivation rows of :func:`solve_gemm_efficiency`: the matmul rate at which the
    model's whole step reproduces each published whole-step throughput. ``without`` leaves
    one source out; a group left without rows takes :func:`fill_missing`'s transfer."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_llm_gemm_"))
    out: dict[tuple[str, str], float] = {}
    for key in GEMM_GROUPS:
        members = [r for r in rows if r.derivation and r.source != without
                   and gemm_group(r) == key]
        if not members:
            continue
        solved = [solve_gemm_efficiency(r, out, key, tmp) for r in members]
        out[key] = statistics.median(solved)
        if verbose:
            print(f"  {key[0]:7s} {key[1]:5s} {len(solved):3d} rows "
                  f"({', '.join(sorted({r.source for r in members}))}): median "
                  f"{out[key]:.3f} (range {min(solved):.3f}-{max(solved):.3f})")
    return fill_missing(out)


def fill_missing(table: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """A group left without rows (leave-one-source-out) takes the other generation's figure
    at bf16, or (fp8) its own generation's bf16 figure: the same share of the doubled peak."""
    out = dict(table)
    out.setdefault(("ampere", "bf16"), out.get(("hopper", "bf16")))
    out.setdefault(("hopper", "bf16"), out[("ampere", "bf16")])
    out.setdefault(("hopper", "fp8"), out[("hopper", "bf16")])
    return out


def log_errors(rows: list[Row], table: dict[tuple[str, str], float], tmp: Path
               ) -> list[tuple[Row, float, float, float]]:
    """(row, predicted, low, high) from the workload alone under ``table``."""
    out = []
    with gemm_table(table):
        for r in rows:
            try:
                got, low, high, _ = predict(r, [], tmp)
            except PredictError:
                continue
            out.append((r, got, low, high))
    return out


def derive_gemm_report(rows: list[Row]) -> None:
    """``--derive-gemm-efficiency``: the GEMM efficiencies from every derivation source and
    task 5 scored with them (the shipped prior first), then leave one source out at a time
    (task 5 and that source's own rows, predicted without it); then the prior width those
    left-out rows give (what ``uncertainty.SIGMA_PRIOR_TRANSFORMER`` would be)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_llm_gemm_"))
    report = [r for r in rows if not r.derivation]

    def task5(table: dict) -> str:
        res = [(100.0 * abs(got - r.tokens_per_s_per_gpu) / r.tokens_per_s_per_gpu,
                low <= r.tokens_per_s_per_gpu <= high, high / low)
               for r, got, low, high in log_errors(report, table, tmp)]
        return summarise("5 workload alone", res).strip()

    print("shipped prior (compute.tensor_efficiency):")
    print("  " + task5({}))
    print("GEMM efficiency inverted from every derivation source:")
    full = derive_gemm_efficiency(rows)
    print("  " + task5(full))
    left_out = []
    for source in sorted({r.source for r in rows if r.derivation}):
        table, own = left_out_errors(rows, source, tmp)
        left_out += own
        print(f"without {source}: "
              + ", ".join(f"{k[0]} {k[1]} {v:.3f}" for k, v in table.items()))
        print(f"  its {len(own)} rows: mean log(published/predicted) "
              f"{statistics.fmean(own):+.3f}, rms {rms(own):.3f}")
        print("  " + task5(table))
    print(f"prior width, rms over the {len(left_out)} derivation rows each predicted without "
          f"its source: {rms(left_out):.3f}")


def rms(values: list[float]) -> float:
    return math.sqrt(statistics.fmean(x * x for x in values))


def left_out_errors(rows: list[Row], source: str, tmp: Path
                    ) -> tuple[dict[tuple[str, str], float], list[float]]:
    """(the GEMM table derived without ``source``, log(published / predicted) of that
    source's derivation rows under it)."""
    table = derive_gemm_efficiency(rows, without=source, verbose=False)
    own = [math.log(r.tokens_per_s_per_gpu / got) for r, got, _, _ in
           log_errors([r for r in rows if r.derivation and r.source == source], table, tmp)]
    return table, own


@contextmanager
def derived_gemm_prior(rows: list[Row]):
    """``--derived-gemm``: the whole benchmark with the inverted GEMM efficiencies
    (:func:`derive_gemm_efficiency`) and, as the prior's width, the leave-one-source-out rms
    of the derivation rows (``uncertainty.SIGMA_PRIOR_TRANSFORMER`` re-derived the same
    way) and ``compute.FP8_RECIPE_EFFICIENCY`` re-derived under them, to see what that prior
    changes on every task before it is shipped."""
    from mlflow_gpuopt.perfmodel import uncertainty

    tmp = Path(tempfile.mkdtemp(prefix="bench_llm_gemm_"))
    print("GEMM efficiency inverted from every derivation source:")
    table = derive_gemm_efficiency(rows)
    width = rms([x for source in sorted({r.source for r in rows if r.derivation})
                 for x in left_out_errors(rows, source, tmp)[1]])
    print(f"  prior width (leave-one-source-out rms): {width:.3f}")
    from mlflow_gpuopt.perfmodel import compute

    with gemm_table(table):
        recipes = derive_fp8_recipe_efficiency()
    print("  FP8_RECIPE_EFFICIENCY re-derived on torchao's README with it: "
          + ", ".join(f"{k} {v:.3f}" for k, v in recipes.items()))
    saved = uncertainty.SIGMA_PRIOR_TRANSFORMER, dict(compute.FP8_RECIPE_EFFICIENCY)
    uncertainty.SIGMA_PRIOR_TRANSFORMER = width
    compute.FP8_RECIPE_EFFICIENCY.update(recipes)
    try:
        with gemm_table(table):
            yield
    finally:
        uncertainty.SIGMA_PRIOR_TRANSFORMER = saved[0]
        compute.FP8_RECIPE_EFFICIENCY.clear()
        compute.FP8_RECIPE_EFFICIENCY.update(saved[1])


def moe_section(tmp: Path) -> list[str]:
    """The mixture-of-experts rows (``llm_moe.py``: published MoE throughput, each model's
    config.json on the CLI path with the published layout); returns their summary lines."""
    import llm_moe

    return llm_moe.run(tmp)


def main() -> None:
    if "--moe" in sys.argv[1:]:
        lines = moe_section(Path(tempfile.mkdtemp(prefix="bench_llm_moe_")))
        print("\nSummary, mixture of experts (tokens/s per GPU; " + GOALS + ")")
        for line in lines:
            print(line)
        return
    if "--derive-prior-width" in sys.argv[1:]:
        derive_prior_width(load_rows()[0])
        return
    if "--derive-transfer-width" in sys.argv[1:]:
        derive_transfer_width()
        import llm_moe

        llm_moe.derive_transfer_width(Path(tempfile.mkdtemp(prefix="bench_llm_moe_pairs_")))
        return
    if "--derive-gemm-efficiency" in sys.argv[1:]:
        derive_gemm_report(load_rows()[0])
        return
    if "--derive-fp8" in sys.argv[1:]:
        for recipe, factor in derive_fp8_recipe_efficiency().items():
            print(f"FP8_RECIPE_EFFICIENCY[{recipe!r}] = {factor:.3f} (torchao README speed-up "
                  f"{TORCHAO_README_TPS[recipe] / TORCHAO_README_TPS['bf16']:.4f}; "
                  f"{fp8_cast_line(recipe)})")
        return
    if "--derived-gemm" in sys.argv[1:]:
        with derived_gemm_prior(load_rows()[0]):
            run_all()
        return
    run_all(selected_tasks(sys.argv[1:]))


def selected_tasks(argv: list[str]) -> frozenset[str] | None:
    """``--tasks 2,5``: the task numbers to run (then without the infeasible count and the
    mixture-of-experts rows); None (every task, the count and the MoE rows) without it.
    Exits 2 with one line on a number that is not a task."""
    if "--tasks" not in argv:
        return None
    at = argv.index("--tasks") + 1
    wanted = {p.strip() for p in (argv[at] if at < len(argv) else "").split(",") if p.strip()}
    known = {name.split()[0] for name in TASKS}
    if not wanted or not wanted <= known:
        print(f"--tasks takes task numbers separated by commas ({', '.join(sorted(known))})",
              file=sys.stderr)
        raise SystemExit(2)
    return frozenset(wanted)


def print_summary(lines: list[str], cp_lines: list[str]) -> None:
    """The tasks' summary lines, then those of their context-parallel rows."""
    print("\nSummary (tokens/s per GPU; " + GOALS + ")")
    for line in lines:
        print(line)
    print("Context-parallel rows of the report set (within the tasks above):")
    for line in cp_lines or ["  none"]:
        print(line)


def run_all(only: frozenset[str] | None = None) -> None:
    """Every task, the infeasible count and the mixture-of-experts rows; with ``only``
    (task numbers, ``--tasks``) those tasks alone."""
    rows, skipped = load_rows()
    report = [r for r in rows if not r.derivation]
    print(f"LLM training throughput: {len(rows)} usable rows ({len(report)} report, "
          f"{len(rows) - len(report)} derivation set, never scored); {skipped} skipped "
          "(tp/pp unknown, or degrees not the GPU count)")
    lines, cp_lines = [], []
    tmp = Path(tempfile.mkdtemp(prefix="bench_llm_"))
    for name, pairs in tasks(rows).items():
        if only is not None and name.split()[0] not in only:
            continue
        res, cp_res, explained = [], [], []
        print(f"\n== Task {name}")
        for target, refs in pairs:
            try:
                out = predict_json(target, refs, tmp)
            except PredictError as exc:
                print(f"  {target.model} {target.gpus}x{target.gpu}: not predicted ({exc})")
                continue
            k = target.seq / target.gpus
            got, low, high = (out["throughput_samples_per_s"] * k, out["low"] * k,
                              out["high"] * k)
            err = 100.0 * abs(got - target.tokens_per_s_per_gpu) / target.tokens_per_s_per_gpu
            res.append((err, low <= target.tokens_per_s_per_gpu <= high, high / low))
            if target.cp > 1:
                cp_res.append(res[-1])
            ref = ", ".join(f"{r.gpus}x{r.gpu} {r.precision} mb{r.micro_batch}" for r in refs)
            print(f"  {target.model:14s} {target.gpus:5d}x{target.gpu:25s} {target.precision} "
                  f"tp{target.tp} pp{target.pp} cp{target.cp} mb{target.micro_batch:<3d} "
                  "published "
                  f"{target.tokens_per_s_per_gpu:8.0f}  predicted {got:8.0f} "
                  f"({low:.0f}-{high:.0f}) err {err:5.1f}%  from [{ref or 'workload alone'}]")
            explained.append((f"{target.model} {target.gpus}x{target.gpu} {target.precision} "
                              f"from [{ref or 'workload alone'}]",
                              math.log(target.tokens_per_s_per_gpu / got), out["width_terms"],
                              out["log_sigma"]))
        if "--explain-width" in sys.argv[1:] and explained:
            for line in explain_widths(name, explained):
                print(line)
        lines.append(summarise(name, res))
        if cp_res:
            cp_lines.append(summarise(name + ", cp > 1 rows", cp_res))
    if only is not None:
        print_summary(lines, cp_lines)
        return
    infeasible = []
    for r in report:
        try:
            _, _, _, fits = predict(r, [], tmp)
        except PredictError:
            continue
        if not fits:
            infeasible.append(r)
    print_summary(lines, cp_lines)
    print(f"  published configurations called infeasible: {len(infeasible)} of {len(report)} "
          "(goal 0; activations from perfmodel.activations: architecture, SDPA, recompute as "
          "the source states)")
    for r in infeasible:
        print(f"    {r.source} {r.model} {r.gpus}x{r.gpu} tp{r.tp} pp{r.pp} mb{r.micro_batch} "
              f"{r.recompute}")
    moe_lines = moe_section(tmp)
    print("\nSummary, mixture of experts (tokens/s per GPU; " + GOALS + ")")
    for line in moe_lines:
        print(line)


if __name__ == "__main__":
    import gemm_shape

    with gemm_shape.from_argv():  # --shape-gemm: the shape-dependent GEMM prior
        main()
