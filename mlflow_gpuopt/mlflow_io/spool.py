"""The writer's undelivered records: numbered, held in memory or in the journal, acked.

:class:`Spool` is the bookkeeping of :class:`~.writer.RunWriter`, apart from its threads: the
pump stores records here, the sender takes batches and commits them. Records stay in memory
until the server fails or more than ``max_memory`` wait; from then on they go to (and are read
back from) a journal on disk (:mod:`.journal`), which is removed once it has caught up. When
the disk refuses the journal, at most ``max_held`` records wait in memory, the oldest dropped
and counted. Every method is called with the writer's condition held; none touches the network.
See docs/reliability.md#the-writer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from mlflow_gpuopt.mlflow_io import delivery
from mlflow_gpuopt.mlflow_io.journal import JournalWriter, iter_lines, new_journal_path
from mlflow_gpuopt.mlflow_io.records import JournalRecord

logger = logging.getLogger(__name__)

_FSYNC_INTERVAL_S = 0.2  # journal appends are flushed at once, fsynced at most this often


@dataclass(frozen=True)
class Leftover:
    """What the spool holds once it is closed."""

    pending_metrics: int  # metric values neither delivered, refused nor dropped
    unwritten_metrics: int  # of those, the ones held in memory only: the disk refused them
    unwritten_artifacts: tuple[str, ...]  # JSON artifacts held in memory only
    journal_path: str | None  # the journal kept on disk, None: none is


class Spool:
    """Undelivered records of one run, in order (see the module docstring).

    ``header``: the journal header to write when a journal is opened (``run_id`` first).
    ``warn``: the writer's once-per-key warning, ``warn(key, message, *args)``.
    """

    def __init__(self, journal_dir: str | os.PathLike | None, max_memory: int, max_held: int,
                 header: Callable[[], dict[str, Any]],
                 warn: Callable[..., None]) -> None:
        self._journal_dir = journal_dir
        self._max_memory = max(1, max_memory)
        self._max_held = max(self._max_memory, max_held)
        self._header = header
        self._warn = warn
        self.seq = 0  # last seq given out
        self.acked = 0  # every record with seq <= this is delivered
        self.verify_through = 0  # records up to this may be in MLflow already
        self.mem: deque[JournalRecord] = deque()  # undelivered records (memory mode)
        self.journal: JournalWriter | None = None  # journal mode when set; mem is then empty
        self.read_offset = 0  # the sender's position in the journal
        self.produced_metrics = 0
        self.delivered_metrics = 0
        self.rejected_metrics = 0
        self.lost_metrics = 0  # dropped from memory while the journal could not be written
        self.closed = False  # the writer closed: records go nowhere but disk
        self.journal_failed = False
        self._last_journal_retry = 0.0
        self._last_fsync = 0.0

    @property
    def all_acked(self) -> bool:
        """Every record numbered so far is delivered."""
        return self.acked == self.seq

    # -- pump side ---------------------------------------------------------------------------
    def store(self, records: list[JournalRecord]) -> None:
        """Number ``records`` and keep them, in memory or in the journal."""
        numbered = []
        for rec in records:
            self.seq += 1
            numbered.append(rec.numbered(self.seq))
            self.produced_metrics += rec.metric_count
        if self.closed:  # close() already finished: too late to keep them anywhere but disk
            self.spill("closed")
        if self.journal is not None:
            if self.mem:  # the journal could not be written lately: try again, in order
                now = time.monotonic()
                if now - self._last_journal_retry >= 1.0:
                    self._last_journal_retry = now
                    if self._append(list(self.mem) + numbered):
                        self.mem.clear()
                        return
            elif self._append(numbered):
                return
            self.mem.extend(numbered)  # kept in memory (bounded) until the disk takes them
            self._bound_memory()
            return
        self.mem.extend(numbered)
        if len(self.mem) > self._max_memory:
            self.spill("memory")
        self._bound_memory()

    def _bound_memory(self) -> None:
        """Drop the oldest records beyond ``max_held`` (no journal to hold them)."""
        while len(self.mem) > self._max_held:
            rec = self.mem.popleft()
            self.lost_metrics += rec.metric_count
            self._warn("held-full", "gpuopt: the tracking journal cannot be written and "
                       "%d records are held in memory; dropping the oldest (counted)",
                       self._max_held)

    def _append(self, records: list[JournalRecord]) -> bool:
        """Append to the journal; False (and one warning) if the disk refused."""
        assert self.journal is not None
        now = time.monotonic()
        sync = now - self._last_fsync >= _FSYNC_INTERVAL_S
        try:
            self.journal.append(records, sync=sync)
        except (OSError, ValueError) as exc:  # ValueError: written after close() closed it
            self._warn("journal-io", "gpuopt: cannot write tracking journal %s (%s); "
                       "holding tracking records in memory and retrying", self.journal.path, exc)
            return False
        if sync:
            self._last_fsync = now
        return True

    def spill(self, reason: str) -> None:
        """Enter journal mode: everything undelivered goes to (and is then read from) disk."""
        if self.journal is not None or self.journal_failed:
            return
        header = self._header()
        path = new_journal_path(header["run_id"], self._journal_dir)
        try:
            self.journal = JournalWriter(path, header)
        except OSError as exc:
            self.journal_failed = True
            self._warn("journal-io", "gpuopt: cannot create tracking journal %s (%s); "
                       "undelivered records stay in memory", path, exc)
            return
        self.read_offset = self.journal.tell()
        self._last_fsync = time.monotonic()
        logger.debug("gpuopt: tracking journal %s opened (%s)", path, reason)
        try:
            if self.verify_through > self.acked:
                self.journal.mark_uncertain(self.verify_through)
            if self.mem:
                self.journal.append(list(self.mem))
                self.mem.clear()
        except OSError as exc:  # a full disk: the records stay in memory (bounded)
            self._warn("journal-io", "gpuopt: cannot write tracking journal %s (%s); "
                       "holding tracking records in memory and retrying", path, exc)

    # -- sender side -------------------------------------------------------------------------
    def next_batch(self) -> tuple[delivery.Batch | None, int]:
        """The oldest undelivered records as one batch, and the journal offset after them.

        The journal holds older records than memory when both hold some (memory takes the
        records the disk refused): the journal is read first.
        """
        batch = delivery.Batch()
        if self.journal is None:
            return self._mem_batch(batch)
        offset = self.read_offset
        try:
            for end, obj in iter_lines(self.journal.path, self.read_offset):
                if "seq" not in obj or obj["seq"] <= self.acked:
                    offset = end  # acks, markers, already delivered
                    continue
                rec = JournalRecord.from_json(obj)
                if not batch.fits(rec):
                    break
                batch.add(rec)
                offset = end
        except Exception as exc:  # an unreadable journal: stop reading it, keep it on disk
            self._warn("journal-read", "gpuopt: cannot read tracking journal %s: %s",
                       self.journal.path, exc)
            return None, 0
        if batch.records:
            return batch, offset
        self.read_offset = offset
        if not self.closed:  # caught up: everything in the journal is in MLflow
            self.journal.remove()
            self.journal = None
            return self._mem_batch(batch)
        return None, 0

    def _mem_batch(self, batch: delivery.Batch) -> tuple[delivery.Batch | None, int]:
        for rec in self.mem:
            if not batch.fits(rec):
                break
            batch.add(rec)
        return (batch if batch.records else None), 0

    def commit(self, batch: delivery.Batch, next_offset: int, rejected: bool = False) -> None:
        """``batch`` went out (or the server refused it for good): count and ack it."""
        n_metrics = sum(r.metric_count for r in batch.records)
        if rejected:
            self.rejected_metrics += n_metrics
        else:
            # Values found already in MLflow (verify) count as delivered too.
            self.delivered_metrics += n_metrics
        self.acked = batch.last_seq
        if self.mem and self.mem[0] is batch.records[0]:
            for _ in batch.records:
                self.mem.popleft()
        if self.journal is not None:
            if next_offset:
                self.read_offset = next_offset
            try:
                self.journal.ack(batch.last_seq)
            except (OSError, ValueError) as exc:
                self._warn("journal-io", "gpuopt: cannot write tracking journal: %s", exc)

    def on_failure(self, batch: delivery.Batch | None, ambiguous: bool) -> str:
        """A send (or the run's creation, ``batch`` None) failed: keep everything on disk
        from now on; ``ambiguous``: the request may have landed. Returns where the records
        are kept, for the warning."""
        if ambiguous and batch is not None:
            self.verify_through = max(self.verify_through, batch.last_seq)
        if self.journal is None:
            self.spill("outage")
        elif ambiguous and batch is not None:
            with contextlib.suppress(OSError, ValueError):
                self.journal.mark_uncertain(self.verify_through)
        return str(self.journal.path) if self.journal is not None else "memory"

    def mark_created(self, run_id: str) -> None:
        """The run that existed only locally was created as ``run_id``."""
        if self.journal is not None:
            with contextlib.suppress(OSError, ValueError):  # replay finds it by its tag
                self.journal.mark_created(run_id)

    # -- close -------------------------------------------------------------------------------
    def close(self, keep: bool, inflight: delivery.Batch | None, end_status: str | None,
              end_ms: int) -> Leftover:
        """Stop: with ``keep``, write what is left (and ``end_status``) to the journal and
        keep it; else remove the journal. ``inflight``: a batch whose request may still
        land (replay checks it first)."""
        self.closed = True
        pending = (self.produced_metrics - self.delivered_metrics - self.rejected_metrics
                   - self.lost_metrics)
        if keep:
            self.journal_failed = False
            self.spill("close")
            if self.journal is not None and self.mem and self._append(list(self.mem)):
                self.mem.clear()  # the disk refused earlier: retried
            if self.journal is not None:
                with contextlib.suppress(OSError, ValueError):
                    if inflight is not None:
                        # the request in flight may still land: replay must check first
                        self.journal.mark_uncertain(inflight.last_seq)
                    if end_status:  # replay sets it again after the records
                        self.journal.mark_end(end_status, end_ms)
        lost_now = sum(r.metric_count for r in self.mem)
        lost_artifacts = tuple(r.file for r in self.mem if r.kind == "dict")
        path = self.journal.path if self.journal is not None else None
        if self.journal is not None:
            try:
                if keep:
                    self.journal.close()
                else:
                    self.journal.remove()
                    path = None
            except OSError as exc:
                self._warn("journal-io", "gpuopt: cannot close tracking journal %s: %s",
                           path, exc)
        return Leftover(pending, lost_now, lost_artifacts, str(path) if path else None)
