"""What a tracked process reports, behind one interface: a single process, or a rank of a job.

The tracker measures the same way in both cases (step clock, aggregator, hardware reader);
a :class:`Reporter` decides what becomes of the figures:

* :class:`LocalReporter` — one process: each tick's window and hardware reading are its
  metrics, its own summary is the run's.
* :class:`JobReporter` — a rank of a torchrun job: windows go into this rank's report
  (:mod:`.rank_report`), which the gatherer brings to rank 0 once per interval; rank 0 logs
  the combined job's metrics (:mod:`.distributed.rank_rows`), the job's layout params and the
  job's summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking._warn import WarnOnce
from mlflow_gpuopt.tracking.aggregate import SteadyState, StepAggregator, StepWindow
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.guard import suppress
from mlflow_gpuopt.tracking.hw_reader import HardwareReading
from mlflow_gpuopt.tracking.rank_report import RankFigures, RankReports
from mlflow_gpuopt.tracking.run_params import launcher_layout, single_process_layout

if TYPE_CHECKING:
    from mlflow_gpuopt.tracking.distributed.comm_meter import CommMeter
    from mlflow_gpuopt.tracking.distributed.job import JobTracking
    from mlflow_gpuopt.tracking.sampler import Sampler


@dataclass(frozen=True)
class Figures:
    """The figures a summary is built from (a process's own, or the job's)."""

    steady: SteadyState
    peak_memory_bytes: float | None
    energy_joules: float | None
    gpu_utilization_mean_percent: float | None
    device_count: int


def window_metrics(window: StepWindow, samples_known: bool) -> dict[str, float]:
    """The step-time and throughput metrics of one process's window."""
    m = {contract.METRIC_STEP_TIME_S: window.duration_s / window.steps}
    if window.duration_s > 0 and window.samples > 0 and samples_known:
        m[contract.METRIC_THROUGHPUT_SAMPLES] = window.samples / window.duration_s
    if window.duration_s > 0 and window.tokens > 0:
        m[contract.METRIC_THROUGHPUT_TOKENS] = window.tokens / window.duration_s
    return m


class Reporter(Protocol):
    """The part of tracking that differs between a single process and a job's rank."""

    #: Meter the step clock stamps on each step record (jobs), or None.
    comm_meter: CommMeter | None

    def start_params(self, device_count: int) -> dict[str, Any]:
        """Layout params known at start (a job logs its layout once the ranks report)."""

    def begin(self, sampler: Sampler) -> list[Any]:
        """Start reporting after the hooks are in; returns hook handles to remove at stop."""

    def wants_reading(self) -> bool:
        """Whether this tick should read the hardware."""

    def tick(self, window: StepWindow | None, reading: HardwareReading | None,
             agg: StepAggregator) -> dict[str, float]:
        """This tick's metrics to log now (the sampler thread, under the tick lock)."""

    def end(self, timeout_s: float) -> None:
        """The last report (a job waits for every rank); before the final tick."""

    def layout_params(self) -> dict[str, Any] | None:
        """Layout params still to log at the end, or None."""

    def figures(self, own: Figures) -> Figures:
        """The summary's figures: this process's own, or the job's on rank 0."""

    def final_metrics(self, metrics: dict[str, float], step: int) -> tuple[dict[str, float], int]:
        """The summary metrics (and step) to log at the end."""

    def hardware_extras(self) -> dict[str, Any]:
        """What the profile's hardware section adds (a job's layout)."""

    def exposed_comm_fraction(self) -> float | None:
        """The job's exposed communication share of the step time, 0..1 (jobs only)."""


class LocalReporter:
    """A single process: its windows and readings are the run's metrics."""

    comm_meter = None

    def __init__(self, ctx: DistributedContext) -> None:
        self.ctx = ctx

    def start_params(self, device_count: int) -> dict[str, Any]:
        return single_process_layout(self.ctx, device_count)

    def begin(self, sampler: Sampler) -> list[Any]:
        sampler.start()
        return []

    def wants_reading(self) -> bool:
        return True

    def tick(self, window: StepWindow | None, reading: HardwareReading | None,
             agg: StepAggregator) -> dict[str, float]:
        m = window_metrics(window, agg.samples_known) if window is not None else {}
        if reading is not None:
            m.update(reading.metrics())
        return m

    def end(self, timeout_s: float) -> None:
        return None

    def layout_params(self) -> dict[str, Any] | None:
        return None

    def figures(self, own: Figures) -> Figures:
        return own

    def final_metrics(self, metrics: dict[str, float], step: int) -> tuple[dict[str, float], int]:
        return metrics, step

    def hardware_extras(self) -> dict[str, Any]:
        return {}

    def exposed_comm_fraction(self) -> float | None:
        return None


class RunSink(Protocol):
    """Where rank 0 writes the job's figures (:class:`~.run_log.RunLog`; no-ops without a
    run)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_params(self, params: dict[str, Any]) -> None: ...


class RankSource(Protocol):
    """What a job's rank reads its report from at each gathering round (the tracker)."""

    @property
    def manual(self) -> bool:
        """Whether steps are marked by hand (``tracker.step()``)."""

    @property
    def steps_total(self) -> int:
        """Steps completed since tracking started."""

    def round(self, final: bool) -> RankFigures:
        """Tick (this rank's steps and hardware since the last tick) and return its figures."""


class JobReporter:
    """A rank of a torchrun job. Its gatherer thread asks for this rank's row each round
    (:meth:`_collect`, built here from the :class:`RankFigures` the source gives) and, on rank
    0, hands every rank's rows to :meth:`_on_round`, whose metrics go to the run; only rank 0
    has a run.

    Args:
        job: this rank's :class:`~.distributed.job.JobTracking`.
        source: the figures of this rank (:class:`RankSource`).
        run: the run rank 0 logs to (no run elsewhere).
        optimizer: the tracked optimizer (its first step creates the gatherer when no process
            group exists yet at start).
    """

    def __init__(self, job: JobTracking, source: RankSource, run: RunSink, warn: WarnOnce,
                 optimizer: Any) -> None:
        self.job = job
        self.comm_meter = job.meter
        self._rows = RankReports(job.ctx, job.gpu_ids, job.interval_s, job.sample_share)
        self._interval_s = job.interval_s
        self._source = source
        self._run = run
        self._warn = warn
        self._optimizer = optimizer
        self._sampler: Sampler | None = None
        self._first_step_handle: Any = None
        self._params: dict[str, Any] | None = None
        self._last_reading_s = float("-inf")

    @property
    def ctx(self) -> DistributedContext:
        return self.job.ctx

    def start_params(self, device_count: int) -> dict[str, Any]:
        return {}

    def begin(self, sampler: Sampler) -> list[Any]:
        self._sampler = sampler
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.start_gatherer()
            return []
        # the gatherer's group is made at the first step, which every rank reaches
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._first_step_handle = register_optimizer_step_post_hook(self._on_first_step)
        return [self._first_step_handle]

    def _on_first_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if self._optimizer is not None and optimizer is not self._optimizer:
            return
        if self._source.manual:
            return
        self.start_gatherer()

    def on_manual_step(self) -> None:
        """``tracker.step()``: the first one creates the gatherer when it is still pending."""
        if self._first_step_handle is not None:
            self.start_gatherer()

    def start_gatherer(self) -> None:
        """Create the rank gatherer (a collective: every rank, main thread, same point);
        without a process group, fall back to this rank's own sampler."""
        handle, self._first_step_handle = self._first_step_handle, None
        if handle is not None:
            self._unhook(handle)
        if not self.job.pending:
            return
        if not self._start_gatherer():
            self._warn("gather", "no torch.distributed process group: rank %d logs only "
                       "its own figures", self.ctx.rank)
            if self._sampler is not None:
                self._sampler.start()

    @suppress("unhook", "could not remove a hook: %s")
    def _unhook(self, handle: Any) -> None:
        handle.remove()

    @suppress("gather", "cannot gather other ranks' figures: %s", default=False)
    def _start_gatherer(self) -> bool:
        return self.job.start_gatherer(self._collect, self._on_round)

    def _collect(self, final: bool) -> list[float]:
        """This rank's row for one round (gatherer thread; never raises)."""
        return self._row(final) or self._rows.empty_row(self._source.steps_total)

    @suppress("row", "could not build this rank's report: %s")
    def _row(self, final: bool) -> list[float] | None:
        return self._rows.row(self._source.round(final))

    def _on_round(self, rows: list[list[float]]) -> None:
        """Rank 0: one round of every rank's reports becomes the job's metrics."""
        combiner = self.job.combiner
        metrics = combiner.add_round(rows)
        if combiner.stalled_ranks:
            self._warn("stalled", "rank(s) %s reported no steps for several intervals; the "
                       "job's throughput is left out until every rank steps again",
                       ", ".join(map(str, combiner.stalled_ranks)))
        if self._params is None:
            self._log_layout()
        self._run.log_metrics(metrics, combiner.step)

    def _log_layout(self) -> None:
        self._params = self._job_params() or launcher_layout(self.ctx, self.job.strategy)
        self._run.log_params(self._params)

    @suppress("layout", "could not read the job layout: %s")
    def _job_params(self) -> dict[str, Any]:
        return self.job.params()

    def wants_reading(self) -> bool:
        """At most one reading per half interval (the last rounds come back to back, and a
        CPU % over a few milliseconds means nothing)."""
        now = time.perf_counter()
        if now - self._last_reading_s < 0.5 * self._interval_s:
            return False
        self._last_reading_s = now
        return True

    def tick(self, window: StepWindow | None, reading: HardwareReading | None,
             agg: StepAggregator) -> dict[str, float]:
        self._rows.add(window, reading)  # the gatherer reports it; rank 0 logs the job's view
        m = ({} if self.job.gatherer is not None or window is None
             else window_metrics(window, agg.samples_known))
        if reading is not None:
            m.update(reading.metrics())
        return m

    def end(self, timeout_s: float) -> None:
        # the last round carries every rank's final figures (waits for all ranks to stop)
        if self.job.gatherer is not None and not self.job.stop(timeout_s=timeout_s):
            self._warn("gather", "not every rank reported at the end; the run's job "
                       "figures may miss the last interval")

    def layout_params(self) -> dict[str, Any] | None:
        if self._params is not None or not self.ctx.is_logging_rank:
            return None
        self._log_layout()
        return self._params

    def figures(self, own: Figures) -> Figures:
        """Rank 0 of a job whose ranks reported: the job's steady state from every rank's
        last report; elsewhere this process's own."""
        job = self.job
        if not (job.gathered and self.ctx.is_logging_rank):
            return own
        js = job.combiner.summary()
        layout = job.combiner.layout()

        def either(job_value: float | None, own_value: float | None) -> float | None:
            return own_value if job_value is None else job_value

        s = own.steady
        steady = replace(
            s, throughput_samples_per_s=js.throughput_samples_per_s,
            throughput_tokens_per_s=js.throughput_tokens_per_s,
            throughput_steps_per_s=either(js.throughput_steps_per_s, s.throughput_steps_per_s),
            step_time_mean_s=either(js.step_time_mean_s, s.step_time_mean_s),
            step_time_p50_s=either(js.step_time_p50_s, s.step_time_p50_s),
            step_time_p90_s=either(js.step_time_p90_s, s.step_time_p90_s))
        return Figures(steady, either(js.peak_memory_bytes, own.peak_memory_bytes),
                       either(js.energy_joules, own.energy_joules),
                       either(js.gpu_utilization_mean_percent, own.gpu_utilization_mean_percent),
                       layout.device_count if layout is not None else own.device_count)

    def final_metrics(self, metrics: dict[str, float], step: int) -> tuple[dict[str, float], int]:
        if not self.job.gathered:
            return metrics, step
        return ({**metrics, **self.job.combiner.summary().metrics()},
                max(step, self.job.combiner.step))

    def hardware_extras(self) -> dict[str, Any]:
        return {contract.param_field(k): v for k, v in (self._params or {}).items()}

    def exposed_comm_fraction(self) -> float | None:
        return self.job.combiner.summary().exposed_comm_fraction if self.job.gathered else None
