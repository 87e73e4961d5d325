"""Something that answers but is not MLflow, in front of a real ``mlflow server``.

A threaded proxy on 127.0.0.1 (``tests/support/bad_proxy.py``) sits between the writer and a real
server and, on demand, answers ``200 text/html`` "Please sign in", ``302 -> /login``, or drips
the server's answer one byte a second. Mid-run and at start, every value must end up in the run
exactly once (delivered when the proxy behaves again, or journaled and delivered by
``replay``), one warning must name the cause, and nothing may wait past its bound.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.bad_proxy import BadProxy
from support.mlflow_server import TinyTraining
from support.wait import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults]

TS0 = 1_700_000_000_000


@pytest.fixture
def proxy(server):
    p = BadProxy(server.port).start()
    try:
        yield p
    finally:
        p.stop()


def _new_run(uri: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment(f"proxy-{time.time_ns()}")
    return client.create_run(exp).info.run_id


def _steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _log(writer, steps: range) -> None:
    for i in steps:
        writer.log_metrics({"loss": 1.0 / (i + 1)}, step=i, timestamp_ms=TS0 + i)


@pytest.mark.parametrize("mode, cause", [("html", "HTML page"), ("redirect", "redirect")])
def test_login_proxy_mid_run_loses_nothing_and_says_why_once(server, proxy, tmp_path, caplog,
                                                             mode, cause):
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.mlflow_io.writer import RunWriter

    run_id = _new_run(server.uri)
    journal_dir = tmp_path / "journal"
    caplog.set_level(logging.WARNING, logger="mlflow_gpuopt")
    writer = RunWriter(run_id, proxy.uri, flush_interval_s=0.05, journal_dir=journal_dir,
                       request_timeout_s=2.0, max_backoff_s=0.2)
    _log(writer, range(0, 100))
    assert writer.flush(timeout_s=20)

    proxy.mode = mode  # the session expired: every request gets the login page now
    _log(writer, range(100, 200))
    wait_until(lambda: list(journal_dir.glob("*.jsonl")))  # not counted as delivered: journaled
    assert not writer.flush(timeout_s=1.0)
    wait_until(lambda: proxy.requests[mode] >= 3)  # retried, and each retry answered by the proxy

    proxy.mode = "pass"  # signed in again
    _log(writer, range(200, 300))
    report = writer.close(timeout_s=30)
    assert report.pending_metrics == 0 and report.journal_path is None
    client = MlflowClient(server.uri)
    assert _steps(client, run_id, "loss") == list(range(300))  # each step exactly once

    said = [r.getMessage() for r in caplog.records if cause in r.getMessage()]
    assert len(said) == 1, said
    assert "login proxy?" in said[0]


def test_html_at_start_is_journaled_and_replay_delivers(server, proxy, tmp_path, monkeypatch,
                                                        caplog):
    """``track()`` starting behind a login page: the run is journaled (not tracking dropped),
    and ``replay`` through the same proxy, once signed in, creates it with every value."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt import contract
    from mlflow_gpuopt.tracking.tracker import track

    journal_dir = tmp_path / "journal"
    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(journal_dir))
    mlflow.set_tracking_uri(proxy.uri)
    exp_name = f"html-start-{time.time_ns()}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", exp_name)
    proxy.mode = "html"
    caplog.set_level(logging.WARNING, logger="mlflow_gpuopt")
    training = TinyTraining()
    steps = 0
    try:
        with track(training.model, training.opt, interval_s=0.05, flush_timeout_s=1.0,
                   print_summary=False, profile=False) as tracker:
            for _ in range(40):
                training.step()
                steps += 1
            time.sleep(0.2)  # a few sampling intervals of a real run (40 steps take ms)
    finally:
        mlflow.set_tracking_uri(None)
    assert proxy.forwarded == 0  # the server itself never saw a request
    journals = list(journal_dir.glob("*.jsonl"))
    assert len(journals) == 1, "tracking was dropped instead of journaled"
    header = json.loads(journals[0].read_text().splitlines()[0])
    assert header["run_id"] == tracker.run_id and "create_run" in header

    proxy.mode = "pass"
    done = subprocess.run([str(Path(sys.executable).with_name("mlflow")), "gpuopt", "replay",
                           str(journals[0]), "--tracking-uri", proxy.uri, "--timeout", "10"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name(exp_name)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags[contract.TAG_LOCAL_RUN_ID] == tracker.run_id
    history = client.get_metric_history(run.info.run_id, contract.SUMMARY_STEPS)
    assert max(m.value for m in history) == steps


@pytest.mark.parametrize("mode", ["drip_status", "drip_body"])
def test_drip_at_start_holds_track_at_most_its_bound(server, proxy, tmp_path, monkeypatch, mode):
    """A server that drips its answer one byte a second: ``track()`` leaves start within
    START_TIMEOUT_S (the bound for the whole start), and the run is created once."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt import contract
    from mlflow_gpuopt.mlflow_io.run_binding import START_TIMEOUT_S
    from mlflow_gpuopt.tracking.tracker import Tracker

    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(tmp_path / "journal"))
    exp_name = f"drip-{time.time_ns()}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", exp_name)
    MlflowClient(server.uri).create_experiment(exp_name)
    mlflow.set_tracking_uri(proxy.uri)
    proxy.mode = mode
    training = TinyTraining()
    try:
        tracker = Tracker(training.model, training.opt, interval_s=0.1, flush_timeout_s=10.0,
                          print_summary=False, profile=False)
        t0 = time.monotonic()
        tracker.start()
        start_s = time.monotonic() - t0
        proxy.mode = "pass"
        for _ in range(30):
            training.step()
        tracker.stop()
    finally:
        mlflow.set_tracking_uri(None)
    # the bound, plus what start does besides the request (hooks, the first sample)
    assert start_s < START_TIMEOUT_S + 1.0, start_s
    client = MlflowClient(server.uri)
    runs = client.search_runs([client.get_experiment_by_name(exp_name).experiment_id])
    wait_until(lambda: client.search_runs(
        [client.get_experiment_by_name(exp_name).experiment_id]) != [], 5)
    runs = client.search_runs([client.get_experiment_by_name(exp_name).experiment_id])
    assert len(runs) == 1, "the dripped create and the writer's made two runs"
    run = runs[0]
    assert run.info.run_id == tracker.run_id
    steps = client.get_metric_history(run.info.run_id, contract.SUMMARY_STEPS)
    assert max(m.value for m in steps) == 30


def test_drip_mid_run_close_is_bounded_and_nothing_lost(server, proxy, tmp_path):
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.mlflow_io.writer import RunWriter

    run_id = _new_run(server.uri)
    journal_dir = tmp_path / "journal"
    writer = RunWriter(run_id, proxy.uri, flush_interval_s=0.05, journal_dir=journal_dir,
                       request_timeout_s=1.0, max_backoff_s=0.2)
    _log(writer, range(0, 50))
    assert writer.flush(timeout_s=20)
    proxy.mode = "drip_body"
    _log(writer, range(50, 100))
    t0 = time.monotonic()
    report = writer.close(timeout_s=3.0, end_status="FINISHED")
    assert time.monotonic() - t0 < 3.0 + 0.5
    assert report.journal_path is not None and report.pending_metrics > 0

    proxy.mode = "pass"
    done = subprocess.run([str(Path(sys.executable).with_name("mlflow")), "gpuopt", "replay",
                           report.journal_path, "--tracking-uri", server.uri, "--timeout", "10"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(server.uri)
    assert _steps(client, run_id, "loss") == list(range(100))
    assert client.get_run(run_id).info.status == "FINISHED"
