"""A rank's report, built from its step windows, hardware reading and cumulative figures
(``tracking/rank_report.py``): plain numbers, no torchrun."""

from __future__ import annotations

import math

import pytest

from mlflow_gpuopt.devices.samples import GpuSample, HostSample
from mlflow_gpuopt.tracking.aggregate import CommSummary, SteadyState, StepWindow
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.distributed.rank_rows import decode
from mlflow_gpuopt.tracking.hw_reader import HardwareReading
from mlflow_gpuopt.tracking.rank_report import RankFigures, RankReports
from mlflow_gpuopt.tracking.steps import CommTotals

CTX = DistributedContext.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                   "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                                   "GROUP_WORLD_SIZE": "2"})


def window(steps: int, duration_s: float, samples: int, **kw) -> StepWindow:
    return StepWindow(first_step=0, last_step=steps - 1, steps=steps, duration_s=duration_s,
                      samples=samples, tokens=kw.pop("tokens", 0), **kw)


def figures(steps_total: int, rate: float | None) -> RankFigures:
    steady = SteadyState(steps=steps_total - 2, warmup_steps=2, step_time_p50_s=0.1,
                         step_time_p90_s=0.12, step_time_mean_s=0.105,
                         throughput_samples_per_s=rate, throughput_tokens_per_s=None,
                         throughput_steps_per_s=9.5)
    comm = CommSummary(steps=steps_total - 2, step_time_s=0.84,
                       totals=CommTotals(collectives=16, time_s=0.2, bytes=4096,
                                         exposed_s=0.05))
    return RankFigures(steps_total, steady, comm, energy_joules=None,
                       peak_memory_bytes=3e9)


def test_windows_of_one_round_add_up_and_the_next_round_starts_empty():
    rows = RankReports(CTX, gpu_ids=[5], interval_s=1.0, sample_share=0.5)  # tp=2
    rows.add(window(3, 0.3, 96, step_time_max_s=0.12, collectives=6, comm_bytes=1536,
                    comm_time_s=0.06, exposed_comm_s=0.01), None)
    rows.add(window(2, 0.25, 64, step_time_max_s=0.15, tokens=640), HardwareReading(
        gpus={0: GpuSample(0, utilization_percent=87.0, memory_used_bytes=2e9,
                           power_watts=250.0)},
        host=HostSample(cpu_utilization_percent=40.0, process_rss_bytes=1e9,
                        host_memory_used_bytes=8e9)))
    r = decode(rows.row(figures(10, 320.0)))
    assert (r.rank, r.node_rank, r.local_rank, r.steps_total) == (3, 1, 1, 10)
    assert (r.steps, r.collectives) == (5, 6)
    assert r.samples == (96 + 64) * 0.5 and r.tokens == 640 * 0.5  # this rank's share
    assert r.step_time_sum_s == pytest.approx(0.55) and r.step_time_max_s == 0.15
    assert r.comm_bytes == 1536.0 and r.exposed_comm_s == pytest.approx(0.01)
    assert r.steady_throughput_samples_per_s == 320.0 * 0.5
    assert math.isnan(r.steady_throughput_tokens_per_s)  # unknown stays unknown
    assert (r.comm_steps, r.comm_collectives, r.comm_bytes_total) == (8, 16, 4096.0)
    assert r.peak_memory_bytes == 3e9 and math.isnan(r.energy_joules)
    assert r.cpu_utilization_percent == 40.0 and r.process_rss_bytes == 1e9
    # the GPU is reported under its node-local index, not its position in this process
    assert [(g.index, g.utilization_percent, g.power_watts) for g in r.gpus] == [
        (5, 87.0, 250.0)]
    nxt = decode(rows.row(figures(11, 330.0)))
    assert (nxt.steps, nxt.samples, nxt.step_time_sum_s) == (0, 0.0, 0.0)
    assert nxt.gpus[0].utilization_percent == 87.0  # the last reading is kept


def test_a_rank_without_a_reading_or_a_report_still_says_where_it_is():
    rows = RankReports(CTX, gpu_ids=[0, 1], interval_s=1.0)
    r = decode(rows.row(figures(4, None)))
    assert [g.index for g in r.gpus] == [0, 1]
    assert all(math.isnan(g.utilization_percent) for g in r.gpus)
    empty = decode(rows.empty_row(steps_total=7))
    assert (empty.rank, empty.node_rank, empty.steps_total, empty.steps) == (3, 1, 7, 0)
