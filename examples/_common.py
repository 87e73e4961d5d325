"""Shared bits of the examples: tracking URI default, CPU threads, argument parsing."""

from __future__ import annotations

import argparse
import os

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def setup_mlflow(experiment: str = "gpuopt-examples") -> None:
    """Use MLflow's current tracking URI (``sqlite:///mlflow.db`` when none is set) and the
    experiment named by ``MLFLOW_EXPERIMENT_NAME`` (a launch script sets it), else
    ``experiment``."""
    import mlflow

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(DEFAULT_TRACKING_URI)
    mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or experiment)


def plan_int(name: str, default: int) -> int:
    """A positive integer from the launched plan's environment (``GPUOPT_MICRO_BATCH``,
    ``GPUOPT_GRAD_ACCUM``, set by ``mlflow gpuopt recommend --emit``), else ``default``.

    Used as an argparse default, so a flag on the command line still wins.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(f"{name}={raw!r}: expected a positive integer")
    return value


def add_batch_args(parser: argparse.ArgumentParser, micro_batch: int) -> None:
    """``--batch`` (micro-batch per process) and ``--grad-accum`` (micro-batches per optimizer
    step), defaulting to the launched plan's ``GPUOPT_MICRO_BATCH`` / ``GPUOPT_GRAD_ACCUM``."""
    parser.add_argument("--batch", type=int, default=plan_int("GPUOPT_MICRO_BATCH", micro_batch),
                        help="micro-batch per process (default: $GPUOPT_MICRO_BATCH or "
                             f"{micro_batch})")
    parser.add_argument("--grad-accum", type=int, default=plan_int("GPUOPT_GRAD_ACCUM", 1),
                        help="micro-batches per optimizer step (default: $GPUOPT_GRAD_ACCUM "
                             "or 1)")


def base_parser(description: str, steps: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps to train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval", type=float, default=1.0, help="hardware sampling period, s")
    return parser
