"""The plan table's columns, one definition for the printed table (``recommend``) and the
HTML report: what decides first (hardware, cost, time, odds), how to run it after."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt.recommend.explain import hours_figure, money

Row = Mapping[str, Any]  # one candidate of the recommendation JSON (docs/metrics.md)


@dataclass(frozen=True)
class Column:
    """A column: its header, the cell text of a candidate row, and its alignment."""

    header: str
    cell: Callable[[Row], str]
    #: names are left-aligned, figures right-aligned
    left: bool = False


def _range(fmt: Callable[[float], str], mid: str, low: str, high: str) -> Callable[[Row], str]:
    return lambda c: f"{fmt(c[mid])} ({fmt(c[low])}–{fmt(c[high])})"


PLAN_COLUMNS: tuple[Column, ...] = (
    Column("#", lambda c: str(c["rank"])),
    Column("provider", lambda c: c["provider"], left=True),
    Column("instance × nodes", lambda c: f'{c["instance_type"]} × {c["nodes"]}', left=True),
    Column("GPUs", lambda c: f'{c["gpus"]} {c["gpu"]}', left=True),
    Column("cost (low–high)", _range(money, "predicted_cost_usd", "cost_low_usd",
                                     "cost_high_usd")),
    Column("hours (low–high)", _range(hours_figure, "predicted_hours", "predicted_hours_low",
                                      "predicted_hours_high")),
    Column("P(deadline)", lambda c: f'{c["p_meets_deadline"]:.0%}'
           + ("" if c["meets_deadline"] else " ✗")),
    Column("pricing", lambda c: c["pricing"].replace("_", "-"), left=True),
    Column("strategy", lambda c: c.get("strategy_label") or c["strategy"], left=True),
    Column("mb × accum", lambda c: f'{c["micro_batch"]} × {c["grad_accum"]}'),
    Column("prec", lambda c: c["precision"], left=True),
)


def plan_cells(row: Row) -> list[str]:
    """The cells of one candidate row, in :data:`PLAN_COLUMNS` order."""
    return [col.cell(row) for col in PLAN_COLUMNS]


def text_table(rows: Sequence[Row]) -> list[str]:
    """The plan table as aligned text lines: header, rule, one line per row."""
    cells = [plan_cells(r) for r in rows]
    widths = [max(len(col.header), *(len(r[i]) for r in cells)) if cells else len(col.header)
              for i, col in enumerate(PLAN_COLUMNS)]

    def fmt(line: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if col.left else c.rjust(w)
                         for c, w, col in zip(line, widths, PLAN_COLUMNS, strict=True)).rstrip()

    return [fmt([col.header for col in PLAN_COLUMNS]), "  ".join("-" * w for w in widths),
            *(fmt(r) for r in cells)]
