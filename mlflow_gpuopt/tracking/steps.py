"""The step clock: the only tracking code on the training thread's hot path.

Each training step appends one record (the fields of :class:`StepRecord`) to a bounded deque
(``comm``: the :class:`~.distributed.comm_meter.CommMeter`'s cumulative :class:`CommTotals` in
a distributed job, else ``None``); everything else (step times, quantiles, throughput) is
computed by the sampler thread from that deque. A step is an optimizer step (global post-hook)
or a manual ``mark()`` — once ``mark()`` is called, it is the only step clock. Any exception in
a hook switches the clock off (one warning) and training goes on with a hook that returns at
once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from mlflow_gpuopt.tracking.profiler import WorkloadProfiler, first_tensor

if TYPE_CHECKING:
    from mlflow_gpuopt.tracking.distributed.comm_meter import CommMeter

logger = logging.getLogger(__name__)


class CommTotals(NamedTuple):
    """A communication meter's cumulative totals (or the difference of two)."""

    collectives: int
    time_s: float  # sum of collective launch -> completion times
    bytes: int  # payload bytes this rank sent into collectives
    exposed_s: float  # communication the steps waited on (not hidden by compute)

    def minus(self, earlier: CommTotals) -> CommTotals:
        return CommTotals(self.collectives - earlier.collectives, self.time_s - earlier.time_s,
                          self.bytes - earlier.bytes, self.exposed_s - earlier.exposed_s)

    def plus(self, other: CommTotals) -> CommTotals:
        return CommTotals(self.collectives + other.collectives, self.time_s + other.time_s,
                          self.bytes + other.bytes, self.exposed_s + other.exposed_s)


NO_COMM = CommTotals(0, 0.0, 0, 0.0)


class StepRecord(NamedTuple):
    """One step boundary, as the training thread leaves it for the sampler thread."""

    t_s: float  # perf_counter at the boundary
    samples: int  # samples of the step (0 = unknown)
    tokens: int
    forwards: int  # gradient-recording forwards of the step (micro-batches)
    cuda_event: Any  # a recorded torch.cuda.Event (GPU-side timing), or None
    comm: CommTotals | None  # the meter's cumulative totals (distributed jobs), or None




class StepClock:
    """Counts and timestamps training steps; drives the one-off workload profiler."""

    def __init__(self, optimizer: Any = None, profiler: WorkloadProfiler | None = None,
                 profile_step: int = 1, cuda_events: bool = False, maxlen: int = 1_000_000,
                 on_error: Callable[[str, BaseException], None] | None = None,
                 comm_meter: CommMeter | None = None) -> None:
        # plain tuples in StepRecord's field order (see _mark)
        self.records: deque[tuple] = deque(maxlen=maxlen)
        self.dropped = 0  # step records pushed out of a full ``records`` (more than maxlen
        # steps between two sampler ticks)
        self._comm_step = comm_meter.end_step if comm_meter is not None else None
        self.optimizer = optimizer
        self.profiler = profiler
        self.profile_step = profile_step if profiler is not None else -1
        self.steps = 0  # completed steps
        self.manual = False
        self.broken = False
        self.pending_samples = 0
        self.pending_tokens = 0
        self.pending_forwards = 0
        self.last_step_samples = 0
        self.last_step_forwards = 0
        self.profile_samples: int | None = None
        self.profile_forwards: int | None = None
        self._event_cls: Any = None
        self._on_error = on_error
        self._perf = time.perf_counter
        import torch

        self._grad_enabled = torch.is_grad_enabled
        self._tensor = torch.Tensor
        self.start_time = self._perf()
        self.start_event: Any = None
        if cuda_events:
            self._event_cls = torch.cuda.Event
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.start_event.record()

    def _fail(self, where: str, exc: BaseException) -> None:
        """A hook failed: the clock is off for the rest of the run (and so is the profile)."""
        self.broken = True
        self._stop_profiling(where, exc)

    def _stop_profiling(self, where: str, exc: BaseException) -> None:
        self.profile_step = -1
        if self.profiler is not None:
            try:
                self.profiler.abort()
            except Exception as inner:  # already failing: just record it
                logger.debug("gpuopt: profiler abort failed: %s", inner)
        if self._on_error is not None:
            self._on_error(where, exc)

    # -- hooks (training thread) ---------------------------------------------------------------
    def on_forward_pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        """Model forward pre-hook: count the batch (forwards that record gradients only)."""
        if self.broken:
            return None
        try:
            if not self._grad_enabled():
                return None
            if args and isinstance(args[0], self._tensor):
                x = args[0]
            else:
                x = first_tensor(args, kwargs)
            if x is not None and x.dim() >= 1:
                n = x.shape[0]
                self.pending_samples += n
                if x.dim() == 2 and not x.is_floating_point():
                    self.pending_tokens += n * x.shape[1]
            self.pending_forwards += 1
        except Exception as exc:
            self._fail("forward hook", exc)
            return None
        if self.steps == self.profile_step and not self.profiler.active and not self.profiler.done:
            try:
                self.profiler.begin_step(x)
            except Exception as exc:
                self._profile_failed(exc)
        return None

    def _profile_failed(self, exc: BaseException) -> None:
        """The one-off profiler failed: drop the profile, keep counting steps."""
        self._stop_profiling("workload profiler", exc)

    def on_forward(self, module: Any, args: tuple, output: Any) -> None:
        """Model forward hook: closes the profiler's activation window."""
        if self.profile_step == self.steps and not self.broken and self.profiler.active:
            try:
                self.profiler.end_forward(output)
            except Exception as exc:
                self._profile_failed(exc)

    def on_optimizer_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        """Global optimizer step post-hook."""
        if self.manual or self.broken:
            return
        if self.optimizer is not None and optimizer is not self.optimizer:
            return
        self._mark(0, 0)

    def mark(self, samples: int | None = None, tokens: int | None = None) -> None:
        """A manual step boundary (``tracker.step()``); from now on the only step clock."""
        if self.broken:
            return
        self.manual = True
        self._mark(samples or 0, tokens or 0)

    def _mark(self, samples: int, tokens: int) -> None:
        try:
            t = self._perf()
            ev = None
            if self._event_cls is not None:
                ev = self._event_cls(enable_timing=True)
                ev.record()
            s = samples or self.pending_samples
            k = tokens or self.pending_tokens
            comm = self._comm_step() if self._comm_step is not None else None
            # a plain tuple, read as a StepRecord off the training thread: the garbage
            # collector untracks exact tuples of plain values, while it would traverse every
            # queued NamedTuple (up to maxlen of them) on each collection
            if len(self.records) == self.records.maxlen:
                self.dropped += 1  # the deque drops the oldest record: counted, warned about
            self.records.append((t, s, k, self.pending_forwards, ev, comm))
            self.last_step_samples = s
            self.last_step_forwards = self.pending_forwards
            self.pending_samples = self.pending_tokens = self.pending_forwards = 0
            profiling = self.steps == self.profile_step and self.profiler.active
            self.steps += 1
        except Exception as exc:
            self._fail("step hook", exc)
            return
        if profiling:
            self.profile_step = -1
            self.profile_samples = s
            self.profile_forwards = self.last_step_forwards
            try:
                self.profiler.end_step()
            except Exception as exc:
                self._profile_failed(exc)
