"""A tracked job that knows its plan: tags, the plan's predictions, the ratios at the end.

The plan id comes from ``track(plan=...)`` or ``GPUOPT_PLAN`` (the launch artefacts set it).
Its tags go on the run at start (parsing the id needs no I/O); the plan's predictions are read
from the recommendation run on a daemon thread, so a slow or unreachable tracking server never
holds up training; at the end the tracker waits for them at most ``wait_s`` seconds. Any
failure is one warning and the run goes on without predictions. MLflow reads and writes are
in :mod:`mlflow_gpuopt.mlflow_io.plans`.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Callable

from mlflow_gpuopt import contract
from mlflow_gpuopt.launch.plan_check import (
    Measured,
    PlanPrediction,
    outlier_line,
    prediction_metrics,
    prediction_ratios,
)
from mlflow_gpuopt.launch.plan_ids import PLAN_ENV, parse_plan_id
from mlflow_gpuopt.tracking._warn import WarnOnce

if TYPE_CHECKING:
    from mlflow_gpuopt.tracking.summary import TrackSummary


def plan_id_for(explicit: str | None) -> str | None:
    """``track(plan=...)`` if given, else ``$GPUOPT_PLAN``; ``None`` when neither is set."""
    pid = (explicit or os.environ.get(PLAN_ENV) or "").strip()
    return pid or None


def plan_tags(plan_id: str) -> dict[str, str]:
    """The run tags of a job launched as ``plan_id`` (no I/O); ``{}`` if it is not a plan id."""
    try:
        rec_id, rank = parse_plan_id(plan_id)
    except ValueError:
        return {}
    tags = {contract.TAG_PLAN: plan_id, contract.TAG_PLAN_RANK: str(rank)}
    if rec_id:
        tags[contract.TAG_RECOMMENDATION_RUN_ID] = rec_id
    return tags


class PlanLink:
    """Reads the plan of a job's run in the background and logs its predictions.

    Args:
        plan_id: the plan the job was launched as.
        run_id: the job's run.
        set_tags / log_metrics: the tracker's writer calls (asynchronous, never raise).
        warn: the tracker's one-time warnings.
        reader / linker: ``plan_id -> PlanPrediction`` and ``(plan, run_id) -> None``
            (default: :func:`~mlflow_gpuopt.mlflow_io.plans.read_plan` / ``link_job``).
    """

    def __init__(self, plan_id: str, run_id: str, set_tags: Callable[[dict], None],
                 log_metrics: Callable[[dict[str, float], int], None], warn: WarnOnce,
                 reader: Callable[[str], PlanPrediction] | None = None,
                 linker: Callable[[PlanPrediction, str], Any] | None = None) -> None:
        self.plan_id = plan_id
        self.run_id = run_id
        self.plan: PlanPrediction | None = None
        self._set_tags = set_tags
        self._log_metrics = log_metrics
        self._warn = warn
        self._reader = reader
        self._linker = linker
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PlanLink:
        tags = plan_tags(self.plan_id)
        if not tags:
            self._warn("plan", "%s=%r is not a plan id (<recommendation_run_id>:<rank>); the "
                       "run is not linked to a plan", PLAN_ENV, self.plan_id)
            self._done.set()
            return self
        self._set_tags(tags)
        self._thread = threading.Thread(target=self._read, name="gpuopt-plan", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        try:
            if self._reader is None or self._linker is None:
                from mlflow_gpuopt.mlflow_io.plans import link_job, read_plan

                self._reader = self._reader or read_plan
                self._linker = self._linker or link_job
            plan = self._reader(self.plan_id)
            if plan.plan_run_id:
                self._set_tags({contract.TAG_PLAN_RUN_ID: plan.plan_run_id})
            self._log_metrics(prediction_metrics(plan), 0)
            self.plan = plan
            try:
                self._linker(plan, self.run_id)
            except Exception as exc:
                self._warn("plan-link", "could not point plan %s's run at this run: %s",
                           self.plan_id, exc)
        except Exception as exc:
            self._warn("plan", "plan %s's predictions are unavailable, the run is not "
                       "compared with them: %s", self.plan_id, exc)
        finally:
            self._done.set()

    def wait(self, wait_s: float) -> PlanPrediction | None:
        """The plan's predictions once read (waiting at most ``wait_s``), else ``None``."""
        if not self._done.wait(wait_s):
            self._warn("plan", "plan %s's predictions were not read within %.0f s; the run "
                       "is not compared with them", self.plan_id, wait_s)
            return None
        return self.plan


def plan_comparison(plan: PlanPrediction, summary: TrackSummary, workload: dict[str, Any],
                    cpu_utilization_mean_percent: float | None,
                    exposed_comm_fraction: float | None) -> tuple[dict[str, float], str | None]:
    """The plan's predictions again (so each is a flat line over the run) with the ratios
    measured / predicted, and the one line said when the job fell outside the plan's interval
    (``None`` inside it). ``workload``: the run's workload params."""
    s = summary
    mb = workload.get(contract.PARAM_MICRO_BATCH)
    measured = Measured(
        throughput_samples_per_s=s.steady.throughput_samples_per_s,
        step_time_s=s.steady.step_time_mean_s,
        peak_memory_per_gpu_bytes=s.peak_memory_bytes if s.device != "cpu" else None,
        gpu_utilization_percent=s.gpu_utilization_mean_percent,
        cpu_utilization_percent=cpu_utilization_mean_percent,
        exposed_comm_fraction=exposed_comm_fraction,
        micro_batch=int(mb) if mb else None, precision=workload.get(contract.PARAM_PRECISION))
    return ({**prediction_metrics(plan), **prediction_ratios(measured, plan)},
            outlier_line(measured, plan))
