"""``mlflow gpuopt replay`` under faults: a store without the run, two replays at once, a
replay killed mid-send, corrupt journal lines. Never deletes what it did not deliver, never
delivers twice, one line and exit 2 for what the user must fix."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.sqlite_store import sqlite_uri
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.mlflow_io.journal import JournalWriter
from mlflow_gpuopt.mlflow_io.records import JournalRecord

pytestmark = pytest.mark.faults

T0 = 1_700_000_000_000


def _run(uri: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.create_run(client.create_experiment(f"rf-{time.time_ns()}")).info.run_id


def _journal(path: Path, run_id: str, uri: str, steps: int) -> JournalWriter:
    j = JournalWriter(path, {"run_id": run_id, "tracking_uri": uri})
    j.append([JournalRecord("params", {"gpuopt.device": "cpu"}, seq=1)])
    j.append([JournalRecord("metrics", {"loss": 1.0 / (s + 1)}, step=s, ts_ms=T0 + s, seq=2 + s)
              for s in range(steps)])
    return j


def _invoke(*args: str):
    return CliRunner().invoke(gpuopt, ["replay", *args])


def _one_error_line(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output
    return lines[0]


def test_replay_into_a_store_without_the_run_keeps_the_journal(tmp_path):
    """A typo in --tracking-uri: no "Delivered", exit 2, the journal as it was."""
    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    path = tmp_path / "j.jsonl"
    _journal(path, run_id, uri, steps=300).close()
    before = path.read_bytes()
    result = _invoke(str(path), "--tracking-uri", f"sqlite:///{tmp_path}/typo.db")
    assert result.exit_code == 2, result.output
    assert "does not exist" in _one_error_line(result)
    assert path.read_bytes() == before


def test_replay_of_a_deleted_run_keeps_the_journal(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    MlflowClient(uri).delete_run(run_id)
    path = tmp_path / "j.jsonl"
    _journal(path, run_id, uri, steps=10).close()
    result = _invoke(str(path))
    assert result.exit_code == 2, result.output
    _one_error_line(result)
    assert path.exists()


def test_a_second_replay_of_one_journal_refuses(tmp_path):
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.mlflow_io.journal import replay_lock

    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    path = tmp_path / "j.jsonl"
    _journal(path, run_id, uri, steps=50).close()
    with replay_lock(path):
        result = _invoke(str(path))
    assert result.exit_code == 2, result.output
    assert "another replay" in _one_error_line(result)
    assert MlflowClient(uri).get_metric_history(run_id, "loss") == []
    assert _invoke(str(path)).exit_code == 0  # the lock is free again: delivered once
    assert len(MlflowClient(uri).get_metric_history(run_id, "loss")) == 50


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after the raise point runs (no except Exception)."""


def test_replay_killed_mid_send_resumes_without_duplicates(tmp_path, monkeypatch):
    """The file store keeps duplicates: a batch whose send landed before the replay died must
    be read back, not sent blindly again."""
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.mlflow_io import delivery

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file://{tmp_path}/mlruns"
    run_id = _run(uri)
    path = tmp_path / "j.jsonl"
    _journal(path, run_id, uri, steps=2500).close()  # three batches of metrics
    real = delivery.ClientTransport.log_batch
    calls = []

    def dies_after_second_send(self, *args, **kwargs):
        real(self, *args, **kwargs)  # the request lands ...
        calls.append(1)
        if len(calls) == 2:
            raise _Killed  # ... and the process dies before it can ack

    monkeypatch.setattr(delivery.ClientTransport, "log_batch", dies_after_second_send)
    with pytest.raises(_Killed):
        CliRunner().invoke(gpuopt, ["replay", str(path)], catch_exceptions=False)
    monkeypatch.setattr(delivery.ClientTransport, "log_batch", real)
    second = _invoke(str(path))
    assert second.exit_code == 0, second.output
    steps = [m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss")]
    assert sorted(steps) == list(range(2500)), "a step is missing or logged twice"


GOOD = {"seq": 2, "kind": "metrics", "step": 0, "ts": T0, "values": {"loss": 1.0}}
CORRUPT = {
    "ack not a number": {"ack": "12"},
    "ack a float": {"ack": 1.5},
    "uncertain negative": {"uncertain": -1},
    "seq 10^30": {**GOOD, "seq": 10**30},
    "seq a string": {**GOOD, "seq": "2"},
    "values a list": {**GOOD, "values": [1.0]},
    "a value a string": {**GOOD, "values": {"loss": "high"}},
    "missing ts": {k: v for k, v in GOOD.items() if k != "ts"},
    "step 10^30": {**GOOD, "step": 10**30},
    "params not strings": {"seq": 2, "kind": "params", "values": {"a": [1]}},
    "unknown kind": {**GOOD, "kind": "logs"},
    "artifact without file": {"seq": 2, "kind": "dict", "obj": {}},
    "end with a bad status": {"end": {"status": "DONE", "end_time_ms": T0}},
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_journal_line_is_one_line_exit_2_nothing_sent(tmp_path, name):
    from mlflow.tracking import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    path = tmp_path / "j.jsonl"
    j = _journal(path, run_id, uri, steps=0)
    j.close()
    with open(path, "a") as f:
        f.write(json.dumps({**GOOD, "seq": 3, "step": 1}) + "\n")
        f.write(json.dumps(CORRUPT[name]) + "\n")
    before = path.read_bytes()
    result = _invoke(str(path))
    assert result.exit_code == 2, result.output
    assert "line 4" in _one_error_line(result)
    assert path.read_bytes() == before
    client = MlflowClient(uri)
    assert client.get_metric_history(run_id, "loss") == []
    assert client.get_run(run_id).data.params == {}


def test_deeply_nested_line_is_one_line_exit_2(tmp_path):
    path = tmp_path / "j.jsonl"
    JournalWriter(path, {"run_id": "r", "tracking_uri": "sqlite:///x.db"}).close()
    with open(path, "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    result = _invoke(str(path))
    assert result.exit_code == 2, result.output
    _one_error_line(result)
