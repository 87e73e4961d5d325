"""The step timing of a tracked loop: the :class:`~.steps.StepClock` on the training thread
(its optimizer, forward and loader hooks) and the :class:`~.aggregate.StepAggregator` the
sampler feeds with its records, with the figures both give a summary or a rank's report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlflow_gpuopt.tracking._warn import WarnOnce
from mlflow_gpuopt.tracking.aggregate import StepAggregator, StepWindow
from mlflow_gpuopt.tracking.batch_dim import sample_dim
from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.guard import suppress
from mlflow_gpuopt.tracking.rank_report import RankFigures
from mlflow_gpuopt.tracking.reporting import Figures
from mlflow_gpuopt.tracking.steps import StepClock

if TYPE_CHECKING:
    from mlflow_gpuopt.tracking.distributed.comm_meter import CommMeter
    from mlflow_gpuopt.tracking.hw_reader import HardwareReader
    from mlflow_gpuopt.tracking.profiler import WorkloadProfiler


class StepTiming:
    """The step clock and its aggregator for one tracked run (see :class:`~.steps.StepClock`
    for the arguments it is made from)."""

    def __init__(self, model: Any, optimizer: Any, profiler: WorkloadProfiler | None,
                 config: TrackConfig, cuda_events: bool, comm_meter: CommMeter | None,
                 warn: WarnOnce) -> None:
        self._warn = warn
        self._max_step_records = config.max_step_records
        self.clock = StepClock(optimizer, profiler, config.profile_step, cuda_events=cuda_events,
                               maxlen=config.max_step_records, on_error=self._hook_error,
                               comm_meter=comm_meter, warn=warn,
                               samples_per_step=config.samples_per_step,
                               has_model=model is not None, sample_dim=sample_dim(model))
        self.clock.input_wait_from_step = config.warmup_steps  # as the steady state does
        self.agg = StepAggregator(self.clock.start_time, config.warmup_steps,
                                  self.clock.start_event,
                                  profiled_step=(config.profile_step + 1
                                                 if profiler is not None else None))
        self._input_wait_seen = (0.0, 0)  # the clock's wait sum and count at the last tick

    def install(self, model: Any, handles: list[Any]) -> None:
        """Put the clock's hooks in, appending each handle to ``handles`` as it is made (so a
        failure half-way leaves every hook already in to be removed)."""
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        from mlflow_gpuopt.tracking.loop_watch import watch

        clock = self.clock
        handles.append(register_optimizer_step_pre_hook(clock.on_optimizer_step_pre))
        handles.append(register_optimizer_step_post_hook(clock.on_optimizer_step))
        handles.append(watch(clock))  # DataLoader batches, skipped scaler steps
        handles.append(clock)  # its compiled-graph counter, if one is on
        if model is not None:
            handles.append(model.register_forward_pre_hook(clock.on_forward_pre,
                                                           with_kwargs=True))
            handles.append(model.register_forward_hook(clock.on_forward))

    def restart(self) -> None:
        """Step 0 starts now, after tracking's start-up (see :meth:`.steps.StepClock.restart`)."""
        self.clock.restart()
        self.agg.restart(self.clock.start_time, self.clock.start_event)

    def take(self, final: bool = False) -> StepWindow | None:
        """The steps completed since the last call (every step when ``final``)."""
        window = self._consume(final)
        if self.clock.dropped:
            self._warn("dropped", "%d training steps were not timed (more than "
                       "max_step_records=%d steps in one interval); raise max_step_records "
                       "or lower interval_s", self.clock.dropped, self._max_step_records)
        return window

    @suppress("steps", "step timing failed: %s")
    def _consume(self, final: bool) -> StepWindow | None:
        return self.agg.consume(self.clock.records, final=final)

    def input_wait_since_last(self) -> float | None:
        """Mean input wait per step since the last call, s (``None``: no step began since)."""
        clock = self.clock
        total, n = clock.input_wait_s, clock.input_waits
        seen_total, seen_n = self._input_wait_seen
        if n <= seen_n:
            return None
        self._input_wait_seen = (total, n)
        return (total - seen_total) / (n - seen_n)

    def input_wait(self, step_time_p50_s: float | None) -> tuple[float | None, float | None]:
        """The run's mean input wait per step (s) and its share of the typical step."""
        from mlflow_gpuopt.tracking.advice_facts import input_wait_figures

        c = self.clock
        return input_wait_figures(c.input_wait_s, c.input_waits, list(c.recent_input_waits_s),
                                  step_time_p50_s)

    def peak_memory(self, hw: HardwareReader) -> float | None:
        """This process's peak memory (see :meth:`HardwareReader.peak_memory_bytes`), counting
        the peak the profiler saw before it reset torch's counters."""
        peak = hw.peak_memory_bytes()
        before_reset = getattr(self.clock.profiler, "peak_reserved_before_reset_bytes", None)
        if before_reset is not None and hw.peak_torch_reserved_bytes is not None:
            peak = max(peak or 0.0, before_reset)
        return peak

    def figures(self, hw: HardwareReader, device_count: int) -> Figures:
        """This process's own summary figures."""
        return Figures(self.agg.steady_state(), self.peak_memory(hw), hw.energy_joules,
                       hw.gpu_utilization_mean_percent, device_count)

    def rank_figures(self, hw: HardwareReader) -> RankFigures:
        """What this rank's report for a gathering round is built from."""
        return RankFigures(self.agg.steps, self.agg.steady_state(), self.agg.comm_summary(),
                           hw.energy_joules, self.peak_memory(hw))

    def _hook_error(self, where: str, exc: BaseException) -> None:
        if where == "workload profiler":
            self._warn("profiler", "workload profiler failed, no profile for this run: %r", exc)
        else:
            self._warn("hook", "%s failed, step tracking is off for this run: %r", where, exc)
