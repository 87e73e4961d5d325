"""SIGTERM/SIGHUP while tracking, and a forked child leaving the tracked block.

Each case runs a real tracked training process (``_stop_job.py``) on a sqlite MLflow store and
reads the run back: a signal ends it ``KILLED`` with its values and summary and the process
still ends as it would have (killed by the signal, or the previous handler's exit status); a
child forked inside the block leaves the parent's run FINISHED and writes no journal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.wait import wait_until
from support.sqlite_store import sqlite_uri

pytestmark = [pytest.mark.slow, pytest.mark.faults]

JOB = Path(__file__).with_name("_stop_job.py")


def _default_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _start(mode: str, tmp_path: Path) -> tuple[subprocess.Popen, str, Path]:
    uri = sqlite_uri(tmp_path / "mlflow.db")
    out = tmp_path / "run_id"
    env = {**os.environ, "GPUOPT_JOURNAL_DIR": str(tmp_path / "journal"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    # the job starts with SIGHUP's default action even where the test runner ignores it
    # (under nohup, whose SIG_IGN a child inherits and track() rightly leaves alone)
    proc = subprocess.Popen([sys.executable, str(JOB), mode, uri, str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sighup)
    return proc, uri, out


def _wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"job exited {proc.returncode}: {proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, "the job never got going"
        time.sleep(0.1)


def _run(uri: str, run_id: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri).get_run(run_id)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_ends_the_run_killed_with_its_summary_and_the_process_still_dies(tmp_path, sig):
    from mlflow_gpuopt import contract

    proc, uri, out = _start("default", tmp_path)
    _wait_for(out, proc)
    run_id = out.read_text()
    wait_until(lambda: _run(uri, run_id).data.metrics, 60, "the job's first values in MLflow")
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == -sig, err[-2000:]  # the default action still ends the process
    assert took < 5.0 + 5.0, took  # flush_timeout_s and the margin of the summary
    run = _run(uri, run_id)
    assert run.info.status == "KILLED"
    assert run.data.metrics[contract.SUMMARY_STEPS] >= 20  # the summary was logged
    assert not list((tmp_path / "journal").glob("*.jsonl"))  # delivered, nothing left over


def test_sigterm_chains_to_the_handler_that_was_there(tmp_path):
    from mlflow_gpuopt import contract

    proc, uri, out = _start("chained", tmp_path)
    _wait_for(out, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err[-2000:]  # the previous handler ran: its exit status
    assert Path(str(out) + ".chained").read_text() == str(int(signal.SIGTERM))
    run = _run(uri, out.read_text())
    assert run.info.status == "KILLED"
    assert contract.SUMMARY_STEPS in run.data.metrics


def test_forked_child_leaving_the_block_leaves_the_parents_run_alone(tmp_path):
    from mlflow_gpuopt import contract

    proc, uri, out = _start("fork", tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert Path(str(out) + ".child").read_text() == "None"  # the child's tracker did nothing
    assert not list((tmp_path / "journal").glob("*.jsonl")), "the child journaled the run"
    run = _run(uri, out.read_text())
    assert run.info.status == "FINISHED"
    assert run.data.metrics[contract.SUMMARY_STEPS] >= 30  # the parent's own 20 + 10 steps
    assert err.count("forked child process") == 1, err[-3000:]  # said once


def test_handlers_installed_only_from_the_main_thread_and_restored(tmp_path, monkeypatch):
    import mlflow
    import torch

    import mlflow_gpuopt as gpuopt

    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(tmp_path / "journal"))
    mlflow.set_tracking_uri(sqlite_uri(tmp_path / "mlflow.db"))
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[str, object] = {}

    def in_thread() -> None:
        with gpuopt.track(model=model, optimizer=opt, print_summary=False, profile=False):
            seen["inside"] = signal.getsignal(signal.SIGTERM)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join(120)
    assert seen["inside"] == before[signal.SIGTERM]  # not installed off the main thread
    try:
        with gpuopt.track(model=model, optimizer=opt, print_summary=False, profile=False):
            inside = signal.getsignal(signal.SIGTERM)
        assert inside != before[signal.SIGTERM]
        assert {s: signal.getsignal(s) for s in before} == before  # put back at stop
    finally:
        mlflow.set_tracking_uri(None)
