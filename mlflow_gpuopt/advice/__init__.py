"""Advice from a run's measurements: what to change in the training script, with the
evidence, the fix and what it is worth on the recommended plan (``mlflow gpuopt advise``).

:mod:`.rules` holds the rules (pure, over :class:`RunFacts`), :mod:`.worth` prices their
findings with the scaling models. The document :func:`advice_doc` builds is what
``gpuopt/advice.json`` holds (schema ``contract.ADVICE_SCHEMA``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.advice.rules import cheap_findings, top_finding
from mlflow_gpuopt.advice.types import Evidence, Finding, NotEvaluated, RunFacts
from mlflow_gpuopt.advice.worth import PlanContext, advise_plan, ranked

__all__ = ["Evidence", "Finding", "NotEvaluated", "PlanContext", "RunFacts", "advice_doc",
           "advise_plan", "cheap_findings", "ranked", "top_finding"]


def advice_doc(run_id: str | None, items: Sequence[Finding | NotEvaluated],
               plan: Mapping[str, Any] | None = None,
               notes: Sequence[str] = ()) -> dict:
    """The JSON document of the advice: ranked findings (largest saving first), the rules
    that could not be evaluated and why, the plan they were priced on."""
    return {
        "schema": contract.ADVICE_SCHEMA,
        "run_id": run_id,
        "plan": dict(plan) if plan else None,
        "findings": [f.to_dict() for f in ranked(list(items))],
        "not_evaluated": [x.to_dict() for x in items if isinstance(x, NotEvaluated)],
        "notes": list(notes),
    }
