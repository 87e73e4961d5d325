"""The MLflow run a tracked process writes to: bound at start, written through one
:class:`~mlflow_gpuopt.mlflow_io.writer.RunWriter`, ended at close.

Only a single process or rank 0 of a job opens one; without a run (none could be bound, or
another rank) every write is a no-op. A resumed job's series go on after the run's last logged
step; a job launched from a plan gets its :class:`~.plan_link.PlanLink`. Ending the run:
docs/reliability.md#when-the-job-is-told-to-stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking._warn import WarnOnce
from mlflow_gpuopt.tracking.guard import suppress

if TYPE_CHECKING:
    from mlflow_gpuopt.mlflow_io.run_binding import RunBinding
    from mlflow_gpuopt.mlflow_io.writer import RunWriter
    from mlflow_gpuopt.tracking.plan_link import PlanLink
    from mlflow_gpuopt.tracking.summary import TrackSummary

#: At exit, how long to wait for the plan's predictions still being read (seconds).
PLAN_WAIT_S = 10.0


class RunLog:
    """Params, metrics and artifacts of the tracked run (no-ops without a run)."""

    def __init__(self, warn: WarnOnce) -> None:
        self._warn = warn
        self.run_id: str | None = None
        self.writer: RunWriter | None = None
        self.binding: RunBinding | None = None
        self.plan_link: PlanLink | None = None
        self.step_offset = 0  # steps the run's series already hold (a resumed job)
        self.closing = False  # set at close: a late sampler or gatherer round logs nothing

    def open(self, run_id: str | None, run_name: str | None, plan: str | None) -> None:
        """Bind (or create) the run and start its writer; the plan's link when launched from
        one. A run that cannot be bound is one warning: measuring goes on without logging."""
        if not self._bind(run_id, run_name):
            return
        if not self.binding.started_here and self.binding.create_run is None:
            from mlflow_gpuopt.mlflow_io.resume import last_logged_step

            self.step_offset = last_logged_step(self.run_id, self.binding.tracking_uri)
        from mlflow_gpuopt.tracking.plan_link import PlanLink, plan_id_for

        plan_id = plan_id_for(plan)
        if plan_id is not None:
            self.plan_link = PlanLink(plan_id, self.run_id, self.writer.set_tags,
                                      self.log_metrics, self._warn).start()

    @suppress("run", "no MLflow run; measuring without logging: %s", default=False)
    def _bind(self, run_id: str | None, run_name: str | None) -> bool:
        from mlflow_gpuopt.mlflow_io.run_binding import bind_run
        from mlflow_gpuopt.mlflow_io.writer import RunWriter

        self.binding = bind_run(run_id, run_name)
        self.run_id = self.binding.run_id
        self.writer = RunWriter(self.run_id, self.binding.tracking_uri,
                                create_run=self.binding.create_run)
        self.writer.set_tags({contract.TAG_TRACKED: "true"})
        return True

    def compare_with_plan(self, summary: TrackSummary, workload: dict[str, Any],
                          cpu_utilization_mean_percent: float | None,
                          exposed_comm_fraction: float | None,
                          ) -> tuple[dict[str, float], str | None]:
        """At the end: the plan's predictions and the ratios measured / predicted, and the
        plan check's line (:func:`~.plan_link.plan_comparison`); ``({}, None)`` without a
        plan or when its predictions were not read within ``PLAN_WAIT_S``."""
        link = self.plan_link
        plan = link.wait(PLAN_WAIT_S) if link is not None else None
        if plan is None:
            return {}, None
        from mlflow_gpuopt.tracking.plan_link import plan_comparison

        return plan_comparison(plan, summary, workload, cpu_utilization_mean_percent,
                               exposed_comm_fraction)

    def log_params(self, params: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.log_params(params)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Metrics at the job's ``step`` (after a resumed run's last step); none once closing."""
        if self.writer is not None and metrics and not self.closing:
            self.writer.log_metrics(metrics, step=step + self.step_offset)

    def log_dict(self, obj: dict, path: str) -> None:
        if self.writer is not None:
            self.writer.log_dict(obj, path)

    def release(self) -> None:
        """Off MLflow's active-run stack of the main thread (the stop ran on another), so that
        MLflow's own exit handler does not end the run a second time as FINISHED."""
        if self.binding is not None and self.writer is not None:
            from mlflow_gpuopt.mlflow_io.run_binding import release_run

            release_run(self.binding)

    def close(self, failed: bool, killed: bool, flush_timeout_s: float) -> None:
        """Deliver what is queued (bounded by ``flush_timeout_s``) and end the run if it was
        started here: ``KILLED`` by a signal, ``FAILED`` by an exception, else ``FINISHED``."""
        self.closing = True
        binding = self.binding
        end_status = None
        if binding is not None and binding.started_here:
            end_status = "KILLED" if killed else "FAILED" if failed else "FINISHED"
        if self.writer is not None:
            self._flush(flush_timeout_s, end_status)
        if binding is not None:
            self._end(binding, failed)

    @suppress("flush", "could not flush to MLflow: %s")
    def _flush(self, timeout_s: float, end_status: str | None) -> None:
        self.writer.close(timeout_s=timeout_s, end_status=end_status)  # warns itself
        self.run_id = self.writer.run_id  # the created run's id, once it exists

    @suppress("end", "could not end the MLflow run: %s")
    def _end(self, binding: RunBinding, failed: bool) -> None:
        from mlflow_gpuopt.mlflow_io.run_binding import end_run, release_run

        if self.writer is not None:
            release_run(binding)
        else:
            end_run(binding, failed)
