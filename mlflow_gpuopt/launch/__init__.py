"""From a ranked plan to a running job: launch artefacts and SkyPilot's time estimator.

* :func:`torchrun_script` / :func:`skypilot_yaml`: a plan (:class:`~mlflow_gpuopt.recommend.Plan`)
  and a :class:`LaunchContext` in, the text of a bash script / SkyPilot task YAML out (pure;
  the CLI writes the file).
* :func:`plan_id` / :func:`parse_plan_id`: ``<recommendation_run_id>:<rank>`` names a plan.
* :func:`skypilot_time_estimator`: ``sky.Resources`` -> predicted seconds, for
  ``sky.Task.set_time_estimator``.
"""

from mlflow_gpuopt.launch.context import LaunchContext, LaunchError, plan_env, public_tracking_uri
from mlflow_gpuopt.launch.estimator import TimeEstimator, skypilot_time_estimator
from mlflow_gpuopt.launch.plan_ids import PLAN_ENV, parse_plan_id, plan_id
from mlflow_gpuopt.launch.skypilot import skypilot_accelerator, skypilot_yaml
from mlflow_gpuopt.launch.torchrun import torchrun_script

__all__ = [
    "LaunchContext", "LaunchError", "PLAN_ENV", "TimeEstimator", "parse_plan_id", "plan_env",
    "plan_id", "public_tracking_uri", "skypilot_accelerator", "skypilot_time_estimator",
    "skypilot_yaml", "torchrun_script",
]
