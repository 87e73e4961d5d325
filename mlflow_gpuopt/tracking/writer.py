"""Asynchronous, batched writes to one MLflow run, off the training thread.

The training loop only ever calls the non-blocking ``log_*`` methods, which put records on a
bounded queue; a daemon thread drains it into ``MlflowClient.log_batch``. A write failure is
reported once as a warning and never reaches the caller.

Interface (stable; other modules code against it):

    writer = RunWriter(run_id)                      # tracking URI: MLflow's current one
    writer.log_params({"gpuopt.device": "cpu"})     # never blocks, never raises
    writer.log_metrics({"gpuopt/step_time_s": 0.01}, step=12, timestamp_ms=...)
    writer.set_tags({...})
    writer.log_dict({...}, "gpuopt/profile.json")   # a JSON artifact
    report = writer.close(timeout_s=10.0)           # drain, then stop the thread
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

logger = logging.getLogger(__name__)

_MAX_BATCH_METRICS = 1000  # MLflow's log_batch limit
_MAX_BATCH_PARAMS = 100


@dataclass(frozen=True)
class CloseReport:
    """What happened to the writes when the writer closed."""

    delivered_metrics: int
    pending_metrics: int  # not delivered before the timeout (0 when all went through)
    journal_path: str | None  # where undelivered records were left, if anywhere


class RunWriter:
    """Non-blocking writer for one MLflow run (see the module docstring)."""

    def __init__(self, run_id: str, tracking_uri: str | None = None, *, max_queue: int = 100_000,
                 flush_interval_s: float = 0.5) -> None:
        from mlflow.tracking import MlflowClient

        self.run_id = run_id
        self._client = MlflowClient(tracking_uri)
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._flush_interval_s = flush_interval_s
        self._stop = threading.Event()
        self._delivered = 0
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="GpuOptWriter", daemon=True)
        self._thread.start()

    # -- producer side (training thread): never blocks, never raises -------------------------
    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        self._put(("metrics", dict(metrics), int(step), ts))

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._put(("params", {k: str(v) for k, v in params.items()}))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._put(("tags", {k: str(v) for k, v in tags.items()}))

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self._put(("dict", obj, artifact_file))

    def _put(self, item: tuple) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._warn_once("gpuopt: tracking queue full; dropping a record")

    # -- consumer side ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set() or not self._queue.empty():
            items = self._drain(timeout_s=self._flush_interval_s)
            if items:
                self._write(items)

    def _drain(self, timeout_s: float) -> list[tuple]:
        items: list[tuple] = []
        try:
            items.append(self._queue.get(timeout=timeout_s))
        except queue.Empty:
            return items
        while len(items) < _MAX_BATCH_METRICS:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _write(self, items: list[tuple]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        metrics, params, tags = [], [], []
        for item in items:
            kind = item[0]
            try:
                if kind == "metrics":
                    _, values, step, ts = item
                    metrics.extend(Metric(k, float(v), ts, step) for k, v in values.items())
                elif kind == "params":
                    params.extend(Param(k, v) for k, v in item[1].items())
                elif kind == "tags":
                    tags.extend(RunTag(k, v) for k, v in item[1].items())
                elif kind == "dict":
                    self._client.log_dict(self.run_id, item[1], item[2])
            except Exception as exc:  # a bad record or a failed artifact write: report, go on
                self._warn_once(f"gpuopt: could not write to MLflow: {exc}")
        try:
            for i in range(0, max(len(metrics), 1), _MAX_BATCH_METRICS):
                chunk_params = params[:_MAX_BATCH_PARAMS] if i == 0 else []
                self._client.log_batch(self.run_id, metrics=metrics[i:i + _MAX_BATCH_METRICS],
                                       params=chunk_params, tags=tags if i == 0 else [])
                for j in range(_MAX_BATCH_PARAMS, len(params) if i == 0 else 0, _MAX_BATCH_PARAMS):
                    self._client.log_batch(self.run_id, params=params[j:j + _MAX_BATCH_PARAMS])
            self._delivered += len(metrics)
        except Exception as exc:
            self._warn_once(f"gpuopt: could not write to MLflow: {exc}")

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(message)

    def close(self, timeout_s: float = 10.0) -> CloseReport:
        """Deliver what is queued (waiting at most ``timeout_s``) and stop the thread."""
        self._stop.set()
        self._thread.join(timeout_s)
        pending = self._queue.qsize()
        return CloseReport(self._delivered, pending, None)
