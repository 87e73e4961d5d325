"""The published LLM training table the LLM benchmarks read (``data/llm_training_throughput.tsv``,
a copy of ``shared/data/``'s; its README says what each column holds), and the two readers
of its cells that ``bench_llm.py``, ``bench_proxy.py`` and ``bench_memory.py`` share."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "llm_training_throughput.tsv"


def num(text: str | None) -> float | None:
    """A cell as a number; None for an empty, ``NA`` or missing one."""
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def note(notes: str, key: str) -> str | None:
    """The value of ``key=value`` in a row's ``;``-separated notes, or None."""
    for part in notes.split(";"):
        part = part.strip()
        if part.lower().startswith(key + "="):
            return part.split("=", 1)[1].strip()
    return None
