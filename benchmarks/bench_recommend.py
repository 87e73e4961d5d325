"""How long ``recommend`` takes: the search over the shipped catalog, and the whole command.

1. Per workload (ResNet-50, a 7B LLM), one whole-catalog search: every offer × node count ×
   strategy × micro-batch/accumulation × precision × pricing, costing, ranking, Pareto set,
   explanation, scaling curves (MLflow's import and the model fit excluded). Goal < 0.5 s
   (the 7B model gets the tensor × pipeline × data-parallel layouts too).
2. The LLM case: a 70B decoder (80 layers, hidden 8192, 64 heads, sequence 4096, vocab
   128256, bf16, AdamW) over the whole catalog, every region, spot and on-demand, tensor ×
   pipeline × data-parallel layouts (ZeRO-1 / FSDP replicas) up to 64 nodes, FP8 where the
   GPU has it (context parallelism is not searched: the perfmodel has no term for it). Prints
   plans considered / predicted / costed and the time of each phase: load (catalog), fit,
   search, explain (scaling curves, charts, HTML report), log (to a temporary sqlite store).
   Goal: search < 1 s. Wall times follow the machine's load; CPU times (in brackets) less so.
3. The whole command against ``mlflow runs describe`` on the same run: a tiny GPT is
   trained for a few steps into a temporary sqlite store (``examples/train_tiny_gpt.py``),
   then ``mlflow gpuopt recommend --run-id …`` with and without ``--no-log`` and
   ``mlflow runs describe --run-id …`` run as subprocesses, interleaved, several times each;
   wall and CPU (user + system) medians and the ratios. Goals: 1.2× with logging, 1.1×
   without. MLflow's own import (~3 s of CPU here) dominates all three.

    python benchmarks/bench_recommend.py [--repeats 5] [--cli-repeats 5] [--no-cli | --cli-only]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow_gpuopt.perfmodel import Observation, Workload
from mlflow_gpuopt.recommend import SearchSpace, Target

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS = {
    "resnet50 (fp16, 25.6M params)": (
        Workload(params=25_557_032, flops_per_sample=3 * 4.1e9 * 2, precision="fp16",
                 name="resnet50", micro_batch=256, optimizer="SGD",
                 optimizer_state_bytes_per_param=4, activation_bytes_per_sample=1.1e8),
        [Observation(gpu="A100-80GB-SXM4", gpu_count=1, throughput_samples_per_s=2470,
                     micro_batch=256, strategy="single", precision="fp16"),
         Observation(gpu="A100-80GB-SXM4", gpu_count=8, throughput_samples_per_s=16621,
                     micro_batch=256, strategy="ddp", precision="fp16")],
        Target(total_samples=90 * 1_281_167, deadline_hours=24.0, per_rank_batch=256,
               description="90 epochs of ImageNet-1k"),
    ),
    "gpt 7B (bf16, 2048 tokens)": (
        Workload(params=7_000_000_000, flops_per_sample=6 * 7e9 * 2048, precision="bf16",
                 name="llm-7b", micro_batch=4, optimizer="AdamW",
                 tokens_per_sample=2048, num_layers=32, hidden_size=4096),
        [Observation(gpu="A100-80GB-SXM4", gpu_count=8, throughput_samples_per_s=6.5,
                     micro_batch=4, strategy="fsdp", precision="bf16")],
        Target(total_samples=2e9 / 2048 * 100, deadline_hours=24 * 14, per_rank_batch=4,
               description="200B tokens"),
    ),
}

_L, _H, _S, _FFN = 80, 8192, 4096, 28672
#: Llama-3-70B-shaped: 80 layers of 4h² attention (GQA ignored: an upper bound) + a SwiGLU
#: MLP of 3·h·28672, embeddings and output head of 128256 × h.
_PARAMS_70B = _L * (4 * _H * _H + 3 * _H * _FFN) + 2 * 128256 * _H
LLM_70B = Workload(
    params=_PARAMS_70B, flops_per_sample=6 * _PARAMS_70B * _S + 12 * _L * _H * _S * _S,
    precision="bf16", name="decoder-70b", micro_batch=1, optimizer="AdamW",
    tokens_per_sample=_S, num_layers=_L, hidden_size=_H, num_heads=64, ffn_hidden_size=_FFN,
    mlp="swiglu", vocab_size=128256, attention="sdpa", dropout=0,
    largest_layer_params=4 * _H * _H + 3 * _H * _FFN)
#: 1T tokens at a global batch of 1024 sequences (4M tokens), within 60 days.
LLM_TARGET = Target(total_samples=1e12 / _S, deadline_hours=24 * 60.0, global_batch=1024,
                    description="1T tokens")


def _hardware_for(spec, offer):
    from mlflow_gpuopt.hardware import hardware_for_gpu

    return hardware_for_gpu(spec, gpus_per_node=offer.gpu_count, offer=offer)


def bench_searches(repeats: int) -> None:
    from mlflow_gpuopt.catalog import load_catalog
    from mlflow_gpuopt.hardware import hardware_for_gpu
    from mlflow_gpuopt.perfmodel import fit
    from mlflow_gpuopt.recommend import recommend

    cat = load_catalog()
    print(f"catalog: {len(cat.offers)} offers, {len(cat.gpus)} GPU types")
    for name, (workload, observations, target) in WORKLOADS.items():
        hw = {o.gpu: hardware_for_gpu(cat.gpus[o.gpu], gpus_per_node=8) for o in observations}
        predictor = fit(workload, observations, hw)
        times, cpu = [], []
        rec = None
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            rec = recommend(predictor, workload, cat.offers, cat.gpus, target,
                            hardware_for=_hardware_for)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        best = rec.winner or rec.fastest
        print(f"{name}: median {statistics.median(times) * 1e3:.0f} ms wall "
              f"({statistics.median(cpu) * 1e3:.0f} ms CPU), max "
              f"{max(times) * 1e3:.0f} ms over {repeats} runs; {rec.searched} plans "
              f"considered, {rec.predicted} predicted, {rec.costed} costed, "
              f"{len(rec.candidates)} listed; "
              f"{'meets deadline' if rec.winner else 'nothing meets the deadline'}: "
              f"{best.offer.provider} {best.offer.instance_type} x {best.nodes} "
              f"{best.config.strategy} {best.hours:.1f} h ${best.cost_usd:,.0f}"
              f" [{'OK' if max(times) < 0.5 else 'SLOWER THAN 0.5 s'}]")


def bench_llm(repeats: int, parent_run_id: str | None) -> None:
    """The 70B case, phase by phase (the catalog is loaded fresh: its per-process cache is
    cleared first)."""
    from mlflow_gpuopt.catalog import clear_catalog_cache, load_catalog
    from mlflow_gpuopt.hardware import hardware_for_gpu
    from mlflow_gpuopt.perfmodel import fit
    from mlflow_gpuopt.recommend import recommend
    from mlflow_gpuopt.recommend.chart_points import scaling_points
    from mlflow_gpuopt.recommend.result import PlanResult
    from mlflow_gpuopt.report.document import recommendation_document

    phases: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def timed(phase, fn):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        phases.setdefault(phase, []).append(time.perf_counter() - t0)
        cpu.setdefault(phase, []).append(time.process_time() - c0)
        return out

    space = SearchSpace(max_nodes=64)
    # One published-shape measurement to fit: torchtitan's Llama 3 70B on 64 H100 (FSDP,
    # bf16), ~2 800 tokens/s/GPU (benchmarks/data/llm_training_throughput.tsv's order).
    obs = [Observation(gpu="H100-SXM5-80GB", gpu_count=64, nodes=8,
                       throughput_samples_per_s=2800 * 64 / _S, micro_batch=1,
                       strategy="fsdp", precision="bf16", recompute="full")]
    rec = None
    for _ in range(repeats):
        clear_catalog_cache()
        cat = timed("load", load_catalog)
        hw = {"H100-SXM5-80GB": hardware_for_gpu(cat.gpus["H100-SXM5-80GB"], gpus_per_node=8,
                                                offer=next(o for o in cat.offers
                                                           if o.gpu == "H100-SXM5-80GB"
                                                           and o.max_nodes > 1))}
        predictor = timed("fit", lambda hw=hw: fit(LLM_70B, obs, hw))
        rec = timed("search", lambda cat=cat, predictor=predictor: recommend(
            predictor, LLM_70B, cat.offers, cat.gpus, LLM_TARGET,
            hardware_for=_hardware_for, space=space, with_scaling=False))

        def explain(rec=rec, cat=cat, predictor=predictor):
            from mlflow_gpuopt.report import pareto_png, render_html, scaling_png

            scaling = scaling_points(predictor, LLM_70B, cat.offers, cat.gpus, _hardware_for,
                                     512, LLM_TARGET.global_batch)
            result = PlanResult(rec, top=20, notes=rec.notes,
                                source_run_ids=(parent_run_id,) if parent_run_id else ())
            doc = recommendation_document(result)
            charts = {"pareto": pareto_png(rec), "scaling": scaling_png(scaling)}
            return result, charts, render_html(doc, charts, title="bench", source="bench")

        result, charts, html = timed("explain", explain)
        if parent_run_id:
            from mlflow_gpuopt.mlflow_io.recommendation import log_recommendation

            timed("log", lambda result=result, charts=charts, html=html: log_recommendation(
                result, charts=charts, report_html=html))
    best = rec.winner or rec.fastest
    search = statistics.median(phases["search"])
    print("\nLLM 70B decoder (bf16, seq 4096, global batch 1024, 1T tokens, 60 days), whole "
          "catalog, every region, spot + on-demand, TP x PP x DP (ZeRO-1/FSDP) up to 64 "
          "nodes, FP8 where the GPU has it:")
    print(f"  {rec.searched} plans considered, {rec.predicted} step times predicted, "
          f"{rec.costed} plans costed, {len(rec.candidates)} listed")
    print(f"  phases, median of {repeats}, wall (CPU) ms: " + ", ".join(
        f"{p} {statistics.median(ts) * 1e3:.0f} ({statistics.median(cpu[p]) * 1e3:.0f})"
        for p, ts in phases.items()))
    print(f"  best: {best.offer.provider} {best.offer.instance_type} x {best.nodes} "
          f"tp{best.config.tp} pp{best.config.pp} {best.config.strategy} "
          f"{best.config.precision} {best.pricing} {best.hours:,.0f} h ${best.cost_usd:,.0f}"
          f"  [search {'OK, under' if search < 1.0 else 'SLOWER THAN'} 1 s wall]")


def _make_run(store: Path, steps: int) -> str:
    """Train the tiny GPT example into a sqlite store in ``store``; its run id."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{store / 'mlflow.db'}",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    subprocess.run([sys.executable, str(ROOT / "examples" / "train_tiny_gpt.py"),
                    "--steps", str(steps)], cwd=store, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("gpuopt-examples")
    return client.search_runs([exp.experiment_id], max_results=1)[0].info.run_id


def _timed_cli(args: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """(wall s, user + system CPU s) of one subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_cli(store: Path, run_id: str, repeats: int) -> None:
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{store / 'mlflow.db'}")
    mlflow = [sys.executable, "-m", "mlflow"]
    commands = {
        "mlflow runs describe": [*mlflow, "runs", "describe", "--run-id", run_id],
        "recommend --no-log": [*mlflow, "gpuopt", "recommend", "--run-id", run_id,
                               "--steps", "100000", "--no-log"],
        "recommend (logs)": [*mlflow, "gpuopt", "recommend", "--run-id", run_id,
                             "--steps", "100000"],
    }
    for args in commands.values():  # warm the page cache and the catalog's byte code
        _timed_cli(args, store, env)
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
    for _ in range(repeats):
        for name, args in commands.items():  # interleaved: load changes hit all alike
            results[name].append(_timed_cli(args, store, env))
    wall = {k: statistics.median(w for w, _ in v) for k, v in results.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in results.items()}
    base = "mlflow runs describe"
    print(f"\nWhole process on the tiny-GPT run {run_id[:8]} (sqlite store), median of "
          f"{repeats}, interleaved:")
    print(f"  {'command':<24}{'wall s':>8}{'CPU s':>8}{'wall ratio':>12}{'CPU ratio':>11}")
    for name in commands:
        print(f"  {name:<24}{wall[name]:>8.2f}{cpu[name]:>8.2f}"
              f"{wall[name] / wall[base]:>11.2f}x{cpu[name] / cpu[base]:>10.2f}x")
    for name, goal in (("recommend --no-log", 1.1), ("recommend (logs)", 1.2)):
        ratio = cpu[name] / cpu[base]
        print(f"  {name}: {ratio:.2f}x describe's CPU (goal {goal}x) "
              f"[{'OK' if ratio <= goal else 'OVER'}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="searches per workload")
    parser.add_argument("--cli-repeats", type=int, default=5, help="runs of each command")
    parser.add_argument("--train-steps", type=int, default=20, help="tiny GPT steps")
    parser.add_argument("--no-cli", action="store_true", help="skip the whole-command part")
    parser.add_argument("--cli-only", action="store_true",
                        help="only the whole-command part (part 3)")
    args = parser.parse_args()
    if args.no_cli and args.cli_only:
        parser.error("give --no-cli or --cli-only, not both")
    if not args.cli_only:
        bench_searches(args.repeats)
    with tempfile.TemporaryDirectory(prefix="bench-recommend-") as tmp:
        store = Path(tmp)
        run_id = None
        if not args.no_cli:
            run_id = _make_run(store, args.train_steps)
            os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
        if not args.cli_only:
            bench_llm(args.repeats, run_id)
        if run_id:
            bench_cli(store, run_id, args.cli_repeats)


if __name__ == "__main__":
    main()
