"""Published LLM training configurations that ran, through ``mlflow gpuopt predict``: how many
the memory model calls infeasible (``p_fits`` < 0.5). Goal: 0.

Data: ``benchmarks/data/llm_training_throughput.tsv`` (torchtitan, NVIDIA NeMo /
Megatron-Bridge, Megatron-LM's 2024 H100 table; the header cites each source). Every row ran,
so every one should be predicted to fit. All rows are used, derivation and report set alike:
no memory constant was set from them.

Each configuration becomes the workload file a user writes from the model's card or
``config.json`` (nothing measured): params, FLOPs per sample (6·N·T, the throughput does not
matter here), layers, hidden size, sequence length, vocabulary where the table gives it, and
the architecture the model family publishes (``FAMILIES``: Llama 2 / 3 heads, key/value heads,
SwiGLU FFN width, no dropout); other models get heads from the notes (or hidden / 128), a
GELU MLP of 4 × hidden and unknown dropout. bf16 (or FP8) with AdamW, SDPA attention, the
recomputation the source states (torchtitan's "selective" is its per-op policy; not stated:
Megatron's default, selective). The layout is the source's tp × pp × dp with FSDP for
torchtitan and Megatron-FSDP rows and ZeRO-1 (Megatron's distributed optimizer) otherwise,
the interleaved schedule's virtual stages from the notes; a micro-batch the table does not
give is 1; torchtitan's pipelines split the local batch into pp × stages-per-rank
micro-batches (``pipeline_llama.py``, 2024-12). Context-parallel rows (the notes' cp) run as
``cpN`` in the layout (docs/models.md#context-parallelism), torchtitan's with its all-gather
exchange (``cp_exchange``).

GPUs: the catalog's H100-SXM5-80GB, A100-80GB-SXM4 and B200. torchtitan's Grand Teton H100s
have 96 GB (95 GB on the 2024-08 page): the prediction is made on the 80 GB part and its
``p_fits`` re-evaluated from the CLI's median and spread (``memory_per_gpu_bytes``,
``memory_sigma_bytes``) against the usable memory of the card the row ran on.

Run: ``python benchmarks/bench_memory.py`` (about a minute, CPU only).
"""

from __future__ import annotations

import csv
import json
import math
import sys
import tempfile
from pathlib import Path

from llm_table import DATA, note, num

from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel.memory import usable_memory_bytes


#: tsv GPU -> (catalog GPU, the memory it ran with, GB)
GPUS = {"H100-SXM-80GB": ("H100-SXM5-80GB", 80),
        "H100-SXM-96GB-HBM2e-500W": ("H100-SXM5-80GB", 96),
        "H100-HBM2e-95GB-lowTDP": ("H100-SXM5-80GB", 95),
        "A100-80GB": ("A100-80GB-SXM4", 80), "B200": ("B200-SXM-180GB", 180)}
#: Published architectures by (family, layers, hidden): heads, key/value heads, FFN width,
#: vocabulary (Meta's Llama 2 / Llama 3 ``config.json``: SwiGLU, no dropout).
FAMILIES = {
    ("llama2", 32, 4096): (32, 32, 11008, 32000), ("llama2", 40, 5120): (40, 40, 13824, 32000),
    ("llama2", 80, 8192): (64, 8, 28672, 32000), ("llama3", 32, 4096): (32, 8, 14336, 128256),
    ("llama3", 80, 8192): (64, 8, 28672, 128256), ("llama3", 126, 16384): (128, 8, 53248, 128256),
}






def _family(model: str) -> str | None:
    m = model.lower().replace("_", "").replace("-", "").replace(".", "")
    if m.startswith("llama2"):
        return "llama2"
    if m.startswith("llama3"):
        return "llama3"
    return None


def configurations() -> tuple[list[dict], int]:
    """One dict per distinct published configuration, and how many were skipped."""
    lines = [ln for ln in DATA.read_text().splitlines() if ln and not ln.startswith("#")]
    out, seen, skipped = [], set(), 0
    for r in csv.DictReader(lines, delimiter="\t"):
        notes = r["notes"] or ""
        tp, pp = num(r["tp"]), num(r["pp"])
        cp = int(num(note(notes, "cp")) or 1)
        if r["gpu"] not in GPUS or tp is None or pp is None:
            skipped += 1
            continue
        clean = ";".join(p for p in notes.split(";") if not p.strip().startswith("alt value"))
        key = (r["source"], r["model"], r["gpu"], r["gpus"], r["tp"], r["pp"],
               r["micro_batch"], r["precision"], r["activation_recompute"], r["seq_len"], clean)
        if key in seen:
            continue
        seen.add(key)
        out.append({**r, "notes": notes, "tp": int(tp), "pp": int(pp), "cp": cp})
    return out, skipped


def workload(r: dict) -> dict:
    """The workload file a user writes for this model (module docstring)."""
    layers, hidden, seq = int(r["layers"]), int(r["hidden"]), int(r["seq_len"])
    params = float(r["params"])
    w = {"name": r["model"], "params": params, "flops_per_sample": 6.0 * params * seq,
         "precision": "bf16", "optimizer": "adamw", "attention": "sdpa",
         "num_layers": layers, "hidden_size": hidden, "tokens_per_sample": seq}
    if r.get("cp", 1) > 1 and r["source"].startswith("torchtitan"):
        w["cp_exchange"] = "allgather"  # torchtitan's default rotate method
    fam = FAMILIES.get((_family(r["model"]) or "", layers, hidden))
    if fam is not None:
        heads, kv, ffn, vocab = fam
        w.update(num_heads=heads, num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab,
                 mlp="swiglu", dropout=0)
    else:
        w.update(num_heads=int(num(note(r["notes"], "heads")) or max(1, hidden // 128)),
                 mlp="gelu")
        if num(r["vocab"]):
            w["vocab_size"] = int(float(r["vocab"]))
    return w


def recompute(r: dict) -> str:
    rc = (r["activation_recompute"] or "").lower()
    if rc.startswith("full"):
        return "full"
    if rc.startswith("selective") and "layer" not in rc and r["source"].startswith("torchtitan"):
        return "selective-op"
    if rc.startswith("none"):
        return "none"
    return "selective"  # stated selective, or not stated: Megatron's default


def cli_args(r: dict, path: str) -> list[str]:
    gpus, tp, pp = int(float(r["gpus"])), r["tp"], r["pp"]
    notes = r["notes"]
    fsdp = r["source"].startswith("torchtitan") or note(notes, "fsdp") not in (None, "NA", "0")
    cp = r.get("cp", 1)
    dp = gpus // (tp * pp * cp)  # replicas; with cp the ranks sharing weights are dp x cp
    dp_strategy = ("fsdp" if fsdp else "zero1") if dp * cp > 1 else "ddp"
    parts = ([f"tp{tp}"] if tp > 1 else []) + ([f"pp{pp}"] if pp > 1 else []) + [dp_strategy]
    parts += [f"cp{cp}"] if cp > 1 else []
    mb = int(num(r["micro_batch"]) or 1)
    accum = None
    vp = int(num(note(notes, "vp")) or 1) if pp > 1 else 1
    if r["source"].startswith("torchtitan") and pp > 1:
        vp = 2 if "interleaved" in notes.lower() else 1
        accum = pp * vp
        mb = max(1, mb // accum)
    gb = num(r["global_batch"])
    if accum is None:
        accum = max(1, round(gb / (dp * mb))) if gb else 1
    args = ["predict", "--workload", path, "--gpu", GPUS[r["gpu"]][0], "--gpus", str(gpus),
            "--nodes", str(max(1, gpus // 8)), "--strategy", "x".join(parts),
            "--micro-batch", str(mb), "--grad-accum", str(accum), "--recompute", recompute(r),
            "--json"]
    if r["precision"].lower().startswith("fp8"):
        args += ["--precision", "fp8"]
    if vp > 1:
        args += ["--virtual-stages", str(vp)]
    return args


def p_fits_on(out: dict, gb: float, gpu: str) -> tuple[float, float]:
    """(p_fits, share of the usable memory) on the card the row ran on."""
    usable = usable_memory_bytes(gpu, gb * 1e9)
    sigma, total = out["memory_sigma_bytes"], out["memory_per_gpu_bytes"]
    p = 0.5 * (1 + math.erf((usable - total) / (sigma * math.sqrt(2)))) if sigma > 0 else \
        float(total <= usable)
    return p, total / usable


def main() -> int:
    rows, skipped = configurations()
    runner = CliRunner()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, r in enumerate(rows):
            path = str(Path(tmp) / f"w{i}.json")
            Path(path).write_text(json.dumps(workload(r)))
            res = runner.invoke(gpuopt, cli_args(r, path), catch_exceptions=False)
            if res.exit_code != 0:
                print(f"  not predicted: {r['model']} {r['gpus']}x{r['gpu']}: "
                      f"{res.output.strip()}")
                continue
            out = json.loads(res.stdout)
            gpu, gb = GPUS[r["gpu"]]
            p, share = p_fits_on(out, gb, gpu)
            results.append((r, out, p, share))
    print(f"Published LLM configurations through `mlflow gpuopt predict` ({DATA.name}): "
          f"{len(results)} distinct, {skipped} rows skipped (tp/pp unknown)")
    print(f"  {'source':28s} {'model':15s} {'GPUs':>11s}  layout                mb  recompute  "
          f"predicted GB  of usable  p_fits")
    for r, out, p, share in sorted(results, key=lambda x: -x[3]):
        gb = GPUS[r["gpu"]][1]
        print(f"  {r['source'][:28]:28s} {r['model'][:15]:15s} {r['gpus']:>5s}x{gb:<3d}GB "
              f" {out['strategy'][:20]:20s} {out['micro_batch']:3d}  {out['recompute']:12s}"
              f"{out['memory_per_gpu_bytes'] / 1e9:8.1f}  {share:8.0%}  {p:6.2f}")
    bad = [x for x in results if x[2] < 0.5]
    shares = sorted(x[3] for x in results)
    print(f"\nSummary: {len(bad)} of {len(results)} published configurations with p_fits < 0.5 "
          f"(goal 0); predicted peak as a share of usable memory: median "
          f"{shares[len(shares) // 2]:.0%}, max {shares[-1]:.0%}; lowest p_fits "
          f"{min(x[2] for x in results):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
