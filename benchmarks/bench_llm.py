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

Each row becomes a workload written from the model's published shape (the way
``benchmarks/workloads/*.json`` are): FLOPs per token ``6·N + 12·L·h·s`` (PaLM's model
FLOPs, attention included, as torchtitan counts them), stored activations per token
``34·h·L`` bytes in bf16 (Korthikanti et al.'s per-layer figure without the s² attention
term, as FlashAttention/SDPA stores it; ``2·h·L`` + one layer's 34·h under full recompute),
DRAM traffic 6 × the un-recomputed activations, AdamW. Layouts: tp × pp × dp as the source
gives them; FSDP for torchtitan and Megatron-FSDP rows, ZeRO-1 (Megatron's distributed
optimizer) for the rest. Context parallelism and interleaved (virtual) pipeline stages are
not modelled in this branch: rows with cp > 1 are skipped (counted), vp rows are scored with
the plain 1F1B bubble. Networks: 8 × 400 Gbit/s per node (DGX H100/B200 InfiniBand, Grand
Teton RDMA), 8 × 200 Gbit/s for the A100 cluster (not stated in the source: DGX A100's HCAs).
The H100 96 GB (HBM2e) part of torchtitan's Grand Teton hosts runs at a 500 W limit (700 W
TDP): modelled as the H100 SXM spec with 96 GB and its FLOP/s scaled by the clock a power cap
leaves, ``(500/700)^(1/3)`` (dynamic power ∝ f·V², V ∝ f); its memory bandwidth is not
published and kept at the SXM part's. The 95 GB "lower TDP" part states no limit and is kept
at the SXM figures, so those rows carry that error.

Tasks (median and p90 absolute % error of tokens/s per GPU, and coverage of the 90%
interval):
  1. scaling: within a config group (source, model, GPU, precision, layout per node, micro-
     batch, recompute, variant), predict every GPU count from the smallest;
  2. across GPU types: the same model shape and precision measured on another GPU type;
  3. across micro-batches: the same config at another micro-batch;
  4. bf16 -> FP8: the same config measured in bf16;
  5. no measurement: every report row from its workload alone (goal: median <= 25 %).
Then the number of published (report-set) configurations the model calls infeasible (does not
fit in GPU memory; goal 0). Memory depends on the activation estimate; the architecture-based
activation formula of issue 10 (another branch) is not in this one, so the count is noted, not
tuned.

Run: ``python benchmarks/bench_llm.py`` (seconds, CPU only).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, fields, replace
from pathlib import Path

from mlflow_gpuopt.catalog import load_gpus
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import Observation, ParallelConfig, PerfModelError, Workload, fit

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "llm_training_throughput.tsv"

DERIVATION_SOURCES = ("megatron_readme_2024_h100", "nemo_24.07_perf")
#: tsv GPU -> (catalog spec, memory GB, node network Gbit/s, power limit W or None)
GPUS = {
    "H100-SXM-80GB": ("H100-SXM5-80GB", 80, 3200.0, None),
    "H100-SXM-96GB-HBM2e-500W": ("H100-SXM5-80GB", 96, 3200.0, 500.0),
    "H100-HBM2e-95GB-lowTDP": ("H100-SXM5-80GB", 95, 3200.0, None),  # limit not stated
    "A100-80GB": ("A100-80GB-SXM4", 80, 1600.0, None),
    "B200": ("B200-SXM-180GB", 180, 3200.0, None),
}


def power_capped_clock(limit_w: float | None, tdp_w: float) -> float:
    """Clock (so FLOP/s) share left under a power limit: dynamic power ∝ f·V² with V ∝ f in
    the DVFS range, so f ∝ P^(1/3) (a first-order physical estimate, not a fit)."""
    if not limit_w or limit_w >= tdp_w:
        return 1.0
    return (limit_w / tdp_w) ** (1.0 / 3.0)
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
        shard = _note(self.variant_notes, "fsdp")
        fsdp = self.source.startswith("torchtitan") or shard not in (None, "NA", "0")
        return "fsdp" if fsdp else "zero1"

    variant_notes: str = ""
    grad_accum: int | None = None  # where the source says (else from the global batch)

    @property
    def family(self) -> str:
        """Software family: a user's runs on two GPU types use the same stack."""
        return "torchtitan" if self.source.startswith("torchtitan") else "nvidia"


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _note(notes: str, key: str) -> str | None:
    for part in notes.split(";"):
        part = part.strip()
        if part.lower().startswith(key + "="):
            return part.split("=", 1)[1].strip()
    return None


def load_rows() -> tuple[list[Row], int]:
    """Report and derivation rows as tokens/s per GPU, and the number skipped (cp > 1, tp/pp
    unknown)."""
    lines = [ln for ln in DATA.read_text().splitlines() if ln and not ln.startswith("#")]
    reader = csv.DictReader(lines, delimiter="\t")
    raw = list(reader)
    out, skipped = [], 0
    seen_tokens = {(r["source"], r["model"], r["gpu"], r["gpus"], r["precision"], r["notes"],
                    r["micro_batch"], r["activation_recompute"], r["seq_len"])
                   for r in raw if r["metric"] == "tokens_per_s_per_gpu"}
    for r in raw:
        metric = r["metric"]
        key = (r["source"], r["model"], r["gpu"], r["gpus"], r["precision"], r["notes"],
               r["micro_batch"], r["activation_recompute"], r["seq_len"])
        if metric == "tflops_per_gpu" and key in seen_tokens:
            continue  # the same configuration's tokens/s is in the table
        if metric not in ("tokens_per_s_per_gpu", "tflops_per_gpu"):
            continue
        tp, pp, dp = _num(r["tp"]), _num(r["pp"]), _num(r["dp"])
        notes = r.get("notes") or ""
        cp = int(_num(_note(notes, "cp") or "1") or 1)
        if r["gpu"] not in GPUS or tp is None or pp is None or cp > 1:
            skipped += 1
            continue
        gpus = int(float(r["gpus"]))
        dp = dp if dp is not None else gpus / (tp * pp)
        if int(tp * pp * dp) != gpus:
            skipped += 1
            continue
        prec = "fp8" if r["precision"].lower().startswith("fp8") else "bf16"
        rc = r["activation_recompute"].lower()
        recompute = "full" if rc.startswith("full") else (
            "selective" if rc.startswith("selective") else "none")
        params, layers, hidden, seq = (float(r["params"]), int(r["layers"]), int(r["hidden"]),
                                       int(r["seq_len"]))
        value = float(r["value"])
        mb = _num(r["micro_batch"])
        accum = None
        if r["source"].startswith("torchtitan") and tp is not None and pp is not None and pp > 1:
            # torchtitan's column is the local batch; a pipeline splits it into micro-batches
            # of ``parallelism.pipeline_parallel_microbatch_size`` (default 1).
            accum, mb = int(mb or 1), 1
        row = Row(source=r["source"], model=r["model"], params=params, layers=layers,
                  hidden=hidden, seq=seq, gpu=r["gpu"], gpus=gpus, tp=int(tp), pp=int(pp),
                  dp=int(dp), micro_batch=int(mb) if mb else 1,
                  global_batch=int(_num(r["global_batch"])) if _num(r["global_batch"]) else None,
                  precision=prec, recompute=recompute, tokens_per_s_per_gpu=value,
                  grad_accum=accum,
                  variant=notes.split(";")[0].replace("+Float8", "").strip(), cp=cp,
                  variant_notes=notes)
        if metric == "tflops_per_gpu":
            row = replace(row, tokens_per_s_per_gpu=value * 1e12 / row.flops_per_token)
        out.append(row)
    return out, skipped


def workload(row: Row) -> Workload:
    """The workload file a user would write for this model (bf16 figures)."""
    s, h, layers = row.seq, row.hidden, row.layers
    act_full = 34.0 * h * layers * s  # bytes per sample, bf16, FlashAttention (no s^2 term)
    stored = 2.0 * h * layers * s + 34.0 * h * s if row.recompute == "full" else act_full
    return Workload(params=int(row.params), flops_per_sample=row.flops_per_token * s,
                    precision="bf16", name=row.model, micro_batch=row.micro_batch,
                    optimizer="adamw", activation_bytes_per_sample=stored,
                    memory_traffic_bytes_per_sample=6.0 * act_full, tokens_per_sample=s,
                    num_layers=layers, hidden_size=h, trainable_params=int(row.params))


def hardware(row: Row):
    spec_name, mem_gb, net, limit_w = GPUS[row.gpu]
    spec = load_gpus()[spec_name]
    hw = hardware_for_gpu(spec, gpus_per_node=8, inter_node_gbps=net)
    clock = power_capped_clock(limit_w, spec.tdp_w)
    return replace(hw, memory_bytes=mem_gb * 1e9,
                   peak_flops_per_s={p: v * clock for p, v in hw.peak_flops_per_s.items()})


def config(row: Row) -> ParallelConfig:
    per_node = min(8, row.gpus)
    accum = row.grad_accum or 1
    if row.grad_accum is None and row.global_batch:
        accum = max(1, round(row.global_batch / (row.dp * row.micro_batch)))
    return ParallelConfig(gpus_per_node=per_node, nodes=max(1, row.gpus // per_node),
                          strategy=row.dp_strategy if row.gpus > 1 else "single",
                          micro_batch=row.micro_batch, grad_accum=accum,
                          precision=row.precision, tp=row.tp, pp=row.pp)


def observation(row: Row) -> Observation:
    c = config(row)
    samples = row.tokens_per_s_per_gpu * row.gpus / row.seq
    kw = dict(gpu=hardware(row).gpu, gpu_count=row.gpus, throughput_samples_per_s=samples,
              nodes=c.nodes, micro_batch=row.micro_batch, strategy=c.strategy,
              precision=row.precision, grad_accum=c.grad_accum)
    if {"tp", "pp"} <= {f.name for f in fields(Observation)}:
        kw.update(tp=row.tp, pp=row.pp)
    return Observation(**kw)


def predict(target: Row, refs: list[Row]):
    """(predicted tokens/s/GPU, low, high, fits) for ``target`` from ``refs``."""
    w = workload(target)
    hw_t = hardware(target)
    hws = {hardware(r).gpu: hardware(r) for r in refs}
    # Several tsv GPU names map to one catalog spec (H100 80/96 GB): keep the target's.
    if hw_t.gpu in hws:
        hws[hw_t.gpu] = replace(hws[hw_t.gpu], memory_bytes=hw_t.memory_bytes)
    pred = fit(w, [observation(r) for r in refs], hws).predict(config(target), hw_t)
    k = target.seq / target.gpus
    return (pred.throughput_samples_per_s * k, pred.low * k, pred.high * k, pred.fits)


def same_shape(a: Row, b: Row) -> bool:
    return (a.layers, a.hidden, a.seq) == (b.layers, b.hidden, b.seq)


def group_key(r: Row, *, gpus=False, mb=False, prec=False, gpu=False):
    key = [r.layers, r.hidden, r.seq, r.recompute, r.tp, r.pp, r.variant]
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


def summarise(name: str, results: list[tuple[float, bool]]) -> str:
    if not results:
        return f"  {name:40s} n=  0  (no pairs in the report set)"
    errs = sorted(e for e, _ in results)
    p90 = errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]
    cover = 100.0 * sum(c for _, c in results) / len(results)
    return (f"  {name:40s} n={len(results):3d} median {statistics.median(errs):6.1f}%  "
            f"p90 {p90:6.1f}%  coverage {cover:5.1f}%")


def main() -> None:
    rows, skipped = load_rows()
    report = [r for r in rows if not r.derivation]
    print(f"LLM training throughput: {len(rows)} usable rows ({len(report)} report, "
          f"{len(rows) - len(report)} derivation set, never scored); {skipped} skipped "
          "(context parallel > 1, tp/pp unknown)")
    lines = []
    for name, pairs in tasks(rows).items():
        res = []
        print(f"\n== Task {name}")
        for target, refs in pairs:
            try:
                got, low, high, _ = predict(target, refs)
            except PerfModelError as exc:
                print(f"  {target.model} {target.gpus}x{target.gpu}: not predicted ({exc})")
                continue
            err = 100.0 * abs(got - target.tokens_per_s_per_gpu) / target.tokens_per_s_per_gpu
            res.append((err, low <= target.tokens_per_s_per_gpu <= high))
            ref = ", ".join(f"{r.gpus}x{r.gpu} {r.precision} mb{r.micro_batch}" for r in refs)
            print(f"  {target.model:14s} {target.gpus:5d}x{target.gpu:25s} {target.precision} "
                  f"tp{target.tp} pp{target.pp} mb{target.micro_batch:<3d} published "
                  f"{target.tokens_per_s_per_gpu:8.0f}  predicted {got:8.0f} "
                  f"({low:.0f}-{high:.0f}) err {err:5.1f}%  from [{ref or 'workload alone'}]")
        lines.append(summarise(name, res))
    infeasible = []
    for r in report:
        try:
            _, _, _, fits = predict(r, [])
        except PerfModelError:
            continue
        if not fits:
            infeasible.append(r)
    print("\nSummary (tokens/s per GPU; " + GOALS + ")")
    for line in lines:
        print(line)
    print(f"  published configurations called infeasible: {len(infeasible)} of {len(report)} "
          "(goal 0; activation estimate = bench workload's Korthikanti figure)")
    for r in infeasible:
        print(f"    {r.source} {r.model} {r.gpus}x{r.gpu} tp{r.tp} pp{r.pp} mb{r.micro_batch} "
              f"{r.recompute}")


if __name__ == "__main__":
    main()
