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
from dataclasses import dataclass, replace
from typing import Any

from mlflow_gpuopt.planning.emitting import EmitRequest
from mlflow_gpuopt.planning.inputs import PlanInputs, RunOptions
from mlflow_gpuopt.planning.target import TrainingTarget
from mlflow_gpuopt.recommend.result import PlanResult


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
    #: how the job runs, over the workload's own (``predict`` takes the same)
    run: RunOptions = RunOptions()
    #: share of each GPU's usable memory a plan leaves free at its predicted peak
    memory_headroom: float = 0.10
    log: bool = True
    emit: EmitRequest | None = None


@dataclass(frozen=True)
class RecommendResult:
    """The recommendation, what it was made from, and where it went."""

    #: the answer, typed, with what each stage added (notes, alternatives, plan ids, ...)
    plan_result: PlanResult
    predictor: Any
    inputs: PlanInputs
    logged: Any = None  # mlflow_io.recommendation.LoggedRecommendation
    #: why logging failed (one line, redacted), or None
    log_error: str | None = None

    @property
    def recommendation(self) -> Any:
        """The search's answer (``recommend.Recommendation``)."""
        return self.plan_result.recommendation

    @property
    def doc(self) -> dict[str, Any]:
        """The ``recommend --json`` document (docs/metrics.md)."""
        from mlflow_gpuopt.report.document import recommendation_document

        return recommendation_document(self.plan_result)


def plan(request: RecommendRequest, catalog: Any = None) -> RecommendResult:
    """Read, fit, search, price advice, log and emit, as ``recommend`` does."""
    from mlflow_gpuopt.planning import emitting
    from mlflow_gpuopt.planning.fitting import fit_runs
    from mlflow_gpuopt.planning.inputs import read_inputs
    from mlflow_gpuopt.planning.searching import make_target, search, search_space

    if catalog is None:
        from mlflow_gpuopt.catalog import load_catalog

        catalog = load_catalog()
    space = search_space(catalog, providers=request.providers, region=request.region,
                         spot=request.spot, max_gpus=request.max_gpus,
                         max_nodes=request.max_nodes,
                         memory_headroom=request.memory_headroom,
                         tp_multiple=request.run.expert_tensor_parallel or 1)
    inputs = read_inputs(run_ids=request.run_ids, experiment=request.experiment,
                         workload_path=request.workload_path,
                         observations_path=request.observations_path,
                         seq_len=request.seq_len, proxy_path=request.proxy_path,
                         catalog=catalog).with_recompute(request.recompute)
    inputs = replace(inputs, workload=request.run.applied_to(inputs.workload))
    logged_row = emitting.check_logged_plan(request.emit, inputs.workload)
    target = make_target(inputs, request.target, deadline_hours=request.deadline_hours,
                         confidence=request.confidence, global_batch=request.global_batch,
                         keep_micro_batch=request.keep_micro_batch)
    predictor = fit_runs(inputs.workload, inputs.observations, catalog, proxy=inputs.proxy,
                         source=", ".join(inputs.run_ids) or str(request.proxy_path))
    rec = search(inputs, predictor, catalog, target, space)

    result = _described(request, inputs, predictor, catalog, rec, target, space)
    emitting.check_plan(request.emit, result.listed, logged_row)
    found_rank = emitting.find_logged_plan(request.emit, rec, logged_row)

    will_log = request.log and bool(rec.candidates) and inputs.from_runs
    # The artefact is written (to a temporary file beside --out) before anything is logged:
    # a directory that refuses it, or a full disk, leaves the store as it was.
    staged = emitting.stage(request.emit, rec, inputs.run_ids, found_rank, logging=will_log)
    logged = log_error = None
    with emitting.unstaged_on_error(staged):
        if will_log:
            try:
                logged = _log(result, inputs)
            except Exception as exc:  # a full disk, a read-only store, a refused write
                from mlflow_gpuopt.redact import one_line_reason

                log_error = one_line_reason(exc)
            else:
                result = replace(result, mlflow_run_id=logged.run_id)
        result = emitting.finish(staged, result, logged)
    return RecommendResult(plan_result=result, predictor=predictor, inputs=inputs,
                           logged=logged, log_error=log_error)


def _described(request: RecommendRequest, inputs: PlanInputs, predictor: Any, catalog: Any,
               rec: Any, target: Any, space: Any) -> PlanResult:
    """The search's answer with what the inputs, a missed deadline and the run's advice
    add: notes (the proxy's transfer, the inputs', the search's, the alternatives'), source
    runs, the model's assumptions."""
    from mlflow_gpuopt.planning.advising import advice_on_plan

    result = PlanResult.of(rec, top=request.top)
    notes = list(rec.notes)
    if rec.winner is None and rec.candidates and request.deadline_hours is not None:
        alts = tuple(_deadline_alternatives(inputs, predictor, catalog, target, space,
                                            batch_may_change=request.target.steps is None))
        result = replace(result, deadline_alternatives=alts)
        notes += [a.line() for a in alts]
    if not inputs.from_runs and request.log:
        notes.append(
            "not logged to MLflow: planned from --workload, there is no run to nest it under")
    assumptions = tuple(getattr(predictor, "assumptions", ()) or ())
    # say where the speed came from, in the printed notes too
    transfer = [a for a in assumptions if a.startswith("transferred from proxy")] \
        if inputs.proxy is not None else []
    result = replace(result, notes=(*transfer, *inputs.notes, *notes),
                     source_run_ids=tuple(inputs.run_ids), model_assumptions=assumptions)
    if inputs.from_runs and rec.candidates and inputs.proxy is None:
        result = replace(result, with_advice=True,
                         advice=advice_on_plan(inputs, rec, predictor, catalog))
    return result


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


def _log(result: PlanResult, inputs: PlanInputs):
    """Log ``result`` with its charts and HTML report nested under the first source run."""
    from mlflow_gpuopt.mlflow_io.recommendation import log_recommendation
    from mlflow_gpuopt.report import pareto_png, render_html, scaling_png
    from mlflow_gpuopt.report.document import recommendation_document

    rec = result.recommendation
    gpus = {p.gpu for p in rec.scaling}
    # a proxy's measurements are of another model: not drawn on this model's scaling curves
    measured = () if inputs.proxy is not None else inputs.observations
    charts = {"pareto": pareto_png(rec),
              "scaling": scaling_png(rec.scaling, [o for o in measured if o.gpu in gpus])}
    html = render_html(recommendation_document(result), charts,
                       title=f"GPU recommendation for {inputs.workload.name}",
                       source="Measured runs: " + ", ".join(inputs.run_ids))
    # MLflow prints "View run … at: <url>" on stdout for HTTP stores; stdout is the
    # command's (--json).
    with contextlib.redirect_stdout(sys.stderr):
        return log_recommendation(result, charts=charts, report_html=html)
