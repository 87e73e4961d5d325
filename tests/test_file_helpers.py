"""The package's two file helpers: the atomic write and the inter-process lock."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mlflow_gpuopt.atomic_write import write_atomically
from mlflow_gpuopt.file_lock import LockHeldError, exclusive_lock
from mlflow_gpuopt.mlflow_io.journal import JournalBusyError, JournalError, lock_path, replay_lock


def test_write_replaces_keeps_the_mode_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "a.csv"
    write_atomically(path, "one\n")
    assert path.read_text() == "one\n"
    os.chmod(path, 0o640)
    write_atomically(path, "two\n")
    assert path.read_text() == "two\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in path.parent.iterdir()] == ["a.csv"]


def test_without_replace_an_existing_file_stays_and_the_temporary_goes(tmp_path):
    path = tmp_path / "a.sh"
    path.write_text("mine\n")
    with pytest.raises(FileExistsError):
        write_atomically(path, "new\n", mode=0o755, replace=False)
    assert path.read_text() == "mine\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.sh"]
    other = tmp_path / "b.sh"
    write_atomically(other, "new\n", mode=0o755, replace=False)
    assert other.read_text() == "new\n" and stat.S_IMODE(other.stat().st_mode) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sh", "b.sh"]


def test_a_directory_in_the_way_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    with pytest.raises(OSError, match="not a regular file"):
        write_atomically(folder, "text")
    assert folder.is_dir() and list(tmp_path.iterdir()) == [folder]


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "a.csv"
    path.write_text("old\n")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, "new\n")
    assert path.read_text() == "old\n"
    assert list(tmp_path.iterdir()) == [path]


_HOLDER = """
import sys
from pathlib import Path
from mlflow_gpuopt.file_lock import exclusive_lock
with exclusive_lock(Path(sys.argv[1]), timeout_s=0, what="holder"):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_lock_held_by_another_process_names_it_and_goes_with_it(tmp_path):
    path = tmp_path / "x.lock"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with (pytest.raises(LockHeldError,
                            match=rf"another test is running \(pid {holder.pid} holds"),
              exclusive_lock(path, timeout_s=0.2, what="test")):
            pass
    finally:
        holder.kill()  # no release: the OS drops the lock with the process
        holder.wait(timeout=30)
    with exclusive_lock(path, timeout_s=5, what="test"):
        assert path.read_text().strip() == str(os.getpid())


def test_the_journal_has_its_own_lock(tmp_path):
    journal = tmp_path / "j.jsonl"
    journal.write_text("")
    assert lock_path(journal) == tmp_path / "j.jsonl.lock"
    with replay_lock(journal):
        assert lock_path(journal).is_file()
        with (pytest.raises(JournalBusyError,
                            match=r"another replay of .*j\.jsonl is running \(pid \d+ holds"),
              replay_lock(journal)):
            pass
    with replay_lock(journal):
        pass
    assert issubclass(JournalBusyError, JournalError)
