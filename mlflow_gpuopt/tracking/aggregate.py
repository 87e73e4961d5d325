"""Turns the step clock's raw records into step times, windows and steady-state figures.

Runs on the sampler thread (and once more at stop). Memory is bounded whatever the number of
steps: step times go into a :class:`LogHistogram`; only the first ``warmup_steps`` times are
kept as a list (the fallback when a run is too short to have a steady state).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from mlflow_gpuopt.tracking.quantiles import LogHistogram
from mlflow_gpuopt.tracking.steps import NO_COMM, CommTotals, StepRecord


@dataclass(frozen=True)
class StepWindow:
    """Steps completed between two sampler ticks, as seen by this process."""

    first_step: int
    last_step: int
    steps: int
    duration_s: float  # sum of the step times in the window
    samples: int  # samples processed in the window (0 = unknown)
    tokens: int
    step_time_max_s: float = 0.0  # the window's slowest step
    collectives: int = 0  # communication of the window's steps (distributed jobs)
    comm_time_s: float = 0.0  # sum of collective launch -> completion times
    comm_bytes: int = 0  # payload bytes this rank sent into collectives
    exposed_comm_s: float = 0.0  # communication the steps waited on (not hidden by compute)


@dataclass(frozen=True)
class SteadyState:
    """Steady-state step figures (warm-up excluded)."""

    steps: int
    warmup_steps: int  # steps left out
    step_time_p50_s: float | None
    step_time_p90_s: float | None
    step_time_mean_s: float | None
    throughput_samples_per_s: float | None  # None when samples per step are unknown
    throughput_tokens_per_s: float | None
    throughput_steps_per_s: float | None


_as_record = StepRecord._make  # the step clock queues plain tuples in this field order
_as_totals = CommTotals._make


class CommSummary(NamedTuple):
    """Communication over the steady steps (all steps when there is no steady state yet)."""

    steps: int
    step_time_s: float  # the step time of those steps
    totals: CommTotals


class StepAggregator:
    """Consumes the step clock's records (:class:`~.steps.StepRecord` fields) in step order.

    Step ``i``'s time is the gap between boundaries ``i-1`` and ``i`` (step 0 starts at
    tracking start). With CUDA events, times are GPU-side and a record waits until its event
    has completed (``query()``), so nothing ever synchronises during training.
    """

    def __init__(self, start_time_s: float, warmup_steps: int, start_event: object = None,
                 profiled_step: int | None = None) -> None:
        self.warmup_steps = warmup_steps
        #: the step (1-based) the profiler instruments: FLOP counting, saved-tensor hooks and
        #: the first import of torch's FLOP counter make it up to seconds slower, so it is
        #: left out of the steady state whatever ``warmup_steps`` is
        self.profiled_step = profiled_step
        self._profiled_at: int | None = None  # its index in the warm-up lists
        self.hist = LogHistogram()
        self.warmup_times: list[float] = []
        self.warmup_samples: list[int] = []
        self.warmup_tokens: list[int] = []
        self.steps = 0
        self.steady_time_s = 0.0
        self.steady_samples = 0
        self.steady_tokens = 0
        self.samples_known = True
        # communication (distributed jobs): cumulative meter totals of the last step seen, and
        # the sums over the steady steps
        self._prev_comm = NO_COMM
        self.steady_comm = NO_COMM
        self.total_comm = NO_COMM
        self._prev_t = start_time_s
        self._prev_event = start_event
        self._waiting: deque = deque()

    def restart(self, start_time_s: float, start_event: object = None) -> None:
        """Step 0 starts at ``start_time_s`` (see :meth:`.steps.StepClock.restart`); a no-op
        once a step was consumed."""
        if self.steps == 0 and not self._waiting:
            self._prev_t, self._prev_event = start_time_s, start_event

    def consume(self, records: deque[tuple], final: bool = False) -> StepWindow | None:
        """Take every available record; return the window they form (``None`` if no step)."""
        while True:
            try:
                self._waiting.append(records.popleft())
            except IndexError:
                break
        first = self.steps
        duration = longest = 0.0
        samples = tokens = 0
        comm_start = self._prev_comm
        while self._waiting:
            rec = _as_record(self._waiting[0])
            t, s, k, ev = rec.t_s, rec.samples, rec.tokens, rec.cuda_event
            if not isinstance(k, int):  # an attention mask's sum, on the device
                k = int(k)
            if ev is not None:
                if not final and not ev.query():
                    break
                if final:
                    ev.synchronize()
                if self._prev_event is not None:
                    dt = self._prev_event.elapsed_time(ev) / 1000.0
                else:
                    dt = t - self._prev_t
                self._prev_event = ev
            else:
                dt = t - self._prev_t
            self._waiting.popleft()
            self._prev_t = t
            self._add(dt, s, k)
            if rec.comm is not None:
                self._add_comm(_as_totals(rec.comm))
            duration += dt
            longest = max(longest, dt)
            samples += s
            tokens += k
        if self.steps == first:
            return None
        c = self._prev_comm.minus(comm_start)
        return StepWindow(first_step=first + 1, last_step=self.steps, steps=self.steps - first,
                          duration_s=duration, samples=samples, tokens=tokens,
                          step_time_max_s=longest, collectives=c.collectives,
                          comm_time_s=c.time_s, comm_bytes=c.bytes, exposed_comm_s=c.exposed_s)

    def _add_comm(self, comm: CommTotals) -> None:
        """One step's communication: the difference of cumulative meter totals."""
        prev = self._prev_comm
        self._prev_comm = self.total_comm = comm
        if self._steady(self.steps):
            self.steady_comm = self.steady_comm.plus(comm.minus(prev))

    def _steady(self, step: int) -> bool:
        return step > self.warmup_steps and step != self.profiled_step

    def comm_summary(self) -> CommSummary:
        """Communication over the steady steps; all steps while there is no steady state."""
        if self.hist.count:
            return CommSummary(self.hist.count, self.steady_time_s, self.steady_comm)
        return CommSummary(self.steps, sum(self.warmup_times), self.total_comm)

    def _add(self, dt: float, samples: int, tokens: int) -> None:
        self.steps += 1
        if samples <= 0:
            self.samples_known = False
        if not self._steady(self.steps):
            if self.steps == self.profiled_step:
                self._profiled_at = len(self.warmup_times)
            self.warmup_times.append(dt)
            self.warmup_samples.append(samples)
            self.warmup_tokens.append(tokens)
            return
        self.hist.add(dt)
        self.steady_time_s += dt
        self.steady_samples += samples
        self.steady_tokens += tokens

    def steady_state(self) -> SteadyState:
        """Figures over the steps after warm-up; a run too short for that drops only step 1."""
        if self.hist.count:
            p50, p90, mean = self.hist.quantile(0.5), self.hist.quantile(0.9), self.hist.mean
            n, time_s = self.hist.count, self.steady_time_s
            samples, tokens = self.steady_samples, self.steady_tokens
            skipped = len(self.warmup_times)
        else:
            # the first step, and the profiled one, as long as a step remains
            keep = list(range(len(self.warmup_times)))
            for drop in (0, self._profiled_at):
                if drop is not None and drop in keep and len(keep) > 1:
                    keep.remove(drop)
            times = [self.warmup_times[i] for i in keep]
            if not times:
                return SteadyState(0, 0, None, None, None, None, None, None)
            srt = sorted(times)
            p50 = srt[int(0.5 * (len(srt) - 1))]
            p90 = srt[int(0.9 * (len(srt) - 1))]
            n, time_s = len(times), sum(times)
            mean = time_s / n
            samples = sum(self.warmup_samples[i] for i in keep)
            tokens = sum(self.warmup_tokens[i] for i in keep)
            skipped = len(self.warmup_times) - len(keep)

        def rate(x):
            return x / time_s if time_s > 0 and x > 0 else None

        return SteadyState(
            steps=n, warmup_steps=skipped, step_time_p50_s=p50, step_time_p90_s=p90,
            step_time_mean_s=mean,
            throughput_samples_per_s=rate(samples) if self.samples_known else None,
            throughput_tokens_per_s=rate(tokens),
            throughput_steps_per_s=rate(n),
        )
