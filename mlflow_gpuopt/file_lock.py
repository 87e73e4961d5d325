"""An inter-process lock on a file (``filelock``), held for a ``with`` block.

The OS drops the lock when its holder exits, even on a crash, so a stale lock file never
blocks anyone. Waiting is bounded; the holder writes its pid into the file, so the one line
that a second process gets can name it. Each user has its own lock file and its own error:
a provider's price refresh (:mod:`mlflow_gpuopt.catalog.refreshers`), a journal's replay
(:func:`mlflow_gpuopt.mlflow_io.journal.replay_lock`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import filelock


class LockHeldError(Exception):
    """Another process held the lock for longer than the allowed wait."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f"pid {text}" if text.isdigit() else ""


@contextlib.contextmanager
def exclusive_lock(path: Path, *, timeout_s: float, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block; a
    second open of the same file conflicts, in this process too.

    Args:
        path: the lock file.
        timeout_s: longest wait for another holder to let go, seconds (0: try once).
        what: what the lock protects, for the error message (e.g. "aws price refresh").

    Raises:
        LockHeldError: still held by another holder after ``timeout_s``.
        OSError: the lock file cannot be created.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(path, timeout=max(timeout_s, 0.0))
    try:
        lock.acquire()
    except filelock.Timeout:
        holder = _holder(path)
        raise LockHeldError(
            f"another {what} is running ({holder + ' holds ' if holder else 'lock '}"
            f"{path}); gave up after waiting {timeout_s:g} s"
        ) from None
    try:
        with contextlib.suppress(OSError):  # the pid only names the holder in a message
            path.write_text(f"{os.getpid()}\n", encoding="utf-8")
        yield
    finally:
        lock.release()
