"""The disk fills up while the writer journals an outage (a real ``mlflow server``, a real
16 KiB tmpfs when the test runs as root, else a journal whose writes fail with ENOSPC past
16 KiB). Nothing may be lost silently: records the disk refuses are held in memory and
delivered when the server is back; what can't be kept anywhere is counted and said."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest
from support.mlflow_server import TinyTraining
from support.wait import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.faults]

DISK_BYTES = 16 * 1024
#: the tmpfs's files: enough for the journals, few enough for :func:`_fill` to take them all
DISK_INODES = 64
#: the simulated disks' byte counts (no tmpfs: not root), by mount directory
_SIMULATED: dict[Path, list[int]] = {}


@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """A directory whose filesystem holds only DISK_BYTES."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},nr_inodes={DISK_INODES}", "tmpfs",
         str(mount)],
        capture_output=True).returncode == 0
    if not mounted:  # simulate: the journal's writes fail once the "disk" is full
        from mlflow_gpuopt.mlflow_io import journal

        used = _SIMULATED.setdefault(mount, [0])
        real_write = os.write

        def write(fd, data):
            try:  # only the small disk's files fill it
                on_disk = os.readlink(f"/proc/self/fd/{fd}").startswith(str(mount))
            except OSError:
                on_disk = True
            if not on_disk:
                return real_write(fd, data)
            if used[0] + len(data) > DISK_BYTES:
                raise OSError(errno.ENOSPC, "No space left on device")
            used[0] += len(data)
            return real_write(fd, data)

        class _Os:
            def __getattr__(self, name):
                return write if name == "write" else getattr(os, name)

        monkeypatch.setattr(journal, "os", _Os())
    try:
        yield mount
    finally:
        _SIMULATED.pop(mount, None)
        if mounted:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(mount: Path) -> None:
    """Take what room the disk still has: the writer's last refused write may have been
    larger than what was left, and a replay's own small writes must find the disk full.

    On the tmpfs its files too: tmpfs charges whole pages, so a small append still fits in
    the slack of the journal's own last page whatever the filler took (a replay's progress
    mark did, in one CI run in ten or so); with no file left to create, the replay's lock
    file beside the journal is refused, before anything is sent."""
    if mount in _SIMULATED:
        _SIMULATED[mount][0] = DISK_BYTES
        return
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for chunk in (4096, 512, 1):
            for _ in range(DISK_BYTES // chunk + 1):
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    for i in range(DISK_INODES + 1):
        try:
            os.close(os.open(mount / f"inode-{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            break
    else:
        raise AssertionError(f"{mount} took {DISK_INODES + 1} files: not the small tmpfs")


def _run(uri: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.create_run(client.create_experiment(f"disk-{time.time_ns()}")).info.run_id


def _log(writer, training, steps) -> None:
    for i in steps:
        loss = training.step()
        writer.log_metrics({"loss": loss, "lr": 0.01}, step=i)


def _outage(server, full_disk, writer, training, caplog) -> None:
    _log(writer, training, range(0, 50))
    assert writer.flush(timeout_s=30)
    server.kill()
    _log(writer, training, range(50, 450))
    writer.log_dict({"schema": "gpuopt.workload/1", "params": 8321}, "gpuopt/profile.json")
    # the disk fills while the server is gone: the writer says it cannot write its journal
    wait_until(lambda: any("cannot" in r.getMessage() and "tracking journal" in r.getMessage()
                           for r in caplog.records), what="the journal's full disk")


def test_disk_full_during_outage_then_server_back_loses_nothing(server, full_disk, caplog):
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.mlflow_io.writer import RunWriter

    run_id = _run(server.uri)
    writer = RunWriter(run_id, server.uri, flush_interval_s=0.05, journal_dir=full_disk,
                       request_timeout_s=1.0, max_backoff_s=0.2, max_memory_records=20)
    training = TinyTraining()
    with caplog.at_level(logging.WARNING):
        _outage(server, full_disk, writer, training, caplog)
        server.start()
        _log(writer, training, range(450, 500))
        report = writer.close(timeout_s=60)
    client = MlflowClient(server.uri)
    steps = [m.step for m in client.get_metric_history(run_id, "loss")]
    assert sorted(steps) == list(range(500)), "a value was lost or logged twice"
    assert [a.path for a in client.list_artifacts(run_id, "gpuopt")] == ["gpuopt/profile.json"]
    assert report.lost_metrics == 0 and report.pending_metrics == 0
    assert not any("lost" in r.getMessage() for r in caplog.records)


def test_disk_full_and_server_gone_at_exit_says_truthfully_what_was_lost(
        server, full_disk, caplog, tmp_path):
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.mlflow_io.writer import RunWriter

    run_id = _run(server.uri)
    writer = RunWriter(run_id, server.uri, flush_interval_s=0.05, journal_dir=full_disk,
                       request_timeout_s=1.0, max_backoff_s=0.2, max_memory_records=20)
    training = TinyTraining()
    with caplog.at_level(logging.WARNING):
        _outage(server, full_disk, writer, training, caplog)
        report = writer.close(timeout_s=1.0)
    produced = 2 * 450
    assert report.delivered_metrics + report.pending_metrics + report.lost_metrics == produced
    assert report.lost_metrics > 0  # the disk really was full
    said = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(said) == 1 and f"{report.lost_metrics} metric values" in said[0]
    assert not any("are kept" in r.getMessage() and "lost" not in r.getMessage()
                   and str(produced - report.delivered_metrics) in r.getMessage()
                   for r in caplog.records)
    # what the journal kept is really there: replay delivers exactly that
    journal = Path(report.journal_path)
    server.start()
    from click.testing import CliRunner

    from mlflow_gpuopt.cli import gpuopt

    _fill(full_disk)
    before = journal.read_bytes()
    with contextlib.chdir(tmp_path):
        still_full = CliRunner().invoke(gpuopt, ["replay", str(journal)])
    assert still_full.exit_code == 1 and len(still_full.output.strip().splitlines()) == 1, \
        still_full.output
    assert journal.read_bytes() == before
    freed = tmp_path / journal.name  # space freed: the journal on a disk with room
    freed.write_bytes(before)
    with contextlib.chdir(tmp_path):
        result = CliRunner().invoke(gpuopt, ["replay", str(freed)])
    assert result.exit_code == 0, result.output
    values = 2 * len(MlflowClient(server.uri).get_metric_history(run_id, "loss"))
    assert values == report.delivered_metrics + report.pending_metrics
