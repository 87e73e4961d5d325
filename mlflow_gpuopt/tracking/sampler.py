"""The background sampler: a named daemon thread that calls one function every ``interval_s``.

It ticks every interval (the owner takes the start sample itself, synchronously)
(``Event.wait``, so stop is immediate); an exception in a tick is warned about (rate-limited)
and the next tick runs as usual.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from mlflow_gpuopt.tracking._warn import WarnOnce

logger = logging.getLogger(__name__)


class Sampler:
    """Calls ``tick()`` on a thread named ``GpuOptSampler`` until :meth:`stop`."""

    def __init__(self, tick: Callable[[], None], interval_s: float = 1.0,
                 warn: WarnOnce | None = None) -> None:
        self._tick = tick
        self._interval_s = interval_s
        self._warn = warn or WarnOnce(logger, every=100)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="GpuOptSampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._tick()
            except Exception as exc:  # one bad tick must not end sampling
                self._warn("tick", "hardware sampling failed: %s", exc)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop ticking and wait (at most ``timeout_s``) for a tick in progress."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
