"""Secrets under faults: a token-only tracking URI (``http://TOKEN@host``), a password quoted
in an exception that tracking warns about, MLflow's own "View run at URL" print."""

from __future__ import annotations

import json
import logging

import pytest
from support.mlflow_server import MlflowServer, TinyTraining
from support.ports import free_port

pytestmark = pytest.mark.faults

TOKEN = "FAKE-token-only-userinfo-7f3a-not-real"
PASSWORD = "FAKE-uri-password-1b2c-not-real"


def test_token_only_userinfo_is_masked_and_never_journaled(tmp_path):
    from mlflow_gpuopt.mlflow_io.writer import RunWriter
    from mlflow_gpuopt.redact import redact, redact_uri

    uri = f"http://{TOKEN}@127.0.0.1:{free_port()}"  # nothing listens: the journal path
    assert TOKEN not in redact(f"API request to {uri}/api/2.0 failed")
    assert TOKEN not in redact_uri(uri)
    writer = RunWriter("r" * 32, uri, journal_dir=tmp_path, request_timeout_s=0.5,
                       flush_interval_s=0.05)
    writer.log_metrics({"loss": 1.0}, step=0)
    report = writer.close(timeout_s=0.5)
    text = (tmp_path / report.journal_path).read_text()
    assert TOKEN not in text
    header = json.loads(text.splitlines()[0])
    assert header["tracking_uri"].startswith("http://127.0.0.1:")  # stored without userinfo


def test_tracking_warnings_mask_the_uri_password(caplog, monkeypatch):
    import mlflow

    from mlflow_gpuopt.tracking._warn import WarnOnce

    mlflow.set_tracking_uri(f"http://gpuopt:{PASSWORD}@127.0.0.1:9")
    try:
        warn = WarnOnce(logging.getLogger("gpuopt.test"))
        with caplog.at_level(logging.WARNING):
            warn("end", "could not end the MLflow run: %s",
                 RuntimeError(f"API request to http://gpuopt:{PASSWORD}@127.0.0.1:9/x failed"))
            warn("tok", "no MLflow run; measuring without logging: %s",
                 RuntimeError(f"to http://{TOKEN}@127.0.0.1:9/x failed"))
    finally:
        mlflow.set_tracking_uri(None)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "could not end" in text and "measuring without logging" in text
    assert PASSWORD not in text and TOKEN not in text


@pytest.mark.slow
def test_no_view_run_line_with_a_token_uri(tmp_path, capfd, monkeypatch):
    """track() and recommend's MlflowClient calls against a real server, token-only URI:
    nothing printed holds the token."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.redact import no_url_echo
    from mlflow_gpuopt.tracking.tracker import track

    server = MlflowServer(tmp_path / "server").start()
    uri = f"http://{TOKEN}@127.0.0.1:{server.port}"
    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(tmp_path / "journal"))
    mlflow.set_tracking_uri(uri)
    try:
        training = TinyTraining()
        with track(training.model, training.opt, interval_s=0.1, print_summary=True):
            for _ in range(10):
                training.step()
        client = MlflowClient(uri)
        run = client.create_run("0")
        with no_url_echo(uri):  # what recommend's logging runs under
            client.set_terminated(run.info.run_id)
    finally:
        mlflow.set_tracking_uri(None)
        server.kill()
    out, err = capfd.readouterr()
    assert "run " in out  # the summary printed
    assert TOKEN not in out and TOKEN not in err
