"""Shared bits of the examples: tracking URI default, CPU threads, argument parsing."""

from __future__ import annotations

import argparse
import os

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def setup_mlflow(experiment: str = "gpuopt-examples") -> None:
    """Use MLflow's current tracking URI; ``sqlite:///mlflow.db`` when none is set."""
    import mlflow

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(DEFAULT_TRACKING_URI)
    mlflow.set_experiment(experiment)


def base_parser(description: str, steps: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps to train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval", type=float, default=1.0, help="hardware sampling period, s")
    return parser
