"""A time estimator for SkyPilot's optimizer, from our fitted model and price catalog.

SkyPilot picks the cheapest launchable resources by ``hourly price × estimated run time``
and, without an estimator, assumes one hour for every candidate: a 4× faster GPU then looks
4× dearer. :func:`skypilot_time_estimator` returns a callable for
``sky.Task.set_time_estimator`` that answers, for each ``sky.Resources``, the predicted
seconds of *compute* for the target (whole optimizer steps at the predicted median
throughput of the best-fitting plan on that machine × ``nodes``); SkyPilot adds its own
provisioning, and preemption overheads are not included.

    estimator = skypilot_time_estimator(run_id="…", target=2e9 / 2048, nodes=2)
    task.set_time_estimator(estimator)

A ``Resources`` is matched to a catalog offer by instance type (same cloud first, any region:
the machine, not the region, sets the speed), else by accelerator name and count. Resources
the catalog does not know raise :class:`LaunchError`, or get ``default_seconds`` when given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlflow_gpuopt.catalog.schema import GpuSpec, Offer
from mlflow_gpuopt.launch.context import LaunchError
from mlflow_gpuopt.launch.skypilot import SKYPILOT_ACCELERATORS, SKYPILOT_CLOUDS
from mlflow_gpuopt.perfmodel.types import Workload
from mlflow_gpuopt.recommend.types import Candidate, Predictor, SearchSpace, Target

_PROVIDER_OF_CLOUD = {v: k for k, v in SKYPILOT_CLOUDS.items()}


@dataclass(frozen=True)
class TimeEstimator:
    """``estimator(resources) -> seconds``: see the module docstring.

    ``plan_for`` / ``seconds_for`` are the same mapping on plain values (instance type,
    ``{"A100": 8}``, cloud name), for callers without SkyPilot.
    """

    predictor: Predictor
    workload: Workload
    offers: tuple[Offer, ...]
    gpus: Mapping[str, GpuSpec]
    target: Target
    nodes: int = 1
    default_seconds: float | None = None
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __call__(self, resources: Any) -> float:
        cloud = getattr(resources, "cloud", None)
        try:
            return self.seconds_for(instance_type=getattr(resources, "instance_type", None),
                                    accelerators=getattr(resources, "accelerators", None),
                                    cloud=str(cloud) if cloud is not None else None)
        except LaunchError:
            if self.default_seconds is None:
                raise
            return float(self.default_seconds)

    def seconds_for(self, *, instance_type: str | None = None,
                    accelerators: Mapping[str, float] | None = None,
                    cloud: str | None = None) -> float:
        """Predicted compute seconds for the target on this machine × ``nodes``."""
        plan = self.plan_for(instance_type=instance_type, accelerators=accelerators,
                             cloud=cloud)
        compute_hours = plan.hours - plan.startup_hours - plan.overhead_hours
        return compute_hours * 3600.0

    def plan_for(self, *, instance_type: str | None = None,
                 accelerators: Mapping[str, float] | None = None,
                 cloud: str | None = None) -> Candidate:
        """The cheapest plan (strategy, micro-batch) the model finds on the matched offer."""
        offer = self.offer_for(instance_type=instance_type, accelerators=accelerators,
                               cloud=cloud)
        key = (offer.provider, offer.instance_type, offer.gpu, offer.gpu_count)
        if key not in self._cache:
            self._cache[key] = self._best_plan(offer)
        return self._cache[key]

    def offer_for(self, *, instance_type: str | None = None,
                  accelerators: Mapping[str, float] | None = None,
                  cloud: str | None = None) -> Offer:
        """The catalog offer a SkyPilot resource stands for; :class:`LaunchError` if none."""
        provider = _PROVIDER_OF_CLOUD.get((cloud or "").strip().lower())
        if instance_type:
            found = [o for o in self.offers if o.instance_type == instance_type]
            if found:
                same = [o for o in found if o.provider == provider]
                return (same or found)[0]
        if accelerators:
            if len(accelerators) != 1:
                raise LaunchError(f"cannot estimate a mix of accelerators {dict(accelerators)}")
            (name, count), = accelerators.items()
            gpus = {g for g, sky_name in SKYPILOT_ACCELERATORS.items()
                    if sky_name.lower() == str(name).lower()}
            found = [o for o in self.offers if o.gpu in gpus and o.gpu_count == int(count)
                     and o.pricing == "on_demand" and o.provider in SKYPILOT_CLOUDS]
            if found:
                same = [o for o in found if o.provider == provider]
                # the cheapest such machine: SkyPilot compares prices, we only supply speed
                return min(same or found, key=lambda o: o.price_per_hour_usd)
        what = instance_type or (dict(accelerators) if accelerators else "no instance type")
        raise LaunchError(f"no catalog offer for {what} (cloud {cloud or 'any'}): the model "
                          "cannot estimate its time")

    def _best_plan(self, offer: Offer) -> Candidate:
        from mlflow_gpuopt.hardware import hardware_for_offer
        from mlflow_gpuopt.recommend import recommend

        if self.nodes > 1 and offer.max_nodes < self.nodes:
            raise LaunchError(f"{offer.provider} {offer.instance_type} offers at most "
                              f"{offer.max_nodes} node(s), not {self.nodes}")
        rec = recommend(self.predictor, self.workload, [offer], self.gpus, self.target,
                        hardware_for=hardware_for_offer,
                        space=SearchSpace(max_nodes=self.nodes, spot=False),
                        with_scaling=False)
        plans = [c for c in rec.candidates if c.nodes == self.nodes]
        if not plans:
            raise LaunchError(f"no plan of {self.nodes} × {offer.instance_type} fits this "
                              "workload (memory, or more nodes stop paying off)")
        return plans[0]


def _fitted(run_id: str, client: Any, catalog: Any) -> tuple[Predictor, Workload]:
    """The model fitted to the run, as ``recommend`` fits it (the one fit pipeline)."""
    from mlflow_gpuopt.planning.fitting import fit_runs
    from mlflow_gpuopt.planning.inputs import read_runs

    inputs = read_runs((run_id,), catalog, client=client)
    return fit_runs(inputs.workload, inputs.observations, catalog), inputs.workload


def skypilot_time_estimator(run_id: str | None = None, workload: Workload | None = None,
                            target: Target | float | None = None, *, nodes: int = 1,
                            default_seconds: float | None = None, catalog: Any = None,
                            client: Any = None) -> TimeEstimator:
    """A ``sky.Task.set_time_estimator`` callable: ``sky.Resources`` -> predicted seconds.

    Give the measured ``run_id`` (its fitted model) or a ``workload`` (the model's priors
    alone), and the ``target``: total samples (a number) or a :class:`Target`. ``nodes`` is
    the task's ``num_nodes``. ``catalog`` defaults to the installed price catalog, ``client``
    to an ``MlflowClient`` on the current tracking URI.
    """
    from mlflow_gpuopt.perfmodel import fit

    if (run_id is None) == (workload is None):
        raise ValueError("give run_id or workload, not both")
    if target is None:
        raise ValueError("give target: total samples, or a Target")
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1 (got {nodes})")
    if catalog is None:
        from mlflow_gpuopt.catalog import load_catalog

        catalog = load_catalog()
    if run_id is not None:
        predictor, workload = _fitted(run_id, client, catalog)
    else:
        predictor = fit(workload, [], {})
    if not isinstance(target, Target):
        per_rank = (workload.micro_batch or 1) * (workload.grad_accum or 1)
        target = Target(total_samples=float(target), per_rank_batch=per_rank)
    return TimeEstimator(predictor=predictor, workload=workload, offers=tuple(catalog.offers),
                         gpus=catalog.gpus, target=target, nodes=nodes,
                         default_seconds=default_seconds)


__all__: Sequence[str] = ("TimeEstimator", "skypilot_time_estimator")
