"""``advise``: what to change in the training script, each finding priced on a plan.

With a training target the run is fitted and searched as ``recommend`` does
(:mod:`.recommending`), and each finding is priced on the recommended plan; without one the
findings are listed unpriced. The same pricing feeds ``recommend``'s report
(:func:`advice_on_plan`), from the run it already read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt.planning.inputs import PlanInputs
from mlflow_gpuopt.planning.target import TrainingTarget


@dataclass(frozen=True)
class AdviseRequest:
    """What ``advise`` was asked (new options become fields with a default)."""

    run_id: str
    target: TrainingTarget | None = None
    deadline_hours: float | None = None
    confidence: float = 0.9
    log: bool = True


@dataclass(frozen=True)
class AdviseResult:
    """The advice document (``gpuopt/advice.json``) and whether logging it failed."""

    doc: dict[str, Any]
    log_error: str | None = None


def plan_summary(c: Any) -> dict[str, Any]:
    """The plan a finding is priced on, as the advice document names it."""
    from mlflow_gpuopt.recommend.explain import strategy_label

    return {"provider": c.offer.provider, "instance_type": c.offer.instance_type,
            "nodes": c.nodes, "gpus": c.config.gpus, "gpu": c.offer.gpu,
            "strategy": strategy_label(c.config), "micro_batch": c.config.micro_batch,
            "grad_accum": c.config.grad_accum, "precision": c.config.precision,
            "pricing": c.pricing, "hours": c.hours, "cost_usd": c.cost_usd}


def measured_spec(device: str):
    """The catalog's spec of the measured GPU, or ``None`` (a CPU, or a GPU it lacks)."""
    if device == "cpu":
        return None
    from mlflow_gpuopt.catalog import CatalogError, UnknownGpuError, load_gpus, resolve_gpu

    try:
        return load_gpus().get(resolve_gpu(device))
    except (CatalogError, UnknownGpuError):
        return None


def price_on_plan(facts: Any, rec: Any, predictor: Any, catalog: Any):
    """(findings priced on ``rec``'s winner — else its cheapest plan —, the plan's summary),
    or ``None`` when the search found no plan."""
    from mlflow_gpuopt.advice import PlanContext, advise_plan
    from mlflow_gpuopt.hardware import hardware_for_gpu, hardware_for_offer
    from mlflow_gpuopt.recommend import Costing

    plan = rec.winner or rec.cheapest
    if plan is None:
        return None
    spec = catalog.gpus[plan.offer.gpu]
    measured = measured_spec(facts.device)
    ctx = PlanContext(plan=plan, predictor=predictor,
                      hardware=hardware_for_offer(spec, plan.offer), spec=spec,
                      target=rec.target, costing=Costing(),
                      measured_hardware=None if measured is None else hardware_for_gpu(
                          measured, gpus_per_node=max(1, facts.world_size)))
    from mlflow_gpuopt.advice.worth import baseline_summary

    return advise_plan(facts, ctx), {**plan_summary(plan),
                                     "baseline": baseline_summary(ctx, facts)}


def advice_on_plan(inputs: PlanInputs, rec: Any, predictor: Any, catalog: Any):
    """The first measured run's findings priced on ``rec``'s plan (the report's advice
    section), from the run already read; ``None`` without a run or a plan."""
    from mlflow_gpuopt.advice import advice_doc

    facts = inputs.run_facts()
    priced = None if facts is None else price_on_plan(facts, rec, predictor, catalog)
    if priced is None:
        return None
    items, plan = priced
    return advice_doc(inputs.run_ids[0], items, plan)


def advise(request: AdviseRequest, catalog: Any = None) -> AdviseResult:
    """The advice document of the run, priced when a target is given, logged unless
    ``request.log`` is false (a failure to log is returned, not raised)."""
    from mlflow_gpuopt.advice import advice_doc, cheap_findings

    notes: list[str] = []
    plan = None
    if request.target is None:
        from mlflow_gpuopt.mlflow_io.advice import load_run_facts

        facts = load_run_facts(request.run_id)
        items = cheap_findings(facts, measured_spec(facts.device))
        notes.append("not priced: give a target (--epochs E --dataset-size N, --samples, "
                     "--tokens or --steps) to price each finding on the recommended plan")
    else:
        rec, predictor, catalog, facts = search_for_run(
            request.run_id, request.target, request.deadline_hours, request.confidence,
            catalog)
        priced = price_on_plan(facts, rec, predictor, catalog)
        if priced is None:
            items = cheap_findings(facts, measured_spec(facts.device))
            notes.append("not priced: no plan fits this target (see `mlflow gpuopt "
                         "recommend`)")
        else:
            items, plan = priced
            if rec.winner is None:
                notes.append("no plan meets the deadline: priced on the cheapest plan")
            notes.append(f"target: {rec.target.description} "
                         f"({rec.target.total_samples:,.0f} samples)")
    doc = advice_doc(request.run_id, items, plan, notes)
    log_error = None
    if request.log:
        from mlflow_gpuopt.mlflow_io.advice import log_advice

        try:
            log_advice(request.run_id, doc)
        except Exception as exc:  # a read-only store: the advice is shown all the same
            from mlflow_gpuopt.redact import one_line_reason

            log_error = one_line_reason(exc)
    return AdviseResult(doc=doc, log_error=log_error)


def search_for_run(run_id: str, training_target: TrainingTarget,
                   deadline_hours: float | None, confidence: float, catalog: Any = None):
    """(recommendation, predictor, catalog, the run's facts) for one run and target, as
    ``recommend`` computes it (without the scaling chart's points)."""
    from mlflow_gpuopt.planning.fitting import fit_runs
    from mlflow_gpuopt.planning.inputs import read_runs
    from mlflow_gpuopt.planning.searching import make_target, search, search_space

    if catalog is None:
        from mlflow_gpuopt.catalog import load_catalog

        catalog = load_catalog()
    inputs = read_runs((run_id,), catalog)
    target = make_target(inputs, training_target, deadline_hours=deadline_hours,
                         confidence=confidence)
    predictor = fit_runs(inputs.workload, inputs.observations, catalog)
    space = search_space(catalog)
    rec = search(inputs, predictor, catalog, target, space, with_scaling=False)
    return rec, predictor, catalog, inputs.run_facts()
