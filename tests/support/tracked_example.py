"""One tracked CPU run of ``examples/train_tiny_gpt.py`` for the tests that plan from it.

Training it takes seconds of a shared CI core; the CLI tests that start from such a run (proxy,
recommend document, end to end, the plan loop) share one, each in its own copy of the store
(they log recommendations, jobs and plans into it, and count runs).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support.sqlite_store import sqlite_uri

REPO = Path(__file__).resolve().parents[2]
STEPS = 8


@dataclass(frozen=True)
class TrackedExample:
    """The store the example trained into, its run and what the script printed."""

    db: Path
    run_id: str
    trained: subprocess.CompletedProcess

    def store_in(self, folder: Path) -> str:
        """A copy of the store in ``folder`` (``mlflow.db``), the caller's own; its URI."""
        db = Path(folder) / "mlflow.db"
        with contextlib.closing(sqlite3.connect(self.db)) as src, \
                contextlib.closing(sqlite3.connect(db)) as dst:
            src.backup(dst)
        return f"sqlite:///{db}"


def train_tiny_gpt(folder: Path) -> TrackedExample:
    """Train the example for :data:`STEPS` steps, tracked, into a new store in ``folder`` (its
    working directory), with no plan in its environment."""
    uri = sqlite_uri(folder / "mlflow.db", str(folder / "mlruns"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MLFLOW_TRACKING_URI": uri, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
           "PYTHONPATH": str(REPO), "GPUOPT_JOURNAL_DIR": str(folder / "journal")}
    env.pop("GPUOPT_PLAN", None)
    out = subprocess.run([sys.executable, str(REPO / "examples" / "train_tiny_gpt.py"),
                          "--steps", str(STEPS)], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    import mlflow

    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("gpuopt-examples").experiment_id])
    return TrackedExample(folder / "mlflow.db", run.info.run_id, out)
