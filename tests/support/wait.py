"""Waiting on a condition with a deadline, instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout_s: float = 30.0, what: str = "") -> None:
    """Return once ``condition()`` is true; fail the test if ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s: {what}"
        time.sleep(0.02)
