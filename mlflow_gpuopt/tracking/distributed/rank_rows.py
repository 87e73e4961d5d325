"""What each rank of a distributed job reports every interval, and how rank 0 combines it.

Pure code (no torch, no mlflow): a :class:`RankReport` is encoded into a fixed-length list of
floats (the same length on every rank, so it can be all-gathered as one small tensor; absent
readings are NaN), decoded on rank 0, and :class:`JobCombiner` turns the reports of one round
into the run's metrics:

* per rank: ``gpuopt/rank_<r>/throughput_samples_per_s``, ``gpuopt/rank_<r>/step_time_s``,
  ``gpuopt/rank_<r>/process_cpu_percent``, ``gpuopt/rank_<r>/process_rss_bytes``;
* per node: ``gpuopt/node_<k>/gpu_<i>_{utilization_percent,memory_used_bytes,power_watts}``
  (``i``: the GPU's index on its node) and ``gpuopt/node_<k>/cpu_utilization_percent``,
  ``gpuopt/node_<k>/host_memory_used_bytes``;
* the job: ``gpuopt/throughput_samples_per_s`` (sum over ranks), ``gpuopt/step_time_s`` (mean
  over ranks), ``gpuopt/comm_time_s`` and ``gpuopt/comm_bytes`` (per step, mean over ranks),
  ``gpuopt/exposed_comm_fraction`` (exposed communication time / step time, all ranks).

At the end, :meth:`JobCombiner.summary` gives the job's steady state as a typed
:class:`JobSummary`; its metric names are given only when it is logged.

Interval figures are deltas since the rank's previous report; steady-state figures
(``steady_*``, ``comm_*``) are cumulative, so the last round alone gives the summary.

The gathering rounds run on a timer, not on step boundaries, so a round can find a rank that
completed no step since the last one (a slow step, or the last round after training ended).
:class:`JobCombiner` then carries the other ranks' intervals over to the next round instead of
logging a partial sum: the job's throughput is always the sum over *every* rank, and the
throughput series advance one job step per logged value. A rank that stays without a step
for ``STALLED_ROUNDS`` rounds while others step (uneven data, or its step clock switched off
after an error) no longer holds the others back: their per-rank figures are logged and the
job's sums are left out, and :attr:`JobCombiner.stalled_ranks` names it for that round.
Intervals still waiting when the job ends are not logged (the steady-state summary covers
them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from mlflow_gpuopt import contract

#: Rounds a rank may go without a step before the others' figures are logged without it.
STALLED_ROUNDS = 3
#: GPUs one rank can report (one process usually drives one GPU; a fixed width keeps the
#: gathered tensor the same size on every rank).
MAX_GPUS_PER_RANK = 8
NAN = float("nan")


@dataclass(frozen=True)
class GpuReading:
    """One GPU as a rank saw it in the interval; NaN where the device does not say."""

    index: int  # the GPU's index on its node (process-visible index before selection)
    utilization_percent: float = NAN
    memory_used_bytes: float = NAN
    power_watts: float = NAN


@dataclass(frozen=True)
class RankReport:
    """One rank's figures for one gathering round (units in the names; NaN = unknown)."""

    rank: int
    node_rank: int
    local_rank: int
    steps_total: int  # steps completed since tracking started (cumulative)
    # -- the interval (deltas since the previous report)
    steps: int = 0
    samples: float = 0.0  # this rank's share of the samples (see JobTracking.sample_share)
    tokens: float = 0.0
    step_time_sum_s: float = 0.0
    step_time_max_s: float = 0.0
    collectives: int = 0
    comm_time_s: float = 0.0
    comm_bytes: float = 0.0
    exposed_comm_s: float = 0.0
    # -- steady state so far (warm-up excluded; cumulative)
    steady_steps: int = 0
    steady_throughput_samples_per_s: float = NAN
    steady_throughput_tokens_per_s: float = NAN
    steady_throughput_steps_per_s: float = NAN
    steady_step_time_mean_s: float = NAN
    steady_step_time_p50_s: float = NAN
    steady_step_time_p90_s: float = NAN
    # -- communication over the steady steps (all steps if the run is too short; cumulative)
    comm_steps: int = 0
    comm_step_time_s: float = 0.0  # step time over those steps
    comm_collectives: int = 0
    comm_time_total_s: float = 0.0
    comm_bytes_total: float = 0.0
    comm_exposed_total_s: float = 0.0
    # -- this rank's host and memory
    process_cpu_percent: float = NAN  # this process, all threads, over the interval
    process_rss_bytes: float = NAN
    cpu_utilization_percent: float = NAN  # whole host
    host_memory_used_bytes: float = NAN
    peak_memory_bytes: float = NAN  # GPU (torch reserved / NVML) else process RSS
    energy_joules: float = NAN  # this rank's GPUs since tracking started
    gpus: tuple[GpuReading, ...] = ()


_SCALARS = [f.name for f in fields(RankReport) if f.name != "gpus"]
_GPU_FIELDS = [f.name for f in fields(GpuReading)]
#: Floats per rank on the wire.
WIDTH = len(_SCALARS) + 1 + MAX_GPUS_PER_RANK * len(_GPU_FIELDS)
_INTS = {f.name for f in fields(RankReport) if f.type in ("int", int)}


def encode(report: RankReport) -> list[float]:
    """The report as ``WIDTH`` floats (GPUs beyond ``MAX_GPUS_PER_RANK`` are dropped)."""
    row = [float(getattr(report, name)) for name in _SCALARS]
    gpus = report.gpus[:MAX_GPUS_PER_RANK]
    row.append(float(len(gpus)))
    for g in gpus:
        row.extend(float(getattr(g, name)) for name in _GPU_FIELDS)
    row.extend([NAN] * (WIDTH - len(row)))
    return row


def decode(row: list[float]) -> RankReport:
    """Inverse of :func:`encode`."""
    if len(row) != WIDTH:
        raise ValueError(f"a rank row has {len(row)} values, expected {WIDTH}")
    values = {}
    # the row is longer than _SCALARS: the per-GPU fields follow the scalars
    for name, v in zip(_SCALARS, row, strict=False):
        values[name] = int(v) if name in _INTS and math.isfinite(v) else v
    n = len(_SCALARS)
    count = int(row[n]) if math.isfinite(row[n]) else 0
    k = len(_GPU_FIELDS)
    gpus = []
    for j in range(min(count, MAX_GPUS_PER_RANK)):
        chunk = row[n + 1 + j * k:n + 1 + (j + 1) * k]
        gpus.append(GpuReading(int(chunk[0]), *chunk[1:]))
    return RankReport(**values, gpus=tuple(gpus))


def _finite(v: float) -> bool:
    return v is not None and math.isfinite(v)


def _mean(values: list[float]) -> float | None:
    vals = [v for v in values if _finite(v)]
    return sum(vals) / len(vals) if vals else None


@dataclass(frozen=True)
class JobLayout:
    """How the job is laid out, as the reports show it."""

    world_size: int
    nodes: int
    gpus_per_node: int  # most GPUs reported on one node (0 on CPU)
    device_count: int  # GPUs in the whole job (0 on CPU)


def job_layout(reports: list[RankReport]) -> JobLayout:
    per_node: dict[int, set[int]] = {}
    for r in reports:
        per_node.setdefault(r.node_rank, set()).update(g.index for g in r.gpus)
    return JobLayout(world_size=len(reports), nodes=len(per_node),
                     gpus_per_node=max((len(s) for s in per_node.values()), default=0),
                     device_count=sum(len(s) for s in per_node.values()))


def round_metrics(reports: list[RankReport], job_sums: bool = True) -> dict[str, float]:
    """The metrics of one gathering round (see the module docstring for the names);
    ``job_sums=False`` leaves out the job's throughputs (some rank's interval is missing)."""
    m: dict[str, float] = {}
    rates: list[float] = []
    token_rates: list[float] = []
    step_times: list[float] = []
    comm_time: list[float] = []
    comm_bytes: list[float] = []
    exposed = busy = 0.0
    all_rates = True
    measured = any(r.collectives or r.comm_collectives for r in reports)
    nodes_seen: set[int] = set()
    for r in sorted(reports, key=lambda r: (r.node_rank, r.local_rank)):
        if r.steps > 0 and r.step_time_sum_s > 0:
            step_times.append(r.step_time_sum_s / r.steps)
            m[contract.rank_metric(r.rank, contract.RANK_STEP_TIME_S)] = step_times[-1]
            if r.samples > 0:
                rates.append(r.samples / r.step_time_sum_s)
                m[contract.rank_metric(r.rank, contract.RANK_THROUGHPUT_SAMPLES)] = rates[-1]
            else:
                all_rates = False
            if r.tokens > 0:
                token_rates.append(r.tokens / r.step_time_sum_s)
            if measured:
                comm_time.append(r.comm_time_s / r.steps)
                comm_bytes.append(r.comm_bytes / r.steps)
                exposed += r.exposed_comm_s
                busy += r.step_time_sum_s
        for name in (contract.RANK_PROCESS_CPU_PERCENT, contract.RANK_PROCESS_RSS_BYTES):
            if _finite(getattr(r, name)):
                m[contract.rank_metric(r.rank, name)] = getattr(r, name)
        if r.node_rank not in nodes_seen:  # host-wide figures: the node's first rank says them
            nodes_seen.add(r.node_rank)
            for name in (contract.NODE_CPU_UTILIZATION_PERCENT,
                         contract.NODE_HOST_MEMORY_USED_BYTES):
                if _finite(getattr(r, name)):
                    m[contract.node_metric(r.node_rank, name)] = getattr(r, name)
        for g in r.gpus:
            for name in (contract.GPU_UTILIZATION_PERCENT, contract.GPU_MEMORY_USED_BYTES,
                         contract.GPU_POWER_WATTS):
                if _finite(getattr(g, name)):
                    m[contract.node_gpu_metric(r.node_rank, g.index, name)] = getattr(g, name)
    if step_times:
        m[contract.METRIC_STEP_TIME_S] = sum(step_times) / len(step_times)
    if rates and all_rates and job_sums:
        m[contract.METRIC_THROUGHPUT_SAMPLES] = sum(rates)
    if token_rates and job_sums:
        m[contract.METRIC_THROUGHPUT_TOKENS] = sum(token_rates)
    if comm_time:
        m[contract.METRIC_COMM_TIME_S] = sum(comm_time) / len(comm_time)
        m[contract.METRIC_COMM_BYTES] = sum(comm_bytes) / len(comm_bytes)
        if busy > 0:
            m[contract.METRIC_EXPOSED_COMM_FRACTION] = min(1.0, exposed / busy)
    return m


@dataclass(frozen=True)
class JobSummary:
    """The job's steady-state figures from the ranks' last reports (``None``: unknown).

    Throughputs (samples, tokens) are sums of the ranks' steady-state throughputs, known only
    when every rank has one; step times and steps/s are means over ranks; communication is per
    step, mean over ranks, and the exposed fraction is exposed communication time / step time
    over all ranks; peak memory is the largest rank's, energy the sum over ranks.
    """

    throughput_samples_per_s: float | None = None
    throughput_tokens_per_s: float | None = None
    throughput_steps_per_s: float | None = None
    step_time_mean_s: float | None = None
    step_time_p50_s: float | None = None
    step_time_p90_s: float | None = None
    comm_time_per_step_s: float | None = None
    comm_bytes_per_step: float | None = None
    collectives_per_step: float | None = None
    exposed_comm_fraction: float | None = None  # 0..1
    peak_memory_bytes: float | None = None
    energy_joules: float | None = None
    gpu_utilization_mean_percent: float | None = None  # every GPU reading of every round

    def metrics(self) -> dict[str, float]:
        """The ``gpuopt/summary/*`` metrics (``contract.SUMMARY_*``); unknown ones left out."""
        values = {
            contract.SUMMARY_THROUGHPUT_SAMPLES: self.throughput_samples_per_s,
            contract.SUMMARY_THROUGHPUT_TOKENS: self.throughput_tokens_per_s,
            contract.SUMMARY_THROUGHPUT_STEPS: self.throughput_steps_per_s,
            contract.SUMMARY_STEP_TIME_MEAN_S: self.step_time_mean_s,
            contract.SUMMARY_STEP_TIME_P50_S: self.step_time_p50_s,
            contract.SUMMARY_STEP_TIME_P90_S: self.step_time_p90_s,
            contract.SUMMARY_COMM_TIME_PER_STEP_S: self.comm_time_per_step_s,
            contract.SUMMARY_COMM_BYTES_PER_STEP: self.comm_bytes_per_step,
            contract.SUMMARY_COLLECTIVES_PER_STEP: self.collectives_per_step,
            contract.SUMMARY_EXPOSED_COMM_FRACTION: self.exposed_comm_fraction,
            contract.SUMMARY_PEAK_MEMORY_BYTES: self.peak_memory_bytes,
            contract.SUMMARY_ENERGY_JOULES: self.energy_joules,
            contract.SUMMARY_GPU_UTILIZATION: self.gpu_utilization_mean_percent,
        }
        return {k: float(v) for k, v in values.items() if v is not None}


def _sum_if_all(values: list[float]) -> float | None:
    """The sum when every value is finite and positive (a job rate is not a partial sum)."""
    return sum(values) if values and all(_finite(v) and v > 0 for v in values) else None


def job_summary(reports: list[RankReport],
                gpu_utilization_mean_percent: float | None = None) -> JobSummary:
    """The job's :class:`JobSummary` from the ranks' last reports."""
    with_comm = [r for r in reports if r.comm_steps > 0 and r.comm_collectives > 0]
    comm: dict[str, float | None] = {}
    if with_comm:
        n = len(with_comm)
        busy = sum(r.comm_step_time_s for r in with_comm)
        comm = {
            "comm_time_per_step_s": sum(r.comm_time_total_s / r.comm_steps
                                        for r in with_comm) / n,
            "comm_bytes_per_step": sum(r.comm_bytes_total / r.comm_steps for r in with_comm) / n,
            "collectives_per_step": sum(r.comm_collectives / r.comm_steps
                                        for r in with_comm) / n,
            "exposed_comm_fraction": (min(1.0, sum(r.comm_exposed_total_s for r in with_comm)
                                          / busy) if busy > 0 else None),
        }
    peak = [r.peak_memory_bytes for r in reports if _finite(r.peak_memory_bytes)]
    energy = [r.energy_joules for r in reports if _finite(r.energy_joules)]
    return JobSummary(
        throughput_samples_per_s=_sum_if_all([r.steady_throughput_samples_per_s
                                              for r in reports]),
        throughput_tokens_per_s=_sum_if_all([r.steady_throughput_tokens_per_s for r in reports]),
        throughput_steps_per_s=_mean([r.steady_throughput_steps_per_s for r in reports]),
        step_time_mean_s=_mean([r.steady_step_time_mean_s for r in reports]),
        step_time_p50_s=_mean([r.steady_step_time_p50_s for r in reports]),
        step_time_p90_s=_mean([r.steady_step_time_p90_s for r in reports]),
        peak_memory_bytes=max(peak) if peak else None,
        energy_joules=sum(energy) if energy else None,
        gpu_utilization_mean_percent=gpu_utilization_mean_percent, **comm)


#: The interval fields of a report, summed when an interval is carried over to the next round.
_INTERVAL_SUMS = ("steps", "samples", "tokens", "step_time_sum_s", "collectives", "comm_time_s",
                  "comm_bytes", "exposed_comm_s")


def _no_interval(r: RankReport) -> RankReport:
    return replace(r, step_time_max_s=0.0, **{name: 0 for name in _INTERVAL_SUMS})


def _carry(earlier: RankReport | None, later: RankReport) -> RankReport:
    """``later`` with ``earlier``'s interval added (the rank's figures over both rounds)."""
    if earlier is None:
        return later
    sums = {name: getattr(earlier, name) + getattr(later, name) for name in _INTERVAL_SUMS}
    return replace(later, step_time_max_s=max(earlier.step_time_max_s, later.step_time_max_s),
                   **sums)


class JobCombiner:
    """Rank 0's state across rounds: the latest report of every rank, the intervals not yet
    logged, and GPU utilisation."""

    def __init__(self) -> None:
        self.reports: list[RankReport] = []
        self.rounds = 0
        self._pending: dict[int, RankReport] = {}  # rank -> its interval since the last log
        self._waits = 0  # rounds the pending intervals have waited for a rank without steps
        self.stalled_ranks: tuple[int, ...] = ()  # ranks this round logged without (no steps)
        self._util_sum = 0.0
        self._util_n = 0

    def add_round(self, rows: list[list[float]]) -> dict[str, float]:
        """Decode one round's rows; returns its metrics.

        Step figures (per-rank and job throughput, step and communication time) come only
        when every rank has completed a step since they were last given, over the interval
        since then; until that happens the round gives hardware figures alone.
        """
        reports = [decode(row) for row in rows]
        self.reports = reports
        self.rounds += 1
        self.stalled_ranks = ()
        for r in reports:
            for g in r.gpus:
                if _finite(g.utilization_percent):
                    self._util_sum += g.utilization_percent
                    self._util_n += 1
        merged = [_carry(self._pending.get(r.rank), r) for r in reports]
        if all(r.steps > 0 for r in merged):
            self._pending, self._waits = {}, 0
            return round_metrics(merged)
        if any(r.steps > 0 for r in reports):
            self._waits += 1
        if self._waits >= STALLED_ROUNDS:  # log the ranks that step; no job sums
            self.stalled_ranks = tuple(sorted(r.rank for r in merged if r.steps == 0))
            self._pending, self._waits = {}, 0
            return round_metrics(merged, job_sums=False)
        self._pending = {r.rank: r for r in merged if r.steps > 0}
        return round_metrics([_no_interval(r) for r in reports])

    @property
    def step(self) -> int:
        """The job's step: the most steps any rank has completed."""
        return max((r.steps_total for r in self.reports), default=0)

    def layout(self) -> JobLayout | None:
        return job_layout(self.reports) if self.reports else None

    def summary(self) -> JobSummary:
        """The job's steady-state figures from every rank's last report."""
        return job_summary(self.reports,
                           self._util_sum / self._util_n if self._util_n else None)
