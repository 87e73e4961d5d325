"""Ending a tracked run when the process is told to stop: SIGTERM and SIGHUP.

SLURM (``scancel``, the time limit, preemption), Kubernetes (pod deletion, eviction) and spot
reclaims stop a job with SIGTERM, and a closed terminal with SIGHUP; with Python's default
action the process dies at once and the run stays RUNNING with its last records unsent.
While ``track()`` is active the handler below runs the tracker's stop (run ended ``KILLED``,
what is in memory delivered within ``flush_timeout_s`` or journaled, the summary logged) and
then does what was there before: the previous Python handler is called, or for the default
action the default is restored and the signal raised again, so the process still ends by
that signal (its exit status unchanged). A signal set to be ignored stays ignored and is not
handled. See docs/reliability.md#when-the-job-is-told-to-stop.

The stop runs on its own thread, waited for at most ``wait_s``: the signal may arrive while the
training thread holds a lock the stop needs (a queue's), and the handler must never hang.
Handlers are only installed from the main thread (Python allows no other) and removed at stop
when they are still the ones in place.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Callable

logger = logging.getLogger(__name__)

#: The signals handled while tracking: how schedulers and terminals stop a job.
SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                if s is not None)


class StopOnSignal:
    """Calls ``on_signal(signum)`` (on a helper thread, waited for at most ``wait_s``) when one
    of :data:`SIGNALS` arrives, then ``on_main()`` on the main thread (what is kept per thread,
    such as MLflow's active run), then chains to the handler that was in place."""

    def __init__(self, on_signal: Callable[[int], None], wait_s: float,
                 on_main: Callable[[], None] | None = None) -> None:
        self._on_signal = on_signal
        self._on_main = on_main
        self._wait_s = wait_s
        self._prev: dict[int, Any] = {}

    def install(self) -> bool:
        """Install for every signal not ignored; False (nothing installed) off the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in SIGNALS:
            try:
                prev = signal.getsignal(sig)
                if prev == signal.SIG_IGN:
                    continue
                signal.signal(sig, self._handle)
            except (OSError, ValueError, RuntimeError) as exc:
                logger.debug("gpuopt: cannot handle signal %s: %s", sig, exc)
                continue
            self._prev[sig] = prev
        return bool(self._prev)

    def uninstall(self) -> None:
        """Put the previous handlers back where ours are still in place."""
        if threading.current_thread() is not threading.main_thread():
            return
        prev, self._prev = self._prev, {}
        for sig, handler in prev.items():
            try:
                if signal.getsignal(sig) == self._handle:
                    signal.signal(sig, handler)
            except (OSError, ValueError, RuntimeError) as exc:
                logger.debug("gpuopt: cannot restore the handler of signal %s: %s", sig, exc)

    def _handle(self, signum: int, frame: Any) -> None:
        prev = self._prev.get(signum, signal.SIG_DFL)
        self.uninstall()  # a second signal goes straight to the previous handler
        t = threading.Thread(target=self._run, args=(signum,), name="GpuOptSignalStop",
                             daemon=True)
        t.start()
        t.join(self._wait_s)
        if t.is_alive():
            logger.warning("gpuopt: tracking could not finish within %.0f s of signal %s",
                           self._wait_s, signum)
        elif self._on_main is not None:
            try:
                self._on_main()
            except Exception as exc:
                logger.warning("gpuopt: could not finish tracking at signal %s: %s", signum,
                               exc)
        if callable(prev):
            prev(signum, frame)
            return
        # SIG_DFL, or a handler set outside Python (None): the default action, which for
        # SIGTERM and SIGHUP ends the process with that signal
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _run(self, signum: int) -> None:
        try:
            self._on_signal(signum)
        except Exception as exc:  # never in the way of the process ending
            logger.warning("gpuopt: could not finish tracking at signal %s: %s", signum, exc)
