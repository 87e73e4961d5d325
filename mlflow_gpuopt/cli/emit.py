"""``recommend --emit {torchrun,skypilot} [--plan K] [--out PATH]``: the options. The
artefact is made and written by :mod:`mlflow_gpuopt.planning.emitting` (before anything is
logged); the lines that say where it went by :mod:`mlflow_gpuopt.report.text`."""

from __future__ import annotations

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
