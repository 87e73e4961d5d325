"""Did the training thread ever touch the network while it was stepping?

"The step loop never waits on the network" is a property of *which thread* sends requests,
so the tests check that directly instead of timing steps (timings belong in
``benchmarks/bench_writer_outage.py``; a loaded CI machine makes any bound on them flaky).
Every HTTP request MLflow or the writer makes goes through ``requests``'
``HTTPAdapter.send``; :class:`NetWatch` wraps it and records each request the calling thread
made inside :meth:`NetWatch.stepping`.
"""

from __future__ import annotations

import contextlib
import threading

import requests.adapters


class NetWatch:
    """Records requests sent from a thread while that thread is inside ``stepping()``."""

    def __init__(self, monkeypatch) -> None:
        self._local = threading.local()
        self.requests_while_stepping: list[str] = []
        self.requests_elsewhere = 0
        send = requests.adapters.HTTPAdapter.send
        watch = self

        def watched_send(adapter, request, *args, **kwargs):
            if getattr(watch._local, "stepping", False):
                watch.requests_while_stepping.append(f"{request.method} {request.url}")
            else:
                watch.requests_elsewhere += 1
            return send(adapter, request, *args, **kwargs)

        monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", watched_send)

    @contextlib.contextmanager
    def stepping(self):
        self._local.stepping = True
        try:
            yield
        finally:
            self._local.stepping = False
