"""Write a recommendation to MLflow: a run nested under the source run, plus child runs.

The recommendation run holds ``gpuopt/recommendation.json``, the candidate table (logged with
``log_table`` so MLflow's table view and evaluation UI can read it), the Pareto and scaling
charts (PNG) and a self-contained HTML report; its metrics are the winner's. The top
candidates become child runs of it, each with params (provider, instance, GPUs, strategy, …)
and metrics (``predicted_hours``, ``predicted_cost_usd``, ``p_meets_deadline``, …), so
MLflow's compare-runs scatter and parallel-coordinates charts work on them directly.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mlflow_gpuopt import contract

if TYPE_CHECKING:
    from mlflow_gpuopt.recommend.result import PlanResult

logger = logging.getLogger(__name__)

#: The run tag ``MlflowClient.log_table`` keeps its tables in (``mlflow.utils.mlflow_tags``).
LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"

#: Candidate keys that become child-run params / metrics.
CHILD_PARAMS = ("rank", "provider", "instance_type", "region", "gpu", "nodes", "gpus",
                "gpus_per_node", "strategy", "strategy_label", "micro_batch", "grad_accum",
                "precision", "pricing", "launch")
CHILD_METRICS = ("predicted_hours", "predicted_hours_low", "predicted_hours_high",
                 "predicted_cost_usd", "cost_low_usd", "cost_high_usd", "p_meets_deadline",
                 "throughput_samples_per_s", "price_per_hour_usd", "usd_per_million_samples",
                 "memory_per_gpu_bytes", "gpus", "nodes")


@dataclass(frozen=True)
class LoggedRecommendation:
    """Where the recommendation went."""

    run_id: str
    experiment_id: str
    child_run_ids: tuple[str, ...]


def _table(doc: Mapping[str, Any]) -> dict[str, list]:
    cols = ("rank", "provider", "instance_type", "nodes", "gpus", "gpu", "strategy_label",
            "micro_batch", "grad_accum", "precision", "pricing", "predicted_hours",
            "predicted_hours_low", "predicted_hours_high", "predicted_cost_usd",
            "cost_low_usd", "cost_high_usd", "p_meets_deadline", "meets_deadline",
            "cost_basis", "why")
    return {c: [row.get(c) for row in doc["candidates"]] for c in cols}


def _param_value(v: Any) -> str:
    text = str(v)
    return text if len(text) <= 6000 else text[:5997] + "..."


def _table_json(doc: Mapping[str, Any]) -> str:
    """The candidate table as ``MlflowClient.log_table`` writes a ``.json`` table (pandas'
    ``orient="split"`` without the index), so MLflow's table view and ``load_table`` read it;
    written here to skip pandas and log_table's four store round trips."""
    table = _table(doc)
    cols = list(table)
    rows = [[_finite(v) for v in r] for r in zip(*(table[c] for c in cols), strict=True)]
    return json.dumps({"columns": cols, "data": rows}, default=str)


def _finite(v: Any) -> Any:
    """None for NaN and infinities, as pandas writes them (``null``)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def log_recommendation(result: PlanResult, *, charts: Mapping[str, bytes], report_html: str,
                       top_children: int = 5, client=None) -> LoggedRecommendation:
    """Log ``result`` nested under its first source run: ``gpuopt/recommendation.json`` is
    its document (:func:`~mlflow_gpuopt.report.document.recommendation_document`) with the
    new run's plan ids.

    As few store round trips as MLflow allows: one ``get_run`` for the experiment; per run
    ``create_run`` (tags), one ``log_batch`` (params, metrics, tags) and ``set_terminated``;
    the recommendation run's artifacts written to one temporary folder and logged with one
    ``log_artifacts``.

    MLflow prints "View run ... at URL" when a run ends, the URL built from the tracking URI
    with its credentials: that print is off while this logs (:func:`~mlflow_gpuopt.redact.
    no_url_echo`).
    """
    import mlflow

    from mlflow_gpuopt.redact import no_url_echo

    uri = getattr(getattr(client, "_tracking_client", None), "tracking_uri", None)
    with no_url_echo(uri or mlflow.get_tracking_uri()):
        return _log_recommendation(result, charts=charts, report_html=report_html,
                                   top_children=top_children, client=client)


def _log_recommendation(result: PlanResult, *, charts: Mapping[str, bytes], report_html: str,
                        top_children: int, client) -> LoggedRecommendation:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from mlflow_gpuopt.recommend.result import PlanIds
    from mlflow_gpuopt.report.document import recommendation_document

    client = client or MlflowClient()
    source_run_ids = result.source_run_ids
    parent = client.get_run(source_run_ids[0])
    exp_id = parent.info.experiment_id
    rec = result.recommendation
    plan = rec.winner or rec.cheapest
    name = "gpuopt-recommendation"
    if plan is not None:
        name += f" {plan.offer.provider} {plan.offer.instance_type} ×{plan.nodes}"
    run = client.create_run(exp_id, run_name=name, tags={
        "mlflow.parentRunId": source_run_ids[0],
        contract.TAG_KIND: contract.KIND_RECOMMENDATION,
        contract.TAG_SOURCE_RUN_IDS: ",".join(source_run_ids),
        "mlflow.note.content": "\n\n".join(rec.explanation or result.notes),
    })
    run_id = run.info.run_id
    doc = recommendation_document(replace(result, plan_ids=PlanIds(run_id)))
    target = doc["target"]
    best = doc["winner"] or doc["cheapest"]
    status = "FAILED"
    children: list[str] = []
    try:
        now = int(time.time() * 1000)
        params = [Param(f"target.{k}", _param_value(v)) for k, v in target.items()
                  if v is not None and v != ""]
        metrics = [Metric("searched_plans", float(doc["searched"]), now, 0),
                   Metric("feasible_plans", float(doc["feasible"]), now, 0),
                   Metric("meets_deadline", 1.0 if doc.get("winner") else 0.0, now, 0)]
        if best:
            metrics += [Metric(k, float(best[k]), now, 0) for k in CHILD_METRICS
                        if isinstance(best.get(k), (int, float))]
            params += [Param(f"recommended.{k}", _param_value(best[k])) for k in CHILD_PARAMS
                       if k != "rank" and best.get(k) is not None]
        # What log_table records so MLflow's UI lists the table.
        tags = [RunTag(LOGGED_ARTIFACTS_TAG,
                       json.dumps([{"path": contract.CANDIDATES_TABLE, "type": "table"}]))]
        client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        files = {contract.RECOMMENDATION_JSON: json.dumps(dict(doc), indent=2, default=str),
                 contract.CANDIDATES_TABLE: _table_json(doc), contract.REPORT_HTML: report_html}
        files.update({path: charts[label] for label, path in (("pareto", contract.PARETO_PNG),
                                                               ("scaling", contract.SCALING_PNG))
                      if label in charts})
        log_files(client, run_id, files)
        for cand in doc["candidates"][:top_children]:
            children.append(_log_child(client, exp_id, run_id, cand, Metric, Param, RunTag,
                                       plan_tags(run_id, cand["rank"])))
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status=status)
    logger.info("logged recommendation run %s with %d candidate runs", run_id, len(children))
    return LoggedRecommendation(run_id=run_id, experiment_id=exp_id,
                                child_run_ids=tuple(children))


def plan_tags(recommendation_run_id: str, rank: int) -> dict[str, str]:
    """The tags that name a plan (on its child run, and on a job launched as it)."""
    from mlflow_gpuopt.launch.plan_ids import plan_id

    return {contract.TAG_PLAN: plan_id(recommendation_run_id, rank),
            contract.TAG_RECOMMENDATION_RUN_ID: recommendation_run_id,
            contract.TAG_PLAN_RANK: str(rank)}


def log_files(client, run_id: str, files: Mapping[str, str | bytes]) -> None:
    """Write ``files`` (artifact path -> text or bytes) under one temporary folder and log
    it with a single ``log_artifacts`` (one upload round for the whole set)."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpuopt-") as tmp:
        for path, data in files.items():
            local = os.path.join(tmp, *path.split("/"))
            os.makedirs(os.path.dirname(local), exist_ok=True)
            if isinstance(data, str):
                with open(local, "w", encoding="utf-8") as fh:
                    fh.write(data)
            else:
                with open(local, "wb") as fh:
                    fh.write(data)
        client.log_artifacts(run_id, tmp)


def _log_child(client, exp_id: str, parent_id: str, cand: Mapping[str, Any],
               metric_cls, param_cls, run_tag_cls, tags: Mapping[str, str]) -> str:
    name = (f"#{cand['rank']} {cand['provider']} {cand['instance_type']} ×{cand['nodes']} "
            f"{cand.get('strategy_label', cand['strategy'])} {cand['pricing'].replace('_', '-')}")
    child = client.create_run(exp_id, run_name=name, tags={
        "mlflow.parentRunId": parent_id, contract.TAG_KIND: contract.KIND_CANDIDATE,
        contract.TAG_WHY: _param_value(cand.get("why", "")), **tags})
    cid = child.info.run_id
    now = int(time.time() * 1000)
    try:
        client.log_batch(
            cid,
            metrics=[metric_cls(k, float(cand[k]), now, 0) for k in CHILD_METRICS
                     if isinstance(cand.get(k), (int, float))],
            params=[param_cls(k, _param_value(cand[k])) for k in CHILD_PARAMS
                    if cand.get(k) is not None],
        )
    finally:
        client.set_terminated(cid)
    return cid
