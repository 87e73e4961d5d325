"""The tracking journal: tracking records kept on local disk while MLflow can't take them.

A journal is one append-only file of JSON lines, named by run id, in ``$GPUOPT_JOURNAL_DIR``
(default ``./.gpuopt-journal/``). The first line is a header; the others are records, acks
and markers, always in the order they were produced:

    {"journal": <contract.JOURNAL_SCHEMA>, "run_id": "...", "tracking_uri": "http://u:***@h", ...}
    {"seq": 1, "kind": "metrics", "step": 0, "ts": 1700000000000, "values": {"loss": 2.3}}
    {"seq": 2, "kind": "params", "values": {<param name>: "cpu"}}
    {"seq": 3, "kind": "tags", "values": {...}}
    {"seq": 4, "kind": "dict", "file": <contract.PROFILE_ARTIFACT>, "obj": {...}}
    {"ack": 2}          # every record with seq <= 2 is in MLflow
    {"uncertain": 4}    # a send of records up to seq 4 failed after the request may have
                        # reached the server: check the run before sending them again

Records are written by one thread and synced to disk (fsync) once per batch. A crash can
tear the last line; readers ignore a torn last line (those records were never acknowledged
to anyone, and at worst a replay finds them missing). Any other unreadable line makes the
journal corrupt (:class:`JournalError`). Secrets never reach the file: the header's URI is
redacted and the writer redacts params, tags and artifacts before they are journaled.
"""

from __future__ import annotations

import json
import logging
import os
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from mlflow_gpuopt import contract

logger = logging.getLogger(__name__)

SCHEMA = contract.JOURNAL_SCHEMA
#: Environment variable that overrides the default journal directory.
JOURNAL_DIR_ENV = "GPUOPT_JOURNAL_DIR"
_DEFAULT_DIR = ".gpuopt-journal"
RECORD_KINDS = ("metrics", "params", "tags", "dict")


class JournalError(Exception):
    """A journal that is missing, unreadable or not a gpuopt journal."""


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
    """Appends records, acks and markers to one journal file (single writer thread)."""

    def __init__(self, path: str | os.PathLike, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # "x": never overwrite a journal that is already there.
        self._file = open(self.path, "x", encoding="utf-8")  # noqa: SIM115 - long-lived handle
        self._file.write(_dumps({"journal": SCHEMA, **header}) + "\n")
        self.sync()

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
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        return self

    def append(self, records: Iterable[dict[str, Any]], sync: bool = True) -> None:
        """Write records (each a dict with ``seq`` and ``kind``), then fsync once."""
        self._file.write("".join(_dumps(r) + "\n" for r in records))
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())

    def ack(self, seq: int) -> None:
        """Mark every record with ``seq`` or lower as delivered."""
        self._file.write(_dumps({"ack": int(seq)}) + "\n")
        self._file.flush()

    def mark_uncertain(self, seq: int) -> None:
        """Records up to ``seq`` may already be in MLflow: verify before re-sending them."""
        self._file.write(_dumps({"uncertain": int(seq)}) + "\n")
        self.sync()

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()

    def remove(self) -> None:
        """Close and delete the file (everything in it was delivered)."""
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
            except ValueError as exc:
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

    @property
    def run_id(self) -> str:
        return str(self.header["run_id"])


def read_state(path: str | os.PathLike) -> JournalState:
    """Validate a whole journal and summarise it; :class:`JournalError` if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise JournalError(f"{path}: no such journal file")
    try:
        lines = iter_lines(path)
        first = next(lines, None)
        if first is None or first[1].get("journal") != SCHEMA or not first[1].get("run_id"):
            raise JournalError(f"{path}: not a gpuopt journal (no '{SCHEMA}' header)")
        body_offset, header = first
        acked = uncertain = 0
        seqs = array("q")  # record seqs in file order (8 bytes each: bounded by the file)
        metric_counts = array("q")
        last_seq = 0
        for _, obj in lines:
            if "ack" in obj:
                acked = max(acked, int(obj["ack"]))
            elif "uncertain" in obj:
                uncertain = max(uncertain, int(obj["uncertain"]))
            elif obj.get("kind") in RECORD_KINDS and isinstance(obj.get("seq"), int):
                if obj["seq"] <= last_seq:
                    raise JournalError(f"{path}: record seq {obj['seq']} out of order")
                last_seq = obj["seq"]
                n = len(obj.get("values", {})) if obj["kind"] == "metrics" else 0
                seqs.append(obj["seq"])
                metric_counts.append(n)
            else:
                raise JournalError(f"{path}: unknown line {_dumps(obj)[:80]}")
    except OSError as exc:
        raise JournalError(f"{path}: cannot read ({exc.strerror})") from exc
    first_pending = bisect_right(seqs, acked)
    return JournalState(path, header, acked, uncertain, len(seqs) - first_pending,
                        sum(metric_counts[first_pending:]), body_offset)


def iter_pending(state: JournalState) -> Iterator[dict[str, Any]]:
    """Records of a validated journal that were not delivered, in order."""
    for _, obj in iter_lines(state.path, state.body_offset):
        if "seq" in obj and obj["seq"] > state.acked_seq:
            yield obj
