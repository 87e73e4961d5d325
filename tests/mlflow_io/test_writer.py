"""RunWriter: delivers to a real store; with MLflow unreachable it never blocks, stays bounded
in memory and keeps every record in its journal."""

from __future__ import annotations

import time

import pytest
from support.ports import free_port
from support.net_watch import NetWatch
from support.sqlite_store import sqlite_uri

from mlflow_gpuopt.mlflow_io.journal import iter_pending, read_state
from mlflow_gpuopt.mlflow_io.writer import RunWriter


def _run(uri: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.create_run(client.create_experiment(f"w-{time.time_ns()}")).info.run_id


def test_delivers_metrics_params_tags_and_artifacts(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("LAMBDA_API_KEY", "FAKE-lambda-key-not-real-123")
    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    w = RunWriter(run_id, uri, flush_interval_s=0.02, journal_dir=tmp_path / "j")
    for i in range(1500):
        w.log_metrics({"loss": 1.0 / (i + 1), "step_time_s": 0.01}, step=i,
                      timestamp_ms=1_700_000_000_000 + i)
    w.log_params({"gpuopt.device": "cpu", "provider_api_key": "abc-def-ghi"})
    w.set_tags({"gpuopt.note": "key FAKE-lambda-key-not-real-123 here"})
    w.log_dict({"schema": "gpuopt.workload/1", "params": 1234}, "gpuopt/profile.json")
    assert w.flush(timeout_s=30)
    report = w.close()
    assert report.delivered_metrics == 3000 and report.pending_metrics == 0
    assert report.journal_path is None and not (tmp_path / "j").exists()
    client = MlflowClient(uri)
    hist = client.get_metric_history(run_id, "loss")
    assert sorted((m.step, m.timestamp) for m in hist) == \
        [(i, 1_700_000_000_000 + i) for i in range(1500)]
    run = client.get_run(run_id)
    assert run.data.params == {"gpuopt.device": "cpu", "provider_api_key": "***"}
    assert run.data.tags["gpuopt.note"] == "key *** here"
    assert [a.path for a in client.list_artifacts(run_id, "gpuopt")] == ["gpuopt/profile.json"]


def test_unreachable_server_never_blocks_bounded_memory_all_journaled(tmp_path, monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    w = RunWriter("0123456789abcdef", uri, flush_interval_s=0.02, journal_dir=tmp_path,
                  max_memory_records=1000, max_queue=20_000, request_timeout_s=1.0)
    net = NetWatch(monkeypatch)
    peak_memory_records = 0
    n = 20_000
    start = time.perf_counter()
    for i in range(n):
        while time.perf_counter() < start + i * 1e-4:  # a fast job: 10,000 steps/s
            pass
        with net.stepping():
            w.log_metrics({"loss": float(i)}, step=i, timestamp_ms=1_000 + i)
        if i % 500 == 0:
            peak_memory_records = max(peak_memory_records, w.records_in_memory)
    w.log_params({"gpuopt.device": "cpu"})
    report = w.close(timeout_s=0.5)
    # log_metrics never sends: every (failed) request came from the writer's thread
    assert net.requests_while_stepping == [] and net.requests_elsewhere > 0
    assert w.dropped_records == 0
    assert peak_memory_records <= 1000 + 1000  # the bound plus one pump batch
    assert report.delivered_metrics == 0 and report.pending_metrics == n
    state = read_state(report.journal_path)
    assert state.run_id == "0123456789abcdef" and state.pending_metrics == n
    steps = [r.step for r in iter_pending(state) if r.kind == "metrics"]
    assert steps == list(range(n))  # in order, each once
    assert state.header["tracking_uri"] == uri


@pytest.mark.slow  # each refused write waits out sqlite's busy timeout (~20 s)
def test_journal_removed_when_caught_up_after_outage(tmp_path):
    """A sqlite store locked by another connection refuses writes; the writer waits it out."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    lock = sqlite3.connect(tmp_path / "mlflow.db", timeout=0)
    lock.execute("BEGIN EXCLUSIVE")  # the store refuses every write while this is held
    try:
        w = RunWriter(run_id, uri, flush_interval_s=0.02, journal_dir=tmp_path / "j",
                      max_backoff_s=0.2)
        for i in range(300):
            w.log_metrics({"loss": float(i)}, step=i)
        deadline = time.monotonic() + 60
        while not list((tmp_path / "j").glob("*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list((tmp_path / "j").glob("*.jsonl")), "records were not journaled"
    finally:
        lock.rollback()
        lock.close()
    for i in range(300, 400):
        w.log_metrics({"loss": float(i)}, step=i)
    report = w.close(timeout_s=60)
    assert report.pending_metrics == 0 and report.journal_path is None
    assert not list((tmp_path / "j").glob("*.jsonl"))
    steps = sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss"))
    assert steps == list(range(400))
