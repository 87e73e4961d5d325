"""The search every command plans with: the space of offers, the target in samples at
the global batch every plan keeps, and the ranked plans (pure, over the loaded catalog)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlflow_gpuopt.planning.inputs import PlanInputs
from mlflow_gpuopt.planning.target import TrainingTarget


def search_space(catalog: Any, *, providers: Sequence[str] = (), region: str | None = None,
                 spot: bool | None = None, max_gpus: int | None = None,
                 max_nodes: int | None = None, memory_headroom: float = 0.10,
                 tp_multiple: int = 1):
    """The :class:`~mlflow_gpuopt.recommend.SearchSpace` asked for (``max_nodes`` None: what
    the catalog's largest clusters allow; ``memory_headroom``: the share of each GPU's
    usable memory a plan leaves free at its predicted peak; ``tp_multiple``: what every
    plan's tensor-parallel degree is a multiple of), checked to match at least one
    offer (:class:`~mlflow_gpuopt.recommend.NoOffersError` otherwise)."""
    from mlflow_gpuopt.recommend import SearchSpace, filter_offers

    if max_nodes is None:
        max_nodes = max((o.max_nodes for o in catalog.offers), default=1)
    space = SearchSpace(providers=tuple(p.lower() for p in providers) or None,
                        region=region, spot=spot, max_gpus=max_gpus, max_nodes=max_nodes,
                        memory_headroom=memory_headroom, tp_multiple=tp_multiple)
    offers = filter_offers(catalog.offers, space, catalog.gpus)
    if tp_multiple > 1 and not any(o.gpu_count % tp_multiple == 0 for o in offers):
        from mlflow_gpuopt.errors import InputError

        raise InputError(f"--expert-tensor-parallel {tp_multiple} divides no offer's GPUs per "
                         f"node (at most {max(o.gpu_count for o in offers)}): tensor "
                         "parallelism, and the experts' within it, stays inside a node")
    return space


def make_target(inputs: PlanInputs, training_target: TrainingTarget, *,
                deadline_hours: float | None, confidence: float,
                global_batch: int | None = None, keep_micro_batch: bool = False):
    """The search's :class:`~mlflow_gpuopt.recommend.Target`: the training target in samples
    at the global batch every plan keeps (the user's; else, for a language model's workload
    file without its own measurements or planned from a proxy, LLM pre-training practice:
    :func:`mlflow_gpuopt.recommend.llm_batch.pretraining_global_batch`; else the measured
    run's), or each GPU keeping the measured per-GPU batch (``keep_micro_batch``)."""
    from mlflow_gpuopt.recommend import Target
    from mlflow_gpuopt.recommend.llm_batch import pretraining_global_batch

    # A workload file states no global batch: a language model's pre-training gets one (a
    # proxy's measured batch is the proxy's, not the bigger model's).
    unmeasured = inputs.proxy is not None or not (inputs.from_runs or inputs.observations)
    derived = (pretraining_global_batch(inputs.workload)
               if unmeasured and global_batch is None and not keep_micro_batch else None)
    plan_batch = global_batch or (derived.samples if derived else inputs.measured_global_batch)
    total = training_target.total_samples(tokens_per_sample=inputs.workload.tokens_per_sample,
                                          samples_per_step=plan_batch)
    return Target(total_samples=total, deadline_hours=deadline_hours, confidence=confidence,
                  per_rank_batch=inputs.per_rank_batch,
                  description=training_target.description,
                  global_batch=None if keep_micro_batch else plan_batch,
                  global_batch_asked=global_batch is not None,
                  global_batch_why=derived.why if derived else "")


def search(inputs: PlanInputs, predictor: Any, catalog: Any, target: Any, space: Any, *,
           with_scaling: bool = True):
    """The ranked plans for ``target`` over the catalog (pure)."""
    from mlflow_gpuopt.hardware import hardware_for_offer
    from mlflow_gpuopt.recommend import recommend

    return recommend(predictor, inputs.workload, catalog.offers, catalog.gpus, target,
                     hardware_for=hardware_for_offer, space=space, with_scaling=with_scaling)
