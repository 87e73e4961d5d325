"""Warnings that are said once (or once per N occurrences), so a failing metric can't flood logs."""

from __future__ import annotations

import logging
import threading


class WarnOnce:
    """Warn the first time each key fails, then every ``every``-th time (0 = never again)."""

    def __init__(self, logger: logging.Logger, every: int = 0) -> None:
        self._logger = logger
        self._every = every
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str, *args: object) -> None:
        with self._lock:
            n = self._counts.get(key, 0) + 1
            self._counts[key] = n
        if n == 1 or (self._every and n % self._every == 0):
            suffix = f" (x{n})" if n > 1 else ""
            # the caller's message is a %-template: prefix/suffix it, its args stay lazy
            self._logger.warning("gpuopt: " + message + suffix, *args)  # noqa: G003
