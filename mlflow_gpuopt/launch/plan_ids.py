"""How a ranked plan is named, and the environment variables a launched job reads.

A plan of a *logged* recommendation is ``<recommendation_run_id>:<rank>``: the MLflow run
that holds ``gpuopt/recommendation.json`` plus the plan's 1-based rank in its ``candidates``.
Every ranked plan has one, also those beyond the few that get a child run. A recommendation
made with ``--no-log`` has no run: its plans are named by their rank alone (``"3"``), which
only means something next to the printed result it came from.
"""

from __future__ import annotations

import re

#: The plan a job was launched as (``<recommendation_run_id>:<rank>`` or ``<rank>``).
PLAN_ENV = "GPUOPT_PLAN"
#: The plan's per-GPU micro-batch (samples per forward), optimizer-step accumulation,
#: precision (fp32 | tf32 | fp16 | bf16) and strategy (single | ddp | zero1..3 | fsdp | tp | pp).
MICRO_BATCH_ENV = "GPUOPT_MICRO_BATCH"
GRAD_ACCUM_ENV = "GPUOPT_GRAD_ACCUM"
PRECISION_ENV = "GPUOPT_PRECISION"
STRATEGY_ENV = "GPUOPT_STRATEGY"
#: The training script the launch artefacts start, and (SkyPilot) its arguments.
SCRIPT_ENV = "GPUOPT_SCRIPT"
SCRIPT_ARGS_ENV = "GPUOPT_SCRIPT_ARGS"

_PLAN_ID = re.compile(r"^(?:(?P<run>[0-9A-Za-z_\-]+):)?(?P<rank>[1-9][0-9]*)$")


def plan_id(recommendation_run_id: str | None, rank: int) -> str:
    """``<run_id>:<rank>`` for a logged recommendation, ``<rank>`` for an unlogged one."""
    if rank < 1:
        raise ValueError(f"a plan rank starts at 1 (got {rank})")
    return f"{recommendation_run_id}:{rank}" if recommendation_run_id else str(rank)


def parse_plan_id(text: str) -> tuple[str | None, int]:
    """``(recommendation_run_id or None, rank)`` of a plan id; ``ValueError`` if malformed."""
    m = _PLAN_ID.match(text.strip())
    if not m:
        raise ValueError(f"not a plan id: {text!r} (expected <recommendation_run_id>:<rank> "
                         "or <rank>)")
    return m.group("run"), int(m.group("rank"))
