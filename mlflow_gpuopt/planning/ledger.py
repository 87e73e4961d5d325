"""``accuracy``: every run launched as a plan held against that plan's predictions, and
against a refit of the model with the measured runs included (leave-one-out: the refit that
scores a run never saw that run). The rows and totals are :mod:`mlflow_gpuopt.launch.ledger`'s.
"""

from __future__ import annotations

from typing import Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.errors import InputError


def _refit(plan, run_ids: tuple[str, ...], catalog, cache: dict) -> Any:
    """The plan's throughput predicted by a model fitted on ``run_ids``; a reason if none."""
    from mlflow_gpuopt.hardware import hardware_for_gpu
    from mlflow_gpuopt.launch.ledger import Refit
    from mlflow_gpuopt.perfmodel.types import ParallelConfig
    from mlflow_gpuopt.planning.fitting import fit_runs
    from mlflow_gpuopt.planning.inputs import read_runs

    if not run_ids:
        return "no run to fit on"
    try:
        if run_ids not in cache:
            inputs = read_runs(run_ids, catalog)
            cache[run_ids] = fit_runs(inputs.workload, inputs.observations, catalog)
        predictor = cache[run_ids]
        spec = catalog.gpu(plan.gpu)
        offers = [o for o in catalog.offers if o.provider == plan.provider
                  and o.instance_type == plan.instance_type and o.gpu == spec.name]
        offer = next((o for o in offers if o.region == plan.region), offers[0] if offers
                     else None)
        per_node = plan.gpus_per_node or max(1, (plan.gpus or 1) // max(1, plan.nodes or 1))
        hardware = hardware_for_gpu(spec, gpus_per_node=offer.gpu_count if offer else per_node,
                                    offer=offer)
        config = ParallelConfig(gpus_per_node=per_node, nodes=plan.nodes or 1,
                                strategy=plan.strategy or "ddp", micro_batch=plan.micro_batch,
                                grad_accum=plan.grad_accum or 1, precision=plan.precision,
                                activation_checkpointing=plan.activation_checkpointing,
                                tp=plan.tp, pp=plan.pp)
        pred = predictor.predict(config, hardware)
    except InputError as exc:  # an unreadable run, a model that cannot be fitted
        return f"refit failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return Refit(pred.throughput_samples_per_s, pred.low, pred.high, run_ids)


def build_ledger(experiment: str, catalog: Any = None) -> dict[str, Any]:
    """The ledger of ``experiment`` as JSON-ready dict; :class:`InputError` if it has none."""
    from mlflow_gpuopt.launch.ledger import ledger_row, ledger_totals, refit_run_ids
    from mlflow_gpuopt.launch.plan_check import PlanPrediction
    from mlflow_gpuopt.mlflow_io.plans import planned_runs_in_experiment, plans_for

    runs = planned_runs_in_experiment(experiment)
    if not runs:
        raise InputError(f"experiment {experiment!r} has no runs launched as a plan (tag "
                         f"{contract.TAG_PLAN}); launch one with `mlflow gpuopt recommend "
                         "... --emit torchrun`")
    plans = plans_for(runs)
    notes: list[str] = []
    pairs = []
    for r in runs:
        plan = plans[r.plan_id]
        measured = r.metrics.get(contract.SUMMARY_THROUGHPUT_SAMPLES)
        if not isinstance(plan, PlanPrediction):
            notes.append(f"run {r.run_id}: {plan}")
        elif not measured:
            notes.append(f"run {r.run_id}: no measured throughput "
                         f"({contract.SUMMARY_THROUGHPUT_SAMPLES}); did it finish?")
        else:
            pairs.append((r, plan, measured))
    if not pairs:
        raise InputError(f"experiment {experiment!r} has no (plan, measured run) pairs: "
                         + "; ".join(notes))
    if catalog is None:
        from mlflow_gpuopt.catalog import load_catalog

        catalog = load_catalog()
    measured_ids = [r.run_id for r, _, _ in pairs
                    if contract.PARAM_FLOPS_PER_SAMPLE in r.params]
    cache: dict = {}
    rows = [ledger_row(r.run_id, r.run_name, plan, measured,
                       _refit(plan, refit_run_ids(plan, r.run_id, measured_ids), catalog, cache))
            for r, plan, measured in pairs]
    return {"experiment": experiment, "pairs": [row.to_dict() for row in rows],
            "totals": ledger_totals(rows), "notes": notes}
