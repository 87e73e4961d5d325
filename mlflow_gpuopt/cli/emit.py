"""``recommend --emit {torchrun,skypilot} [--plan K] [--out PATH]``: the options, and the
lines that say where the artefact went. The artefact is made and written by
:mod:`mlflow_gpuopt.planning.emitting` (written before anything is logged)."""

from __future__ import annotations

from typing import Any

import click

from mlflow_gpuopt.planning.emitting import EMIT_CHOICES


def emit_options(command):
    """The ``--emit``, ``--plan``, ``--out``, ``--force`` and ``--script`` options."""
    options = [
        click.option("--emit", type=click.Choice(EMIT_CHOICES), default=None,
                     help="Write the launch artefact of one plan: a torchrun script or a "
                          "SkyPilot task YAML."),
        click.option("--plan", "plan_rank", default=None, metavar="K|PLAN_ID",
                     help="Plan to --emit: a rank of this result (default 1, the winner), or "
                          "a logged plan's id <recommendation_run_id>:<rank> (same workload "
                          "and target)."),
        click.option("--out", "out_path", metavar="PATH", default=None,
                     help="Where --emit writes (default ./gpuopt-plan<K>-torchrun.sh or "
                          "./gpuopt-plan<K>-skypilot.yaml)."),
        click.option("--force", is_flag=True,
                     help="Let --emit replace an existing file."),
        click.option("--script", metavar="PATH", default=None,
                     help="Training script for --emit (default: the one the measured run "
                          "recorded, MLflow's mlflow.source.name tag)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def print_lines(doc: dict[str, Any], out: Any) -> None:
    """The plan-id line and, after ``--emit``, where the artefact is and how to run it."""
    cands = doc["candidates"]
    if cands and cands[0].get("plan_id"):
        first = cands[0]["plan_id"]
        scheme = ("<recommendation run>:<rank>" if ":" in first
                  else "the rank (not logged)")
        click.echo(f"Plan ids: {scheme}, e.g. #1 = {first}; launch one with "
                   "--emit torchrun|skypilot --plan K", file=out)
    e = doc.get("emitted")
    if not e:
        return
    if e["kind"] == "torchrun":
        how = f"run it on each node: NODE_RANK=<rank> MASTER_ADDR=<node 0> bash {e['path']}"
    else:
        how = f"launch it: sky launch -c gpuopt {e['path']}"
    click.echo(f"Wrote the {e['kind']} launch artefact of plan {e['plan_id']} to {e['path']}; "
               f"{how}", file=out)
    for note in e["notes"]:
        click.echo(f"Note: {note}", file=out)
