"""Fixtures of the MLflow-edge tests."""

from __future__ import annotations

import pytest

from support.mlflow_server import MlflowServer


@pytest.fixture
def server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 with its own store, killed after the test."""
    srv = MlflowServer(tmp_path / "server")
    try:
        yield srv.start()
    finally:
        srv.kill()
