"""The mixture-of-experts rows of ``bench_llm.py``: published MoE pre-training throughput
(``data/moe_training_throughput.tsv``, whose header names each source, commit and date:
Megatron-Bridge's performance-summary archive, NeMo AutoModel's performance summary,
torchtitan's DeepEP README),
predicted through ``mlflow gpuopt predict`` (``cli_path.run_predict``) as a user would: the
model's Hugging Face ``config.json`` (``workloads/hf/``) as ``--workload`` with
``--seq-len``, and the published layout as ``--strategy`` (``tpN x ppN x epN x`` zero1 for
Megatron's distributed optimizer, fsdp for AutoModel's FSDP2), ``--virtual-stages`` from VP,
``--moe-dispatcher`` the dispatcher the run used (the tsv's ``dispatcher``) and
``--moe-routing`` its router's forced balance (``MoeRow.gate``).

Rows not scored (counted and named): context parallel > 1 (``cpN`` is another developer's
part); an expert-parallel degree that does not divide the data-parallel one (Megatron takes
the expert group over tp × dp with expert tensor parallel 1; the model's ``ep`` comes from the
data-parallel ranks); token-dropping runs whose capacity factor the source does not state;
a run with DeepSeek-V3's multi-token-prediction layer (not in the ``transformers`` model, so
not in the config.json count). The attention kernel is the stack's, as for the dense rows
(``llm_table.attention_kernel``, ``--attention-kernel``): Transformer Engine's (``te``) for
Megatron-Bridge (``transformer_impl = "transformer_engine"``) and AutoModel (its configs'
``backend: attn: te``), PyTorch SDPA's default for torchtitan; tensor-parallel overlap is
the default; recomputation is what the run's configuration states (AutoModel's: full), else
the default (Megatron-Bridge's table does not state it).

Rows whose printed gradient accumulation contradicts GBS / (dp × MBS) are skipped too (the
table's arithmetic does not say which of its cells is wrong).

Tasks (tokens/s per GPU; the dense rows' goals): scaling (the same source, model, GPU, layout
and micro-batch measured at its smallest GPU count), across GPU types (the same model and
source measured on the other GPU type, the same release's run where there is one, else the
smallest such run, as the observation), and every scored row from its config.json alone.
Megatron-Bridge's 26.02.01 and 26.04 releases (``DERIVATION_SOURCES``) are never scored:
``derive_transfer_width`` (``bench_llm.py --derive-transfer-width``) derives the MoE layers'
transfer width piece (``uncertainty.SIGMA_MOE_TRANSFER``) from their cross-GPU pairs and the
token-dropping rows.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from cli_path import PredictError, observations_args, run_predict
from llm_table import attention_kernel

from mlflow_gpuopt.perfmodel.layout import with_degree
from scores import leave_one_model_out, net_piece, summary_line

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "moe_training_throughput.tsv"
CONFIGS = HERE / "workloads" / "hf"
#: tsv GPU -> (the ``--gpu`` name a user gives, node network Gbit/s: DGX H100 / B200 have
#: 8 × 400 Gbit/s InfiniBand)
GPUS = {"H100-SXM-80GB": ("NVIDIA H100 80GB HBM3", 3200.0), "B200": ("NVIDIA B200", 3200.0)}
TASKS = ("MoE: scaling, from the smallest GPU count", "MoE: across GPU types",
         "MoE: no measurement (config.json alone)")
#: Megatron-Bridge's releases after the archive upstream's stored history holds (26.02.01 and
#: 26.04, read from forks carrying upstream's page; the tsv's header): the derivation set of
#: the MoE transfer width (:func:`derive_transfer_width`), never scored by a task.
DERIVATION_SOURCES = ("megatron_bridge_2602_01", "megatron_bridge_2604")
#: Sources whose rows run Megatron-Bridge's performance recipes.
MEGATRON_BRIDGE = ("megatron_bridge_archive",) + DERIVATION_SOURCES


@dataclass(frozen=True)
class MoeRow:
    source: str
    date: str
    model: str
    config: str
    gpu: str
    gpus: int
    tp: int
    pp: int
    vp: int
    ep: int
    cp: int
    dp_strategy: str
    micro_batch: int
    global_batch: int
    grad_accum: int | None
    seq: int
    precision: str  # bf16 | fp8
    routing: str
    dispatcher: str  # alltoall | flex (the tsv's header says where each comes from)
    a2a_overlap: str  # 1f1b | none (--moe-a2a-overlap; the tsv's header cites each)
    recompute: str | None  # none | selective | full; None where the source does not say
    tokens_per_s_per_gpu: float
    notes: str

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def accum(self) -> int:
        if self.grad_accum:
            return self.grad_accum
        return max(1, round(self.global_batch / (self.dp * self.micro_batch)))

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // 8)

    @property
    def local_batch(self) -> int | None:
        """AutoModel's LBS (its notes: 'LBS 8, GA 4'): the samples one run of its pipeline
        schedule takes, gradient accumulation running it GA times; None elsewhere (Megatron
        runs one schedule per step)."""
        m = re.search(r"\bLBS (\d+)", self.notes)
        return int(m.group(1)) if m and self.source == "automodel_perf" else None

    @property
    def gate(self) -> str:
        """Where the run's router sent a token's experts (``--moe-routing``): the forced
        balance of torchtitan and AutoModel is round-robin, Megatron's random logits are
        random (the tsv's header cites both)."""
        if self.routing == "balanced" and self.source in ("torchtitan_deepep",
                                                          "automodel_perf"):
            return "round_robin"
        return "random"

    @property
    def expert_tp(self) -> int | None:
        """The experts' tensor-parallel degree (``--expert-tensor-parallel``): 1 for
        Megatron-Bridge's performance configs (``expert_tensor_parallel_size=1`` in
        ``scripts/performance/configs/deepseek/workload_base_configs.py``'s
        ``BASE_DEEPSEEK_V3_CONFIG`` and in the Qwen3 MoE presets, @ 0fa501ac), else None
        (tp: the other sources' rows have tp 1)."""
        return 1 if self.source in MEGATRON_BRIDGE else None

    @property
    def strategy(self) -> str:
        parts = [f"{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("ep", self.ep))
                 if v > 1]
        return "x".join(parts + [self.dp_strategy])

    def skip_reason(self) -> str | None:
        if self.grad_accum and self.grad_accum * self.dp * self.micro_batch != self.global_batch:
            return (f"the table's GA {self.grad_accum} contradicts GBS / (dp x MBS) = "
                    f"{self.global_batch / (self.dp * self.micro_batch):g}")
        if self.cp > 1:
            return "context parallel"
        if self.dp % self.ep and self.expert_tp is None:
            # Megatron-Bridge's rows fold the expert group over tp x dp (ETP 1, expert_tp)
            return f"ep{self.ep} over tp x dp (dp {self.dp}), the experts' tp not stated"
        if self.routing == "tokendrop":
            return "token dropping, capacity factor not stated"
        if "MTP" in self.model and "w/o MTP" not in self.model:
            return "multi-token-prediction layer"
        if self.gpu not in GPUS:
            return "GPU not in the catalog"
        return None


def load_moe_rows() -> list[MoeRow]:
    lines = [ln for ln in DATA.read_text().splitlines() if ln and not ln.startswith("#")]
    out = []
    for r in csv.DictReader(lines, delimiter="\t"):
        accum = r["grad_accum"]
        out.append(MoeRow(
            source=r["source"], date=r["date"], model=r["model"], config=r["config"],
            gpu=r["gpu"], gpus=int(r["gpus"]), tp=int(r["tp"]), pp=int(r["pp"]),
            vp=int(r["vp"]), ep=int(r["ep"]), cp=int(r["cp"]), dp_strategy=r["dp_strategy"],
            micro_batch=int(r["micro_batch"]), global_batch=int(r["global_batch"]),
            grad_accum=None if accum == "NA" else int(accum), seq=int(r["seq_len"]),
            precision="fp8" if r["precision"].lower().startswith(("fp8", "mxfp8"))
            else "bf16", routing=r["routing"], dispatcher=r["dispatcher"],
            a2a_overlap=r["a2a_overlap"],
            recompute=None if r["recompute"] == "NA" else r["recompute"],
            tokens_per_s_per_gpu=float(r["tokens_per_s_per_gpu"]), notes=r["notes"]))
    return out


def cli_args(row: MoeRow) -> list[str]:
    """``mlflow gpuopt predict`` flags: the config.json, its training sequence length and
    the published layout."""
    args = ["--workload", str(CONFIGS / f"{row.config}.json"), "--seq-len", str(row.seq),
            "--gpu", GPUS[row.gpu][0], "--gpus", str(row.gpus), "--nodes", str(row.nodes),
            "--strategy", row.strategy, "--micro-batch", str(row.micro_batch),
            "--grad-accum", str(row.accum), "--precision", row.precision,
            "--inter-node-gbps", str(GPUS[row.gpu][1]),
            "--moe-dispatcher", row.dispatcher, "--moe-routing", row.gate,
            "--moe-a2a-overlap", row.a2a_overlap]
    kernel = attention_kernel(row.source)
    if kernel:
        args += ["--attention-kernel", kernel]
    if row.vp > 1 and row.pp > 1:
        args += ["--virtual-stages", str(row.vp)]
    if row.recompute:
        args += ["--recompute", row.recompute]
    if row.expert_tp and row.tp > 1:
        args += ["--expert-tensor-parallel", str(row.expert_tp)]
    if row.pp > 1 and row.local_batch:
        # each gradient-accumulation step runs the schedule over the local batch
        args += ["--pp-microbatches", str(row.local_batch // row.micro_batch)]
    return args


def observation_line(row: MoeRow) -> list:
    """The measured run as a row of the observations CSV, its interleaved schedule as
    ``vpN`` in the layout (the CSV has no column for it), its own dispatcher, routing,
    experts' tensor parallel and all-to-all overlap in theirs (the target's flags describe
    the planned run only)."""
    samples = row.tokens_per_s_per_gpu * row.gpus / row.seq
    strategy = (with_degree(row.strategy, "vp", row.vp) if row.vp > 1 and row.pp > 1
                else row.strategy)
    return [GPUS[row.gpu][0], row.gpus, row.nodes, row.micro_batch, samples, strategy,
            row.precision, row.accum, row.recompute or "", "", row.dispatcher, row.gate,
            row.expert_tp or "", row.a2a_overlap]


def predict(target: MoeRow, refs: list[MoeRow], tmp: Path) -> tuple[float, float, float,
                                                                      bool, dict]:
    """(tokens/s per GPU, low, high, fits, the command's JSON) for ``target``."""
    args = cli_args(target)
    if refs:
        args += observations_args(tmp / "moe_observations.csv", map(observation_line, refs))
    out = run_predict(args)
    k = target.seq / target.gpus
    return (out["throughput_samples_per_s"] * k, out["low"] * k, out["high"] * k,
            out["fits"], out)


def scored_rows(rows: list[MoeRow]) -> list[MoeRow]:
    """The report set: rows no skip reason holds back, outside ``DERIVATION_SOURCES``."""
    return [r for r in rows if r.skip_reason() is None and r.source not in DERIVATION_SOURCES]


def moe_tasks(rows: list[MoeRow]) -> dict[str, list[tuple[MoeRow, list[MoeRow]]]]:
    scored = scored_rows(rows)
    out: dict[str, list[tuple[MoeRow, list[MoeRow]]]] = {name: [] for name in TASKS}
    for t in scored:
        out[TASKS[2]].append((t, []))
        same = [r for r in scored if (r.source, r.model, r.config, r.gpu, r.precision,
                                      r.micro_batch, r.tp, r.pp, r.ep, r.dp_strategy)
                == (t.source, t.model, t.config, t.gpu, t.precision, t.micro_batch, t.tp,
                    t.pp, t.ep, t.dp_strategy)]
        smallest = min(r.gpus for r in same)
        if t.gpus > smallest:
            out[TASKS[0]].append((t, [r for r in same if r.gpus == smallest][:1]))
        others = [r for r in scored if r.gpu != t.gpu and r.config == t.config
                  and r.source == t.source and r.precision == t.precision]
        # the same release on the other GPU type where the source has one (the same
        # software on both sides), else any of the source's
        others = [r for r in others if r.date == t.date] or others
        if others:
            smallest = min(o.gpus for o in others)
            out[TASKS[1]].append((t, [o for o in others if o.gpus == smallest][:1]))
    return out


def run(tmp: Path, verbose: bool = False) -> list[str]:
    """Print every MoE row's prediction per task; return the summary lines."""
    rows = load_moe_rows()
    skipped = [(r, r.skip_reason()) for r in rows if r.skip_reason()]
    derivation = [r for r in rows if r.source in DERIVATION_SOURCES and not r.skip_reason()]
    print(f"\nMixture-of-experts rows: {len(rows)} ({len(scored_rows(rows))} scored, "
          f"{len(derivation)} in the transfer width's derivation set, {len(skipped)} skipped)")
    for r, why in skipped:
        print(f"  skipped {r.source} {r.date} {r.model} {r.gpus}x{r.gpu} {r.strategy}: {why}")
    lines = []
    infeasible: set[MoeRow] = set()
    for name, pairs in moe_tasks(rows).items():
        print(f"\n== Task {name}")
        res = []
        for target, refs in pairs:
            try:
                got, low, high, fits, out = predict(target, refs, tmp)
            except PredictError as exc:
                print(f"  {target.model} {target.gpus}x{target.gpu}: not predicted ({exc})")
                continue
            if not fits and not refs:
                infeasible.add(target)
            pub = target.tokens_per_s_per_gpu
            err = 100.0 * abs(got - pub) / pub
            res.append((err, low <= pub <= high, high / low))
            ref = ", ".join(f"{r.gpus}x{r.gpu} {r.strategy}" for r in refs)
            t = out.get("time_breakdown", {})
            print(f"  {target.model[:24]:24s} {target.gpus:5d}x{target.gpu:14s} "
                  f"{target.precision:4s} {target.strategy:20s} mb{target.micro_batch} "
                  f"published {pub:7.0f} predicted {got:7.0f} ({low:.0f}-{high:.0f}) "
                  f"err {err:5.1f}%{'' if fits else ' [does not fit]'}  "
                  f"a2a {1e3 * t.get('alltoall_s', 0.0):.0f} ms of "
                  f"{1e3 * out.get('step_time_s', 0.0):.0f} ms  from [{ref or 'config alone'}]")
            if verbose:
                print("    " + json.dumps(t))
        lines.append(summary_line(name, res))
    scored = len(scored_rows(rows))
    lines.append(f"  published MoE configurations called infeasible: {len(infeasible)} of "
                 f"{scored} (goal 0)")
    lines += overlap_abs(tmp)
    return lines


@dataclass(frozen=True)
class OverlapAB:
    """A published end-to-end A/B of the 1F1B all-to-all overlap: the same job without and
    with it (``speedup``: the published ratio), predicted from the model's config alone."""

    name: str
    source: str
    args: tuple[str, ...]
    speedup: float
    #: the published figures, as printed (step seconds or TFLOP/s per GPU)
    published: str
    #: layers of the config the job ran, where it cut the model's (a proxy)
    layers: int | None = None


def _ab_args(config: str, seq: int, gpus: int, strategy: str, accum: int,
             dispatcher: str, *extra: str) -> tuple[str, ...]:
    return ("--workload", config, "--seq-len", str(seq), "--gpu", "NVIDIA H100 80GB HBM3",
            "--gpus", str(gpus), "--nodes", str(gpus // 8), "--strategy", strategy,
            "--micro-batch", "1", "--grad-accum", str(accum), "--precision", "bf16",
            "--inter-node-gbps", "3200", "--moe-dispatcher", dispatcher,
            "--moe-routing", "random", "--attention-kernel", "te", *extra)


#: The published A/Bs of the overlap, every one on H100 in BF16. The first decided which
#: seconds ``moe.A2A_OVERLAP_GEMM_COST`` is charged to (docs/models.md#mixture-of-experts);
#: the other two were found after and check it. None is scored by a task.
OVERLAP_ABS = (
    OverlapAB("Qwen3-235B-A22B, 256 H100, DeepEP, tp2 x pp8 x vp4 x ep32 (the derivation)",
              # NVIDIA's Megatron-MoE-ModelZoo best_practice/qwen3/readme.md @ 020b8136b3bc,
              # "Cross-node EP strategy": MBS 1, GBS 2048 (GA 128), sequence 4096, expert
              # tensor parallel 1, recompute "norm, act" (not a mode the model has)
              "yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md @ 020b8136",
              _ab_args(str(CONFIGS / "qwen3_235b_a22b.json"), 4096, 256,
                       "tp2xpp8xep32xzero1", 128, "flex", "--virtual-stages", "4",
                       "--expert-tensor-parallel", "1"),
              19.7 / 17.6, "19.7 s -> 17.6 s a step"),
    OverlapAB("Qwen3-30B-A3B, 16 H100 (2 nodes), NCCL all-to-all, ep16",
              # Megatron-Bridge skills/perf-moe-comm-overlap/SKILL.md @ b17a5c9e07ae, "Measured
              # Short-Run Caveat" (2026-05-16): EP 16, alltoall, GBS 1024 (the H100 BF16 v1
              # preset: MBS 1, no pipeline: GA 64), CUDA graphs off, moe_permute_fusion false
              # in both arms; a rerun in PR #3862 gave 41.25 s -> 31.31 s (1.32x)
              "NVIDIA-NeMo/Megatron-Bridge skills/perf-moe-comm-overlap/SKILL.md @ b17a5c9e",
              _ab_args(str(CONFIGS / "qwen3_30b_a3b.json"), 4096, 16, "ep16xzero1", 64,
                       "alltoall"),
              43.1 / 32.6, "43.1 s -> 32.6 s a step"),
    OverlapAB("DeepSeek-V3 14-layer proxy, 64 H100, NCCL all-to-all, pp4 x vp2 x ep16, full "
              "recompute",
              # Megatron-LM PR #6311's description: 14 layers, 256 experts, hidden 7168, MLA,
              # MTP 1 (not modelled), sequence 2048, TP1 PP4 EP16, layout "Ett|(tt|)*6mL"
              # (8 chunks: vp 2), MBS 1, GBS 256 (GA 16), bf16, alltoall, full recompute
              # (uniform, 1): 184.2 TFLOP/s without, 198.5 with (CUDA_DEVICE_MAX_CONNECTIONS
              # 32; 191.1 at 1, the baseline's)
              "NVIDIA/Megatron-LM pull request #6311",
              _ab_args(str(CONFIGS / "deepseek_v3.json"), 2048, 64, "pp4xep16xzero1", 16,
                       "alltoall", "--virtual-stages", "2", "--recompute", "full"),
              198.5 / 184.2, "184.2 -> 198.5 TFLOP/s a GPU", layers=14),
)


def _ab_workload(ab: OverlapAB, tmp: Path) -> tuple[str, ...]:
    """``ab.args`` with its config cut to the proxy's layers where it was one."""
    if ab.layers is None:
        return ab.args
    args = list(ab.args)
    i = args.index("--workload") + 1
    doc = json.loads(Path(args[i]).read_text())
    doc["num_hidden_layers"] = ab.layers
    cut = tmp / f"{Path(args[i]).stem}_{ab.layers}_layers.json"
    cut.write_text(json.dumps(doc))
    args[i] = str(cut)
    return tuple(args)


def overlap_abs(tmp: Path) -> list[str]:
    """Each published overlap A/B (:data:`OVERLAP_ABS`) predicted from the config, a line
    each."""
    lines = []
    for ab in OVERLAP_ABS:
        args = _ab_workload(ab, tmp)
        step = {o: run_predict([*args, "--moe-a2a-overlap", o])["step_time_s"]
                for o in ("none", "1f1b")}
        lines.append(f"  1F1B overlap A/B, {ab.name}: published {ab.published} "
                     f"({ab.speedup:.2f}x), predicted {step['none']:.2f} s -> "
                     f"{step['1f1b']:.2f} s ({step['none'] / step['1f1b']:.2f}x)  [{ab.source}]")
    return lines


def unscored_transfer_pairs(rows: list[MoeRow]) -> list[tuple[MoeRow, MoeRow]]:
    """(target, reference) pairs across GPU types whose target no task scores: a row of the
    derivation releases (``DERIVATION_SOURCES``) or a row skipped for token dropping (its
    capacity factor unstated: the same recipe and release on both GPU types, so the
    reference's calibration carries it), predicted from the row of the same source, release,
    config.json and precision on the other GPU type, the smallest such run, as
    :func:`moe_tasks` pairs the scored rows."""
    out = []
    for t in rows:
        derivation = t.source in DERIVATION_SOURCES and t.skip_reason() is None
        dropping = t.routing == "tokendrop" and t.skip_reason() is not None
        if not (derivation or dropping) or t.gpu not in GPUS:
            continue
        others = [r for r in rows if r.gpu != t.gpu and r.gpu in GPUS and r.source == t.source
                  and r.date == t.date and r.config == t.config and r.precision == t.precision]
        if others:
            smallest = min(o.gpus for o in others)
            out.append((t, [o for o in others if o.gpus == smallest][0]))
    return out


def other_pieces(out: dict, without: str) -> float:
    """The combined σ of a ``predict --json`` answer's width pieces other than ``without``."""
    return math.sqrt(sum(w["log_sigma"] ** 2 for w in out["width_terms"]
                         if w["term"] != without))


def derive_transfer_width(tmp: Path) -> float:
    """``bench_llm.py --derive-transfer-width``'s mixture-of-experts part: the MoE layers'
    piece a run measured on another GPU type leaves, from pairs no task scores
    (:func:`unscored_transfer_pairs`), each target predicted from its reference through
    ``predict`` as the across-GPU task does. Per model, log(published / predicted) beside the
    interval's other pieces (everything but ``uncertainty.TERM_MOE``); the piece is what the
    errors show beyond them (``scores.net_piece``), ``uncertainty.SIGMA_MOE_TRANSFER``
    only where, picked leave-one-model-out, it covers at least 80 % of the held-out rows.
    Then, as a check and never used, the scored rows predicted from the references the task
    did not pick (other releases of the same configuration): their targets are scored."""
    from mlflow_gpuopt.perfmodel import uncertainty as unc

    rows = load_moe_rows()
    logs: dict[str, list[tuple[float, float]]] = {}
    print("Mixture of experts, another GPU type, pairs whose target no task scores "
          "(Megatron-Bridge 26.02.01 and 26.04, token-dropping rows; the same release on the "
          "other GPU type as the observation):")
    for target, ref in unscored_transfer_pairs(rows):
        release = target.date.split("(")[-1].rstrip(")")
        label = (f"{release} {target.model[:28]} {target.gpus}x{target.gpu} "
                 f"from {ref.model[:28]} {ref.gpus}x{ref.gpu}")
        try:
            got, _, _, _, out = predict(target, [ref], tmp)
        except PredictError as exc:
            print(f"  {label}: not predicted ({exc})")
            continue
        e = math.log(target.tokens_per_s_per_gpu / got)
        rest = other_pieces(out, unc.TERM_MOE)
        logs.setdefault(target.config, []).append((e, rest))
        print(f"  {label}: log(published/predicted) {e:+.3f}, other pieces {rest:.3f}")
    errors = [e for v in logs.values() for e, _ in v]
    piece = net_piece(logs)
    covered, n = leave_one_model_out(logs)
    if n:
        rms_e = math.sqrt(sum(e * e for e in errors) / n)
        rms_rest = math.sqrt(sum(s * s for v in logs.values() for _, s in v) / n)
        print(f"  RMS {rms_e:.3f} over {n} rows of {len(logs)} models, other pieces "
              f"{rms_rest:.3f}: MoE piece {piece:.3f}; leave-one-model-out coverage "
              f"{100 * covered / n:.1f}% of {n} rows")
    used = n > 0 and covered >= 0.8 * n
    print(f"  MoE transfer piece {piece:.3f}: "
          + (f"used (uncertainty.SIGMA_MOE_TRANSFER {unc.SIGMA_MOE_TRANSFER})" if used
             else f"not used, the prior's SIGMA_MOE_LAYERS {unc.SIGMA_MOE_LAYERS} would stay "
             "(leave-one-model-out coverage below 80 %)"))
    print("  check, not used (scored targets, the references the task did not pick):")
    scored = scored_rows(rows)
    both = {m: list(v) for m, v in logs.items()}
    for t, refs in moe_tasks(rows)[TASKS[1]]:
        for ref in scored:
            if (ref not in refs and ref.gpu != t.gpu and ref.source == t.source
                    and ref.config == t.config and ref.precision == t.precision):
                got, _, _, _, out = predict(t, [ref], tmp)
                e = math.log(t.tokens_per_s_per_gpu / got)
                rest = other_pieces(out, unc.TERM_MOE)
                both.setdefault(t.config, []).append((e, rest))
                print(f"    {t.date[:7]} {t.model[:20]} {t.gpus}x{t.gpu} from {ref.date[:7]} "
                      f"{ref.gpus}x{ref.gpu}: {e:+.3f}, other pieces {rest:.3f}")
    covered, n = leave_one_model_out(both)
    if n:
        print(f"    with them: MoE piece {net_piece(both):.3f} over {n} rows, "
              f"leave-one-model-out coverage {100 * covered / n:.1f}%")
    return piece
