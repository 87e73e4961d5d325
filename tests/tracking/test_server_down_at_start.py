"""A tracking server that is down when training starts, or gone when it ends.

Against a real ``mlflow server`` on 127.0.0.1: ``track()`` starts with nothing listening on
the server's port, trains, and leaves the block; the run exists only in the journal (a run id
minted locally and a "create run" record). The server then starts and ``mlflow gpuopt replay``
creates the run, delivers every value once and sets the run's end status.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.mlflow_server import MlflowServer, TinyTraining

pytestmark = [pytest.mark.slow, pytest.mark.faults]

STEPS = 60


def _replay(path: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).with_name("mlflow")), "gpuopt", "replay", str(path),
           "--timeout", "5", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_server_down_at_start_journals_the_run_and_replay_creates_it(tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt import contract
    from mlflow_gpuopt.tracking.tracker import track

    server = MlflowServer(tmp_path / "server")  # not started: nothing listens on its port
    journal_dir = tmp_path / "journal"
    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(journal_dir))
    mlflow.set_tracking_uri(server.uri)
    training = TinyTraining()
    try:
        with track(training.model, training.opt, interval_s=0.1, flush_timeout_s=1.0,
                   run_name="down-at-start", print_summary=False) as tracker:
            for _ in range(STEPS):
                training.step()
        local_id = tracker.run_id
        assert local_id and len(local_id) == 32
        journals = list(journal_dir.glob("*.jsonl"))
        assert len(journals) == 1, "the run's values were not journaled"
        header = json.loads(journals[0].read_text().splitlines()[0])
        assert header["run_id"] == local_id
        assert header["create_run"]["run_name"] == "down-at-start"
        steps_journaled = {json.loads(line).get("step") for line in
                           journals[0].read_text().splitlines()[1:]
                           if contract.METRIC_STEP_TIME_S in line}
        assert steps_journaled

        server.start()
        done = _replay(journals[0])
        assert done.returncode == 0, done.stderr
        assert not journals[0].exists()
        client = MlflowClient(server.uri)
        runs = client.search_runs(["0"])
        assert len(runs) == 1
        run = runs[0]
        assert run.info.run_name == "down-at-start"
        assert run.info.status == "FINISHED"
        assert run.data.tags[contract.TAG_TRACKED] == "true"
        assert run.data.tags[contract.TAG_LOCAL_RUN_ID] == local_id
        assert contract.PARAM_DEVICE in run.data.params
        hist = client.get_metric_history(run.info.run_id, contract.METRIC_STEP_TIME_S)
        assert {m.step for m in hist} == steps_journaled
        assert len(hist) == len({(m.step, m.timestamp) for m in hist})  # none twice
        arts = [a.path for a in client.list_artifacts(run.info.run_id, "gpuopt")]
        assert contract.PROFILE_ARTIFACT in arts

        again = _replay(journals[0])  # delivered and removed: one line, exit 2
        assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    finally:
        mlflow.set_tracking_uri(None)
        server.kill()


def test_server_frozen_at_exit_close_is_bounded_and_end_status_replayed(tmp_path, monkeypatch):
    """SIGSTOP the server mid-run: leaving the block must not wait on MLflow's retries; the
    journal records the end status and replay sets it."""
    import os
    import signal

    import mlflow
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.tracking.tracker import track

    server = MlflowServer(tmp_path / "server").start()
    journal_dir = tmp_path / "journal"
    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(journal_dir))
    mlflow.set_tracking_uri(server.uri)
    training = TinyTraining()
    frozen = False
    try:
        with track(training.model, training.opt, interval_s=0.1, flush_timeout_s=2.0,
                   print_summary=False) as tracker:
            for _ in range(20):
                training.step()
            os.killpg(server.proc.pid, signal.SIGSTOP)
            frozen = True
            for _ in range(20):
                training.step()
        run_id = tracker.run_id
        journals = list(journal_dir.glob("*.jsonl"))
        assert len(journals) == 1
        lines = [json.loads(x) for x in journals[0].read_text().splitlines()]
        assert {"status": "FINISHED"}.items() <= next(x["end"] for x in lines if "end" in x).items()
        os.killpg(server.proc.pid, signal.SIGCONT)
        frozen = False
        done = _replay(journals[0])
        assert done.returncode == 0, done.stderr
        assert MlflowClient(server.uri).get_run(run_id).info.status == "FINISHED"
    finally:
        if frozen:
            os.killpg(server.proc.pid, signal.SIGCONT)
        mlflow.set_tracking_uri(None)
        server.kill()
