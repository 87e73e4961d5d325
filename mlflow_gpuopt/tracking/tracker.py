"""``track()`` and ``Tracker``: measure a PyTorch training loop into an MLflow run.

The façade wires the parts together and owns none of their policy: a :class:`~.step_timing.
StepTiming` (the step clock's hooks on the training thread, the aggregator behind them), a
:class:`~.sampler.Sampler` thread whose ticks turn step records and device readings into
figures, a :class:`~.profile_log.ProfileLog` (the workload profile, measured once on a real
step), a :class:`~.reporting.Reporter` that decides what the figures become (a single
process's metrics, or a rank's report to rank 0 of a torchrun job, the only rank with a run),
and a :class:`~.run_log.RunLog` for the MLflow run. Metric names: :mod:`mlflow_gpuopt.contract`.
Nothing in here may break training: every failure becomes one warning (:mod:`.guard`).

Two process events end a run differently (docs/reliability.md#when-the-job-is-told-to-stop):
SIGTERM/SIGHUP while tracking ends it ``KILLED`` (:mod:`.signals`), and a forked child that
leaves the block leaves the parent's run alone (the tracker remembers the pid that started it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Iterator

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking._warn import WarnOnce
from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.guard import suppress
from mlflow_gpuopt.tracking.optimizers import unwrap_optimizer
from mlflow_gpuopt.tracking.profile_log import ProfileLog
from mlflow_gpuopt.tracking.reporting import JobReporter, LocalReporter, Reporter
from mlflow_gpuopt.tracking.run_log import RunLog
from mlflow_gpuopt.tracking.run_params import device_params, with_layout
from mlflow_gpuopt.tracking.summary import TrackSummary, summarize

if TYPE_CHECKING:
    from mlflow_gpuopt.tracking.distributed.mesh import ParallelLayout
    from mlflow_gpuopt.tracking.hw_reader import HardwareReader
    from mlflow_gpuopt.tracking.workload_profile import WorkloadProfile
    from mlflow_gpuopt.tracking.rank_report import RankFigures
    from mlflow_gpuopt.tracking.sampler import Sampler
    from mlflow_gpuopt.tracking.step_timing import StepTiming
    from mlflow_gpuopt.tracking.steps import StepClock

logger = logging.getLogger(__name__)


class Tracker:
    """Measures training between :meth:`start` and :meth:`stop` (or as a ``with`` block).

    Args:
        model: the ``nn.Module`` being trained (for batch size, FLOPs and activations).
        optimizer: its optimizer (or a wrapper holding it as ``.optimizer``: accelerate's,
            Lightning's, DeepSpeed's); steps of other optimizers are then ignored. Without
            it, the first optimizer to step is the step clock (a second one is ignored, with
            one warning).
        config: a :class:`TrackConfig`; keyword arguments override its fields.

    Example::

        tracker = Tracker(model, opt, interval_s=0.5).start()
        for x, y in loader:
            ...; opt.step()                      # steps are found by a global optimizer hook
        summary = tracker.stop()
    """

    def __init__(self, model: Any = None, optimizer: Any = None, *,
                 config: TrackConfig | None = None, **kwargs: Any) -> None:
        self.config = TrackConfig.from_kwargs(config, kwargs)
        self.model = model
        self.optimizer = unwrap_optimizer(optimizer)
        self.summary: TrackSummary | None = None
        #: One line when the job fell outside its plan's interval (see ``launch.plan_check``).
        self.plan_check: str | None = None
        self._warn = WarnOnce(logger, every=100)
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._run = RunLog(self._warn)
        self._profile = ProfileLog(model, self.config, self._run, self._warn)
        self._timing: StepTiming | None = None
        self._sampler: Sampler | None = None
        self._hw: HardwareReader | None = None
        self._reporter: Reporter | None = None
        self._device = "cpu"
        self._device_count = 0
        self._dist = DistributedContext()
        self._layout: ParallelLayout | None = None
        self._started = False
        self._stopped = False
        self._pid = os.getpid()  # the process whose run this is (a forked child's is not)
        self._killed_by: int | None = None  # the signal that ended tracking
        self._signals: Any = None

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id (``None`` without a run, and on other ranks of a job)."""
        return self._run.run_id

    @property
    def profile(self) -> WorkloadProfile | None:
        """The workload profile, once the profiled step is done."""
        return self._profile.profile

    @property
    def _clock(self) -> StepClock | None:
        return self._timing.clock if self._timing is not None else None

    # -- public --------------------------------------------------------------------------------
    def start(self) -> Tracker:
        """Start measuring (idempotent). Never raises: on failure, training goes on untracked."""
        if self._started:
            return self
        self._started = True
        self._pid = os.getpid()
        if not self._start():
            self._remove_hooks()
            return self
        from mlflow_gpuopt.tracking.signals import StopOnSignal

        # the stop's own bound (flush_timeout_s) and a margin for the summary before it
        self._signals = StopOnSignal(self._on_signal, self.config.flush_timeout_s + 5.0,
                                     self._run.release)
        self._signals.install()
        return self

    def _on_signal(self, signum: int) -> None:
        self._killed_by = signum
        self.stop()

    def step(self, samples: int | None = None, tokens: int | None = None) -> None:
        """Mark the end of one training step by hand (loops without an optimizer, or to give
        the samples/tokens of a step). Once called, the optimizer hook no longer counts steps.
        """
        clock = self._clock
        if clock is not None:
            clock.mark(samples, tokens)
            if isinstance(self._reporter, JobReporter):
                self._reporter.on_manual_step()

    def begin_step(self, batch: Any = None) -> None:
        """Mark the start of one training step by hand (a trainer whose step runs several
        optimizers, e.g. a GAN's): steps then end at :meth:`step` only, and the profiled step
        is profiled from here, whichever module runs first. ``batch``: the step's data."""
        clock = self._clock
        if clock is not None:
            clock.begin(batch)

    def stop(self, failed: bool = False) -> TrackSummary | None:
        """Stop, log the summary and profile, flush, end the run if it was started here.

        Returns the summary (also kept as ``self.summary``), or ``None`` if tracking failed.
        """
        if not self._started or self._stopped:
            return self.summary
        if os.getpid() != self._pid:  # a forked child: the run is the parent's to end
            self._warn("fork", "a forked child process (pid %d) left the tracked block of pid "
                       "%d; its run is left to that process (nothing ended, logged or "
                       "journaled here)", os.getpid(), self._pid)
            return None
        self._stopped = True
        if self._signals is not None:
            self._signals.uninstall()
        self._remove_hooks()
        try:
            self._finish()
        finally:
            self._run.close(failed, self._killed_by is not None, self.config.flush_timeout_s)
            if self._hw is not None:
                self._close_gpus()
        return self.summary

    def __enter__(self) -> Tracker:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop(failed=exc_type is not None)

    # -- start ---------------------------------------------------------------------------------
    @suppress("start", "tracking could not start; training goes on untracked: %s",
              default=False)
    def _start(self) -> bool:
        from mlflow_gpuopt.devices import get_gpus, get_host
        from mlflow_gpuopt.tracking.advice_facts import model_wrapper
        from mlflow_gpuopt.tracking.gpu_select import select_gpus
        from mlflow_gpuopt.tracking.hw_reader import HardwareReader
        from mlflow_gpuopt.tracking.profiler import WorkloadProfiler
        from mlflow_gpuopt.tracking.sampler import Sampler
        from mlflow_gpuopt.tracking.step_timing import StepTiming

        cfg = self.config
        self._dist = DistributedContext.from_env(strategy=cfg.strategy)
        sel = select_gpus(self.model, cfg.gpu_indices, self._dist, get_gpus())
        self._device_count = len(sel.gpus)
        self._device = sel.device
        self._layout = self._detect_layout()
        if self._layout is not None:
            self._profile.context_parallel = self._layout.cp
        self._hw = HardwareReader(sel.gpus, get_host(), list(sel.cuda_indices), warn=self._warn)
        self._reporter = self._make_reporter(list(sel.gpu_ids))
        if self._dist.is_logging_rank:  # other ranks never touch MLflow
            self._run.open(cfg.run_id, cfg.run_name, cfg.plan)
        self._run.log_params({**device_params(self._device, sel.gpus.backend),
                              **with_layout(self._reporter.start_params(self._device_count),
                                            self._layout),
                              contract.PARAM_MODEL_WRAPPER: model_wrapper(self.model)})
        profiler = (WorkloadProfiler(self.model, self.optimizer, cfg.name)
                    if cfg.profile and self.model is not None and self._dist.is_logging_rank
                    else None)
        self._timing = StepTiming(self.model, self.optimizer, profiler, cfg,
                                  cuda_events=bool(sel.cuda_indices),
                                  comm_meter=self._reporter.comm_meter, warn=self._warn)
        self._timing.install(self.model, self._handles)
        self._safe_tick()  # the start sample, before the first step (so a run always has it)
        self._sampler = Sampler(self._tick, cfg.interval_s, warn=self._warn)
        self._handles += self._reporter.begin(self._sampler)
        with self._lock:  # the sampler thread runs: its tick reads the aggregator
            self._timing.restart()  # step 0 starts when the training loop gets control
        return True

    @suppress("layout", "could not read the parallel layout: %s")
    def _detect_layout(self) -> ParallelLayout | None:
        """Degrees of parallelism from the config, the device mesh or the model's DTensors."""
        from mlflow_gpuopt.tracking.distributed.mesh import detect_layout

        c = self.config
        return detect_layout(self.model, c.device_mesh, c.tp, c.pp, c.dp, c.cp,
                             self._dist.world_size, ep=c.ep)

    def _make_reporter(self, gpu_ids: list[int]) -> Reporter:
        if not self._dist.is_distributed:
            return LocalReporter(self._dist)
        from mlflow_gpuopt.tracking.distributed.job import JobTracking

        cfg = self.config
        job = JobTracking(self._dist, self.model, cfg.strategy, gpu_ids, cfg.interval_s,
                          layout=self._layout)
        return JobReporter(job, _RankSource(self), self._run, self._warn, self.optimizer)

    def _remove_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            self._unhook(h)

    @suppress("unhook", "could not remove a hook: %s")
    def _unhook(self, handle: Any) -> None:
        handle.remove()

    # -- sampler thread ------------------------------------------------------------------------
    def _tick(self, final: bool = False) -> None:
        if not self._lock.acquire(timeout=10.0):
            return
        try:
            timing, reporter = self._timing, self._reporter
            window = timing.take(final)
            reading = self._hw.read() if reporter.wants_reading() else None
            metrics = reporter.tick(window, reading, timing.agg)
            wait = timing.input_wait_since_last()
            if wait is not None and metrics is not None:
                metrics[contract.METRIC_INPUT_WAIT_S] = wait
            self._profile.on_tick(timing.clock)
            self._run.log_metrics(metrics, timing.agg.steps)
        finally:
            self._lock.release()

    @suppress("tick", "hardware sampling failed: %s")
    def _safe_tick(self, final: bool = False) -> None:
        self._tick(final)

    # -- stop ----------------------------------------------------------------------------------
    @suppress("stop", "could not finish tracking: %s")
    def _finish(self) -> None:
        timing = self._timing
        if timing is None:
            return
        self._profile.abort(timing.clock)  # the profiled step never finished
        timing.clock.check_model_ran()
        if self._sampler is not None:
            self._sampler.stop()
        reporter = self._reporter
        wait_s = max(30.0, 3 * self.config.interval_s)
        if self._killed_by is not None:  # every rank is being stopped: a short last round
            wait_s = min(wait_s, max(1.0, 0.3 * self.config.flush_timeout_s))
        reporter.end(timeout_s=wait_s)
        self._tick(final=True)  # the end sample, and every step not yet read
        if not self._dist.is_logging_rank:
            self.summary = self._summarize()  # this rank's own view; nothing is logged
            return
        reporter.layout_params()
        self._profile.finish(timing.clock)
        summary = self._summarize()
        self.summary = dataclasses.replace(summary, advice=self._advice(summary))
        if self._run.writer is not None:
            metrics, step = reporter.final_metrics(self.summary.metrics(), timing.agg.steps)
            plan, self.plan_check = self._run.compare_with_plan(
                self.summary, self._profile.params(timing.clock),
                self._hw.cpu_utilization_mean_percent, reporter.exposed_comm_fraction())
            padded = self._profile.mean_padded_tokens(timing.clock)
            if padded is not None:
                metrics[contract.SUMMARY_MEAN_PADDED_TOKENS] = padded
            self._run.log_metrics({**metrics, **plan}, step)
            d = self._dist
            self._profile.save({"device": self._device, "device_count": self._device_count,
                                "world_size": d.world_size, "nodes": d.nodes,
                                **self._reporter.hardware_extras()})  # a job: its layout
        if self.config.print_summary:
            print(self.summary.text(), flush=True)
            if self.plan_check:
                print(self.plan_check, flush=True)

    def _summarize(self) -> TrackSummary:
        """This process's summary; on rank 0 of a job whose ranks reported, the job's."""
        return summarize(self.run_id, self._device, self._device_count, self._timing,
                         self._hw, self._reporter, self.profile)

    @suppress("advice", "could not evaluate the advice rules: %s")
    def _advice(self, summary: TrackSummary) -> str | None:
        """The top finding of the cheap advice rules, one line (or ``None``)."""
        from mlflow_gpuopt.tracking.summary import advice_line

        p = self.profile
        precision = (p.precision if p else None) or self._profile.fallback_precision()
        return advice_line(summary, p, self.model, self._device_count, precision,
                           self._dist.world_size)

    @suppress("close", "could not release the GPU backend: %s")
    def _close_gpus(self) -> None:
        self._hw.gpus.close()


class _RankSource:
    """The tracker as a job's rank reads it each gathering round (:class:`~.reporting.
    RankSource`)."""

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker

    @property
    def manual(self) -> bool:
        clock = self._tracker._clock
        return clock is not None and clock.manual

    @property
    def steps_total(self) -> int:
        timing = self._tracker._timing
        return timing.agg.steps if timing is not None else 0

    def round(self, final: bool) -> RankFigures:
        t = self._tracker
        t._safe_tick(final)
        return t._timing.rank_figures(t._hw)


@contextlib.contextmanager
def track(model: Any = None, optimizer: Any = None, *, config: TrackConfig | None = None,
          **kwargs: Any) -> Iterator[Tracker]:
    """Measure the training inside the block into the active (or a new) MLflow run.

    Example::

        with gpuopt.track(model=model, optimizer=opt) as tracker:
            for x, y in loader:
                loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
        print(tracker.summary)

    See :class:`Tracker` for the arguments and :class:`TrackConfig` for the options.
    """
    tracker = Tracker(model, optimizer, config=config, **kwargs)
    tracker.start()
    failed = True
    try:
        yield tracker
        failed = False
    finally:
        tracker.stop(failed=failed)
