"""The one serialiser of a recommendation: what each stage adds reaches the JSON, in the
documented key order, and an earlier stage's document is not changed by a later one."""

from __future__ import annotations

import json
from dataclasses import replace

from support.recommend import GPUS, OFFERS, RESNET, AnalyticPredictor, hardware_for

from mlflow_gpuopt.recommend import Target, recommend, recommendation_dict
from mlflow_gpuopt.recommend.result import Emitted, PlanIds, PlanResult
from mlflow_gpuopt.recommend.shortfall import Alternative
from mlflow_gpuopt.report.document import recommendation_document

#: The keys of ``recommend --json`` in order (docs/metrics.md), optional ones included.
ORDER = ["target", "batch_policy", "candidates", "pareto", "meets_deadline", "winner",
         "fastest", "cheapest", "explanation", "notes", "dropped", "searched",
         "memory_headroom", "predicted", "costed", "feasible", "scaling",
         "deadline_alternatives", "source_run_ids", "model_assumptions", "advice",
         "mlflow_run_id", "emitted"]


def _rec(deadline_hours: float = 24.0):
    target = Target(total_samples=90 * 1_281_167, deadline_hours=deadline_hours,
                    per_rank_batch=256)
    return recommend(AnalyticPredictor(RESNET), RESNET, OFFERS, GPUS, target,
                     hardware_for=hardware_for)


def test_the_search_alone_is_its_recommendation_dict_plus_the_empty_sources():
    rec = _rec()
    doc = recommendation_document(PlanResult.of(rec, top=4))
    assert doc == {**recommendation_dict(rec, top=4), "source_run_ids": [],
                   "model_assumptions": []}
    assert list(doc) == [k for k in ORDER if k in doc]
    assert all("plan_id" not in c for c in doc["candidates"])  # no ids before they exist


def test_every_stage_reaches_the_json_in_the_documented_order():
    rec = _rec()
    late = rec.candidates[1]
    result = replace(PlanResult.of(rec, top=3), notes=("from the inputs", *rec.notes),
                     deadline_alternatives=(Alternative("--keep-micro-batch", True, late),
                                            Alternative("--max-nodes 64", False, None)),
                     source_run_ids=("src1",), model_assumptions=("assumed x",),
                     with_advice=True, advice=None)
    staged = replace(result, plan_ids=PlanIds("rec9", ("c1", "c2")), mlflow_run_id="rec9",
                     emitted=Emitted("torchrun", "/tmp/p.sh", 2, "rec9:2", None, ("n",)))
    before = json.dumps(recommendation_document(result))
    doc = recommendation_document(staged)
    assert json.dumps(recommendation_document(result)) == before  # the earlier stage is as it was
    assert list(doc) == ORDER
    assert doc["notes"][0] == "from the inputs" and doc["notes"][1:] == list(rec.notes)
    assert doc["deadline_alternatives"] == [
        {"flag": "--keep-micro-batch", "meets_deadline": True, "predicted_hours": late.hours,
         "predicted_cost_usd": late.cost_usd, "provider": late.offer.provider,
         "instance_type": late.offer.instance_type, "nodes": late.nodes, "gpus": late.gpus},
        {"flag": "--max-nodes 64", "meets_deadline": False, "predicted_hours": None,
         "predicted_cost_usd": None, "provider": None, "instance_type": None, "nodes": None,
         "gpus": None}]
    assert doc["advice"] is None  # priced advice asked for, the run's measurements unread
    assert (doc["source_run_ids"], doc["model_assumptions"], doc["mlflow_run_id"]) == (
        ["src1"], ["assumed x"], "rec9")
    assert doc["emitted"] == {"kind": "torchrun", "path": "/tmp/p.sh", "rank": 2,
                              "plan_id": "rec9:2", "script": None, "notes": ["n"]}
    assert [(c["rank"], c["plan_id"], c.get("plan_run_id")) for c in doc["candidates"]] == [
        (1, "rec9:1", "c1"), (2, "rec9:2", "c2"), (3, "rec9:3", None)]
    # the ids are the last keys of a row, after the candidate's own
    assert list(doc["candidates"][0])[-2:] == ["plan_id", "plan_run_id"]
    assert doc["winner"]["plan_id"] == "rec9:1" and doc["winner"]["plan_run_id"] == "c1"


def test_unlogged_plans_are_named_by_their_bare_rank():
    doc = recommendation_document(replace(PlanResult.of(_rec(), top=2), plan_ids=PlanIds()))
    assert [c["plan_id"] for c in doc["candidates"]] == ["1", "2"]
    assert all("plan_run_id" not in c for c in doc["candidates"])
    assert "mlflow_run_id" not in doc and "emitted" not in doc
