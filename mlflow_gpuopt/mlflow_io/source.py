"""What a launch artefact needs from MLflow: the training script a run recorded, its
experiment, and the tracking URI a job logs to."""

from __future__ import annotations

import os

#: Names MLflow records as ``mlflow.source.name`` that are not a script one can relaunch.
NOT_A_SCRIPT = ("ipykernel_launcher.py",)


def recorded_source(run_id: str) -> tuple[str | None, str | None]:
    """(training script recorded by the run, its experiment's name); ``None`` where unknown."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient()
        run = client.get_run(run_id)
        experiment = client.get_experiment(run.info.experiment_id).name
    except MlflowException:
        return None, None
    name = run.data.tags.get("mlflow.source.name") or ""
    ok = name.endswith(".py") and os.path.basename(name) not in NOT_A_SCRIPT
    return (name if ok else None), experiment


def current_tracking_uri() -> str:
    """The current tracking URI, local paths made absolute (a job runs elsewhere)."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + os.path.abspath(uri[len("sqlite:///"):])
    elif "://" not in uri and not uri.startswith(("databricks", "file:")):
        uri = os.path.abspath(uri)
    return uri
