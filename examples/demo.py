"""The README's demo: train the tiny GPT with tracking into MLflow, show what was measured,
then recommend cloud GPUs for a 2B-token run within 24 h (logged to MLflow).

    python examples/demo.py [--steps 30]

Everything shown is read back from the MLflow run (``sqlite:///mlflow.db`` unless
``MLFLOW_TRACKING_URI`` says otherwise), so it is what other tools will see.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_tiny_gpt


def show_run(run_id: str) -> dict:
    """Print the measured figures of ``run_id``; returns them."""
    import mlflow

    run = mlflow.get_run(run_id)
    p, m = run.data.params, run.data.metrics
    figures = {
        "run_id": run_id,
        "device": (f"{p.get('gpuopt.device_count')} x {p.get('gpuopt.device')}"
                   if p.get("gpuopt.device_count") not in (None, "0") else p.get("gpuopt.device")),
        "precision": p.get("gpuopt.precision"),
        "throughput_samples_per_s": m.get("gpuopt/summary/throughput_samples_per_s"),
        "step_time_p50_s": m.get("gpuopt/summary/step_time_p50_s"),
        "step_time_p90_s": m.get("gpuopt/summary/step_time_p90_s"),
        "flops_per_sample": (float(p["gpuopt.flops_per_sample"])
                             if "gpuopt.flops_per_sample" in p else None),
        "params": int(p["gpuopt.params"]) if "gpuopt.params" in p else None,
        "peak_memory_bytes": m.get("gpuopt/summary/peak_memory_bytes"),
    }

    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    print()
    print("Measured by gpuopt.track() (read back from MLflow):")
    print(f"  run id            {run_id}")
    print(f"  tracking URI      {mlflow.get_tracking_uri()}")
    print(f"  device            {figures['device']}  precision {figures['precision']}")
    print(f"  throughput        {fmt(figures['throughput_samples_per_s'], '.1f')} samples/s")
    p50, p90 = figures["step_time_p50_s"], figures["step_time_p90_s"]
    print(f"  step time         p50 {fmt(p50 and p50 * 1e3, '.2f')} ms, "
          f"p90 {fmt(p90 and p90 * 1e3, '.2f')} ms")
    print(f"  FLOPs/sample      {fmt(figures['flops_per_sample'], '.3e')} (forward + backward)")
    print(f"  parameters        {fmt(figures['params'], ',')}")
    peak = figures["peak_memory_bytes"]
    print(f"  peak memory       {fmt(peak and peak / 2**20, '.0f')} MiB")
    return figures


def recommend(run_id: str) -> None:
    """Recommend GPUs for training this model on 2B tokens within 24 h, logged to MLflow."""
    from mlflow_gpuopt.cli import gpuopt

    print()
    print("$ mlflow gpuopt recommend --run-id", run_id, "--tokens 2B --deadline 24h --top 8")
    gpuopt.main(["recommend", "--run-id", run_id, "--tokens", "2B", "--deadline", "24h",
                 "--top", "8"], prog_name="mlflow gpuopt", standalone_mode=False)
    print()
    print("Open it in MLflow's UI:  mlflow ui --backend-store-uri sqlite:///mlflow.db")
    print("  -> experiment 'gpuopt-examples' -> the tiny-gpt run -> its nested "
          "'gpuopt-recommendation' run -> Artifacts -> gpuopt/report.html;")
    print("  select its candidate child runs and press Compare for the scatter and "
          "parallel-coordinates charts.")


def main(argv: list[str] | None = None) -> dict:
    run_id = train_tiny_gpt.main(argv)
    figures = show_run(run_id)
    recommend(run_id)
    return figures


if __name__ == "__main__":
    main()
