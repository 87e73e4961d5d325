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


TORCHRUN_OUT = "gpuopt-plan1-torchrun.sh"
SKYPILOT_OUT = "gpuopt-plan1-skypilot.yaml"


def recommend(run_id: str) -> str | None:
    """Recommend GPUs for training this model on 2B tokens within 24 h, logged to MLflow,
    and write the winner's torchrun launch script; returns the recommendation run's id."""
    import mlflow

    from mlflow_gpuopt.cli import gpuopt

    args = ["--run-id", run_id, "--tokens", "2B", "--deadline", "24h", "--top", "8"]
    print()
    print("$ mlflow gpuopt recommend", " ".join(args), "--emit torchrun --out", TORCHRUN_OUT)
    gpuopt.main(["recommend", *args, "--emit", "torchrun", "--out", TORCHRUN_OUT, "--force"],
                prog_name="mlflow gpuopt", standalone_mode=False)
    recs = mlflow.search_runs(
        experiment_ids=[mlflow.get_run(run_id).info.experiment_id], output_format="list",
        filter_string=f"tags.mlflow.parentRunId = '{run_id}' and "
                      "tags.`gpuopt.kind` = 'recommendation'",
        order_by=["attributes.start_time DESC"], max_results=1)
    return recs[0].info.run_id if recs else None


def emit_skypilot(run_id: str, rec_id: str) -> None:
    """The same plan (by its id) as a SkyPilot task YAML; nothing new is logged."""
    import contextlib
    import io

    import click

    from mlflow_gpuopt.cli import gpuopt

    plan = f"{rec_id}:1"
    print()
    print(f"$ mlflow gpuopt recommend --run-id {run_id} --tokens 2B --deadline 24h --top 8 "
          f"--no-log --emit skypilot --plan {plan} --out {SKYPILOT_OUT}")
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):  # the same table again: show its last lines
            gpuopt.main(["recommend", "--run-id", run_id, "--tokens", "2B", "--deadline", "24h",
                         "--top", "8", "--no-log", "--emit", "skypilot", "--plan", plan,
                         "--out", SKYPILOT_OUT, "--force"], prog_name="mlflow gpuopt",
                        standalone_mode=False)
    except click.ClickException as exc:  # e.g. a Colab winner: not a SkyPilot cloud
        print(f"  (no SkyPilot task: {exc.format_message()})")
        return
    for line in printed.getvalue().splitlines():
        if line.startswith(("Wrote", "Note")):
            print(line)


def show_loop(rec_id: str | None) -> None:
    """Where the launch artefacts are, and the two commands that close the loop."""
    print()
    print("Launch artefacts of the winning plan:")
    for path in (TORCHRUN_OUT, SKYPILOT_OUT):
        if os.path.exists(path):
            print(f"  {os.path.abspath(path)}")
    if rec_id:
        print(f"Run the plan here (CPU stands in for its GPUs):  bash {TORCHRUN_OUT} --steps 30")
        print("then hold its prediction against the measurement:  "
              "mlflow gpuopt accuracy --experiment gpuopt-examples")


def how_to_open() -> None:
    print()
    print("Open it in MLflow's UI:  mlflow ui --backend-store-uri sqlite:///mlflow.db")
    print("  -> experiment 'gpuopt-examples' -> the tiny-gpt run -> its nested "
          "'gpuopt-recommendation' run -> Artifacts -> gpuopt/report.html;")
    print("  select its candidate child runs and press Compare for the scatter and "
          "parallel-coordinates charts.")


def main(argv: list[str] | None = None) -> dict:
    run_id = train_tiny_gpt.main(argv)
    figures = show_run(run_id)
    rec_id = recommend(run_id)
    how_to_open()
    if rec_id:
        emit_skypilot(run_id, rec_id)
    show_loop(rec_id)
    return figures


if __name__ == "__main__":
    main()
