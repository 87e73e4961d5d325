"""The tracking journal: tracking records kept on local disk while MLflow can't take them.

One append-only file of JSON lines per run, in ``$GPUOPT_JOURNAL_DIR`` (default
``./.gpuopt-journal/``): a header, then records (:class:`~.records.JournalRecord`), acks and
markers in the order they were produced. The format, the run a down server could not create
(``create_run`` in the header, ``{"created": id}`` once made) and replay:
docs/reliability.md#the-journal.

:class:`JournalWriter` appends (one writer thread; fsync once per batch; a failed write is cut
back, so no partial line). :func:`read_state` validates every line (types, ranges, kinds) and
names the first bad one; a torn last line (a crash mid-write) is ignored, those records were
never acknowledged. Secrets never reach the file: the header's URI is redacted and the writer
redacts params, tags and artifacts before they are journaled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from mlflow_gpuopt import contract
from mlflow_gpuopt.file_lock import LockHeldError, exclusive_lock
from mlflow_gpuopt.mlflow_io.records import JournalRecord

logger = logging.getLogger(__name__)

#: Environment variable that overrides the default journal directory.
JOURNAL_DIR_ENV = "GPUOPT_JOURNAL_DIR"
_DEFAULT_DIR = ".gpuopt-journal"
END_STATUSES = ("FINISHED", "FAILED", "KILLED")
_MAX_SEQ = 2**62  # far beyond any journal; larger numbers are corruption
_INT64 = 2**63


class JournalError(Exception):
    """A journal that is missing, unreadable or not a gpuopt journal."""


class JournalBusyError(JournalError):
    """Another replay holds the journal's lock."""


def lock_path(path: str | os.PathLike) -> Path:
    """The journal's own lock file, ``PATH.lock`` beside it."""
    return Path(f"{path}.lock")


@contextlib.contextmanager
def replay_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the journal's lock (:func:`lock_path`) for the ``with`` block, so two replays of
    one journal never run at once; :class:`JournalBusyError` at once if another holds it.

    Raises:
        JournalBusyError: another replay is running (the message names its pid).
        OSError: the lock file cannot be created beside the journal.
    """
    held = contextlib.ExitStack()
    try:
        held.enter_context(exclusive_lock(lock_path(path), timeout_s=0,
                                          what=f"replay of {path}"))
    except LockHeldError as exc:
        raise JournalBusyError(str(exc)) from None
    with held:
        yield


def journal_dir(directory: str | os.PathLike | None = None) -> Path:
    """Where journals go: ``directory``, else ``$GPUOPT_JOURNAL_DIR``, else
    ``./.gpuopt-journal``."""
    if directory is not None:
        return Path(directory)
    return Path(os.environ.get(JOURNAL_DIR_ENV) or _DEFAULT_DIR)


def new_journal_path(run_id: str, directory: str | os.PathLike | None = None) -> Path:
    """A path for a new journal of ``run_id`` that does not overwrite an existing one."""
    base = journal_dir(directory)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id) or "run"
    path = base / f"{safe}.jsonl"
    n = 1
    while path.exists():
        path = base / f"{safe}.{n}.jsonl"
        n += 1
    return path


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=True)


class JournalWriter:
    """Appends records, acks and markers to one journal file (single writer thread).

    Writes go straight to the file descriptor (no buffer that a later flush could fail on).
    A write that fails (a full disk) is undone: the file is cut back to its size before the
    write, so the journal never holds a partial line, and the ``OSError`` is raised.
    """

    def __init__(self, path: str | os.PathLike, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: never overwrite a journal that is already there.
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._size = 0
        try:
            self._write(_dumps({"journal": contract.JOURNAL_SCHEMA, **header}) + "\n")
            self.sync()
        except OSError:
            self._discard()
            raise

    @classmethod
    def reopen(cls, path: str | os.PathLike) -> JournalWriter:
        """Append to an existing journal (used by replay to record its progress).

        A torn last line (a writer killed mid-write) is cut off first, so that what is
        appended stays readable; readers ignore such a line anyway.
        """
        self = cls.__new__(cls)
        self.path = Path(path)
        with open(self.path, "rb+") as f:
            data_end = f.seek(0, os.SEEK_END)
            tail = b""
            while data_end > 0 and b"\n" not in tail:
                step = min(4096, data_end)
                f.seek(data_end - step)
                tail = f.read(step) + tail
                data_end -= step
            keep = data_end + tail.rfind(b"\n") + 1 if b"\n" in tail else 0
            f.truncate(keep)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = keep
        return self

    @property
    def closed(self) -> bool:
        return self._fd is None

    def _write(self, text: str) -> None:
        if self._fd is None:
            raise ValueError(f"journal {self.path} is closed")
        data = text.encode("utf-8")
        before = self._size
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError:
            with contextlib.suppress(OSError):  # undo the partial line
                os.ftruncate(self._fd, before)
                os.lseek(self._fd, before, os.SEEK_SET)
            raise
        self._size = before + len(data)

    def append(self, records: Iterable[JournalRecord], sync: bool = True) -> None:
        """Write numbered records, then fsync once."""
        self._write("".join(_dumps(r.to_json()) + "\n" for r in records))
        if sync:
            self.sync()

    def ack(self, seq: int) -> None:
        """Mark every record with ``seq`` or lower as delivered."""
        self._write(_dumps({"ack": int(seq)}) + "\n")

    def mark_uncertain(self, seq: int) -> None:
        """Records up to ``seq`` may already be in MLflow: verify before re-sending them."""
        self._write(_dumps({"uncertain": int(seq)}) + "\n")
        self.sync()

    def mark_created(self, run_id: str) -> None:
        """The header's ``create_run`` made run ``run_id``: records go there."""
        self._write(_dumps({"created": str(run_id)}) + "\n")
        self.sync()

    def mark_end(self, status: str, end_time_ms: int) -> None:
        """Set the run's end status once everything is delivered (replay does)."""
        self._write(_dumps({"end": {"status": status, "end_time_ms": int(end_time_ms)}}) + "\n")
        self.sync()

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def tell(self) -> int:
        return self._size

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _discard(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.path.unlink(missing_ok=True)

    def remove(self) -> None:
        """Close and delete the file (everything in it was delivered)."""
        with contextlib.suppress(OSError):
            self.close()
        self.path.unlink(missing_ok=True)


def iter_lines(path: Path, offset: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(end_offset, object)`` for each complete line from byte ``offset``.

    A torn last line (no newline at the end of the file) is not yielded. Raises
    :class:`JournalError` for a line that is not a JSON object.
    """
    with open(path, "rb") as f:
        f.seek(offset)
        pos = offset
        for raw in f:
            if not raw.endswith(b"\n"):
                logger.warning("gpuopt: ignoring a torn last line in journal %s", path)
                return
            pos += len(raw)
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise JournalError(f"{path}: line at byte {pos - len(raw)} is not JSON") from exc
            if not isinstance(obj, dict):
                raise JournalError(f"{path}: line at byte {pos - len(raw)} is not a JSON object")
            yield pos, obj


@dataclass(frozen=True)
class JournalState:
    """What a journal holds, from one validating pass over the file.

    ``acked_seq``: records with ``seq`` up to this were delivered (0: none).
    ``uncertain_seq``: records up to this may be in MLflow already (0: none are).
    ``pending_records`` / ``pending_metrics``: records not acked, and the metric values in them.
    ``body_offset``: byte offset just after the header line.
    """

    path: Path
    header: dict[str, Any]
    acked_seq: int
    uncertain_seq: int
    pending_records: int
    pending_metrics: int
    body_offset: int
    created_run_id: str | None = None
    end: dict[str, Any] | None = None

    @property
    def run_id(self) -> str:
        """The run records go to: the created run, else the header's (maybe local) id."""
        return self.created_run_id or str(self.header["run_id"])

    @property
    def create_run(self) -> dict[str, Any] | None:
        """The run to create first (the server was unreachable when training started)."""
        return None if self.created_run_id else self.header.get("create_run")


def _int_in(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _record_problem(obj: dict[str, Any]) -> str | None:
    """Why a record line is invalid, or None."""
    kind = obj.get("kind")
    if not _int_in(obj.get("seq"), 1, _MAX_SEQ):
        return "seq is not an integer in 1..2**62"
    if kind == "metrics":
        if not _int_in(obj.get("step"), -_INT64, _INT64 - 1):
            return "step is not a 64-bit integer"
        if not _int_in(obj.get("ts"), 0, _INT64 - 1):
            return "ts is not a timestamp in milliseconds"
        values = obj.get("values")
        if not isinstance(values, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values()):
            return "values is not a mapping of names to numbers"
    elif kind in ("params", "tags"):
        if not _str_map(obj.get("values")):
            return "values is not a mapping of names to strings"
    elif kind == "dict":
        if not isinstance(obj.get("file"), str) or not obj["file"] or "obj" not in obj:
            return "a JSON artifact without file name or content"
    else:
        return f"unknown record kind {str(kind)[:20]!r}"
    return None


def _header_problem(header: dict[str, Any]) -> str | None:
    if not isinstance(header.get("run_id"), str) or not header["run_id"]:
        return "run_id is not a string"
    uri = header.get("tracking_uri")
    if uri is not None and not isinstance(uri, str):
        return "tracking_uri is not a string"
    create = header.get("create_run")
    if create is not None:
        if not isinstance(create, dict) or not _str_map(create.get("tags", {})):
            return "create_run is not a run description"
        if not _int_in(create.get("start_time_ms"), 0, _INT64 - 1):
            return "create_run.start_time_ms is not a timestamp"
        if not (isinstance(create.get("experiment_id"), str)
                or isinstance(create.get("experiment_name"), str)):
            return "create_run names no experiment"
    return None


def read_state(path: str | os.PathLike) -> JournalState:
    """Validate a whole journal and summarise it; :class:`JournalError` (one line naming the
    line number and what is wrong) if it is not a valid journal."""
    path = Path(path)
    if not path.is_file():
        raise JournalError(f"{path}: no such journal file")
    lineno = 1
    try:
        lines = iter_lines(path)
        first = next(lines, None)
        if first is None or first[1].get("journal") != contract.JOURNAL_SCHEMA:
            raise JournalError(f"{path}: not a gpuopt journal "
                               f"(no '{contract.JOURNAL_SCHEMA}' header)")
        body_offset, header = first
        problem = _header_problem(header)
        if problem:
            raise JournalError(f"{path}: corrupt header: {problem}")
        acked = uncertain = 0
        created: str | None = None
        end: dict[str, Any] | None = None
        seqs = array("q")  # record seqs in file order (8 bytes each: bounded by the file)
        metric_counts = array("q")
        last_seq = 0
        for _, obj in lines:
            lineno += 1
            keys = set(obj)
            if keys == {"ack"} or keys == {"uncertain"}:
                (key, value), = obj.items()
                if not _int_in(value, 0, _MAX_SEQ):
                    raise JournalError(f"{path}: line {lineno}: {key} is not an integer "
                                       "in 0..2**62")
                if key == "ack":
                    acked = max(acked, value)
                else:
                    uncertain = max(uncertain, value)
            elif keys == {"created"}:
                if not isinstance(obj["created"], str) or not obj["created"]:
                    raise JournalError(f"{path}: line {lineno}: created is not a run id")
                created = obj["created"]
            elif keys == {"end"}:
                e = obj["end"]
                if not (isinstance(e, dict) and e.get("status") in END_STATUSES
                        and _int_in(e.get("end_time_ms"), 0, _INT64 - 1)):
                    raise JournalError(f"{path}: line {lineno}: end is not a status and time")
                end = e
            elif "kind" in obj or "seq" in obj:
                problem = _record_problem(obj)
                if problem:
                    raise JournalError(f"{path}: line {lineno}: {problem}")
                if obj["seq"] <= last_seq:
                    raise JournalError(f"{path}: line {lineno}: record seq {obj['seq']} "
                                       "out of order")
                last_seq = obj["seq"]
                n = len(obj["values"]) if obj["kind"] == "metrics" else 0
                seqs.append(obj["seq"])
                metric_counts.append(n)
            else:
                raise JournalError(f"{path}: line {lineno}: unknown line {_dumps(obj)[:60]}")
    except OSError as exc:
        raise JournalError(f"{path}: cannot read ({exc.strerror})") from exc
    except RecursionError:
        raise JournalError(f"{path}: line {lineno + 1}: nested too deeply") from None
    first_pending = bisect_right(seqs, acked)
    return JournalState(path, header, acked, uncertain, len(seqs) - first_pending,
                        sum(metric_counts[first_pending:]), body_offset, created, end)


def iter_pending(state: JournalState) -> Iterator[JournalRecord]:
    """Records of a validated journal that were not delivered, in order."""
    for _, obj in iter_lines(state.path, state.body_offset):
        if "seq" in obj and obj["seq"] > state.acked_seq:
            yield JournalRecord.from_json(obj)
