"""A real tracking server dies mid-training and comes back: nothing lost, nothing twice.

Each test starts ``mlflow server`` (sqlite store, served artifacts) on 127.0.0.1, trains a
small real MLP, SIGKILLs the server mid-run, keeps training, restarts the server on the same
store and port, and checks the run.
"""

from __future__ import annotations

import time

import pytest
from support.mlflow_server import TinyTraining
from support.net_watch import NetWatch

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def _new_run(uri: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment(f"outage-{time.time_ns()}")
    return client.create_run(exp).info.run_id


def _train(training: TinyTraining, writer, steps: range, expected: dict, net: NetWatch) -> None:
    for i in steps:
        with net.stepping():
            loss = training.step()
            ts = int(time.time() * 1000)
            writer.log_metrics({"loss": loss, "lr": 0.01}, step=i, timestamp_ms=ts)
        expected[i] = (ts, loss)


def test_server_killed_mid_run_every_step_delivered_once(server, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.mlflow_io.writer import RunWriter

    journal_dir = tmp_path / "journal"
    run_id = _new_run(server.uri)
    writer = RunWriter(run_id, server.uri, flush_interval_s=0.05, journal_dir=journal_dir,
                       request_timeout_s=2.0, max_backoff_s=0.5, max_memory_records=500)
    training = TinyTraining()
    expected: dict[int, tuple[int, float]] = {}
    net = NetWatch(monkeypatch)
    _train(training, writer, range(0, 300), expected, net)
    writer.log_params({"gpuopt.device": "cpu"})
    assert writer.flush(timeout_s=20)

    server.kill()
    step = 300
    _train(training, writer, range(step, step + 300), expected, net)
    step += 300
    # the writer noticed and keeps what it can't send on disk
    deadline = time.monotonic() + 10
    while not list(journal_dir.glob("*.jsonl")) and time.monotonic() < deadline:
        _train(training, writer, range(step, step + 1), expected, net)
        step += 1
    assert list(journal_dir.glob("*.jsonl")), "no journal while the server was down"
    writer.log_dict({"note": "logged during the outage"}, "gpuopt/outage.json")

    server.launch()  # restart on the same store and port while training goes on
    while not server.healthy():
        _train(training, writer, range(step, step + 20), expected, net)
        step += 20
        assert step < 200_000, "server did not come back"
    _train(training, writer, range(step, step + 300), expected, net)
    step += 300

    report = writer.close(timeout_s=30)
    assert report.pending_metrics == 0 and report.journal_path is None
    assert report.delivered_metrics == 2 * step
    assert not list(journal_dir.glob("*.jsonl")), "journal not removed after full delivery"

    client = MlflowClient(server.uri)
    history = client.get_metric_history(run_id, "loss")
    assert len(history) == step, f"{len(history)} loss values for {step} steps"
    got = {m.step: (m.timestamp, m.value) for m in history}
    assert sorted(got) == list(range(step))  # every step exactly once
    for s, (ts, loss) in expected.items():
        assert got[s][0] == ts and got[s][1] == pytest.approx(loss, rel=1e-12), s
    assert len(client.get_metric_history(run_id, "lr")) == step
    run = client.get_run(run_id)
    assert run.data.params["gpuopt.device"] == "cpu"
    assert [a.path for a in client.list_artifacts(run_id, "gpuopt")] == ["gpuopt/outage.json"]

    # The step loop never waited on the network: every request (hundreds of them, failed
    # ones included) was sent from the writer's thread, none from inside a training step.
    assert net.requests_while_stepping == []
    assert net.requests_elsewhere > 10


def test_track_against_server_that_goes_away(server, tmp_path, monkeypatch):
    """The same outage under ``gpuopt.track()`` (its RunWriter logs at the sampling interval)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    import mlflow_gpuopt as gpuopt

    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(tmp_path / "journal"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    mlflow.set_tracking_uri(server.uri)
    mlflow.set_experiment(f"track-outage-{time.time_ns()}")
    training = TinyTraining()
    net = NetWatch(monkeypatch)
    steps_before = steps_during = 0
    try:
        with gpuopt.track(model=training.model, optimizer=training.opt, interval_s=0.1,
                          print_summary=False, profile=False) as tracker:
            t_end = time.monotonic() + 1.0
            while time.monotonic() < t_end:
                with net.stepping():
                    training.step()
                steps_before += 1
            server.kill()
            kill_ms = int(time.time() * 1000)
            t_end = time.monotonic() + 1.5
            while time.monotonic() < t_end:
                with net.stepping():
                    training.step()
                steps_during += 1
            server.launch()
            while not server.healthy():
                with net.stepping():
                    training.step()
                steps_during += 1
            back_ms = int(time.time() * 1000)
            for _ in range(200):
                with net.stepping():
                    training.step()
    finally:
        mlflow.set_tracking_uri(None)
    run_id = tracker.run_id
    assert run_id
    client = MlflowClient(server.uri)
    history = client.get_metric_history(run_id, "gpuopt/step_time_s")
    keys = [(m.step, m.timestamp) for m in history]
    assert len(keys) == len(set(keys)), "a step_time value was logged twice"
    outage = [m for m in history if kill_ms < m.timestamp < back_ms]
    assert len(outage) >= 5, "values sampled while the server was down were not delivered"
    assert max(m.step for m in history) >= steps_before + steps_during
    run = client.get_run(run_id)
    assert "gpuopt/summary/step_time_p50_s" in run.data.metrics
    assert run.info.status == "FINISHED"
    assert not list((tmp_path / "journal").glob("*.jsonl"))
    # the tracker's hooks ran inside every step; none of them sent a request
    assert net.requests_while_stepping == []
    assert net.requests_elsewhere > 10
