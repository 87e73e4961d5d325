"""Which MLflow run tracking writes into: a given one, the active one, or a new one.

Only a run this module started is ended by it. Every MLflow call is guarded by the caller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunBinding:
    """The run tracking writes into, and whether tracking started (so must end) it."""

    run_id: str
    started_here: bool


def bind_run(run_id: str | None = None, run_name: str | None = None) -> RunBinding:
    """``run_id`` if given; else the active run (e.g. ``mlflow.autolog()``'s); else a new run.

    Raises whatever MLflow raises (the tracker turns it into one warning).
    """
    import mlflow

    if run_id:
        return RunBinding(run_id, started_here=False)
    active = mlflow.active_run()
    if active is not None:
        return RunBinding(active.info.run_id, started_here=False)
    run = mlflow.start_run(run_name=run_name)
    return RunBinding(run.info.run_id, started_here=True)


def end_run(binding: RunBinding, failed: bool) -> None:
    """End the run if tracking started it and it is still the active one."""
    if not binding.started_here:
        return
    import mlflow

    from mlflow_gpuopt.redact import no_url_echo

    active = mlflow.active_run()
    with no_url_echo(mlflow.get_tracking_uri()):  # MLflow would print the URI's password
        if active is not None and active.info.run_id == binding.run_id:
            mlflow.end_run(status="FAILED" if failed else "FINISHED")
        else:  # the user ended or switched runs inside the block: close ours by id
            from mlflow.tracking import MlflowClient

            MlflowClient().set_terminated(binding.run_id,
                                          status="FAILED" if failed else "FINISHED")
