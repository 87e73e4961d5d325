"""A recommendation with what the later stages of ``recommend`` know (frozen, pure).

The search returns a :class:`~.types.Recommendation`; reading the inputs adds notes and
source runs, a missed deadline its alternatives, pricing the run's advice its document,
logging the plan ids and the run id, ``--emit`` its artefact. Each stage adds its part with
``dataclasses.replace``; the JSON is written once, at the edge
(:func:`mlflow_gpuopt.report.document.recommendation_document`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt.recommend.shortfall import Alternative
from mlflow_gpuopt.recommend.types import Candidate, Recommendation


@dataclass(frozen=True)
class PlanIds:
    """How the ranked plans are named: ``<recommendation_run_id>:<rank>`` once logged, the
    bare rank when not (``recommendation_run_id`` None); ``child_run_ids[rank - 1]`` is the
    candidate run logged for a plan (the top five)."""

    recommendation_run_id: str | None = None
    child_run_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Emitted:
    """The launch artefact ``--emit`` wrote: its kind, path, plan and notes for the user."""

    kind: str  # torchrun | skypilot
    path: str
    rank: int
    plan_id: str
    script: str | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanResult:
    """What ``recommend`` answers (the ``--json`` document's content, typed).

    ``notes`` are all the lines shown as notes, in order (the inputs', the search's, what
    would meet a missed deadline); ``deadline_alternatives`` is None where none were searched
    (the deadline was met, or there was none), ``advice`` the run's advice document, present
    only when ``with_advice`` (None within it: the run's measurements could not be read).
    ``plan_ids`` is None until the result is logged or known not to be; ``mlflow_run_id`` the
    recommendation run, once logged.
    """

    recommendation: Recommendation
    top: int = 20  # ranked plans listed (``--top``)
    notes: tuple[str, ...] = ()
    source_run_ids: tuple[str, ...] = ()
    model_assumptions: tuple[str, ...] = ()
    deadline_alternatives: tuple[Alternative, ...] | None = None
    with_advice: bool = False
    advice: Mapping[str, Any] | None = None
    plan_ids: PlanIds | None = None
    mlflow_run_id: str | None = None
    emitted: Emitted | None = None

    @classmethod
    def of(cls, rec: Recommendation, top: int = 20) -> PlanResult:
        """The search's answer alone: its own notes, nothing added yet."""
        return cls(recommendation=rec, top=top, notes=rec.notes)

    @property
    def listed(self) -> tuple[Candidate, ...]:
        """The ranked plans shown (the top ``top``), best first; rank = index + 1."""
        return self.recommendation.candidates[:self.top]
