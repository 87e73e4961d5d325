"""Plans in MLflow: read a plan's predictions, link a job's run to its plan, list the pairs.

A plan id is ``<recommendation_run_id>:<rank>`` (:mod:`mlflow_gpuopt.launch.plan_ids`); its
predictions are row ``rank`` of the recommendation run's ``gpuopt/recommendation.json``. A job
launched as a plan carries ``gpuopt.plan`` (set by ``track()``); the plan's run (its child
run, else the recommendation run) carries ``gpuopt.job_run_ids`` back to the job runs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt.launch.plan_check import PlanPrediction, plan_from_candidate
from mlflow_gpuopt.launch.plan_ids import parse_plan_id

logger = logging.getLogger(__name__)

class PlanError(InputError):
    """A plan id that names no readable plan (message: one line)."""


def _client(client: Any) -> Any:
    if client is not None:
        return client
    from mlflow import MlflowClient

    return MlflowClient()


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def read_recommendation(run_id: str, client: Any = None) -> dict[str, Any]:
    """``gpuopt/recommendation.json`` of recommendation run ``run_id``; :class:`PlanError`
    if the run is unknown, is not a recommendation, or its document cannot be read."""
    from mlflow.exceptions import MlflowException

    from mlflow_gpuopt.mlflow_io.runs import RunInputError, get_run

    client = _client(client)
    try:
        run = get_run(client, run_id)
    except RunInputError as exc:
        raise PlanError(f"plan's recommendation: {exc}") from None
    if run.data.tags.get(contract.TAG_KIND) != contract.KIND_RECOMMENDATION:
        raise PlanError(f"run {run_id} is not a gpuopt recommendation run (a plan id is "
                        "<recommendation run id>:<rank>)")
    # a progress bar in the middle of a training job's output says nothing (the user's own
    # setting wins)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        with tempfile.TemporaryDirectory(prefix="gpuopt-plan-") as tmp:
            local = client.download_artifacts(run_id, contract.RECOMMENDATION_JSON, tmp)
            doc = json.loads(Path(local).read_text(encoding="utf-8"))
    except (MlflowException, OSError, ValueError) as exc:
        raise PlanError(f"cannot read {contract.RECOMMENDATION_JSON} of run {run_id}: "
                        f"{_one_line(exc)}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("candidates"), list):
        raise PlanError(f"{contract.RECOMMENDATION_JSON} of run {run_id} has no candidates")
    doc["_experiment_id"] = run.info.experiment_id
    return doc


def plan_of(doc: dict[str, Any], recommendation_run_id: str, rank: int,
            client: Any = None) -> PlanPrediction:
    """Plan ``rank`` of the recommendation document ``doc`` (its child run looked up)."""
    from mlflow_gpuopt.launch.plan_ids import plan_id

    cands = doc["candidates"]
    pid = plan_id(recommendation_run_id, rank)
    if rank > len(cands):
        raise PlanError(f"plan {pid}: the recommendation has only {len(cands)} ranked plan(s)")
    child = None
    exp_id = doc.get("_experiment_id")
    if exp_id is not None:
        try:
            found = _client(client).search_runs(
                [exp_id], filter_string=f"tags.`{contract.TAG_PLAN}` = '{pid}' and "
                f"tags.`{contract.TAG_KIND}` = '{contract.KIND_CANDIDATE}'", max_results=1)
            child = found[0].info.run_id if found else None
        except Exception as exc:  # the link is a convenience: the predictions still hold
            logger.debug("cannot look up the child run of plan %s: %s", pid, exc)
    return plan_from_candidate(cands[rank - 1], plan_id=pid,
                               recommendation_run_id=recommendation_run_id,
                               target=doc.get("target"),
                               source_run_ids=tuple(doc.get("source_run_ids") or ()),
                               plan_run_id=child)


def read_plan(plan_id: str, client: Any = None) -> PlanPrediction:
    """The predictions of plan ``plan_id``; :class:`PlanError` (one line) if it has none."""
    try:
        run_id, rank = parse_plan_id(plan_id)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if run_id is None:
        raise PlanError(f"plan {plan_id} names a row of an unlogged recommendation (--no-log): "
                        "there are no predictions to compare with")
    client = _client(client)
    return plan_of(read_recommendation(run_id, client), run_id, rank, client)


def logged_plan_row(plan_id: str, workload: Any, client: Any = None) -> dict[str, Any]:
    """Row ``rank`` of plan ``plan_id``'s recommendation, checked to be a plan of
    ``workload`` (its source run measured the same model); :class:`PlanError` if not."""
    from mlflow_gpuopt.mlflow_io.runs import RunInputError, load_run_inputs, same_workload

    try:
        run_id, rank = parse_plan_id(plan_id)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if run_id is None:
        raise PlanError("a bare rank names a row of this result; give <run_id>:<rank> for a "
                        "logged plan")
    client = _client(client)
    doc = read_recommendation(run_id, client)
    cands = doc["candidates"]
    if rank > len(cands):
        raise PlanError(f"the recommendation has only {len(cands)} ranked plan(s)")
    sources = doc.get("source_run_ids") or []
    if not sources:
        raise PlanError(f"recommendation {run_id} names no measured run; cannot tell its "
                        "workload")
    try:
        theirs = load_run_inputs([sources[0]], client=client).workload
    except RunInputError as exc:
        raise PlanError(f"cannot read the plan's measured run: {exc}") from None
    why = same_workload(theirs, workload)
    if why:
        raise PlanError(f"a plan of another workload ({why}); emit a plan recommended for "
                        "these runs")
    return dict(cands[rank - 1])


#: Times ``link_job`` writes the list tag and reads it back before giving up on it (the
#: job's own tag holds the link anyway).
LINK_TRIES = 6


def _job_ids(tags: dict[str, str]) -> list[str]:
    """The job runs linked in ``tags``: the list tag's, then those only their own tag names."""
    listed = [i for i in (tags.get(contract.TAG_JOB_RUN_IDS) or "").split(",") if i]
    own = sorted(k[len(contract.TAG_JOB_RUN_PREFIX):] for k in tags
                 if k.startswith(contract.TAG_JOB_RUN_PREFIX))
    return listed + [i for i in own if i not in listed]


def link_job(plan: PlanPrediction, job_run_id: str, client: Any = None) -> str:
    """Link ``job_run_id`` to the plan's run; returns that run.

    The plan's run is its child run where one was logged, else the recommendation run. The
    job gets a tag of its own there (``gpuopt.job_run.<id>``, never lost), and
    ``gpuopt.job_run_ids`` is rewritten as every linked job (the list and the own tags) and
    read back, with a short random pause, until it holds this job: a tag has no atomic
    append, so two jobs linking at once each keep the other's id.
    """
    import random
    import time

    from mlflow.exceptions import MlflowException

    client = _client(client)
    target = plan.plan_run_id or plan.recommendation_run_id
    client.set_tag(target, f"{contract.TAG_JOB_RUN_PREFIX}{job_run_id}", "1")
    for attempt in range(LINK_TRIES):
        tags = client.get_run(target).data.tags
        listed = (tags.get(contract.TAG_JOB_RUN_IDS) or "").split(",")
        ids = _job_ids(tags)
        if job_run_id in listed and len(ids) == len([i for i in listed if i]):
            return target
        try:
            client.set_tag(target, contract.TAG_JOB_RUN_IDS, ",".join(ids)[:5000])
        except MlflowException as exc:
            # Two first writes at once: the SQL store inserts the tag twice and one insert
            # fails its unique key (sqlite IntegrityError). The other job's list is there
            # now; read it again and add to it.
            logger.debug("gpuopt: plan link write raced (%s); reading it again", exc)
        time.sleep(random.uniform(0.02, 0.1) * (attempt + 1))  # another job's write may race
    return target


@dataclass(frozen=True)
class PlannedRun:
    """A run launched as a plan: its id, name, measured figures (metrics, params), the plan."""

    run_id: str
    run_name: str
    plan_id: str
    metrics: dict[str, float]
    params: dict[str, str]
    start_time_ms: int


def planned_runs(runs: Sequence[Any]) -> list[PlannedRun]:
    """The runs among ``runs`` (MLflow ``Run`` objects) that carry a plan id."""
    out = []
    for r in runs:
        pid = r.data.tags.get(contract.TAG_PLAN)
        if not pid or r.data.tags.get(contract.TAG_KIND):
            continue  # a candidate run names its own plan; it measured nothing
        out.append(PlannedRun(r.info.run_id, r.info.run_name or "", pid, dict(r.data.metrics),
                              dict(r.data.params), r.info.start_time or 0))
    return out


def planned_runs_in_experiment(name: str, client: Any = None) -> list[PlannedRun]:
    """Runs of experiment ``name`` launched as a plan, oldest first; :class:`PlanError` if
    there is no such experiment or it cannot be read."""
    from mlflow_gpuopt.mlflow_io.runs import experiment_runs

    return planned_runs(experiment_runs(_client(client), name, oldest_first=True,
                                        error=PlanError))


def plans_for(runs: Sequence[PlannedRun], client: Any = None) -> dict[str, PlanPrediction | str]:
    """plan id -> its predictions, or why they cannot be read (one line); each
    recommendation document is read once."""
    client = _client(client)
    docs: dict[str, dict | PlanError] = {}
    out: dict[str, PlanPrediction | str] = {}
    for r in runs:
        if r.plan_id in out:
            continue
        try:
            rec_id, rank = parse_plan_id(r.plan_id)
            if rec_id is None:
                raise PlanError(f"plan {r.plan_id} is a row of an unlogged recommendation")
            if rec_id not in docs:
                try:
                    docs[rec_id] = read_recommendation(rec_id, client)
                except PlanError as exc:
                    docs[rec_id] = exc
            doc = docs[rec_id]
            if isinstance(doc, PlanError):
                raise doc
            out[r.plan_id] = plan_of(doc, rec_id, rank, client)
        except (PlanError, ValueError) as exc:
            out[r.plan_id] = str(exc)
    return out
