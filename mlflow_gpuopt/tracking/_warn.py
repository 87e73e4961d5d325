"""Warnings that are said once (or once per N occurrences), so a failing metric can't flood logs."""

from __future__ import annotations

import logging
import threading


def _uri_secrets() -> list[str]:
    """The password or token of MLflow's tracking URI (it need not be in the environment)."""
    try:
        from mlflow_gpuopt.mlflow_io.run_binding import tracking_uri_secrets

        return tracking_uri_secrets()
    except Exception:
        return []


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
            from mlflow_gpuopt.redact import redact

            suffix = f" (x{n})" if n > 1 else ""
            try:
                text = "gpuopt: " + message + suffix
                text = text % args if args else text
            except (TypeError, ValueError):
                text = "gpuopt: " + message + suffix + " " + " ".join(map(str, args))
            # an exception message may quote the tracking URI with its password: mask it
            self._logger.warning("%s", redact(text, _uri_secrets()))
