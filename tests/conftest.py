"""Shared fixtures. Keep this small; add fixtures at the end."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # CI machines have 2 cores, shared


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch):
    """A fresh sqlite MLflow store in ``tmp_path``, set as the current tracking URI."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(tmp_path / "journal"))
    mlflow.set_tracking_uri(uri)
    yield uri
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture(autouse=True)
def _forget_mlflow_experiment():
    """Each test starts with no active experiment.

    ``mlflow.set_experiment`` remembers an experiment id process-wide (and in the
    ``MLFLOW_EXPERIMENT_ID`` environment variable); the next test's fresh store has no such
    id, so ``start_run`` would fail there.
    """
    saved = {k: os.environ.get(k) for k in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")}
    yield
    import sys

    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is not None:
        while fluent.active_run() is not None:
            fluent.end_run()
        fluent._active_experiment_id = None
