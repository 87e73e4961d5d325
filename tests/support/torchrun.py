"""What the torchrun tests share: the launch command, the job's environment, reading its run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from support.sqlite_store import sqlite_uri

TIMEOUT_S = 120  # one job on 2 shared CPU cores


def job_env(tmp_path: Path) -> dict:
    """The job's environment: a sqlite store (made here, empty) and a journal folder in
    ``tmp_path``, the job's working directory."""
    uri = sqlite_uri(tmp_path / "mlflow.db", artifact_root=str(tmp_path / "mlruns"))
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": uri,
                "GPUOPT_JOURNAL_DIR": str(tmp_path / "journal"), "PYTHONUNBUFFERED": "1"})
    return env


def torchrun(*args: str) -> list[str]:
    """``torchrun ARGS`` with this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", *args]


def only_run(tmp_path: Path):
    """The one run the job in ``tmp_path`` logged (the test fails on zero or several)."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def history(run_id: str, key: str) -> dict[int, float]:
    """A metric's values by step (the current tracking URI)."""
    from mlflow.tracking import MlflowClient

    return {m.step: m.value for m in MlflowClient().get_metric_history(run_id, key)}
