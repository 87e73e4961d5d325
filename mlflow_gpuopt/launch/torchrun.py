"""A plan as a bash script that starts it with ``torchrun`` on every node (pure: returns text).

Run the same script on each node with that node's ``NODE_RANK`` and node 0's address::

    NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash launch.sh --steps 1000   # on node 0
    NODE_RANK=1 MASTER_ADDR=10.0.0.1 bash launch.sh --steps 1000   # on node 1

Arguments after the script name go to the training script. The node count and processes per
node are the plan's and fixed; so are the plan id, micro-batch, accumulation, precision and
strategy exported as ``GPUOPT_*`` (the job is a measurement *of this plan*).
``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ``MASTER_PORT`` and ``GPUOPT_SCRIPT`` keep
a value already set in the environment.
"""

from __future__ import annotations

import shlex

from mlflow_gpuopt.launch.context import (
    LaunchContext,
    plan_env,
    plan_summary,
    prediction_summary,
)
from mlflow_gpuopt.launch.plan_ids import SCRIPT_ENV
from mlflow_gpuopt.recommend.types import Candidate

#: Variables the user may set before running the script (the rest are the plan's).
_OVERRIDABLE = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")


def strategy_hint(plan: Candidate) -> str:
    """How the training script should apply the plan's strategy (the launch line's comment)."""
    _, _, comment = plan.launch.partition("#")
    return comment.strip()


def torchrun_script(plan: Candidate, ctx: LaunchContext) -> str:
    """The bash script that launches ``plan`` (see the module docstring for its use)."""
    q = shlex.quote
    cfg = plan.config
    lines = [
        "#!/usr/bin/env bash",
        f"# gpuopt plan {ctx.plan_id}: {ctx.description or plan_summary(plan)}",
        f"# {prediction_summary(plan)}",
        f"# Run on each of the {plan.nodes} node(s): NODE_RANK=<0..{plan.nodes - 1}> "
        "MASTER_ADDR=<node 0's address> bash THIS_SCRIPT [training script arguments]",
    ]
    hint = strategy_hint(plan)
    if hint:
        lines.append(f"# The training script should run it as: {hint}")
    lines += [
        "# GPUOPT_MICRO_BATCH / GPUOPT_GRAD_ACCUM / GPUOPT_PRECISION / GPUOPT_STRATEGY carry the",
        "# plan's settings; the gpuopt examples read them, your script may too.",
        "set -euo pipefail",
        "",
        f"NNODES={plan.nodes}",
        f"NPROC_PER_NODE={cfg.gpus_per_node}",
        'NODE_RANK="${NODE_RANK:-0}"',
        'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"',
        f'MASTER_PORT="${{MASTER_PORT:-{int(ctx.master_port)}}}"',
        "",
    ]
    for name, value in plan_env(plan, ctx).items():
        if name in _OVERRIDABLE:
            lines.append(f"{name}=${{{name}:-{q(value)}}}")
        else:
            lines.append(f"{name}={q(value)}")
        lines.append(f"export {name}")
    lines.append("")
    if ctx.script:
        lines.append(f"SCRIPT=${{{SCRIPT_ENV}:-{q(ctx.script)}}}")
    else:
        lines += [
            "# The measured run did not record its script: set GPUOPT_SCRIPT to the training",
            "# script (or pass --script to `mlflow gpuopt recommend --emit`).",
            f'SCRIPT="${{{SCRIPT_ENV}:-}}"',
            'if [ -z "$SCRIPT" ]; then',
            f'  echo "set {SCRIPT_ENV}=path/to/train.py: the plan\'s run did not record its'
            ' training script" >&2',
            "  exit 2",
            "fi",
        ]
    lines += [
        "",
        'exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" '
        '--node-rank "$NODE_RANK" \\',
        '  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$SCRIPT" "$@"',
        "",
    ]
    return "\n".join(lines)
