"""``mlflow gpuopt replay PATH``: deliver a journal exactly once, refuse bad input cleanly."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.mlflow_server import MlflowServer, TinyTraining
from support.sqlite_store import sqlite_uri
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.mlflow_io.journal import JournalWriter
from mlflow_gpuopt.mlflow_io.records import JournalRecord


def _run(uri: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.create_run(client.create_experiment(f"replay-{time.time_ns()}")).info.run_id


def _journal(path: Path, run_id: str, uri: str, steps: int, t0: int = 1_700_000_000_000):
    j = JournalWriter(path, {"run_id": run_id, "tracking_uri": uri})
    j.append([JournalRecord("params", {"gpuopt.device": "cpu"}, seq=1)])
    j.append([JournalRecord("metrics", {"loss": 1.0 / (s + 1)}, step=s, ts_ms=t0 + s, seq=2 + s)
              for s in range(steps)])
    j.append([JournalRecord("dict", file="gpuopt/profile.json",
                            obj={"schema": "gpuopt.workload/1", "params": 10}, seq=2 + steps)])
    return j


def _invoke(*args: str):
    return CliRunner().invoke(gpuopt, ["replay", *args])


def test_replay_delivers_in_order_once_and_removes_journal(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    path = tmp_path / "j.jsonl"
    j = _journal(path, run_id, uri, steps=2500)
    j.ack(101)  # records 1..101 (params and steps 0..99) were delivered before
    j.close()
    result = _invoke(str(path))
    assert result.exit_code == 0, result.output
    assert not path.exists()
    client = MlflowClient(uri)
    hist = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in hist) == list(range(100, 2500))
    assert all(m.timestamp == 1_700_000_000_000 + m.step for m in hist)
    assert client.get_run(run_id).data.params == {}  # acked: not sent again
    assert [a.path for a in client.list_artifacts(run_id, "gpuopt")] == ["gpuopt/profile.json"]


def test_uncertain_batch_is_checked_so_nothing_is_logged_twice(tmp_path, monkeypatch):
    """A file store keeps duplicates; records that may have landed are checked first."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file://{tmp_path}/mlruns"
    run_id = _run(uri)
    client = MlflowClient(uri)
    t0 = 1_700_000_000_000
    # a send of steps 0..49 reached the store but the response was lost
    client.log_batch(run_id, metrics=[Metric("loss", 1.0 / (s + 1), t0 + s, s) for s in range(50)])
    path = tmp_path / "j.jsonl"
    j = _journal(path, run_id, uri, steps=200)
    j.mark_uncertain(51)
    j.close()
    result = _invoke(str(path))
    assert result.exit_code == 0, result.output
    steps = [m.step for m in client.get_metric_history(run_id, "loss")]
    assert sorted(steps) == list(range(200)), "a step is missing or logged twice"


@pytest.mark.parametrize("content", [
    None,  # no such file
    b"",  # empty
    b'{"not": "a journal"}\n',
    b'{"journal": "gpuopt.journal/1", "run_id": "r"}\n{"seq": 1, "kind": "metrics"\n',
    b'{"journal": "gpuopt.journal/1", "run_id": "r"}\nnot json at all\n{"ack": 1}\n',
])
def test_bad_path_or_corrupt_journal_is_one_line_exit_2(tmp_path, content):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_bytes(content)
    result = _invoke(str(path), "--tracking-uri", f"sqlite:///{tmp_path}/x.db")
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output
    assert "Traceback" not in result.output
    if content is not None:
        assert path.read_bytes() == content  # left as it was


def test_torn_last_line_is_ignored(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    path = tmp_path / "j.jsonl"
    _journal(path, run_id, uri, steps=10).close()
    with open(path, "a") as f:
        f.write('{"seq": 99, "kind": "metr')  # the writer was killed mid-line
    result = _invoke(str(path))
    assert result.exit_code == 0, result.output
    assert len(MlflowClient(uri).get_metric_history(run_id, "loss")) == 10


@pytest.mark.slow
def test_close_while_server_down_then_replay(tmp_path, caplog):
    """close() with the server gone leaves the journal and one warning; replay delivers it."""
    import logging

    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.mlflow_io.writer import RunWriter

    server = MlflowServer(tmp_path / "server")
    try:
        server.start()
        run_id = _run(server.uri)
        writer = RunWriter(run_id, server.uri, flush_interval_s=0.05, request_timeout_s=2.0,
                           journal_dir=tmp_path / "journal", max_backoff_s=0.2)
        training = TinyTraining()
        expected = {}
        for i in range(200):
            ts = int(time.time() * 1000)
            loss = training.step()
            writer.log_metrics({"loss": loss}, step=i, timestamp_ms=ts)
            expected[i] = (ts, loss)
        assert writer.flush(20)
        server.kill()
        for i in range(200, 500):
            ts = int(time.time() * 1000)
            loss = training.step()
            writer.log_metrics({"loss": loss}, step=i, timestamp_ms=ts)
            expected[i] = (ts, loss)
        writer.log_params({"gpuopt.micro_batch": 256})
        writer.log_dict({"schema": "gpuopt.workload/1", "params": 8321}, "gpuopt/profile.json")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            t0 = time.monotonic()
            report = writer.close(timeout_s=1.0)
            assert time.monotonic() - t0 < 5
        assert report.pending_metrics == 300 and report.delivered_metrics == 200
        path = Path(report.journal_path)
        assert path.is_file() and path.parent == tmp_path / "journal"
        replay_hints = [r.getMessage() for r in caplog.records if "replay" in r.getMessage()]
        assert replay_hints == [replay_hints[0]]
        assert f"mlflow gpuopt replay {path}" in replay_hints[0]

        # still down: exit 1, one line, journal untouched
        before = path.read_bytes()
        cmd = [str(Path(sys.executable).with_name("mlflow")), "gpuopt", "replay", str(path),
               "--timeout", "2"]
        down = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert down.returncode == 1, down.stderr
        assert len(down.stderr.strip().splitlines()) == 1, down.stderr
        assert path.read_bytes() == before

        server.start()
        up = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr
        assert not path.exists()
        client = MlflowClient(server.uri)
        got = {m.step: (m.timestamp, m.value) for m in client.get_metric_history(run_id, "loss")}
        assert len(client.get_metric_history(run_id, "loss")) == 500
        assert got == {s: (ts, pytest.approx(v)) for s, (ts, v) in expected.items()}
        assert client.get_run(run_id).data.params == {"gpuopt.micro_batch": "256"}
        assert [a.path for a in client.list_artifacts(run_id, "gpuopt")] == ["gpuopt/profile.json"]

        again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    finally:
        server.kill()


def test_journal_lines_in_any_key_order_replay_and_records_round_trip(tmp_path):
    """The journal is JSON lines: a reader takes the keys in any order (here the order of a
    writer that numbers a record after building it), and a record written by
    ``JournalRecord.to_json`` reads back as the same record."""
    import json

    from mlflow.tracking import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    run_id = _run(uri)
    path = tmp_path / "j.jsonl"
    lines = [{"journal": "gpuopt.journal/1", "run_id": run_id, "tracking_uri": uri},
             {"kind": "params", "values": {"gpuopt.device": "cpu"}, "seq": 1},
             {"kind": "metrics", "step": 0, "ts": 1_700_000_000_000, "values": {"loss": 2.5},
              "seq": 2},
             {"kind": "metrics", "step": 1, "ts": 1_700_000_000_001, "values": {"loss": 1.5},
              "seq": 3},
             {"ack": 1},
             {"kind": "dict", "file": "gpuopt/profile.json", "obj": {"params": 10}, "seq": 4}]
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    for obj in lines[1:4] + lines[5:]:
        rec = JournalRecord.from_json(obj)
        assert rec.to_json() == obj and JournalRecord.from_json(rec.to_json()) == rec
    result = _invoke(str(path))
    assert result.exit_code == 0, result.output
    client = MlflowClient(uri)
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.timestamp, m.value) for m in history] == [
        (0, 1_700_000_000_000, 2.5), (1, 1_700_000_000_001, 1.5)]
    assert client.get_run(run_id).data.params == {}  # acked: delivered before, not again
    assert not path.exists()
