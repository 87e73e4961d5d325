"""How long the recommender takes to search the whole shipped catalog (target: < 0.5 s).

Excludes MLflow's import and the model fit; includes everything ``recommend`` does (every
offer × node count × strategy × micro-batch/accumulation × precision × pricing, costing,
ranking, Pareto set, explanation, scaling curves). Prints one line per workload.

    python benchmarks/bench_recommend.py
"""

from __future__ import annotations

import statistics
import time

from mlflow_gpuopt.catalog import load_catalog
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import Observation, Workload, fit
from mlflow_gpuopt.recommend import Target, recommend

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


def main(repeats: int = 5) -> None:
    cat = load_catalog()

    def hardware_for(spec, offer):
        return hardware_for_gpu(spec, gpus_per_node=offer.gpu_count, offer=offer)

    print(f"catalog: {len(cat.offers)} offers, {len(cat.gpus)} GPU types")
    for name, (workload, observations, target) in WORKLOADS.items():
        hw = {o.gpu: hardware_for_gpu(cat.gpus[o.gpu], gpus_per_node=8) for o in observations}
        predictor = fit(workload, observations, hw)
        times = []
        rec = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            rec = recommend(predictor, workload, cat.offers, cat.gpus, target,
                            hardware_for=hardware_for)
            times.append(time.perf_counter() - t0)
        best = rec.winner or rec.fastest
        print(f"{name}: median {statistics.median(times) * 1e3:.0f} ms, max "
              f"{max(times) * 1e3:.0f} ms over {repeats} runs; {rec.searched} plans "
              f"predicted, {len(rec.candidates)} feasible; "
              f"{'meets deadline' if rec.winner else 'nothing meets the deadline'}: "
              f"{best.offer.provider} {best.offer.instance_type} x {best.nodes} "
              f"{best.config.strategy} {best.hours:.1f} h ${best.cost_usd:,.0f}"
              f" [{'OK' if max(times) < 0.5 else 'SLOWER THAN 0.5 s'}]")


if __name__ == "__main__":
    main()
