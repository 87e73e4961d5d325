"""``track()`` and ``Tracker``: measure a PyTorch training loop into an MLflow run.

The façade only wires parts together: a :class:`StepClock` on the training thread (hooks),
a :class:`Sampler` thread that turns step records and device readings into metrics, a
:class:`WorkloadProfiler` run once on a real step, and :class:`RunWriter` for MLflow.
Under torchrun (``WORLD_SIZE`` > 1) a :class:`~.distributed.job.JobTracking` times the model's
collectives and its gatherer thread brings every rank's figures to rank 0 — the only rank
that opens a run or touches MLflow — which logs the job as one run.
Nothing in here may break training: every failure becomes one warning.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking._warn import WarnOnce
from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.profiler import WorkloadProfile, WorkloadProfiler, detect_precision
from mlflow_gpuopt.tracking.summary import TrackSummary

logger = logging.getLogger(__name__)

PROFILE_ARTIFACT = contract.PROFILE_ARTIFACT


class Tracker:
    """Measures training between :meth:`start` and :meth:`stop` (or as a ``with`` block).

    Args:
        model: the ``nn.Module`` being trained (for batch size, FLOPs and activations).
        optimizer: its optimizer; steps of other optimizers are then ignored. Without it,
            any optimizer's ``step()`` counts as a training step.
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
        self.optimizer = optimizer
        self.run_id: str | None = None
        self.summary: TrackSummary | None = None
        self.profile: WorkloadProfile | None = None
        self._warn = WarnOnce(logger, every=100)
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._writer: Any = None
        self._binding: Any = None
        self._sampler: Any = None
        self._clock: Any = None
        self._agg: Any = None
        self._hw: Any = None
        self._device = "cpu"
        self._device_count = 0
        self._dist = DistributedContext()
        self._gpu_ids: list[int] = []  # node-local indices of the sampled GPUs
        self._job: Any = None  # JobTracking in a distributed job
        self._job_params: dict[str, Any] | None = None
        self._first_step_handle: Any = None
        self._last_hw_s = float("-inf")  # perf_counter of the last hardware reading
        self._profile_params_logged = False
        self._started = False
        self._stopped = False
        self._stopped_logging = False  # set at close: a late gatherer round logs nothing

    # -- public --------------------------------------------------------------------------------
    def start(self) -> Tracker:
        """Start measuring (idempotent). Never raises: on failure, training goes on untracked."""
        if self._started:
            return self
        self._started = True
        try:
            self._start()
        except Exception as exc:
            self._warn("start", "tracking could not start; training goes on untracked: %s", exc)
            self._remove_hooks()
        return self

    def step(self, samples: int | None = None, tokens: int | None = None) -> None:
        """Mark the end of one training step by hand (loops without an optimizer, or to give
        the samples/tokens of a step). Once called, the optimizer hook no longer counts steps.
        """
        clock = self._clock
        if clock is not None:
            clock.mark(samples, tokens)
            if self._first_step_handle is not None:
                self._start_gatherer()

    def stop(self, failed: bool = False) -> TrackSummary | None:
        """Stop, log the summary and profile, flush, end the run if it was started here.

        Returns the summary (also kept as ``self.summary``), or ``None`` if tracking failed.
        """
        if not self._started or self._stopped:
            return self.summary
        self._stopped = True
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
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from mlflow_gpuopt.devices import get_host
        from mlflow_gpuopt.tracking.aggregate import StepAggregator
        from mlflow_gpuopt.tracking.hw_reader import HardwareReader
        from mlflow_gpuopt.tracking.sampler import Sampler
        from mlflow_gpuopt.tracking.steps import StepClock

        cfg = self.config
        self._dist = DistributedContext.from_env(strategy=cfg.strategy)
        gpus, cuda_indices = self._select_gpus()
        self._device_count = len(gpus)
        self._device = gpus.name(0) if len(gpus) else "cpu"
        self._hw = HardwareReader(gpus, get_host(), cuda_indices, warn=self._warn)
        if self._dist.is_distributed:
            from mlflow_gpuopt.tracking.distributed.job import JobTracking

            self._job = JobTracking(self._dist, self.model, cfg.strategy, self._gpu_ids,
                                    cfg.interval_s)
        if self._dist.is_logging_rank:  # other ranks never touch MLflow
            self._open_run()
        params: dict[str, Any] = {contract.PARAM_DEVICE: self._device,
                                  contract.PARAM_GPU_BACKEND: gpus.backend}
        if self._job is None:  # a job's layout is logged once the ranks have reported
            params.update({contract.PARAM_DEVICE_COUNT: self._device_count,
                           contract.PARAM_NODES: self._dist.nodes,
                           contract.PARAM_WORLD_SIZE: self._dist.world_size,
                           contract.PARAM_STRATEGY: self._dist.strategy})
        self._log_params(params)
        profiler = (WorkloadProfiler(self.model, self.optimizer, cfg.name)
                    if cfg.profile and self.model is not None and self._dist.is_logging_rank
                    else None)
        self._clock = StepClock(self.optimizer, profiler, cfg.profile_step,
                                cuda_events=bool(cuda_indices), maxlen=cfg.max_step_records,
                                on_error=self._hook_error,
                                comm_meter=self._job.meter if self._job is not None else None)
        self._agg = StepAggregator(self._clock.start_time, cfg.warmup_steps,
                                   self._clock.start_event)
        self._handles.append(register_optimizer_step_post_hook(self._clock.on_optimizer_step))
        if self.model is not None:
            self._handles.append(self.model.register_forward_pre_hook(self._clock.on_forward_pre,
                                                                      with_kwargs=True))
            self._handles.append(self.model.register_forward_hook(self._clock.on_forward))
        try:
            self._tick()  # the start sample, before the first step (so a run always has it)
        except Exception as exc:
            self._warn("tick", "hardware sampling failed: %s", exc)
        self._sampler = Sampler(self._tick, cfg.interval_s, warn=self._warn)
        if self._job is None:
            self._sampler.start()
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self._start_gatherer()
        else:  # the gatherer's group is made at the first step, which every rank reaches
            self._first_step_handle = register_optimizer_step_post_hook(self._on_first_step)
            self._handles.append(self._first_step_handle)

    # -- distributed job -----------------------------------------------------------------------
    def _on_first_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if self.optimizer is not None and optimizer is not self.optimizer:
            return
        if self._clock is not None and self._clock.manual:
            return
        self._start_gatherer()

    def _start_gatherer(self) -> None:
        """Create the rank gatherer (a collective: every rank, main thread, same point);
        without a process group, fall back to this rank's own sampler."""
        handle, self._first_step_handle = self._first_step_handle, None
        if handle is not None:
            try:
                handle.remove()
            except Exception as exc:
                self._warn("unhook", "could not remove a hook: %s", exc)
        job = self._job
        if job is None or not job.pending:
            return
        try:
            started = job.start_gatherer(self._collect_row, self._on_round)
        except Exception as exc:
            self._warn("gather", "cannot gather other ranks' figures: %s", exc)
            started = False
        if not started:
            self._warn("gather", "no torch.distributed process group: rank %d logs only "
                       "its own figures", self._dist.rank)
            self._sampler.start()

    def _collect_row(self, final: bool) -> list[float]:
        """This rank's report for one gathering round (gatherer thread; never raises)."""
        from mlflow_gpuopt.tracking.distributed.rank_rows import RankReport, encode

        try:
            self._tick(final=final)
        except Exception as exc:
            self._warn("tick", "hardware sampling failed: %s", exc)
        try:
            return self._job.row(self._agg, self._hw, self._peak_memory())
        except Exception as exc:
            self._warn("row", "could not build this rank's report: %s", exc)
            d = self._dist
            return encode(RankReport(d.rank, d.node_rank, d.local_rank,
                                     steps_total=self._agg.steps if self._agg else 0))

    def _on_round(self, rows: list[list[float]]) -> None:
        """Rank 0: one round of every rank's reports becomes the job's metrics."""
        job = self._job
        metrics = job.combiner.add_round(rows)
        if job.combiner.stalled_ranks:
            self._warn("stalled", "rank(s) %s reported no steps for several intervals; the "
                       "job's throughput is left out until every rank steps again",
                       ", ".join(map(str, job.combiner.stalled_ranks)))
        if self._job_params is None:
            self._log_job_params()
        if self._writer is not None and metrics and not self._stopped_logging:
            self._writer.log_metrics(metrics, step=job.combiner.step)

    def _log_job_params(self) -> None:
        try:
            self._job_params = self._job.params()
        except Exception as exc:
            self._warn("layout", "could not read the job layout: %s", exc)
            d = self._dist
            self._job_params = {contract.PARAM_STRATEGY: self._job.strategy,
                                contract.PARAM_WORLD_SIZE: d.world_size,
                                contract.PARAM_NODES: d.nodes}
        self._log_params(self._job_params)

    def _select_gpus(self) -> tuple[Any, list[int]]:
        """The GPUs this process uses, and those of them torch.cuda holds the model on."""
        from mlflow_gpuopt.devices import get_gpus

        model_cuda: list[int] = []
        on_cpu = False
        if self.model is not None:
            import torch

            devs = {p.device for p in self.model.parameters()}
            model_cuda = sorted({d.index if d.index is not None else torch.cuda.current_device()
                                 for d in devs if d.type == "cuda"})
            on_cpu = bool(devs) and not model_cuda and torch.cuda.is_available()
        gpus = get_gpus()
        if self.config.gpu_indices is not None:
            indices = list(self.config.gpu_indices)
        elif model_cuda:
            indices = model_cuda
        elif on_cpu:  # CPU training on a machine that has GPUs: they are not ours
            indices = []
        elif self._dist.world_size > 1:
            indices = [self._dist.local_rank]
        else:
            self._gpu_ids = list(range(len(gpus)))
            return gpus, []
        self._gpu_ids = [i for i in indices if i < len(gpus)]
        return gpus.select(self._gpu_ids), model_cuda

    def _open_run(self) -> None:
        from mlflow_gpuopt.mlflow_io.run_binding import bind_run
        from mlflow_gpuopt.mlflow_io.writer import RunWriter

        try:
            self._binding = bind_run(self.config.run_id, self.config.run_name)
            self.run_id = self._binding.run_id
            self._writer = RunWriter(self.run_id)
            self._writer.set_tags({contract.TAG_TRACKED: "true"})
        except Exception as exc:
            self._warn("run", "no MLflow run; measuring without logging: %s", exc)

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
            metrics: dict[str, float] = {}
            try:
                window = self._agg.consume(self._clock.records, final=final)
            except Exception as exc:
                self._warn("steps", "step timing failed: %s", exc)
                window = None
            job = self._job
            hw = self._read_hw(job)
            if job is not None:
                job.add(window, hw)  # the gatherer reports it; rank 0 logs the job's view
                if job.gatherer is not None:
                    window = None
            if window is not None:
                metrics[contract.METRIC_STEP_TIME_S] = window.duration_s / window.steps
                if window.duration_s > 0 and window.samples > 0 and self._agg.samples_known:
                    metrics[contract.METRIC_THROUGHPUT_SAMPLES] = window.samples / window.duration_s
                if window.duration_s > 0 and window.tokens > 0:
                    metrics[contract.METRIC_THROUGHPUT_TOKENS] = window.tokens / window.duration_s
            metrics.update(hw)
            self._maybe_log_profile_params()
            if self._writer is not None and metrics and not self._stopped_logging:
                self._writer.log_metrics(metrics, step=self._agg.steps)
        finally:
            self._lock.release()

    def _read_hw(self, job: Any) -> dict[str, float]:
        """A hardware reading; in a job, at most one per half interval (the last rounds come
        back to back, and a CPU % over a few milliseconds means nothing)."""
        import time

        now = time.perf_counter()
        if job is not None and now - self._last_hw_s < 0.5 * self.config.interval_s:
            return {}
        self._last_hw_s = now
        return self._hw.read()

    def _maybe_log_profile_params(self) -> None:
        if self._profile_params_logged:
            return
        profiler = self._clock.profiler
        if profiler is None or not profiler.done:
            return
        self._profile_params_logged = True
        try:
            self.profile = profiler.result(self._clock.profile_samples,
                                           self._clock.profile_forwards, self._overrides())
        except Exception as exc:
            self._warn("profile", "workload profile failed: %s", exc)
            return
        self._log_profile_params(self.profile)

    def _overrides(self) -> dict:
        c = self.config
        return {"micro_batch": c.micro_batch, "grad_accum": c.grad_accum,
                "precision": c.precision, "tokens_per_sample": c.tokens_per_sample}

    def _log_profile_params(self, p: WorkloadProfile | None) -> None:
        c = self.config
        params: dict[str, Any] = {
            contract.PARAM_PRECISION: (p.precision if p else None) or c.precision
            or self._fallback_precision(),
            contract.PARAM_MICRO_BATCH: (p.micro_batch if p else None) or c.micro_batch
            or c.samples_per_step or (self._clock.last_step_samples if self._clock else None),
            contract.PARAM_GRAD_ACCUM: (p.grad_accum if p else None) or c.grad_accum or 1,
        }
        if p is not None:
            params[contract.PARAM_PARAMS] = p.params
            params[contract.PARAM_TRAINABLE_PARAMS] = p.trainable_params
            if p.flops_per_sample is not None:
                params[contract.PARAM_FLOPS_PER_SAMPLE] = f"{p.flops_per_sample:.6g}"
            if p.optimizer:
                params[contract.PARAM_OPTIMIZER] = p.optimizer
            if p.tokens_per_sample:
                params[contract.PARAM_TOKENS_PER_SAMPLE] = p.tokens_per_sample
            if p.kernels_per_micro_step:
                params[contract.PARAM_KERNELS_PER_MICRO_STEP] = f"{p.kernels_per_micro_step:.10g}"
        self._log_params({k: v for k, v in params.items() if v not in (None, "", 0)})

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
        if self._sampler is not None:
            self._sampler.stop()
        job = self._job
        # the last round carries every rank's final figures (waits for all ranks to stop)
        if (job is not None and job.gatherer is not None
                and not job.stop(timeout_s=max(30.0, 3 * self.config.interval_s))):
            self._warn("gather", "not every rank reported at the end; the run's job "
                       "figures may miss the last interval")
        self._tick(final=True)  # the end sample, and every step not yet read
        if not self._dist.is_logging_rank:
            self.summary = self._summarize()  # this rank's own view; nothing is logged
            return
        if job is not None and self._job_params is None:
            self._log_job_params()
        if not self._profile_params_logged:
            self._profile_params_logged = True
            if self.model is not None and clock.profiler is not None:
                try:
                    self.profile = clock.profiler.result(clock.last_step_samples or None,
                                                         clock.last_step_forwards or None,
                                                         self._overrides())
                except Exception as exc:
                    self._warn("profile", "workload profile failed: %s", exc)
            self._log_profile_params(self.profile)
        self.summary = self._summarize()
        if self._writer is not None:
            metrics = self.summary.metrics()
            step = self._agg.steps
            if job is not None and job.gathered:
                metrics.update(job.combiner.summary())
                step = max(step, job.combiner.step)
            self._writer.log_metrics(metrics, step=step)
            if self.profile is not None:
                self._writer.log_dict(self.profile.to_json(self._hardware()), PROFILE_ARTIFACT)
        if self.config.print_summary:
            print(self.summary.text(), flush=True)

    def _hardware(self) -> dict:
        from mlflow_gpuopt.devices.fingerprint import hardware_fingerprint

        try:
            hw = hardware_fingerprint().to_dict()
        except Exception as exc:
            self._warn("fingerprint", "hardware fingerprint failed: %s", exc)
            hw = {}
        hw.update({"device": self._device, "device_count": self._device_count,
                   "world_size": self._dist.world_size, "nodes": self._dist.nodes})
        if self._job_params:  # a distributed job: its layout as the ranks reported it
            hw.update({contract.param_field(k): v for k, v in self._job_params.items()})
        return hw

    def _peak_memory(self) -> float | None:
        """This process's peak memory (see :meth:`HardwareReader.peak_memory_bytes`)."""
        hw = self._hw
        peak = hw.peak_memory_bytes()
        profiler = self._clock.profiler if self._clock is not None else None
        before_reset = getattr(profiler, "peak_reserved_before_reset_bytes", None)
        if before_reset is not None and hw.peak_torch_reserved_bytes is not None:
            peak = max(peak or 0.0, before_reset)
        return peak

    def _summarize(self) -> TrackSummary:
        """This process's summary; on rank 0 of a job whose ranks reported, the job's."""
        from mlflow_gpuopt.catalog import peak_flops_per_s

        steady = self._agg.steady_state()
        hw = self._hw
        peak = self._peak_memory()
        device_count = self._device_count
        energy = hw.energy_joules
        util = hw.util_sum / hw.util_n if hw.util_n else None
        job = self._job
        if job is not None and job.gathered and self._dist.is_logging_rank:
            steady, peak, energy, util, device_count = self._job_summary(steady, peak, energy, util)
        p = self.profile
        mfu = None
        if (p is not None and p.flops_per_sample and steady.throughput_samples_per_s
                and device_count):
            peak_flops = peak_flops_per_s(self._device, p.precision)
            if peak_flops:
                mfu = (p.flops_per_sample * steady.throughput_samples_per_s
                       / (peak_flops * device_count))
        return TrackSummary(
            run_id=self.run_id, device=self._device, device_count=device_count,
            total_steps=self._agg.steps, steady=steady, peak_memory_bytes=peak,
            mfu=mfu, flops_per_sample=p.flops_per_sample if p else None,
            params=p.params if p else None, energy_joules=energy,
            gpu_utilization_mean_percent=util)

    def _job_summary(self, steady: Any, peak: Any, energy: Any, util: Any) -> tuple:
        """The job's steady state from every rank's last report (rank 0)."""
        from dataclasses import replace

        job = self._job
        m = job.combiner.summary()
        layout = job.combiner.layout()

        def g(name: str, default: Any) -> Any:
            return m.get(contract.summary_metric(name), default)

        steady = replace(
            steady,
            throughput_samples_per_s=g("throughput_samples_per_s", None),
            throughput_tokens_per_s=g("throughput_tokens_per_s", None),
            throughput_steps_per_s=g("throughput_steps_per_s", steady.throughput_steps_per_s),
            step_time_mean_s=g("step_time_mean_s", steady.step_time_mean_s),
            step_time_p50_s=g("step_time_p50_s", steady.step_time_p50_s),
            step_time_p90_s=g("step_time_p90_s", steady.step_time_p90_s))
        return (steady, g("peak_memory_bytes", peak), g("energy_joules", energy),
                g("gpu_utilization_percent", util),
                layout.device_count if layout is not None else self._device_count)

    def _close(self, failed: bool) -> None:
        self._stopped_logging = True
        if self._writer is not None:
            try:
                self._writer.close(timeout_s=self.config.flush_timeout_s)  # warns itself
            except Exception as exc:
                self._warn("flush", "could not flush to MLflow: %s", exc)
        if self._binding is not None:
            from mlflow_gpuopt.mlflow_io.run_binding import end_run

            try:
                end_run(self._binding, failed)
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
