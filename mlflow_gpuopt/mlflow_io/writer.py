"""Asynchronous, batched writes to one MLflow run, off the training thread, nothing lost.

The training loop only ever calls the non-blocking ``log_*`` methods, which put records on a
bounded queue. Two daemon threads do the rest:

* the *pump* takes records off the queue, numbers them (``seq``), redacts secrets from params,
  tags and artifacts, and keeps them in memory — or, once the tracking server has failed or
  more than ``max_memory_records`` are waiting, appends them to a local journal file
  (:mod:`.journal`, synced to disk once per batch). It never touches the network, so the queue
  drains even while the server is gone.
* the *sender* sends the oldest undelivered records in batches (:mod:`.delivery`: one short
  request, no MLflow-internal retries), and on failure retries with backoff (0.1 s doubling to
  ``max_backoff_s``). Records keep their original step and timestamp; delivery is in order and
  exactly once (acks in the journal; a batch whose request may have landed is checked against
  the run before it is sent again). When it has caught up, the journal is deleted.

Interface (stable; other modules code against it; names from :mod:`mlflow_gpuopt.contract`):

    writer = RunWriter(run_id)                      # tracking URI: MLflow's current one
    writer.log_params({PARAM_DEVICE: "cpu"})        # never blocks, never raises
    writer.log_metrics({METRIC_STEP_TIME_S: 0.01}, step=12, timestamp_ms=...)
    writer.set_tags({...})
    writer.log_dict({...}, PROFILE_ARTIFACT)        # a JSON artifact
    writer.flush(timeout_s=5.0)                     # optional: wait until delivered
    report = writer.close(timeout_s=10.0)           # drain, then stop the threads

``close`` waits at most ``timeout_s`` for delivery; whatever is left stays in the journal and
one warning says how to deliver it later (``mlflow gpuopt replay PATH``). A record is lost
only if the queue (``max_queue`` records) overflows, i.e. the pump can't keep up with local
disk writes; that is counted and warned about.

A forked child inherits the writer but not its threads: there ``log_*`` and ``close`` do
nothing (one warning), so a child never journals, ends or logs into the parent's run.
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
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

from mlflow_gpuopt.mlflow_io import delivery
from mlflow_gpuopt.mlflow_io.journal import JournalWriter, iter_lines, new_journal_path
from mlflow_gpuopt.redact import (
    redact,
    redact_mapping,
    redact_obj,
    public_uri,
    redact_uri,
    uri_secrets,
)

logger = logging.getLogger(__name__)

_MAX_BATCH_METRICS = delivery.MAX_BATCH_METRICS  # MLflow's log_batch limit
_MAX_BATCH_PARAMS = delivery.MAX_BATCH_PARAMS
_FSYNC_INTERVAL_S = 0.2  # journal appends are flushed at once, fsynced at most this often
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
        self._journal_dir = journal_dir
        self._max_memory = max(1, max_memory_records)
        self._max_backoff_s = max_backoff_s
        self.local_run_id = run_id
        self._create = dict(create_run) if create_run else None
        self._max_held = max(self._max_memory, max_held_records)

        self._cond = threading.Condition()
        # -- state below is guarded by self._cond ----------------------------------------------
        self._seq = 0  # last seq given out by the pump
        self._acked = 0  # every record with seq <= this is delivered
        self._verify_through = 0  # records up to this may be in MLflow already
        self._mem: deque[dict[str, Any]] = deque()  # undelivered records (memory mode)
        self._journal: JournalWriter | None = None  # journal mode when set; _mem is then empty
        self._read_offset = 0  # the sender's position in the journal
        self._inflight: delivery.Batch | None = None
        self._produced_metrics = 0
        self._delivered_metrics = 0
        self._rejected_metrics = 0
        self._closed = False
        self._journal_failed = False
        self._lost_metrics = 0  # dropped from memory while the journal could not be written
        self._last_journal_retry = 0.0
        self._outage_since: float | None = None
        self._last_fsync = 0.0
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
                self._spill_locked("run not created yet")
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
                    self._store_locked(records)
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
        while len(items) < _MAX_BATCH_METRICS:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _to_records(self, item: tuple) -> list[dict[str, Any]]:
        """Queue items -> journal records (secrets masked; seq added under the lock)."""
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
                return [{"kind": "metrics", "step": step, "ts": ts, "values": part}
                        for part in delivery.split_values(clean, _MAX_BATCH_METRICS) if part]
            if kind in ("params", "tags"):
                values = redact_mapping(item[1], self._secrets)
                return [{"kind": kind, "values": part}
                        for part in delivery.split_values(values, _MAX_BATCH_PARAMS) if part]
            if kind == "dict":
                obj = json.loads(json.dumps(item[1], default=str))
                return [{"kind": "dict", "file": item[2], "obj": redact_obj(obj, self._secrets)}]
        except Exception as exc:
            self._warn_once("bad-record", "gpuopt: ignoring a %s record: %s", kind,
                            redact(str(exc), self._secrets))
        return []

    def _store_locked(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            self._seq += 1
            rec["seq"] = self._seq
            if rec["kind"] == "metrics":
                self._produced_metrics += len(rec["values"])
        if self._closed:  # close() already finished: too late to keep them anywhere but disk
            self._spill_locked("closed")
        if self._journal is not None:
            if self._mem:  # the journal could not be written lately: try again, in order
                now = time.monotonic()
                if now - self._last_journal_retry >= 1.0:
                    self._last_journal_retry = now
                    if self._append_locked(list(self._mem) + records):
                        self._mem.clear()
                        return
            elif self._append_locked(records):
                return
            self._mem.extend(records)  # kept in memory (bounded) until the disk takes them
            self._bound_memory_locked()
            return
        self._mem.extend(records)
        if len(self._mem) > self._max_memory:
            self._spill_locked("memory")
        self._bound_memory_locked()

    def _bound_memory_locked(self) -> None:
        """Drop the oldest records beyond ``max_held_records`` (no journal to hold them)."""
        while len(self._mem) > self._max_held:
            rec = self._mem.popleft()
            if rec["kind"] == "metrics":
                self._lost_metrics += len(rec["values"])
            self._warn_once("held-full", "gpuopt: the tracking journal cannot be written and "
                            "%d records are held in memory; dropping the oldest (counted)",
                            self._max_held)

    def _append_locked(self, records: list[dict[str, Any]]) -> bool:
        """Append to the journal; False (and one warning) if the disk refused."""
        assert self._journal is not None
        now = time.monotonic()
        sync = now - self._last_fsync >= _FSYNC_INTERVAL_S
        try:
            self._journal.append(records, sync=sync)
        except (OSError, ValueError) as exc:  # ValueError: written after close() closed it
            self._warn_once("journal-io", "gpuopt: cannot write tracking journal %s (%s); "
                            "holding tracking records in memory and retrying", self._journal.path,
                            exc)
            return False
        if sync:
            self._last_fsync = now
        return True

    def _spill_locked(self, reason: str) -> None:
        """Enter journal mode: everything undelivered goes to (and is then read from) disk."""
        if self._journal is not None or self._journal_failed:
            return
        path = new_journal_path(self.run_id, self._journal_dir)
        header = {"run_id": self.run_id, "tracking_uri": public_uri(self._uri),
                  "created_ms": int(time.time() * 1000), "pid": os.getpid()}
        if self._create is not None:
            header["create_run"] = self._create
        try:
            self._journal = JournalWriter(path, header)
        except OSError as exc:
            self._journal_failed = True
            self._warn_once("journal-io", "gpuopt: cannot create tracking journal %s (%s); "
                            "undelivered records stay in memory", path, exc)
            return
        self._read_offset = self._journal.tell()
        self._last_fsync = time.monotonic()
        logger.debug("gpuopt: tracking journal %s opened (%s)", path, reason)
        try:
            if self._verify_through > self._acked:
                self._journal.mark_uncertain(self._verify_through)
            if self._mem:
                self._journal.append(list(self._mem))
                self._mem.clear()
        except OSError as exc:  # a full disk: the records stay in memory (bounded)
            self._warn_once("journal-io", "gpuopt: cannot write tracking journal %s (%s); "
                            "holding tracking records in memory and retrying", path, exc)

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
                batch, next_offset = self._next_batch_locked()
                if batch is None:
                    if self._stop.is_set() and not self._pump.is_alive():
                        return  # all delivered
                    self._cond.wait(self._flush_interval_s)
                    continue
                self._inflight = batch
                verify = batch.records[0]["seq"] <= self._verify_through
            try:
                sent = delivery.send(self._transport, self.run_id, batch, verify=verify)
            except delivery.DeliveryError as exc:
                if exc.permanent:  # one record the server will never take: report, skip it
                    self._warn_once("refused", "gpuopt: MLflow refused a tracking record: %s",
                                    redact(str(exc), self._secrets))
                    self._commit(batch, next_offset, 0, rejected=True)
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
            self._commit(batch, next_offset, sent)

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
            if self._journal is not None:
                with contextlib.suppress(OSError, ValueError):  # replay finds it by its tag
                    self._journal.mark_created(run_id)
            self.run_id = run_id
            self._create = None
        logger.info("gpuopt: created MLflow run %s for the locally started run %s", run_id,
                    self.local_run_id)

    def _next_batch_locked(self) -> tuple[delivery.Batch | None, int]:
        """The oldest undelivered records as one batch, and the journal offset after them.

        The journal holds older records than memory when both hold some (memory takes the
        records the disk refused): the journal is read first.
        """
        batch = delivery.Batch()
        if self._journal is None:
            return self._mem_batch(batch)
        offset = self._read_offset
        try:
            for end, obj in iter_lines(self._journal.path, self._read_offset):
                if "seq" not in obj or obj["seq"] <= self._acked:
                    offset = end  # acks, markers, already delivered
                    continue
                if not batch.fits(obj):
                    break
                batch.add(obj)
                offset = end
        except Exception as exc:  # an unreadable journal: stop reading it, keep it on disk
            self._warn_once("journal-read", "gpuopt: cannot read tracking journal %s: %s",
                            self._journal.path, exc)
            return None, 0
        if batch.records:
            return batch, offset
        self._read_offset = offset
        if not self._closed:  # caught up: everything in the journal is in MLflow
            self._journal.remove()
            self._journal = None
            return self._mem_batch(batch)
        return None, 0

    def _mem_batch(self, batch: delivery.Batch) -> tuple[delivery.Batch | None, int]:
        for rec in self._mem:
            if not batch.fits(rec):
                break
            batch.add(rec)
        return (batch if batch.records else None), 0

    def _commit(self, batch: delivery.Batch, next_offset: int, sent: int,
                rejected: bool = False) -> None:
        with self._cond:
            self._inflight = None
            if self._closed:
                return  # close() has written the journal; leave it as it is
            n_metrics = sum(len(r["values"]) for r in batch.records if r["kind"] == "metrics")
            if rejected:
                self._rejected_metrics += n_metrics
            else:
                # Values found already in MLflow (verify) count as delivered too.
                self._delivered_metrics += n_metrics
            self._acked = batch.last_seq
            if self._mem and self._mem[0] is batch.records[0]:
                for _ in batch.records:
                    self._mem.popleft()
            if self._journal is not None:
                if next_offset:
                    self._read_offset = next_offset
                try:
                    self._journal.ack(batch.last_seq)
                except (OSError, ValueError) as exc:
                    self._warn_once("journal-io", "gpuopt: cannot write tracking journal: %s", exc)
            if self._outage_since is not None:
                logger.info("gpuopt: MLflow is reachable again after %.1f s; delivering the "
                            "tracking records kept meanwhile",
                            time.monotonic() - self._outage_since)
                self._outage_since = None
            self._cond.notify_all()
        del sent

    def _on_failure(self, batch: delivery.Batch | None, exc: delivery.DeliveryError) -> None:
        with self._cond:
            self._inflight = None
            if self._closed:
                return
            if exc.ambiguous and batch is not None:
                self._verify_through = max(self._verify_through, batch.last_seq)
            first = self._outage_since is None
            if first:
                self._outage_since = time.monotonic()
            if self._journal is None:
                self._spill_locked("outage")
            elif exc.ambiguous and batch is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._journal.mark_uncertain(self._verify_through)
            where = self._journal.path if self._journal is not None else "memory"
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
    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything logged so far is in MLflow; False if ``timeout_s`` ran out."""
        deadline = time.monotonic() + timeout_s
        target = self._put_count
        with self._cond:
            while True:
                if self._pumped_count >= target and self._acked == self._seq:
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
            left = self._seq > self._acked or not self._queue.empty() or self._pump.is_alive()
            created = self._create is None
        ended = False
        if end_status and created:  # also with records left: they follow via replay
            ended = self._end_run(end_status, end_ms, deadline)
        with self._cond:
            self._closed = True
            pending = (self._produced_metrics - self._delivered_metrics - self._rejected_metrics
                       - self._lost_metrics)
            keep = left or (end_status is not None and not ended)
            if keep:
                self._journal_failed = False
                self._spill_locked("close")
                # the disk refused earlier: retry
                if self._journal is not None and self._mem and self._append_locked(
                        list(self._mem)):
                    self._mem.clear()
                if self._journal is not None:
                    with contextlib.suppress(OSError, ValueError):
                        if self._inflight is not None:
                            # the request in flight may still land: replay must check first
                            self._journal.mark_uncertain(self._inflight.last_seq)
                        if end_status:  # replay sets it again after the records
                            self._journal.mark_end(end_status, end_ms)
            lost_now = sum(len(r["values"]) for r in self._mem if r["kind"] == "metrics")
            lost_artifacts = [r["file"] for r in self._mem if r["kind"] == "dict"]
            path = self._journal.path if self._journal is not None else None
            if self._journal is not None:
                try:
                    if keep:
                        self._journal.close()
                    else:
                        self._journal.remove()
                        path = None
                except OSError as exc:
                    self._warn_once("journal-io", "gpuopt: cannot close tracking journal %s: %s",
                                    path, exc)
        lost = self._lost_metrics + lost_now
        self._report = CloseReport(self._delivered_metrics, max(pending - lost_now, 0),
                                   str(path) if path else None, lost)
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
                           "the disk refused the writes" if self._journal_failed or lost_now
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
