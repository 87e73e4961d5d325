"""Asynchronous, batched writes to one MLflow run, off the training thread, nothing lost.

The training loop calls the non-blocking ``log_*`` methods, which put records on a bounded
queue; two daemon threads do the rest (docs/reliability.md#the-writer):

* the *pump* turns queue items into :class:`~.records.JournalRecord` values (secrets redacted)
  and stores them in the :class:`~.spool.Spool` (memory, or the journal on disk). It never
  touches the network, so the queue drains even while the server is gone;
* the *sender* sends the oldest undelivered records in batches (:mod:`.delivery`), retrying
  with backoff (0.1 s doubling to ``max_backoff_s``), in order and exactly once.

Interface (stable; names from :mod:`mlflow_gpuopt.contract`):

    writer = RunWriter(run_id)                      # tracking URI: MLflow's current one
    writer.log_params({PARAM_DEVICE: "cpu"})        # never blocks, never raises
    writer.log_metrics({METRIC_STEP_TIME_S: 0.01}, step=12, timestamp_ms=...)
    writer.set_tags({...})
    writer.log_dict({...}, PROFILE_ARTIFACT)        # a JSON artifact
    writer.flush(timeout_s=5.0)                     # optional: wait until delivered
    report = writer.close(timeout_s=10.0)           # drain, then stop the threads

What ``close`` could not deliver in time stays in the journal, and one warning says how to
deliver it (``mlflow gpuopt replay PATH``). In a forked child ``log_*`` and ``close`` do
nothing (one warning): a child never journals, ends or logs into the parent's run.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from mlflow_gpuopt.mlflow_io import delivery
from mlflow_gpuopt.mlflow_io.records import JournalRecord
from mlflow_gpuopt.mlflow_io.spool import Spool
from mlflow_gpuopt.redact import (
    redact,
    redact_mapping,
    redact_obj,
    public_uri,
    redact_uri,
    uri_secrets,
)

logger = logging.getLogger(__name__)

_STOP = object()  # wakes the pump at close


@dataclass(frozen=True)
class CloseReport:
    """What happened to the writes when the writer closed.

    ``delivered_metrics``: metric values that reached MLflow.
    ``pending_metrics``: metric values not delivered before the timeout (0 when all went
    through); they are in ``journal_path``, the journal left on disk (``None`` when nothing
    was left).
    ``lost_metrics``: metric values neither delivered nor journaled (the disk refused the
    journal and more than ``max_held_records`` were waiting, or nothing could be written at
    close). Warned about with their count.
    """

    delivered_metrics: int
    pending_metrics: int
    journal_path: str | None
    lost_metrics: int = 0


class RunWriter:
    """Non-blocking, outage-proof writer for one MLflow run (see the module docstring).

    ``max_queue``: records the producer may be ahead of the pump (memory bound of the queue).
    ``flush_interval_s``: how long the threads wait for more records before writing a batch.
    ``journal_dir``: where journals go (default ``$GPUOPT_JOURNAL_DIR`` or ``./.gpuopt-journal``).
    ``max_memory_records``: undelivered records kept in memory before spilling to the journal.
    ``request_timeout_s``: per-request timeout towards a tracking server.
    ``max_backoff_s``: the longest wait between retries while the server is unreachable.
    ``transport``: how records reach MLflow (default: from the tracking URI; tests may pass
    their own :class:`~.delivery.Transport`).
    ``create_run``: the run ``run_id`` names exists only locally (the server was unreachable
    when training started; see :mod:`.journal`): a description of the run to create
    (``experiment_id`` or ``experiment_name``, ``run_name``, ``start_time_ms``, ``tags``).
    Records go to the journal at once; the sender creates the run when the server answers,
    and from then on ``run_id`` is the created run's id.
    ``max_held_records``: records kept in memory when the journal cannot be written (a full
    disk); beyond that the oldest are dropped, counted and warned about.
    """

    def __init__(self, run_id: str, tracking_uri: str | None = None, *, max_queue: int = 100_000,
                 flush_interval_s: float = 0.5, journal_dir: str | os.PathLike | None = None,
                 max_memory_records: int = 10_000, request_timeout_s: float = 5.0,
                 max_backoff_s: float = 5.0, transport: delivery.Transport | None = None,
                 create_run: dict[str, Any] | None = None,
                 max_held_records: int = 200_000) -> None:
        import mlflow

        self.run_id = run_id
        self._uri = tracking_uri or mlflow.get_tracking_uri()
        self._secrets = uri_secrets(self._uri)
        self._transport = transport or delivery.make_transport(self._uri, request_timeout_s)
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._flush_interval_s = flush_interval_s
        self._max_backoff_s = max_backoff_s
        self.local_run_id = run_id
        self._create = dict(create_run) if create_run else None

        self._cond = threading.Condition()
        # -- state below is guarded by self._cond ----------------------------------------------
        self._spool = Spool(journal_dir, max_memory_records, max_held_records,
                            self._journal_header, self._warn_once)
        self._inflight: delivery.Batch | None = None
        self._outage_since: float | None = None
        # --------------------------------------------------------------------------------------
        self._dropped = 0
        self._put_count = 0  # items the producer queued (producer thread only)
        self._pumped_count = 0  # items the pump has numbered and stored (under self._cond)
        self._warned: set[str] = set()
        self._stop = threading.Event()  # no more records are coming: drain and finish
        self._abort = threading.Event()  # close's deadline passed: stop sending
        self._kick = threading.Event()  # close() began: retry now, not after the backoff
        self._report: CloseReport | None = None
        self._pid = os.getpid()  # the process whose threads deliver (a fork's child has none)
        self._pump = threading.Thread(target=self._pump_loop, name="GpuOptWriterPump",
                                      daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="GpuOptWriter", daemon=True)
        if self._create is not None:  # nothing of a run that exists only here may be lost
            with self._cond:
                self._spool.spill("run not created yet")
        self._pump.start()
        self._sender.start()
        atexit.register(self._close_at_exit)

    # -- producer side (training thread): never blocks, never raises -------------------------
    def log_metrics(self, metrics: Mapping[str, float], step: int,
                    timestamp_ms: int | None = None) -> None:
        try:
            ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
            self._put(("metrics", dict(metrics), int(step), ts))
        except Exception as exc:  # a bad argument must not stop training
            self._warn_once("bad-metric", "gpuopt: ignoring a metric record: %s", exc)

    def log_params(self, params: Mapping[str, Any]) -> None:
        try:
            self._put(("params", dict(params)))
        except Exception as exc:
            self._warn_once("bad-param", "gpuopt: ignoring a params record: %s", exc)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        try:
            self._put(("tags", dict(tags)))
        except Exception as exc:
            self._warn_once("bad-tag", "gpuopt: ignoring a tags record: %s", exc)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self._put(("dict", obj, str(artifact_file)))

    def _forked_child(self, what: str) -> bool:
        if os.getpid() == self._pid:
            return False
        self._warn_once("fork", "gpuopt: a forked child process (pid %d) %s the tracking "
                        "writer of pid %d, whose run it is; ignored", os.getpid(), what,
                        self._pid)
        return True

    def _put(self, item: tuple) -> None:
        if self._forked_child("logged into"):
            return
        if self._stop.is_set():
            self._warn_once("closed", "gpuopt: tracking writer is closed; ignoring a record")
            return
        try:
            self._queue.put_nowait(item)
            self._put_count += 1
        except queue.Full:
            self._dropped += 1
            self._warn_once("full", "gpuopt: tracking queue full (%d records); dropping records",
                            self._queue.maxsize)

    # -- pump: queue -> memory or journal (no network) ---------------------------------------
    def _pump_loop(self) -> None:
        while True:
            items = self._drain(self._flush_interval_s)
            items = [item for item in items if item is not _STOP]
            records = [r for item in items for r in self._to_records(item)]
            if items:
                with self._cond:
                    self._spool.store(records)
                    self._pumped_count += len(items)
                    self._cond.notify_all()
            if self._stop.is_set() and self._queue.empty():
                with self._cond:
                    self._cond.notify_all()
                return

    def _drain(self, timeout_s: float) -> list:
        items: list = []
        try:
            items.append(self._queue.get(timeout=timeout_s))
        except queue.Empty:
            return items
        while len(items) < delivery.MAX_BATCH_METRICS:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _to_records(self, item: tuple) -> list[JournalRecord]:
        """A queue item -> unnumbered records (secrets masked; the spool numbers them)."""
        kind = item[0]
        try:
            if kind == "metrics":
                _, values, step, ts = item
                clean = {}
                for k, v in values.items():
                    try:
                        clean[str(k)] = float(v)
                    except (TypeError, ValueError):
                        self._warn_once("bad-value", "gpuopt: metric %s is not a number", k)
                return [JournalRecord("metrics", part, step=step, ts_ms=ts)
                        for part in delivery.split_values(clean, delivery.MAX_BATCH_METRICS)
                        if part]
            if kind in ("params", "tags"):
                values = redact_mapping(item[1], self._secrets)
                return [JournalRecord(kind, part)
                        for part in delivery.split_values(values, delivery.MAX_BATCH_PARAMS)
                        if part]
            if kind == "dict":
                obj = json.loads(json.dumps(item[1], default=str))
                return [JournalRecord("dict", file=item[2], obj=redact_obj(obj, self._secrets))]
        except Exception as exc:
            self._warn_once("bad-record", "gpuopt: ignoring a %s record: %s", kind,
                            redact(str(exc), self._secrets))
        return []

    def _journal_header(self) -> dict[str, Any]:
        """The header of a journal opened now (the spool asks when it spills)."""
        header = {"run_id": self.run_id, "tracking_uri": public_uri(self._uri),
                  "created_ms": int(time.time() * 1000), "pid": os.getpid()}
        if self._create is not None:
            header["create_run"] = self._create
        return header

    # -- sender: memory/journal -> MLflow -----------------------------------------------------
    def _send_loop(self) -> None:
        backoff_s = 0.0
        while not self._abort.is_set():
            if self._create is not None:
                try:
                    self._create_run()
                except Exception as exc:
                    err = (exc if isinstance(exc, delivery.DeliveryError)
                           else delivery.DeliveryError(repr(exc), ambiguous=True))
                    self._on_failure(None, err)
                    backoff_s = min(max(0.1, backoff_s * 2), self._max_backoff_s)
                    self._pause(backoff_s)
                    continue
                backoff_s = 0.0
            with self._cond:
                batch, next_offset = self._spool.next_batch()
                if batch is None:
                    if self._stop.is_set() and not self._pump.is_alive():
                        return  # all delivered
                    self._cond.wait(self._flush_interval_s)
                    continue
                self._inflight = batch
                verify = batch.records[0].seq <= self._spool.verify_through
            try:
                delivery.send(self._transport, self.run_id, batch, verify=verify)
            except delivery.DeliveryError as exc:
                if exc.permanent:  # one record the server will never take: report, skip it
                    self._warn_once("refused", "gpuopt: MLflow refused a tracking record: %s",
                                    redact(str(exc), self._secrets))
                    self._commit(batch, next_offset, rejected=True)
                    continue
                self._on_failure(batch, exc)
                backoff_s = min(max(0.1, backoff_s * 2), self._max_backoff_s)
                self._pause(backoff_s)
                continue
            except Exception as exc:  # a bug or an unexpected library error: keep the records
                self._on_failure(batch, delivery.DeliveryError(repr(exc), ambiguous=True))
                backoff_s = min(max(0.1, backoff_s * 2), self._max_backoff_s)
                self._pause(backoff_s)
                continue
            backoff_s = 0.0
            self._commit(batch, next_offset)

    def _pause(self, backoff_s: float) -> None:
        """Wait before a retry; close() cuts the wait short once (the server may be back)."""
        if self._kick.wait(backoff_s) and not self._abort.is_set():
            self._kick.clear()

    def _create_run(self) -> None:
        """Create the run that exists only locally (sender thread), once: a run already
        tagged with our local id (a create whose answer was lost) is taken instead."""
        from mlflow_gpuopt import contract

        spec = self._create
        assert spec is not None
        exp_id = spec.get("experiment_id") or self._transport.experiment_id(
            spec["experiment_name"])
        run_id = self._transport.find_run(exp_id, contract.TAG_LOCAL_RUN_ID, self.local_run_id)
        if run_id is None:
            tags = {**spec.get("tags", {}), contract.TAG_LOCAL_RUN_ID: self.local_run_id}
            run_id = self._transport.create_run(exp_id, spec.get("run_name"),
                                                spec["start_time_ms"], tags)
        with self._cond:
            self._spool.mark_created(run_id)
            self.run_id = run_id
            self._create = None
        logger.info("gpuopt: created MLflow run %s for the locally started run %s", run_id,
                    self.local_run_id)

    def _commit(self, batch: delivery.Batch, next_offset: int, rejected: bool = False) -> None:
        with self._cond:
            self._inflight = None
            if self._spool.closed:
                return  # close() has written the journal; leave it as it is
            self._spool.commit(batch, next_offset, rejected)
            if self._outage_since is not None:
                logger.info("gpuopt: MLflow is reachable again after %.1f s; delivering the "
                            "tracking records kept meanwhile",
                            time.monotonic() - self._outage_since)
                self._outage_since = None
            self._cond.notify_all()

    def _on_failure(self, batch: delivery.Batch | None, exc: delivery.DeliveryError) -> None:
        with self._cond:
            self._inflight = None
            if self._spool.closed:
                return
            first = self._outage_since is None
            if first:
                self._outage_since = time.monotonic()
            where = self._spool.on_failure(batch, exc.ambiguous)
        if exc.cause in ("html", "redirect", "not-json", "deadline"):
            # what answered is not MLflow (or drips): said once per cause, whenever it shows
            self._warn_once(f"cause-{exc.cause}", "gpuopt: %s; keeping tracking records in %s "
                            "and retrying in the background (values are checked against the "
                            "run before they are sent again)", redact(str(exc), self._secrets),
                            where)
        elif first:
            logger.warning("gpuopt: cannot write to MLflow at %s (%s); keeping tracking records "
                           "in %s and retrying in the background", redact_uri(self._uri),
                           redact(str(exc), self._secrets), where)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    # -- caller side ------------------------------------------------------------------------
    @property
    def produced_metrics(self) -> int:
        """Metric values the pump has taken so far (delivered or not)."""
        return self._spool.produced_metrics

    @property
    def records_in_memory(self) -> int:
        """Undelivered records held in memory now (not in the journal)."""
        return len(self._spool.mem)

    @property
    def dropped_records(self) -> int:
        """Records dropped because the queue was full."""
        return self._dropped

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything logged so far is in MLflow; False if ``timeout_s`` ran out."""
        deadline = time.monotonic() + timeout_s
        target = self._put_count
        with self._cond:
            while True:
                if self._pumped_count >= target and self._spool.all_acked:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))

    def close(self, timeout_s: float = 10.0, end_status: str | None = None) -> CloseReport:
        """Deliver what is queued (waiting at most ``timeout_s``) and stop the threads.

        ``end_status`` (``FINISHED``/``FAILED``/``KILLED``): also end the run, within the same
        ``timeout_s`` and through the same bounded transport; when that can't be done in time
        the status goes into the journal and ``replay`` sets it.

        Whatever is not delivered by then stays in the journal, and one warning says how to
        deliver it later. A clean close removes the journal. Never raises.
        """
        if self._report is not None:
            return self._report
        if self._forked_child("closed"):
            return CloseReport(0, 0, None)
        deadline = time.monotonic() + max(0.0, timeout_s)
        end_ms = int(time.time() * 1000)
        self._stop.set()
        self._kick.set()
        with contextlib.suppress(queue.Full):  # the pump is busy with a full queue anyway
            self._queue.put_nowait(_STOP)
        # The pump only does local work: give it at least a moment even at timeout 0.
        self._pump.join(max(deadline - time.monotonic(), 1.0))
        with self._cond:
            self._cond.notify_all()
        # ending the run gets the last part of the time (a fifth, at most 2 s)
        reserve = min(2.0, 0.2 * max(0.0, timeout_s)) if end_status else 0.0
        self._sender.join(max(deadline - reserve - time.monotonic(), 0.0))
        self._abort.set()
        self._kick.set()
        with self._cond:
            left = (not self._spool.all_acked or not self._queue.empty()
                    or self._pump.is_alive())
            created = self._create is None
        ended = False
        if end_status and created:  # also with records left: they follow via replay
            ended = self._end_run(end_status, end_ms, deadline)
        with self._cond:
            keep = left or (end_status is not None and not ended)
            rest = self._spool.close(keep, self._inflight, end_status, end_ms)
        pending, path = rest.pending_metrics, rest.journal_path
        lost_now, lost_artifacts = rest.unwritten_metrics, rest.unwritten_artifacts
        lost = self._spool.lost_metrics + lost_now
        self._report = CloseReport(self._spool.delivered_metrics, max(pending - lost_now, 0),
                                   path, lost)
        atexit.unregister(self._close_at_exit)
        if path and pending - lost_now > 0:
            logger.warning(
                "gpuopt: %d metric values (and any params, tags or artifacts logged with them) "
                "could not be delivered to MLflow at %s within %gs; they are kept in %s. "
                "Deliver them with: mlflow gpuopt replay %s",
                pending - lost_now, redact_uri(self._uri), timeout_s, path, path)
        elif path:
            logger.warning("gpuopt: the MLflow run could not be ended within %gs; its end "
                           "status is kept in %s. Set it with: mlflow gpuopt replay %s",
                           timeout_s, path, path)
        if lost:
            logger.warning("gpuopt: %d metric values%s could not be delivered to MLflow nor "
                           "written to the journal (%s); they are lost", lost,
                           f" and {', '.join(lost_artifacts)}" if lost_artifacts else "",
                           "the disk refused the writes" if self._spool.journal_failed
                           or lost_now
                           else "more than max_held_records were waiting")
        if self._dropped:
            logger.warning("gpuopt: %d tracking records were dropped because the queue was "
                           "full", self._dropped)
        return self._report

    def _end_run(self, status: str, end_ms: int, deadline: float) -> bool:
        """Set the run's end status via the transport; False if not done by ``deadline``."""
        done = threading.Event()

        def end() -> None:
            try:
                self._transport.update_run(self.run_id, status, end_ms)
                done.set()
            except Exception as exc:
                self._warn_once("end", "gpuopt: could not end the MLflow run: %s",
                                redact(str(exc), self._secrets))

        t = threading.Thread(target=end, name="GpuOptEndRun", daemon=True)
        t.start()
        t.join(max(deadline - time.monotonic(), 0.0))
        return done.is_set()

    def _close_at_exit(self) -> None:
        if self._report is None and os.getpid() == self._pid:  # a child's exit: not its run
            try:
                self.close(timeout_s=5.0)
            except Exception as exc:  # at interpreter exit: a warning, never a traceback
                logger.warning("gpuopt: could not close the tracking writer: %s",
                               redact(str(exc), self._secrets))
