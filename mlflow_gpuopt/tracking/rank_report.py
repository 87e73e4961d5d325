"""This rank's report for one gathering round of a torchrun job (:mod:`.distributed.rank_rows`):
its step windows and hardware reading since the last round, and its cumulative figures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mlflow_gpuopt.tracking.aggregate import CommSummary, SteadyState, StepWindow
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.distributed.rank_rows import NAN, GpuReading, RankReport, encode
from mlflow_gpuopt.tracking.hw_reader import HardwareReading


def _opt(v: float | None) -> float:
    return float(v) if v is not None else NAN


def _scaled(v: float | None, factor: float) -> float | None:
    return None if v is None else v * factor


@dataclass(frozen=True)
class RankFigures:
    """This process's cumulative figures at one round (what its report is built from)."""

    steps_total: int  # steps completed since tracking started
    steady: SteadyState
    comm: CommSummary
    energy_joules: float | None  # this rank's GPUs since tracking started
    peak_memory_bytes: float | None


@dataclass
class _Interval:
    """This rank's steps since its last report (several ticks may fall in one round)."""

    steps: int = 0
    samples: int = 0
    tokens: int = 0
    collectives: int = 0
    comm_bytes: int = 0
    step_time_sum_s: float = 0.0
    comm_time_s: float = 0.0
    exposed_comm_s: float = 0.0
    step_time_max_s: float = 0.0

    def add(self, w: StepWindow) -> None:
        self.steps += w.steps
        self.samples += w.samples
        self.tokens += w.tokens
        self.collectives += w.collectives
        self.comm_bytes += w.comm_bytes
        self.step_time_sum_s += w.duration_s
        self.comm_time_s += w.comm_time_s
        self.exposed_comm_s += w.exposed_comm_s
        self.step_time_max_s = max(self.step_time_max_s, w.step_time_max_s)


class RankReports:
    """Builds this rank's reports round after round.

    Args:
        ctx: this process's place in the job.
        gpu_ids: node-local indices of the GPUs this rank samples.
        interval_s: seconds between rounds (a round much shorter keeps the last CPU %).
        sample_share: the share of each sample this rank reports (1 / the ranks that share
            it: tensor x pipeline x context parallel), so the job's sum counts it once.
    """

    def __init__(self, ctx: DistributedContext, gpu_ids: list[int], interval_s: float,
                 sample_share: float = 1.0) -> None:
        self.ctx = ctx
        self.gpu_ids = list(gpu_ids)
        self.interval_s = interval_s
        self.sample_share = sample_share
        self._window = _Interval()
        self._hw = HardwareReading()
        self._cpu_t = (time.perf_counter(), time.process_time())
        self._cpu_pct = float("nan")  # this process's CPU %, all threads, last interval

    def add(self, window: StepWindow | None, reading: HardwareReading | None) -> None:
        """One tick's step window and hardware reading, added to the current interval."""
        if window is not None:
            self._window.add(window)
        if reading is not None:
            self._hw = reading

    def report(self, f: RankFigures) -> RankReport:
        """This rank's report for the round; resets the interval."""
        steady, comm = f.steady, f.comm
        now = (time.perf_counter(), time.process_time())
        wall = now[0] - self._cpu_t[0]
        if wall >= 0.5 * self.interval_s:  # shorter (the last rounds): keep the last figure
            self._cpu_pct = 100.0 * (now[1] - self._cpu_t[1]) / wall
            self._cpu_t = now
        share = self.sample_share
        w, self._window = self._window, _Interval()
        hw = self._hw
        host = hw.host
        gpus = []
        for j, gpu_id in enumerate(self.gpu_ids):
            s = hw.gpus.get(j)
            gpus.append(GpuReading(gpu_id) if s is None else GpuReading(
                gpu_id, _opt(s.utilization_percent), _opt(s.memory_used_bytes),
                _opt(s.power_watts)))
        return RankReport(
            rank=self.ctx.rank, node_rank=self.ctx.node_rank, local_rank=self.ctx.local_rank,
            steps_total=f.steps_total, steps=w.steps, samples=w.samples * share,
            tokens=w.tokens * share,
            step_time_sum_s=w.step_time_sum_s, step_time_max_s=w.step_time_max_s,
            collectives=w.collectives, comm_time_s=w.comm_time_s, comm_bytes=float(w.comm_bytes),
            exposed_comm_s=w.exposed_comm_s,
            steady_steps=steady.steps,
            steady_throughput_samples_per_s=_opt(_scaled(steady.throughput_samples_per_s,
                                                         share)),
            steady_throughput_tokens_per_s=_opt(_scaled(steady.throughput_tokens_per_s, share)),
            steady_throughput_steps_per_s=_opt(steady.throughput_steps_per_s),
            steady_step_time_mean_s=_opt(steady.step_time_mean_s),
            steady_step_time_p50_s=_opt(steady.step_time_p50_s),
            steady_step_time_p90_s=_opt(steady.step_time_p90_s),
            comm_steps=int(comm.steps), comm_step_time_s=float(comm.step_time_s),
            comm_collectives=int(comm.totals.collectives),
            comm_time_total_s=float(comm.totals.time_s),
            comm_bytes_total=float(comm.totals.bytes),
            comm_exposed_total_s=float(comm.totals.exposed_s),
            process_cpu_percent=self._cpu_pct,
            process_rss_bytes=_opt(host.process_rss_bytes if host else None),
            cpu_utilization_percent=_opt(host.cpu_utilization_percent if host else None),
            host_memory_used_bytes=_opt(host.host_memory_used_bytes if host else None),
            peak_memory_bytes=_opt(f.peak_memory_bytes), energy_joules=_opt(f.energy_joules),
            gpus=tuple(gpus))

    def row(self, f: RankFigures) -> list[float]:
        """:meth:`report` as the row the gatherer sends."""
        return encode(self.report(f))

    def empty_row(self, steps_total: int) -> list[float]:
        """A row with this rank's place and step count only (its report could not be built)."""
        c = self.ctx
        return encode(RankReport(c.rank, c.node_rank, c.local_rank, steps_total=steps_total))
