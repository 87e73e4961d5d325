"""Proxy runs: a small model's measured throughput plans a bigger model of its family.

Data: ``benchmarks/data/llm_training_throughput.tsv`` (a copy of
``shared/data/llm_training_throughput.tsv``; its header cites each source and commit). A
*family* is the rows of one source, one GPU, one precision and FP8 recipe, one sequence length
and one software stack (torchtitan's eager / ``torch.compile`` / async-TP variants are kept
apart; each Megatron-Bridge release is its own family). In each family the smallest model is
the proxy: each of its rows is the "proxy measurement", and every bigger model's row is a
target. Rows whose layout is not stated (tp/pp unknown) or that use context parallelism
(cp > 1; ``bench_llm.py`` scores those) are left out, counted.

Each pair goes through what a user runs, in-process through the click entry point:

    mlflow gpuopt predict --workload BIG.json --proxy-workload PROXY.json \\
        --observations PROXY.csv --gpu ... --gpus ... --strategy ... --json

The workload files hold only what a model card or ``config.json`` gives (params, FLOPs per
sample ``(6·N + 12·L·h·s)·s``, layers, hidden, heads, key/value heads, FFN width, MLP kind,
vocabulary, sequence length, SDPA attention, no dropout for Llama) and how the job runs
(precision, FP8 recipe, recomputation, the attention kernel and, with tensor parallelism,
whether its collectives overlap the GEMMs, as ``llm_table`` reads them from the source, the
same as ``bench_llm.py``): never ``memory_traffic_bytes_per_sample`` or another
profile-only key. The observations CSV is the proxy's published tokens/s × GPUs ÷ sequence,
with its layout. Architectures: Llama 2 / 3 from their Hugging Face configs (parameter counts
and shapes, which the issue allows); GPT-3, Nemotron and Megatron-LM's GPT rows give layers,
hidden and heads only (a GELU MLP of 4 × hidden, multi-head attention; vocabulary where the
source states it).

Printed: n, median and p90 |error| of tokens/s per GPU, coverage of the 90 % interval and its
median width (high / low), per source and overall; then two naive baselines on the same pairs:
carrying the proxy's model FLOPs per second per GPU unchanged (= its MFU; same GPU) and
carrying its hardware FLOPs per second (model FLOPs + the recomputed forward: 4/3 for full
recomputation), and the prediction from the target's workload file alone (no proxy) for
reference. Goal: median <= 15 %.

Nothing in the model was set from these pairs: the transfer's width comes from
``uncertainty.TRANSFORMER_MFU_SPREAD`` (bench_llm's derivation set), see
``perfmodel/transfer.py``.

``--diagnose`` adds a what-if that says how much of the transfer's miss is communication
(never the product's settings): the same pairs with the step model's tensor-parallel
collectives and pipeline point-to-point sends taken as free.

Run: ``python benchmarks/bench_proxy.py [-v] [--diagnose]`` (seconds, CPU only; ``-v`` prints
every pair).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from cli_path import run_predict
from llm_table import DATA, attention_kernel, note, num, tp_comm_overlap, tp_overlap
from scores import p90


#: tsv GPU -> (catalog GPU, node network Gbit/s per node): DGX H100/B200 and Grand Teton 8 ×
#: 400 Gbit/s; the A100 cluster 8 × 200 (DGX A100's HCAs; not stated in the source). The
#: H100 96 GB HBM2e / 500 W parts are the catalog's H100 SXM: proxy and target ran on the
#: same part, which the proxy's measured efficiency absorbs.
GPUS = {"H100-SXM-80GB": ("H100-SXM5-80GB", 3200.0),
        "H100-SXM-96GB-HBM2e-500W": ("H100-SXM5-80GB", 3200.0),
        "H100-HBM2e-95GB-lowTDP": ("H100-SXM5-80GB", 3200.0),
        "A100-80GB": ("A100-80GB-SXM4", 1600.0),
        "B200": ("B200-SXM-180GB", 3200.0)}
#: Published Hugging Face configs (meta-llama/Llama-2-*-hf, Meta-Llama-3(.1)-*): keyed by
#: (family prefix, layers, hidden): (heads, kv heads, ffn, vocabulary).
LLAMA = {("llama2", 32, 4096): (32, 32, 11008, 32000),
         ("llama2", 40, 5120): (40, 40, 13824, 32000),
         ("llama2", 80, 8192): (64, 8, 28672, 32000),
         ("llama3", 32, 4096): (32, 8, 14336, 128256),
         ("llama3", 80, 8192): (64, 8, 28672, 128256),
         ("llama3", 126, 16384): (128, 8, 53248, 128256)}


@dataclass(frozen=True)
class Row:
    source: str
    model: str
    params: float
    layers: int
    hidden: int
    seq: int
    vocab: int | None
    gpu: str
    gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    grad_accum: int
    precision: str  # bf16 | fp8
    fp8_recipe: str | None
    recompute: str
    vp: int
    dp_strategy: str
    tokens_per_s_per_gpu: float
    family: tuple
    notes: str

    @property
    def flops_per_token(self) -> float:
        return 6.0 * self.params + 12.0 * self.layers * self.hidden * self.seq

    @property
    def strategy(self) -> str:
        parts = [f"tp{self.tp}"] if self.tp > 1 else []
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
            if self.vp > 1:
                parts.append(f"vp{self.vp}")
        if self.gpus > 1:
            parts.append(self.dp_strategy)
        return "x".join(parts) or "single"

    @property
    def hardware_flops_factor(self) -> float:
        """Hardware ÷ model FLOPs: the forward again under full recomputation."""
        return 4.0 / 3.0 if self.recompute == "full" else 1.0






def _stack(source: str, notes: str) -> tuple:
    """The software variant a row ran: compile, async TP (torchtitan), the release
    (Megatron-Bridge)."""
    low = notes.lower()
    if source == "megatron_bridge_perf_archive":
        return (note(notes, "release"),)
    if source.startswith("torchtitan"):
        compiled = "compile" in low or ("2d+asynctp" in low)
        asynctp = "asynctp" in low.replace(" ", "") or "async tp" in low
        return ("compile" if compiled else "eager", "asynctp" if asynctp else "tp")
    return ()


def _recompute(raw: str, source: str) -> str:
    rc = raw.lower()
    if rc.startswith("full"):
        return "full"
    if rc.startswith("selective") and "layer" not in rc and source.startswith("torchtitan"):
        return "selective-op"  # torchtitan's per-op policy (its llama3 tomls)
    if rc.startswith("selective"):
        return "selective"
    return "none"


def load_rows() -> tuple[list[Row], int]:
    """Usable rows as tokens/s per GPU (a TFLOP/s row only where the same configuration has
    no tokens/s row), and the number left out."""
    lines = [ln for ln in DATA.read_text().splitlines() if ln and not ln.startswith("#")]
    raw = list(csv.DictReader(lines, delimiter="\t"))

    def config_key(r):
        notes = ";".join(p for p in (r["notes"] or "").split(";")
                         if not p.strip().startswith("alt value"))
        return (r["source"], r["model"], r["gpu"], r["gpus"], r["precision"], notes,
                r["micro_batch"], r["activation_recompute"], r["seq_len"])

    with_tokens = {config_key(r) for r in raw if r["metric"] == "tokens_per_s_per_gpu"}
    rows, skipped = [], 0
    for r in raw:
        metric = r["metric"]
        if metric not in ("tokens_per_s_per_gpu", "tflops_per_gpu") or (
                metric == "tflops_per_gpu" and config_key(r) in with_tokens):
            continue
        notes = r["notes"] or ""
        tp, pp = num(r["tp"]), num(r["pp"])
        cp = int(num(note(notes, "cp")) or 1)
        if r["gpu"] not in GPUS or tp is None or pp is None or cp > 1:
            skipped += 1
            continue
        gpus, tp, pp = int(float(r["gpus"])), int(tp), int(pp)
        dp = gpus // (tp * pp)
        source = r["source"]
        prec_raw = r["precision"].lower()
        precision = "fp8" if prec_raw.startswith("fp8") else "bf16"
        recipe = None
        if precision == "fp8":
            recipe = ("rowwise" if "rowwise" in prec_raw else "tensorwise") \
                if source.startswith("torchtitan") else "te"
        mb = int(num(r["micro_batch"]) or 1)
        vp = int(num(note(notes, "vp")) or 1) if pp > 1 else 1
        accum = None
        if source.startswith("torchtitan") and pp > 1:
            # torchtitan splits the local batch into pp × stages-per-rank micro-batches
            # (1 stage for 1F1B, 2 for interleaved: pipeline_llama.py defaults, 2024-12)
            vp = 2 if "interleaved" in notes.lower() else 1
            accum = pp * vp
            mb = max(1, mb // accum)
        ga = num(note(notes, "ga"))
        gbs = num(r["global_batch"])
        if accum is None:
            accum = int(ga) if ga else (max(1, round(gbs / (dp * mb))) if gbs else 1)
        fsdp = note(notes, "fsdp")
        dp_strategy = ("fsdp" if source.startswith("torchtitan")
                       or fsdp not in (None, "NA", "0") else "zero1")
        params, layers, hidden, seq = (float(r["params"]), int(r["layers"]), int(r["hidden"]),
                                       int(r["seq_len"]))
        value = float(r["value"])
        if metric == "tflops_per_gpu":
            value = value * 1e12 / (6.0 * params + 12.0 * layers * hidden * seq)
        family = (source, r["gpu"], prec_raw, seq, _model_family(r["model"]),
                  *_stack(source, notes))
        rows.append(Row(source=source, model=r["model"], params=params, layers=layers,
                        hidden=hidden, seq=seq, vocab=int(num(r["vocab"]) or 0) or None,
                        gpu=r["gpu"], gpus=gpus, tp=tp, pp=pp, dp=dp, micro_batch=mb,
                        grad_accum=accum, precision=precision, fp8_recipe=recipe,
                        recompute=_recompute(r["activation_recompute"], source), vp=vp,
                        dp_strategy=dp_strategy, tokens_per_s_per_gpu=value,
                        family=family, notes=notes))
    return rows, skipped


def _model_family(model: str) -> str:
    """``llama2``, ``llama3``, ``gpt``, ``nemotron``: which published architecture."""
    low = model.lower().replace("_", "").replace("-", "")
    for name in ("llama2", "llama3", "nemotron"):
        if low.startswith(name):
            return name
    return "gpt"


def workload_doc(row: Row) -> dict:
    """The workload file a user writes from the model card: no profile-only key."""
    kind = _model_family(row.model)
    doc = {"name": row.model, "params": int(row.params),
           "flops_per_sample": row.flops_per_token * row.seq, "precision": row.precision,
           "tokens_per_sample": row.seq, "num_layers": row.layers, "hidden_size": row.hidden,
           "optimizer": "adamw", "attention": "sdpa", "recompute": row.recompute}
    if row.fp8_recipe:
        doc["fp8_recipe"] = row.fp8_recipe
    overlap = tp_comm_overlap(row.source, row.notes, row.tp)
    if overlap is not None:
        doc["tp_comm_overlap"] = overlap
    built = tp_overlap(row.source, row.notes, row.tp)
    if built:
        doc["tp_overlap"] = built
    kernel = attention_kernel(row.source)
    if kernel:
        doc["attention_kernel"] = kernel
    arch = LLAMA.get((kind, row.layers, row.hidden))
    if arch is not None:
        heads, kv, ffn, vocab = arch
        if row.source.startswith("torchtitan"):
            kv = heads  # torchtitan expands K/V to every query head before SDPA (repeat_kv)
        doc.update(num_heads=heads, num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab,
                   mlp="swiglu", dropout=0.0)
    else:
        heads = int(note(row.notes, "heads") or max(1, row.hidden // 128))
        doc.update(num_heads=heads, ffn_hidden_size=4 * row.hidden, mlp="gelu")
        if row.vocab:
            doc["vocab_size"] = row.vocab
    return doc


def observations_csv(row: Row) -> str:
    gpu = GPUS[row.gpu][0]
    samples = row.tokens_per_s_per_gpu * row.gpus / row.seq
    nodes = max(1, row.gpus // 8)
    return ("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,precision,"
            "grad_accum,recompute\n"
            f"{gpu},{row.gpus},{nodes},{row.micro_batch},{samples!r},{row.strategy},"
            f"{row.precision},{row.grad_accum},{row.recompute}\n")


def cli_args(target: Row) -> list[str]:
    gpu, net = GPUS[target.gpu]
    return ["--gpu", gpu, "--gpus", str(target.gpus), "--nodes", str(max(1, target.gpus // 8)),
            "--strategy", target.strategy, "--micro-batch", str(target.micro_batch),
            "--grad-accum", str(target.grad_accum), "--precision", target.precision,
            "--recompute", target.recompute, "--inter-node-gbps", str(net), "--json"]




def pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
    """(proxy, target): every row of a family's smallest model × every bigger model's row."""
    families = defaultdict(list)
    for r in rows:
        families[r.family].append(r)
    out = []
    for members in families.values():
        smallest = min(m.params for m in members)
        proxies = [m for m in members if m.params == smallest]
        out += [(p, t) for t in members if t.params > smallest for p in proxies]
    return out


def predict_pair(proxy: Row, target: Row, tmp: Path, workload=workload_doc
                 ) -> tuple[float, float, float, dict]:
    """(tokens/s per GPU, low, high, the JSON) of ``target`` transferred from ``proxy``."""
    big, small, obs = tmp / "big.json", tmp / "proxy.json", tmp / "proxy.csv"
    big.write_text(json.dumps(workload(target)))
    small.write_text(json.dumps(workload(proxy)))
    obs.write_text(observations_csv(proxy))
    doc = run_predict(["--workload", str(big), "--proxy-workload", str(small),
                       "--observations", str(obs), *cli_args(target)])
    k = target.seq / target.gpus
    return doc["throughput_samples_per_s"] * k, doc["low"] * k, doc["high"] * k, doc


def predict_alone(target: Row, tmp: Path) -> float:
    big = tmp / "alone.json"
    big.write_text(json.dumps(workload_doc(target)))
    doc = run_predict(["--workload", str(big), *cli_args(target)])
    return doc["throughput_samples_per_s"] * target.seq / target.gpus


def summary(name: str, res: list[tuple[float, bool | None, float | None]]) -> str:
    if not res:
        return f"  {name:34s} n=  0"
    errs = sorted(e for e, _, _ in res)
    line = (f"  {name:34s} n={len(res):3d}  median {statistics.median(errs):5.1f}%  "
            f"p90 {p90(errs):5.1f}%")
    if res[0][1] is not None:
        cover = 100.0 * sum(bool(c) for _, c, _ in res) / len(res)
        width = statistics.median(w for _, _, w in res)
        line += f"  coverage {cover:5.1f}%  width {width:4.2f}x"
    return line


def err(pred: float, truth: float) -> float:
    return 100.0 * abs(pred - truth) / truth


def score(todo: list[tuple[Row, Row]], workload=None) -> list[tuple[float, bool, float]]:
    """The transfer's (error, covered, width) on ``todo``, quietly (for ``--diagnose``)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as d:
        for proxy, target in todo:
            truth = target.tokens_per_s_per_gpu
            try:
                got, low, high, _ = predict_pair(proxy, target, Path(d),
                                                 workload or workload_doc)
            except RuntimeError as exc:
                print(f"  {proxy.model} -> {target.model}: not predicted ({exc})")
                continue
            out.append((err(got, truth), low <= truth <= high, high / low))
    return out


def diagnose(todo: list[tuple[Row, Row]]) -> None:
    """The what-if of the module docstring: the pairs with TP and PP communication free."""
    from mlflow_gpuopt.perfmodel import comm

    print("\nDiagnosis (what-if, not the product's settings)")
    tp, p2p = comm.tp_allreduce_s, comm.pp_p2p_s
    comm.tp_allreduce_s = comm.pp_p2p_s = lambda *a, **k: 0.0
    try:
        print(summary("TP collectives + PP p2p free", score(todo)))
    finally:
        comm.tp_allreduce_s, comm.pp_p2p_s = tp, p2p


def main() -> None:
    verbose = "-v" in sys.argv[1:]
    rows, skipped = load_rows()
    todo = pairs(rows)
    print(f"Proxy -> target within a family: {len(rows)} usable rows ({skipped} left out: "
          f"tp/pp unknown or context parallel), {len(todo)} pairs")
    ours, mfu, hfu, alone = defaultdict(list), [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as d:
        tmp = Path(d)
        for proxy, target in todo:
            truth = target.tokens_per_s_per_gpu
            try:
                got, low, high, _ = predict_pair(proxy, target, tmp)
                prior = predict_alone(target, tmp)
            except RuntimeError as exc:
                print(f"  {proxy.model} -> {target.model} {target.gpus}x{target.gpu}: not "
                      f"predicted ({exc})")
                continue
            e = err(got, truth)
            ours[proxy.source].append((e, low <= truth <= high, high / low))
            ours["all"].append((e, low <= truth <= high, high / low))
            carried = proxy.tokens_per_s_per_gpu * proxy.flops_per_token / target.flops_per_token
            mfu.append((err(carried, truth), None, None))
            hw = carried * proxy.hardware_flops_factor / target.hardware_flops_factor
            hfu.append((err(hw, truth), None, None))
            alone.append((err(prior, truth), None, None))
            if verbose:
                print(f"  {proxy.source[:22]:22s} {proxy.model:13s} {proxy.gpus:4d}x "
                      f"{proxy.strategy:16s} {proxy.recompute:12s} -> {target.model:13s} "
                      f"{target.gpus:4d}x {target.strategy:16s} {target.recompute:12s} "
                      f"published {truth:7.0f} predicted {got:7.0f} ({low:.0f}-{high:.0f}) "
                      f"err {e:5.1f}%  carry-MFU {err(carried, truth):5.1f}%")
    print("\nTransfer through `mlflow gpuopt predict --proxy-workload` (tokens/s per GPU; "
          "goal median <= 15%)")
    for source in sorted(k for k in ours if k != "all"):
        print(summary(source, ours[source]))
    print(summary("all pairs", ours["all"]))
    print("\nBaselines on the same pairs")
    print(summary("carry MFU (model FLOP/s per GPU)", mfu))
    print(summary("carry HFU (with recomputation)", hfu))
    print(summary("target's workload file alone", alone))
    if "--diagnose" in sys.argv[1:]:
        diagnose(todo)


if __name__ == "__main__":
    import gemm_shape

    with gemm_shape.from_argv():  # --shape-gemm: the shape-dependent GEMM prior
        main()
