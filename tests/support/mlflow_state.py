"""MLflow's process-wide fluent state, put back between tests.

``mlflow.set_experiment`` and ``mlflow.set_tracking_uri`` remember an experiment id and a URI
for the whole process; a later test's fresh store has no such experiment, and a stale URI
would win over the ``MLFLOW_TRACKING_URI`` that test sets.
"""

from __future__ import annotations

import sys


def reset_mlflow_globals() -> None:
    """End the active runs, forget the tracking URI and the active experiment (what MLflow
    loaded; importing it here would cost the tests that never use it)."""
    if "mlflow" not in sys.modules:
        return
    import mlflow

    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)  # (and unsets MLFLOW_TRACKING_URI: the caller restores it)
    # MLflow has no public call that forgets ``set_experiment``'s id (3.x): its own test suite
    # resets this attribute the same way (its tests/tracking/conftest.py, reset_active_experiment).
    # It is the only private name of MLflow the tests touch; keep it here.
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is not None:
        fluent._active_experiment_id = None
