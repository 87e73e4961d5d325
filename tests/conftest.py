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
