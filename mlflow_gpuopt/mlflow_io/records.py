"""A tracking record: one numbered write the writer keeps, journals and delivers, in order.

On disk it is one JSON line of the journal (:mod:`.journal`; docs/reliability.md#the-journal):

    {"seq": 1, "kind": "metrics", "step": 0, "ts": 1700000000000, "values": {"loss": 2.3}}
    {"seq": 2, "kind": "params", "values": {...}}        # "tags" alike
    {"seq": 3, "kind": "dict", "file": "gpuopt/profile.json", "obj": {...}}

:meth:`JournalRecord.to_json` writes exactly these keys and :meth:`JournalRecord.from_json`
reads them back, so journals written before and after this module replay alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

#: The kinds of record: metric values, params, tags, one JSON artifact.
RECORD_KINDS = ("metrics", "params", "tags", "dict")


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One tracking record (``seq`` 0: not numbered yet; the pump numbers it). Slotted: the
    writer may hold up to ``max_held_records`` of them in memory."""

    kind: str  # one of RECORD_KINDS
    #: metrics: name -> value; params and tags: name -> string (redacted); dict: empty
    values: Mapping[str, Any] = field(default_factory=dict)
    step: int = 0  # metrics: the training step they were logged at
    ts_ms: int = 0  # metrics: when they were logged, epoch milliseconds ("ts" on disk)
    file: str = ""  # dict: the artifact's path in the run
    obj: Any = None  # dict: the artifact's JSON content (redacted)
    seq: int = 0  # order of production, from 1; delivery and acks follow it

    @property
    def metric_count(self) -> int:
        """Metric values in this record (0 for params, tags and artifacts)."""
        return len(self.values) if self.kind == "metrics" else 0

    def numbered(self, seq: int) -> JournalRecord:
        """This record with its place in the run's order."""
        return replace(self, seq=seq)

    def to_json(self) -> dict[str, Any]:
        """The journal line's object."""
        if self.kind == "metrics":
            return {"seq": self.seq, "kind": "metrics", "step": self.step, "ts": self.ts_ms,
                    "values": self.values}
        if self.kind == "dict":
            return {"seq": self.seq, "kind": "dict", "file": self.file, "obj": self.obj}
        return {"seq": self.seq, "kind": self.kind, "values": self.values}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> JournalRecord:
        """The record of a journal line (validated by :func:`.journal.read_state`, or
        written by :meth:`to_json`)."""
        kind = obj["kind"]
        if kind == "metrics":
            return cls(kind, obj["values"], step=obj["step"], ts_ms=obj["ts"], seq=obj["seq"])
        if kind == "dict":
            return cls(kind, file=obj["file"], obj=obj["obj"], seq=obj["seq"])
        return cls(kind, obj["values"], seq=obj["seq"])
