"""``track()`` and ``Tracker``: measure a PyTorch training loop into an MLflow run.

The façade wires the parts together and owns none of their policy: a :class:`StepClock` on
the training thread (hooks), a :class:`Sampler` thread whose ticks turn step records and
device readings into figures, a :class:`WorkloadProfiler` run once on a real step, a
:class:`~.reporting.Reporter` that decides what the figures become (a single process's
metrics, or a rank's report to rank 0 of a torchrun job — the only rank that opens a run),
and a :class:`~mlflow_gpuopt.mlflow_io.writer.RunWriter` for MLflow. GPU selection lives in
:mod:`.gpu_select`, param precedence in :mod:`.run_params`, MFU with the summary
(:mod:`.summary`), metric names in :mod:`mlflow_gpuopt.contract`.
Nothing in here may break training: every failure becomes one warning.

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
from mlflow_gpuopt.tracking.optimizers import unwrap_optimizer
from mlflow_gpuopt.tracking.profiler import WorkloadProfile, WorkloadProfiler, detect_precision
from mlflow_gpuopt.tracking.reporting import Figures, JobReporter, LocalReporter, Reporter
from mlflow_gpuopt.tracking.run_params import (
    device_params,
    profile_overrides,
    with_layout,
    workload_params,
)
from mlflow_gpuopt.tracking.summary import TrackSummary, build_summary

if TYPE_CHECKING:
    from mlflow_gpuopt.mlflow_io.run_binding import RunBinding
    from mlflow_gpuopt.mlflow_io.writer import RunWriter
    from mlflow_gpuopt.tracking.aggregate import StepAggregator
    from mlflow_gpuopt.tracking.distributed.mesh import ParallelLayout
    from mlflow_gpuopt.tracking.hw_reader import HardwareReader
    from mlflow_gpuopt.tracking.sampler import Sampler
    from mlflow_gpuopt.tracking.plan_link import PlanLink
    from mlflow_gpuopt.tracking.steps import StepClock

logger = logging.getLogger(__name__)

PROFILE_ARTIFACT = contract.PROFILE_ARTIFACT
#: At exit, how long to wait for the plan's predictions still being read (seconds).
PLAN_WAIT_S = 10.0


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
        self.run_id: str | None = None
        self.summary: TrackSummary | None = None
        self.profile: WorkloadProfile | None = None
        self._warn = WarnOnce(logger, every=100)
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._writer: RunWriter | None = None
        self._binding: RunBinding | None = None
        self._sampler: Sampler | None = None
        self._clock: StepClock | None = None
        self._agg: StepAggregator | None = None
        self._hw: HardwareReader | None = None
        self._reporter: Reporter | None = None
        self._device = "cpu"
        self._device_count = 0
        self._dist = DistributedContext()
        self._layout: ParallelLayout | None = None
        self._profile_params_logged = False
        self._started = False
        self._stopped = False
        self._stopped_logging = False  # set at close: a late gatherer round logs nothing
        self._input_wait_seen = (0.0, 0)  # the step clock's wait sum and count at last tick
        self._plan_link: PlanLink | None = None
        self._step_offset = 0  # steps the run's series already hold (a resumed job)
        self._pid = os.getpid()  # the process whose run this is (a forked child's is not)
        self._killed_by: int | None = None  # the signal that ended tracking
        self._signals: Any = None
        #: One line when the job fell outside its plan's interval (see ``launch.plan_check``).
        self.plan_check: str | None = None

    # -- public --------------------------------------------------------------------------------
    def start(self) -> Tracker:
        """Start measuring (idempotent). Never raises: on failure, training goes on untracked."""
        if self._started:
            return self
        self._started = True
        self._pid = os.getpid()
        try:
            self._start()
        except Exception as exc:
            self._warn("start", "tracking could not start; training goes on untracked: %s", exc)
            self._remove_hooks()
            return self
        from mlflow_gpuopt.tracking.signals import StopOnSignal

        # the stop's own bound (flush_timeout_s) and a margin for the summary before it
        self._signals = StopOnSignal(self._on_signal, self.config.flush_timeout_s + 5.0,
                                     self._release_active_run)
        self._signals.install()
        return self

    def _on_signal(self, signum: int) -> None:
        self._killed_by = signum
        self.stop()

    def _release_active_run(self) -> None:
        """Off MLflow's active-run stack of the main thread (the stop ran on another), so that
        MLflow's own exit handler does not end the run a second time as FINISHED."""
        if self._binding is not None and self._writer is not None:
            from mlflow_gpuopt.mlflow_io.run_binding import release_run

            release_run(self._binding)

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
        except Exception as exc:
            self._warn("stop", "could not finish tracking: %s", exc)
        finally:
            self._close(failed)
        return self.summary

    def __enter__(self) -> Tracker:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop(failed=exc_type is not None)

    # -- start ---------------------------------------------------------------------------------
    def _start(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        from mlflow_gpuopt.devices import get_gpus, get_host
        from mlflow_gpuopt.tracking.aggregate import StepAggregator
        from mlflow_gpuopt.tracking.gpu_select import select_gpus
        from mlflow_gpuopt.tracking.hw_reader import HardwareReader
        from mlflow_gpuopt.tracking.loop_watch import watch
        from mlflow_gpuopt.tracking.sampler import Sampler
        from mlflow_gpuopt.tracking.steps import StepClock

        cfg = self.config
        self._dist = DistributedContext.from_env(strategy=cfg.strategy)
        sel = select_gpus(self.model, cfg.gpu_indices, self._dist, get_gpus())
        self._device_count = len(sel.gpus)
        self._device = sel.device
        self._layout = self._detect_layout()
        self._hw = HardwareReader(sel.gpus, get_host(), list(sel.cuda_indices), warn=self._warn)
        self._reporter = self._make_reporter(list(sel.gpu_ids))
        if self._dist.is_logging_rank:  # other ranks never touch MLflow
            self._open_run()
        from mlflow_gpuopt.tracking.advice_facts import model_wrapper

        self._log_params({**device_params(self._device, sel.gpus.backend),
                          **with_layout(self._reporter.start_params(self._device_count),
                                        self._layout),
                          contract.PARAM_MODEL_WRAPPER: model_wrapper(self.model)})
        profiler = (WorkloadProfiler(self.model, self.optimizer, cfg.name)
                    if cfg.profile and self.model is not None and self._dist.is_logging_rank
                    else None)
        self._clock = StepClock(self.optimizer, profiler, cfg.profile_step,
                                cuda_events=bool(sel.cuda_indices), maxlen=cfg.max_step_records,
                                on_error=self._hook_error, comm_meter=self._reporter.comm_meter,
                                warn=self._warn, samples_per_step=cfg.samples_per_step,
                                has_model=self.model is not None)
        self._clock.input_wait_from_step = cfg.warmup_steps  # as the steady state does
        self._agg = StepAggregator(self._clock.start_time, cfg.warmup_steps,
                                   self._clock.start_event)
        self._handles.append(register_optimizer_step_pre_hook(self._clock.on_optimizer_step_pre))
        self._handles.append(register_optimizer_step_post_hook(self._clock.on_optimizer_step))
        self._handles.append(watch(self._clock))  # DataLoader batches, skipped scaler steps
        self._handles.append(self._clock)  # its compiled-graph counter, if one is on
        if self.model is not None:
            self._handles.append(self.model.register_forward_pre_hook(self._clock.on_forward_pre,
                                                                      with_kwargs=True))
            self._handles.append(self.model.register_forward_hook(self._clock.on_forward))
        try:
            self._tick()  # the start sample, before the first step (so a run always has it)
        except Exception as exc:
            self._warn("tick", "hardware sampling failed: %s", exc)
        self._sampler = Sampler(self._tick, cfg.interval_s, warn=self._warn)
        self._handles += self._reporter.begin(self._sampler)

    def _detect_layout(self) -> ParallelLayout | None:
        """Degrees of parallelism from the config, the device mesh or the model's DTensors."""
        from mlflow_gpuopt.tracking.distributed.mesh import detect_layout

        c = self.config
        try:
            return detect_layout(self.model, c.device_mesh, c.tp, c.pp, c.dp, c.cp,
                                 self._dist.world_size, ep=c.ep)
        except Exception as exc:
            self._warn("layout", "could not read the parallel layout: %s", exc)
            return None

    def _make_reporter(self, gpu_ids: list[int]) -> Reporter:
        if not self._dist.is_distributed:
            return LocalReporter(self._dist)
        from mlflow_gpuopt.tracking.distributed.job import JobTracking

        cfg = self.config
        job = JobTracking(self._dist, self.model, cfg.strategy, gpu_ids, cfg.interval_s,
                          layout=self._layout)
        return JobReporter(job, cfg.interval_s, self._warn, self._collect_row, self._log_metrics,
                           self._log_params, self.optimizer,
                           lambda: self._clock is not None and self._clock.manual)

    def _collect_row(self, final: bool) -> list[float]:
        """This rank's report for one gathering round (gatherer thread; never raises)."""
        from mlflow_gpuopt.tracking.distributed.rank_rows import RankReport, encode

        try:
            self._tick(final=final)
        except Exception as exc:
            self._warn("tick", "hardware sampling failed: %s", exc)
        try:
            return self._reporter.job.row(self._agg, self._hw.energy_joules,
                                          self._peak_memory())
        except Exception as exc:
            self._warn("row", "could not build this rank's report: %s", exc)
            d = self._dist
            return encode(RankReport(d.rank, d.node_rank, d.local_rank,
                                     steps_total=self._agg.steps if self._agg else 0))

    def _open_run(self) -> None:
        from mlflow_gpuopt.mlflow_io.run_binding import bind_run
        from mlflow_gpuopt.mlflow_io.writer import RunWriter

        try:
            self._binding = bind_run(self.config.run_id, self.config.run_name)
            self.run_id = self._binding.run_id
            self._writer = RunWriter(self.run_id, self._binding.tracking_uri,
                                     create_run=self._binding.create_run)
            self._writer.set_tags({contract.TAG_TRACKED: "true"})
        except Exception as exc:
            self._warn("run", "no MLflow run; measuring without logging: %s", exc)
            return
        if not self._binding.started_here and self._binding.create_run is None:
            from mlflow_gpuopt.mlflow_io.resume import last_logged_step

            self._step_offset = last_logged_step(  # a resumed job's series go on
                self.run_id, self._binding.tracking_uri)
        from mlflow_gpuopt.tracking.plan_link import PlanLink, plan_id_for

        plan = plan_id_for(self.config.plan)
        if plan is not None:
            self._plan_link = PlanLink(plan, self.run_id, self._writer.set_tags,
                                       self._log_metrics, self._warn).start()

    # -- hot-path failure ----------------------------------------------------------------------
    def _hook_error(self, where: str, exc: BaseException) -> None:
        if where == "workload profiler":
            self._warn("profiler", "workload profiler failed, no profile for this run: %r", exc)
        else:
            self._warn("hook", "%s failed, step tracking is off for this run: %r", where, exc)

    def _remove_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            try:
                h.remove()
            except Exception as exc:
                self._warn("unhook", "could not remove a hook: %s", exc)

    # -- sampler thread ------------------------------------------------------------------------
    def _tick(self, final: bool = False) -> None:
        if not self._lock.acquire(timeout=10.0):
            return
        try:
            try:
                window = self._agg.consume(self._clock.records, final=final)
            except Exception as exc:
                self._warn("steps", "step timing failed: %s", exc)
                window = None
            if self._clock.dropped:
                self._warn("dropped", "%d training steps were not timed (more than "
                           "max_step_records=%d steps in one interval); raise max_step_records "
                           "or lower interval_s", self._clock.dropped,
                           self.config.max_step_records)
            reporter = self._reporter
            reading = self._hw.read() if reporter.wants_reading() else None
            metrics = reporter.tick(window, reading, self._agg)
            wait = self._input_wait_metric()
            if wait is not None and metrics is not None:
                metrics[contract.METRIC_INPUT_WAIT_S] = wait
            self._maybe_log_profile_params()
            if metrics:
                self._log_metrics(metrics, self._agg.steps)
        finally:
            self._lock.release()

    def _input_wait_metric(self) -> float | None:
        """Mean input wait per step since the last tick (``None``: no step began since)."""
        clock = self._clock
        total, n = clock.input_wait_s, clock.input_waits
        seen_total, seen_n = self._input_wait_seen
        if n <= seen_n:
            return None
        self._input_wait_seen = (total, n)
        return (total - seen_total) / (n - seen_n)

    def _maybe_log_profile_params(self) -> None:
        if self._profile_params_logged:
            return
        profiler = self._clock.profiler
        if profiler is None or not profiler.done:
            return
        self._profile_params_logged = True
        try:
            self.profile = profiler.result(self._clock.profile_samples,
                                           self._clock.profile_forwards,
                                           profile_overrides(self.config))
        except Exception as exc:
            self._warn("profile", "workload profile failed: %s", exc)
            return
        self._log_profile_params(self.profile)

    def _log_profile_params(self, p: WorkloadProfile | None) -> None:
        last = self._clock.last_step_samples if self._clock else None
        self._log_params(workload_params(p, self.config, last, self._fallback_precision))

    def _fallback_precision(self) -> str:
        if self.model is None:
            return "fp32"
        try:
            p = next(iter(self.model.parameters()))
            return detect_precision(self.model, p.device.type)
        except Exception:
            return "fp32"

    def _log_params(self, params: dict) -> None:
        if self._writer is not None:
            self._writer.log_params(params)

    def _log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._writer is not None and metrics and not self._stopped_logging:
            self._writer.log_metrics(metrics, step=step + self._step_offset)

    # -- stop ----------------------------------------------------------------------------------
    def _finish(self) -> None:
        clock = self._clock
        if clock is None:
            return
        if clock.profiler is not None and clock.profiler.active:
            try:
                clock.profiler.abort()  # the profiled step never finished
            except Exception as exc:
                self._warn("profile", "could not leave the profiler's modes: %s", exc)
        clock.check_model_ran()
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
        if not self._profile_params_logged:
            self._profile_params_logged = True
            if self.model is not None and clock.profiler is not None:
                try:
                    self.profile = clock.profiler.result(clock.last_step_samples or None,
                                                         clock.last_step_forwards or None,
                                                         profile_overrides(self.config))
                except Exception as exc:
                    self._warn("profile", "workload profile failed: %s", exc)
            self._log_profile_params(self.profile)
        self.summary = self._with_advice(self._summarize())
        if self._writer is not None:
            metrics, step = reporter.final_metrics(self.summary.metrics(), self._agg.steps)
            metrics.update(self._plan_metrics(metrics))
            self._writer.log_metrics(metrics, step=step + self._step_offset)
            if self.profile is not None:
                self._writer.log_dict(self.profile.to_json(self._hardware()), PROFILE_ARTIFACT)
        if self.config.print_summary:
            print(self.summary.text(), flush=True)
            if self.plan_check:
                print(self.plan_check, flush=True)

    def _plan_metrics(self, final: dict[str, float]) -> dict[str, float]:
        """The plan's predictions again (so each is a flat line over the run) and the ratios
        measured / predicted; sets :attr:`plan_check`. ``{}`` for a job without a plan."""
        from mlflow_gpuopt.launch.plan_check import (
            Measured,
            outlier_line,
            prediction_metrics,
            prediction_ratios,
        )

        link = self._plan_link
        plan = link.wait(PLAN_WAIT_S) if link is not None else None
        if plan is None:
            return {}
        s = self.summary
        wp = workload_params(self.profile, self.config, self._clock.last_step_samples,
                             self._fallback_precision)
        mb = wp.get(contract.PARAM_MICRO_BATCH)
        measured = Measured(
            throughput_samples_per_s=s.steady.throughput_samples_per_s,
            step_time_s=s.steady.step_time_mean_s,
            peak_memory_per_gpu_bytes=s.peak_memory_bytes if s.device != "cpu" else None,
            gpu_utilization_percent=s.gpu_utilization_mean_percent,
            cpu_utilization_percent=self._hw.cpu_utilization_mean_percent,
            exposed_comm_fraction=final.get(contract.SUMMARY_EXPOSED_COMM_FRACTION),
            micro_batch=int(mb) if mb else None, precision=wp.get(contract.PARAM_PRECISION))
        self.plan_check = outlier_line(measured, plan)
        return {**prediction_metrics(plan), **prediction_ratios(measured, plan)}

    def _hardware(self) -> dict:
        from mlflow_gpuopt.devices.fingerprint import hardware_fingerprint

        try:
            hw = hardware_fingerprint().to_dict()
        except Exception as exc:
            self._warn("fingerprint", "hardware fingerprint failed: %s", exc)
            hw = {}
        hw.update({"device": self._device, "device_count": self._device_count,
                   "world_size": self._dist.world_size, "nodes": self._dist.nodes})
        hw.update(self._reporter.hardware_extras())  # a job: its layout as the ranks reported
        return hw

    def _peak_memory(self) -> float | None:
        """This process's peak memory (see :meth:`HardwareReader.peak_memory_bytes`), counting
        the peak the profiler saw before it reset torch's counters."""
        hw = self._hw
        peak = hw.peak_memory_bytes()
        profiler = self._clock.profiler if self._clock is not None else None
        before_reset = getattr(profiler, "peak_reserved_before_reset_bytes", None)
        if before_reset is not None and hw.peak_torch_reserved_bytes is not None:
            peak = max(peak or 0.0, before_reset)
        return peak

    def _summarize(self) -> TrackSummary:
        """This process's summary; on rank 0 of a job whose ranks reported, the job's."""
        hw = self._hw
        own = Figures(self._agg.steady_state(), self._peak_memory(), hw.energy_joules,
                      hw.gpu_utilization_mean_percent, self._device_count)
        f = self._reporter.figures(own)
        summary = build_summary(self.run_id, self._device, f.device_count, self._agg.steps,
                                f.steady, f.peak_memory_bytes, f.energy_joules,
                                f.gpu_utilization_mean_percent, self.profile)
        from mlflow_gpuopt.tracking.advice_facts import input_wait_figures

        clock = self._clock
        wait_mean, wait_share = input_wait_figures(clock.input_wait_s, clock.input_waits,
                                                   list(clock.recent_input_waits_s),
                                                   own.steady.step_time_p50_s)
        return dataclasses.replace(summary, input_wait_mean_s=wait_mean,
                                   input_wait_fraction=wait_share,
                                   cpu_utilization_mean_percent=hw.cpu_utilization_mean_percent,
                                   skipped_steps=clock.skipped_steps)

    def _with_advice(self, summary: TrackSummary) -> TrackSummary:
        """The summary with the top finding of the cheap advice rules (never raises)."""
        from mlflow_gpuopt.advice import RunFacts
        from mlflow_gpuopt.tracking.advice_facts import model_wrapper, top_finding_line

        try:
            p = self.profile
            facts = RunFacts(
                run_id=self.run_id, device=self._device, device_count=self._device_count,
                precision=(p.precision if p else None) or self._fallback_precision(),
                params=p.params if p else None, micro_batch=p.micro_batch if p else None,
                grad_accum=p.grad_accum if p else 1,
                step_time_mean_s=summary.steady.step_time_mean_s,
                input_wait_mean_s=summary.input_wait_mean_s,
                input_wait_fraction=summary.input_wait_fraction,
                gpu_utilization_mean_percent=summary.gpu_utilization_mean_percent,
                cpu_utilization_mean_percent=summary.cpu_utilization_mean_percent,
                gemm_shapes=p.gemm_shapes if p else None,
                model_wrapper=model_wrapper(self.model),
                kernels_per_micro_step=p.kernels_per_micro_step if p else None,
                world_size=self._dist.world_size)
            return dataclasses.replace(summary, advice=top_finding_line(facts))
        except Exception as exc:
            self._warn("advice", "could not evaluate the advice rules: %s", exc)
            return summary

    def _close(self, failed: bool) -> None:
        self._stopped_logging = True
        if isinstance(self._reporter, JobReporter):
            self._reporter.logging = False
        binding = self._binding
        end_status = None
        if binding is not None and binding.started_here:
            end_status = ("KILLED" if self._killed_by is not None
                          else "FAILED" if failed else "FINISHED")
        if self._writer is not None:
            try:  # delivery and the run's end, bounded by flush_timeout_s; warns itself
                self._writer.close(timeout_s=self.config.flush_timeout_s, end_status=end_status)
                self.run_id = self._writer.run_id  # the created run's id, once it exists
            except Exception as exc:
                self._warn("flush", "could not flush to MLflow: %s", exc)
        if binding is not None:
            from mlflow_gpuopt.mlflow_io.run_binding import end_run, release_run

            try:
                if self._writer is not None:
                    release_run(binding)
                else:
                    end_run(binding, failed)
            except Exception as exc:
                self._warn("end", "could not end the MLflow run: %s", exc)
        if self._hw is not None:
            try:
                self._hw.gpus.close()
            except Exception as exc:
                self._warn("close", "could not release the GPU backend: %s", exc)


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
