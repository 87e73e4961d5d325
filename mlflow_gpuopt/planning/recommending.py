"""Where a recommendation is made: ``plan(request) -> result``.

Inputs (runs or files) are read, the scaling model fitted (:func:`.fitting.fit_runs`), the
search run over the catalog, the measured run's advice priced on the chosen plan, and the
result logged to MLflow (unless asked not to) and emitted as a launch artefact when asked.
Bad input raises an :class:`~mlflow_gpuopt.errors.InputError` before anything is written.
A failure to log is not raised: the result carries it (``log_error``), so the caller can
show the recommendation all the same (``docs/cli.md``).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt.planning.emitting import EmitRequest
from mlflow_gpuopt.planning.inputs import PlanInputs
from mlflow_gpuopt.planning.target import TrainingTarget


@dataclass(frozen=True)
class RecommendRequest:
    """What ``recommend`` was asked, checked flag by flag (new options become fields with
    a default, so every existing caller keeps working)."""

    target: TrainingTarget
    run_ids: tuple[str, ...] = ()
    experiment: str | None = None
    workload_path: str | None = None
    observations_path: str | None = None
    #: workload.json of the smaller model the observations measured (a proxy)
    proxy_path: str | None = None
    #: a Hugging Face config.json's training sequence length (tokens)
    seq_len: int | None = None
    deadline_hours: float | None = None
    confidence: float = 0.9
    providers: tuple[str, ...] = ()
    region: str | None = None
    spot: bool | None = None
    max_gpus: int | None = None
    #: None: what the catalog's largest clusters allow
    max_nodes: int | None = None
    top: int = 20
    #: samples per optimizer step every plan keeps (None: the measured run's)
    global_batch: int | None = None
    keep_micro_batch: bool = False
    recompute: str | None = None
    #: share of each GPU's usable memory a plan leaves free at its predicted peak
    memory_headroom: float = 0.10
    log: bool = True
    emit: EmitRequest | None = None


@dataclass(frozen=True)
class RecommendResult:
    """The recommendation, what it was made from, and where it went."""

    recommendation: Any  # recommend.Recommendation
    predictor: Any
    inputs: PlanInputs
    #: the ``recommend --json`` document (docs/metrics.md), plan ids and emit record added
    doc: dict[str, Any]
    logged: Any = None  # mlflow_io.recommendation.LoggedRecommendation
    #: why logging failed (one line, redacted), or None
    log_error: str | None = None


def plan(request: RecommendRequest, catalog: Any = None) -> RecommendResult:
    """Read, fit, search, price advice, log and emit, as ``recommend`` does."""
    from mlflow_gpuopt.planning import emitting
    from mlflow_gpuopt.planning.advising import advice_on_plan
    from mlflow_gpuopt.planning.fitting import fit_runs
    from mlflow_gpuopt.planning.inputs import read_inputs
    from mlflow_gpuopt.planning.searching import make_target, search, search_space
    from mlflow_gpuopt.recommend import recommendation_dict

    if catalog is None:
        from mlflow_gpuopt.catalog import load_catalog

        catalog = load_catalog()
    space = search_space(catalog, providers=request.providers, region=request.region,
                         spot=request.spot, max_gpus=request.max_gpus,
                         max_nodes=request.max_nodes,
                         memory_headroom=request.memory_headroom)
    inputs = read_inputs(run_ids=request.run_ids, experiment=request.experiment,
                         workload_path=request.workload_path,
                         observations_path=request.observations_path,
                         seq_len=request.seq_len, proxy_path=request.proxy_path,
                         catalog=catalog).with_recompute(request.recompute)
    logged_row = emitting.check_logged_plan(request.emit, inputs.workload)
    target = make_target(inputs, request.target, deadline_hours=request.deadline_hours,
                         confidence=request.confidence, global_batch=request.global_batch,
                         keep_micro_batch=request.keep_micro_batch)
    predictor = fit_runs(inputs.workload, inputs.observations, catalog, proxy=inputs.proxy,
                         source=", ".join(inputs.run_ids) or str(request.proxy_path))
    rec = search(inputs, predictor, catalog, target, space)

    doc = recommendation_dict(rec, top=request.top)
    if rec.winner is None and rec.candidates and request.deadline_hours is not None:
        alts = _deadline_alternatives(inputs, predictor, catalog, target, space,
                                      batch_may_change=request.target.steps is None)
        doc["deadline_alternatives"] = [a.as_dict() for a in alts]
        doc["notes"] = [*doc["notes"], *(a.line() for a in alts)]
    doc["source_run_ids"] = list(inputs.run_ids)
    if not inputs.from_runs and request.log:
        doc["notes"].append(
            "not logged to MLflow: planned from --workload, there is no run to nest it under")
    doc["model_assumptions"] = list(getattr(predictor, "assumptions", ()) or ())
    doc["notes"] = [*inputs.notes, *doc["notes"]]
    if inputs.proxy is not None:  # say where the speed came from, in the printed notes too
        doc["notes"][:0] = [a for a in doc["model_assumptions"]
                            if a.startswith("transferred from proxy")]
    if inputs.from_runs and rec.candidates and inputs.proxy is None:
        doc["advice"] = advice_on_plan(inputs, rec, predictor, catalog)
    emitting.check_plan(request.emit, doc, logged_row)
    found_rank = emitting.find_logged_plan(request.emit, rec, logged_row)

    will_log = request.log and bool(rec.candidates) and inputs.from_runs
    # The artefact is written (to a temporary file beside --out) before anything is logged:
    # a directory that refuses it, or a full disk, leaves the store as it was.
    staged = emitting.stage(request.emit, rec, doc, inputs.run_ids, found_rank,
                            logging=will_log)
    logged = log_error = None
    with emitting.unstaged_on_error(staged):
        if will_log:
            try:
                logged = _log(doc, rec, inputs)
            except Exception as exc:  # a full disk, a read-only store, a refused write
                from mlflow_gpuopt.redact import one_line_reason

                log_error = one_line_reason(exc)
            else:
                doc["mlflow_run_id"] = logged.run_id
        emitting.finish(staged, doc, logged)
    return RecommendResult(recommendation=rec, predictor=predictor, inputs=inputs, doc=doc,
                           logged=logged, log_error=log_error)


def _deadline_alternatives(inputs: PlanInputs, predictor: Any, catalog: Any, target: Any,
                           space: Any, *, batch_may_change: bool):
    """When no plan meets the deadline: the reruns a user would try next (what binds;
    :func:`mlflow_gpuopt.recommend.shortfall.alternatives`), each searched once."""
    from mlflow_gpuopt.planning.searching import search
    from mlflow_gpuopt.recommend.llm_batch import larger_global_batch
    from mlflow_gpuopt.recommend.shortfall import alternatives

    return alternatives(
        lambda t, s: search(inputs, predictor, catalog, t, s, with_scaling=False),
        target, space, max_nodes=max((o.max_nodes for o in catalog.offers), default=1),
        larger_batch=larger_global_batch(inputs.workload, target.global_batch),
        batch_may_change=batch_may_change)


def _log(doc: dict[str, Any], rec: Any, inputs: PlanInputs):
    """Log ``doc`` with its charts and HTML report nested under the first source run."""
    from mlflow_gpuopt.mlflow_io.recommendation import log_recommendation
    from mlflow_gpuopt.report import pareto_png, render_html, scaling_png

    gpus = {p.gpu for p in rec.scaling}
    # a proxy's measurements are of another model: not drawn on this model's scaling curves
    measured = () if inputs.proxy is not None else inputs.observations
    charts = {"pareto": pareto_png(rec),
              "scaling": scaling_png(rec.scaling, [o for o in measured if o.gpu in gpus])}
    html = render_html(doc, charts, title=f"GPU recommendation for {inputs.workload.name}",
                       source="Measured runs: " + ", ".join(inputs.run_ids))
    # MLflow prints "View run … at: <url>" on stdout for HTTP stores; stdout is the
    # command's (--json).
    with contextlib.redirect_stdout(sys.stderr):
        return log_recommendation(doc, source_run_ids=list(inputs.run_ids), charts=charts,
                                  report_html=html)
