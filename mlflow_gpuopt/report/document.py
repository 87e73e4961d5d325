"""The recommendation as JSON: one serialiser for ``recommend --json``, the logged
``gpuopt/recommendation.json`` and the HTML report (keys: ``docs/metrics.md``).

Each writes the :class:`~mlflow_gpuopt.recommend.result.PlanResult` as it stands: the HTML
before the plans have ids, the artifact once its run exists (plan ids, no child runs yet),
``--json`` at the end (child runs, ``mlflow_run_id``, ``emitted``). The printed table reads
the same rows (:mod:`.table`).
"""

from __future__ import annotations

from typing import Any

from mlflow_gpuopt.launch.plan_ids import plan_id
from mlflow_gpuopt.recommend.result import Emitted, PlanIds, PlanResult
from mlflow_gpuopt.recommend.serialize import recommendation_dict


def recommendation_document(result: PlanResult) -> dict[str, Any]:
    """``{"target", "candidates", "pareto", ..., "source_run_ids", ...}`` of ``result``."""
    doc = recommendation_dict(result.recommendation, top=result.top)
    doc["notes"] = list(result.notes)
    if result.deadline_alternatives is not None:
        doc["deadline_alternatives"] = [a.as_dict() for a in result.deadline_alternatives]
    doc["source_run_ids"] = list(result.source_run_ids)
    doc["model_assumptions"] = list(result.model_assumptions)
    if result.with_advice:
        doc["advice"] = result.advice
    if result.mlflow_run_id is not None:
        doc["mlflow_run_id"] = result.mlflow_run_id
    if result.plan_ids is not None:
        _name_plans(doc, result.plan_ids)
    if result.emitted is not None:
        doc["emitted"] = _emitted(result.emitted)
    return doc


def _name_plans(doc: dict[str, Any], ids: PlanIds) -> None:
    """``plan_id`` on every ranked row (candidates, Pareto set, winner, fastest, cheapest),
    and ``plan_run_id`` on those with a candidate run."""
    rows = [*doc["candidates"], *doc["pareto"],
            *(doc[k] for k in ("winner", "fastest", "cheapest") if doc[k])]
    for row in rows:
        rank = row["rank"]
        if rank:
            row["plan_id"] = plan_id(ids.recommendation_run_id, rank)
            if rank <= len(ids.child_run_ids):
                row["plan_run_id"] = ids.child_run_ids[rank - 1]


def _emitted(e: Emitted) -> dict[str, Any]:
    return {"kind": e.kind, "path": e.path, "rank": e.rank, "plan_id": e.plan_id,
            "script": e.script, "notes": list(e.notes)}
