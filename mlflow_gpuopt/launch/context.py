"""What a launch artefact needs besides the plan: where to log, which script, which plan id.

:class:`LaunchContext` holds it; :func:`plan_env` turns plan + context into the environment the
job gets (``GPUOPT_PLAN``, ``GPUOPT_MICRO_BATCH`` …, see :mod:`.plan_ids`). Pure: the CLI
reads the tracking URI, the experiment and the source script and builds the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt.launch.plan_ids import (
    GRAD_ACCUM_ENV,
    MICRO_BATCH_ENV,
    PLAN_ENV,
    PRECISION_ENV,
    STRATEGY_ENV,
)
from mlflow_gpuopt.recommend.types import Candidate


class LaunchError(InputError):
    """A plan that this launcher cannot start (e.g. a Colab plan on SkyPilot)."""


@dataclass(frozen=True)
class LaunchContext:
    """Everything about the launch that is not in the plan.

    ``plan_id`` is ``<recommendation_run_id>:<rank>`` (or the bare rank when the
    recommendation was not logged). ``tracking_uri`` must be credential-free (see
    :func:`public_tracking_uri`). ``script`` is the training script as the job should see it
    (``None``: the user must set ``GPUOPT_SCRIPT``). ``master_port`` is the rendezvous TCP
    port on node 0. ``setup`` are shell lines that install the job's dependencies (SkyPilot's
    ``setup``).
    """

    plan_id: str
    tracking_uri: str | None = None
    experiment_name: str | None = None
    script: str | None = None
    master_port: int = 29500
    setup: tuple[str, ...] = ("pip install mlflow-gpuopt",)
    description: str = ""  # one line on the plan, for the artefact's header comment


def public_tracking_uri(uri: str | None) -> tuple[str | None, bool]:
    """``(uri without user:password@, whether credentials were removed)``.

    An artefact is a file the user may share or commit; the job gets its credentials from
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` / ``MLFLOW_TRACKING_TOKEN``
    in its own environment instead.
    """
    if not uri:
        return uri, False
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, False
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), True


def plan_env(plan: Candidate, ctx: LaunchContext) -> dict[str, str]:
    """The environment the launched job needs, in a stable order (str -> str)."""
    cfg = plan.config
    env: dict[str, str] = {}
    if ctx.tracking_uri:
        env["MLFLOW_TRACKING_URI"] = ctx.tracking_uri
    if ctx.experiment_name:
        env["MLFLOW_EXPERIMENT_NAME"] = ctx.experiment_name
    env[PLAN_ENV] = ctx.plan_id
    env[MICRO_BATCH_ENV] = str(cfg.micro_batch)
    env[GRAD_ACCUM_ENV] = str(cfg.grad_accum)
    if cfg.precision:
        env[PRECISION_ENV] = cfg.precision
    env[STRATEGY_ENV] = cfg.strategy
    return env


def plan_summary(plan: Candidate) -> str:
    """'2 × p4d.24xlarge (16 × A100-40GB-SXM4) aws us-east-1, ddp, mb 8 × 2, bf16, on-demand'."""
    from mlflow_gpuopt.recommend.explain import strategy_label

    cfg = plan.config
    return (f"{plan.nodes} × {plan.offer.instance_type} ({plan.gpus} × {plan.offer.gpu}) "
            f"{plan.offer.provider} {plan.offer.region}, {strategy_label(cfg)}, micro-batch "
            f"{cfg.micro_batch} × {cfg.grad_accum}, {cfg.precision}, "
            f"{plan.pricing.replace('_', '-')}")


def prediction_summary(plan: Candidate) -> str:
    """'predicted 3.2 h (2.9-3.6), $140.12, 5123 samples/s' for the header comment."""
    return (f"predicted {plan.hours:.3g} h ({plan.hours_low:.3g}-{plan.hours_high:.3g}), "
            f"${plan.cost_usd:,.2f} ({plan.pricing.replace('_', '-')}), "
            f"{plan.throughput_samples_per_s:.4g} samples/s")
