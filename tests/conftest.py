"""Shared fixtures. Keep this small; add fixtures at the end."""

from __future__ import annotations

import json
import os

import pytest
from support.mlflow_state import reset_mlflow_globals

from mlflow_gpuopt.testing import clear_caches

os.environ.setdefault("OMP_NUM_THREADS", "1")  # CI machines have 2 cores, shared


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch):
    """A fresh sqlite MLflow store in ``tmp_path``, set as the current tracking URI (a copy of
    one migrated store: ``support/sqlite_store.py``)."""
    import mlflow
    from support.sqlite_store import sqlite_uri

    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(tmp_path / "journal"))
    mlflow.set_tracking_uri(uri)
    yield uri
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture(autouse=True)
def _isolate_mlflow_globals():
    """Each test leaves MLflow's process-wide state as it found it: no active run, no
    remembered tracking URI or experiment (``support/mlflow_state.py``), and the variables
    below as they were."""
    # (and the progress-bar switch the gpuopt CLI group sets for its own process)
    names = ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_URI",
             "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    saved_env = {k: os.environ.get(k) for k in names}
    yield
    reset_mlflow_globals()
    for key, value in saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def _reset_process_caches():
    """Each test starts without what earlier tests cached process-wide: the loaded catalog,
    the GPU-name tables built from it, and the hardware fingerprint (a test may fake the
    devices or the environment it reads)."""
    clear_caches()
    yield
    clear_caches()


@pytest.fixture
def pricing_env(tmp_path, monkeypatch):
    """Prices read and refreshed in this test's own cache folder, with fake API keys and none
    of the user's price-URL or price-age settings."""
    from support.pricing import FAKE_GCP_KEY, FAKE_LAMBDA_KEY, USER_OVERRIDES

    monkeypatch.setenv("GPUOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUOPT_GCP_API_KEY", FAKE_GCP_KEY)
    monkeypatch.setenv("LAMBDA_API_KEY", FAKE_LAMBDA_KEY)
    for var in USER_OVERRIDES:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def files(request, tmp_path) -> tuple[str, str]:
    """(workload.json, obs.csv) paths, written from the test module's ``WORKLOAD`` dict and
    ``OBS`` CSV text."""
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(request.module.WORKLOAD))
    observations = tmp_path / "obs.csv"
    observations.write_text(request.module.OBS)
    return str(workload), str(observations)


@pytest.fixture(scope="session")
def tiny_gpt_run(tmp_path_factory):
    """examples/train_tiny_gpt.py trained once, tracked, for the tests that plan from such a
    run; each writes to its own copy (``support/tracked_example.py``)."""
    from support.tracked_example import train_tiny_gpt

    return train_tiny_gpt(tmp_path_factory.mktemp("tiny-gpt-run"))
