"""An inter-process lock file, so two refreshes of one provider never run at once.

``fcntl.flock`` (POSIX) or ``msvcrt.locking`` (Windows) on a lock file (refreshes use
``<cache>/.refresh-<provider>.lock``): the OS drops the lock when the holder exits, even on a
crash, so a stale lock file never blocks anyone. Waiting is bounded; the holder's pid is
written into the file so the error can name it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from mlflow_gpuopt.catalog.errors import RefreshError

try:  # POSIX
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

except ImportError:  # pragma: no cover - Windows
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


class LockTimeoutError(RefreshError):
    """The lock was held by another process for longer than the allowed wait."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f"pid {text}" if text.isdigit() else ""


@contextlib.contextmanager
def exclusive_lock(path: Path, *, timeout_s: float, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block.

    Args:
        path: the lock file.
        timeout_s: longest wait for another holder to let go, seconds (0: try once).
        what: what the lock protects, for the error message (e.g. "aws price refresh").

    Raises:
        LockTimeoutError: still held by another process after ``timeout_s``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        delay = 0.02
        while not _try_lock(fd):
            left = deadline - time.monotonic()
            if left <= 0:
                holder = _holder(path)
                raise LockTimeoutError(
                    f"another {what} is running ({holder + ' holds ' if holder else 'lock '}"
                    f"{path}); gave up after waiting {timeout_s:g} s"
                )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.25)
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            _unlock(fd)
    finally:
        os.close(fd)
