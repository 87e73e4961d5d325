"""A plan as a SkyPilot task YAML (pure: returns text; SkyPilot itself is not imported).

The task asks for exactly the plan's machine (cloud, region, instance type, accelerators,
spot or on-demand) × ``num_nodes``, carries the plan's environment in ``envs`` and starts
``torchrun`` from the variables SkyPilot sets on every node: ``SKYPILOT_NODE_RANK``,
``SKYPILOT_NUM_NODES``, ``SKYPILOT_NUM_GPUS_PER_NODE`` and ``SKYPILOT_NODE_IPS`` (one address a
line; the first is the head node, the rendezvous master). ``workdir: .`` syncs the directory
``sky launch`` is run from, so the script path is relative to it. Arguments for the script go
in ``GPUOPT_SCRIPT_ARGS`` (``sky launch --env GPUOPT_SCRIPT_ARGS="--steps 1000" task.yaml``).
"""

from __future__ import annotations

import json

from mlflow_gpuopt.launch.context import (
    LaunchContext,
    LaunchError,
    plan_env,
    plan_summary,
    prediction_summary,
)
from mlflow_gpuopt.launch.plan_ids import SCRIPT_ARGS_ENV, SCRIPT_ENV
from mlflow_gpuopt.recommend.types import Candidate

#: Catalog provider -> SkyPilot cloud name (Colab is not a SkyPilot cloud).
SKYPILOT_CLOUDS = {"aws": "aws", "gcp": "gcp", "azure": "azure", "lambda": "lambda"}

#: Catalog GPU name -> SkyPilot accelerator name (as in SkyPilot's catalogs: ``sky show-gpus``).
#: SkyPilot names the 40 GB A100 ``A100`` and the 80 GB one ``A100-80GB``, whatever the form
#: factor; the H100 is ``H100`` in both forms.
SKYPILOT_ACCELERATORS = {
    "A10": "A10", "A10G": "A10G", "L4": "L4", "T4": "T4", "RTX-A6000": "A6000",
    "A100-40GB-PCIe": "A100", "A100-40GB-SXM4": "A100",
    "A100-80GB-PCIe": "A100-80GB", "A100-80GB-SXM4": "A100-80GB",
    "H100-PCIe-80GB": "H100", "H100-SXM5-80GB": "H100", "H200-SXM-141GB": "H200",
    "V100-SXM2-16GB": "V100", "V100-SXM2-32GB": "V100-32GB",
}

#: Regions that mean "any" in the catalog (Lambda's, Colab's): left for SkyPilot to choose.
_ANY_REGION = frozenset({"global", ""})


def skypilot_accelerator(gpu: str) -> str:
    """SkyPilot's name for a catalog GPU; :class:`LaunchError` if it has none."""
    try:
        return SKYPILOT_ACCELERATORS[gpu]
    except KeyError:
        raise LaunchError(f"no SkyPilot accelerator name known for {gpu}") from None


def _s(value: str) -> str:
    """A YAML double-quoted scalar (JSON string syntax is valid YAML)."""
    return json.dumps(value, ensure_ascii=False)


def _block(text: str, indent: str = "  ") -> list[str]:
    return [indent + line if line else "" for line in text.splitlines()]


def skypilot_yaml(plan: Candidate, ctx: LaunchContext) -> str:
    """The SkyPilot task YAML that launches ``plan``; :class:`LaunchError` if it cannot."""
    offer = plan.offer
    cloud = SKYPILOT_CLOUDS.get(offer.provider)
    if cloud is None:
        raise LaunchError(f"{offer.provider} plans cannot be launched by SkyPilot (not a "
                          "SkyPilot cloud); use --emit torchrun or pick another --plan")
    accel = f"{skypilot_accelerator(offer.gpu)}:{offer.gpu_count}"
    env = plan_env(plan, ctx)
    env[SCRIPT_ENV] = ctx.script or ""
    env[SCRIPT_ARGS_ENV] = ""
    name = "gpuopt-plan-" + "".join(ch if ch.isalnum() else "-" for ch in ctx.plan_id)
    lines = [
        f"# gpuopt plan {ctx.plan_id}: {ctx.description or plan_summary(plan)}",
        f"# {prediction_summary(plan)}",
        "# sky launch -c gpuopt THIS_FILE --env GPUOPT_SCRIPT_ARGS=\"--steps 1000\"",
    ]
    if not ctx.script:
        lines.append("# The measured run did not record its script: set GPUOPT_SCRIPT "
                     "(--env GPUOPT_SCRIPT=train.py).")
    lines += [
        f"name: {_s(name.lower()[:60])}",
        "",
        "resources:",
        f"  cloud: {cloud}",
    ]
    if offer.region.lower() not in _ANY_REGION:
        lines.append(f"  region: {_s(offer.region)}")
    lines += [
        f"  instance_type: {_s(offer.instance_type)}",
        f"  accelerators: {_s(accel)}",
        f"  use_spot: {'true' if plan.pricing == 'spot' else 'false'}",
        "",
        f"num_nodes: {plan.nodes}",
        "",
        "workdir: .",
        "",
        "envs:",
    ]
    lines += [f"  {k}: {_s(v)}" for k, v in env.items()]
    lines += ["", "setup: |"]
    lines += _block("\n".join(ctx.setup) or "true")
    run = "\n".join([
        "set -euo pipefail",
        'if [ -z "${GPUOPT_SCRIPT}" ]; then echo "set GPUOPT_SCRIPT (sky launch --env '
        'GPUOPT_SCRIPT=train.py)" >&2; exit 2; fi',
        'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
        "# GPUOPT_SCRIPT_ARGS is split on spaces on purpose: it holds the script's arguments.",
        'torchrun --nnodes "$SKYPILOT_NUM_NODES" '
        '--nproc-per-node "$SKYPILOT_NUM_GPUS_PER_NODE" --node-rank "$SKYPILOT_NODE_RANK" \\',
        f'  --master-addr "$MASTER_ADDR" --master-port {int(ctx.master_port)} '
        '"$GPUOPT_SCRIPT" $GPUOPT_SCRIPT_ARGS',
    ])
    lines += ["", "run: |"]
    lines += _block(run)
    return "\n".join(lines) + "\n"
