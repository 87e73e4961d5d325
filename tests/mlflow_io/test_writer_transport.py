"""Exactly-once delivery's failure branches, driven through RunWriter's ``transport=`` seam.

Each transport below is the real :class:`~mlflow_gpuopt.mlflow_io.delivery.ClientTransport`
on a real sqlite MLflow store, failing in one chosen way; the real writer and journal run on
top. The store's metric history is then read back: every value must be there exactly once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from support.sqlite_store import sqlite_uri

from mlflow_gpuopt.mlflow_io import delivery
from mlflow_gpuopt.mlflow_io.journal import read_state
from mlflow_gpuopt.mlflow_io.writer import RunWriter

TS0 = 1_700_000_000_000
N = 300


def _store(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment(f"t-{time.time_ns()}")).info.run_id
    return uri, client, run_id


def _history(client, run_id, key) -> Counter:
    return Counter((m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))


class _Failing(delivery.ClientTransport):
    """The real client transport with a failure schedule on ``log_batch``."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.lock = threading.Lock()
        self.calls = 0
        self.history_calls = 0

    def metric_history(self, run_id, key):
        with self.lock:
            self.history_calls += 1
        return super().metric_history(run_id, key)


class AmbiguousOnce(_Failing):
    """The first metric batches land in the store, then the reply is lost (a timeout after
    the server applied them): the writer cannot tell whether they landed."""

    def __init__(self, uri: str, failures: int) -> None:
        super().__init__(uri)
        self.failures = failures

    def log_batch(self, run_id, metrics, params, tags):
        super().log_batch(run_id, metrics, params, tags)
        with self.lock:
            self.calls += 1
            if metrics and self.failures > 0:
                self.failures -= 1
                raise delivery.DeliveryError("read timed out after the write", ambiguous=True)


class RefusesBadMetric(_Failing):
    """The server refuses (400-like, permanent) any batch holding a metric named ``bad``."""

    def log_batch(self, run_id, metrics, params, tags):
        with self.lock:
            self.calls += 1
        if any(m[0] == "bad" for m in metrics):
            raise delivery.DeliveryError("INVALID_PARAMETER_VALUE: bad", permanent=True)
        super().log_batch(run_id, metrics, params, tags)


class DownThenUp(_Failing):
    """Unreachable (nothing sent) for the first ``down`` calls, then fine."""

    def __init__(self, uri: str, down: int) -> None:
        super().__init__(uri)
        self.down = down

    def log_batch(self, run_id, metrics, params, tags):
        with self.lock:
            self.calls += 1
            failing = self.calls <= self.down
        if failing:
            raise delivery.DeliveryError("connection refused")
        super().log_batch(run_id, metrics, params, tags)


def _log(w: RunWriter, n: int = N) -> None:
    for i in range(n):
        w.log_metrics({"loss": 1.0 / (i + 1)}, step=i, timestamp_ms=TS0 + i)


def test_ambiguous_write_is_verified_not_resent(tmp_path):
    uri, client, run_id = _store(tmp_path)
    transport = AmbiguousOnce(uri, failures=2)
    w = RunWriter(run_id, uri, flush_interval_s=0.02, journal_dir=tmp_path / "j",
                  max_backoff_s=0.05, transport=transport)
    _log(w)  # the first batch lands, its reply is lost
    assert w.flush(timeout_s=60)
    for i in range(N, 2 * N):  # and so does the next one's
        w.log_metrics({"loss": 1.0 / (i + 1)}, step=i, timestamp_ms=TS0 + i)
    w.log_params({"p": "1"})
    report = w.close(timeout_s=60)
    assert transport.failures == 0, "the ambiguous branch was not reached twice"
    assert transport.history_calls >= 2, "the writer re-sent without checking the run first"
    hist = _history(client, run_id, "loss")
    assert hist == Counter({(i, TS0 + i, 1.0 / (i + 1)): 1 for i in range(2 * N)})
    assert report.pending_metrics == 0 and report.journal_path is None
    assert client.get_run(run_id).data.params == {"p": "1"}


def test_ambiguous_write_is_marked_in_the_journal_while_unresolved(tmp_path):
    """While the server stays unreachable after an ambiguous write, the journal says which
    records must be checked before they are sent again."""
    uri, client, run_id = _store(tmp_path)

    class AmbiguousThenDown(_Failing):
        def log_batch(self, run_id, metrics, params, tags):
            with self.lock:
                self.calls += 1
                first = self.calls == 1
            if first:
                super().log_batch(run_id, metrics, params, tags)
                raise delivery.DeliveryError("reply lost", ambiguous=True)
            raise delivery.DeliveryError("connection refused")

        def metric_history(self, run_id, key):  # the check cannot reach the server either
            raise delivery.DeliveryError("connection refused")

    w = RunWriter(run_id, uri, flush_interval_s=0.02, journal_dir=tmp_path / "j",
                  max_backoff_s=0.05, transport=AmbiguousThenDown(uri))
    _log(w)
    report = w.close(timeout_s=1.0)
    assert report.journal_path is not None and report.pending_metrics > 0
    state = read_state(report.journal_path)
    assert state.uncertain_seq > state.acked_seq  # the uncertain records are marked
    assert state.pending_metrics == N  # and every value is still in the journal
    landed = _history(client, run_id, "loss")
    assert landed and all(c == 1 for c in landed.values())


def test_permanent_error_skips_only_the_refused_record(tmp_path, caplog):
    uri, client, run_id = _store(tmp_path)
    transport = RefusesBadMetric(uri)
    w = RunWriter(run_id, uri, flush_interval_s=0.02, journal_dir=tmp_path / "j",
                  max_backoff_s=0.05, transport=transport)
    _log(w, 100)
    w.log_metrics({"bad": 1.0}, step=100, timestamp_ms=TS0 + 100)
    for i in range(101, N):
        w.log_metrics({"loss": 1.0 / (i + 1)}, step=i, timestamp_ms=TS0 + i)
    report = w.close(timeout_s=60)
    hist = _history(client, run_id, "loss")
    assert hist == Counter({(i, TS0 + i, 1.0 / (i + 1)): 1 for i in range(N) if i != 100})
    assert not client.get_metric_history(run_id, "bad")
    assert report.pending_metrics == 0 and report.journal_path is None
    assert any("refused a tracking record" in r.getMessage() for r in caplog.records)


def test_outage_journals_then_delivers_exactly_once(tmp_path):
    uri, client, run_id = _store(tmp_path)
    transport = DownThenUp(uri, down=5)
    w = RunWriter(run_id, uri, flush_interval_s=0.02, journal_dir=tmp_path / "j",
                  max_backoff_s=0.05, transport=transport)
    _log(w)
    deadline = time.monotonic() + 30
    while transport.calls <= transport.down and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list((tmp_path / "j").glob("*.jsonl")), "records were not journaled during the outage"
    report = w.close(timeout_s=60)
    assert _history(client, run_id, "loss") == Counter(
        {(i, TS0 + i, 1.0 / (i + 1)): 1 for i in range(N)})
    assert report.delivered_metrics == N and report.journal_path is None
