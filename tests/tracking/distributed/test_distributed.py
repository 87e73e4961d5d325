"""How a distributed job's figures combine — with plain numbers, no torchrun.

The torchrun runs themselves are in ``test_distributed_torchrun.py``.
"""

from __future__ import annotations

import math
from collections import deque

import pytest

from mlflow_gpuopt.tracking.distributed import comm_meter as comm_mod
from mlflow_gpuopt.tracking.aggregate import StepAggregator
from mlflow_gpuopt.tracking.steps import CommTotals, StepRecord
from mlflow_gpuopt.tracking.distributed.comm_meter import CommMeter
from mlflow_gpuopt.tracking.distributed.context import DistributedContext
from mlflow_gpuopt.tracking.distributed.rank_rows import (
    MAX_GPUS_PER_RANK,
    WIDTH,
    GpuReading,
    JobCombiner,
    RankReport,
    decode,
    encode,
    job_layout,
    job_summary,
    round_metrics,
)

NAN = float("nan")


def report(rank: int, node: int = 0, local: int | None = None, **kw) -> RankReport:
    return RankReport(rank=rank, node_rank=node, local_rank=rank if local is None else local,
                      steps_total=kw.pop("steps_total", 10), **kw)


def test_row_roundtrip_keeps_every_field_and_nan():
    r = report(3, node=1, local=1, steps=7, samples=224, tokens=0, step_time_sum_s=0.35,
               comm_bytes=340008.0, exposed_comm_s=0.01, steady_throughput_samples_per_s=640.0,
               process_rss_bytes=NAN,
               gpus=(GpuReading(1, 97.0, 3.2e10, NAN), GpuReading(5, 12.5, NAN, 250.0)))
    row = encode(r)
    assert len(row) == WIDTH
    back = decode(row)
    assert back.rank == 3 and back.node_rank == 1 and back.steps == 7 and back.samples == 224
    assert back.comm_bytes == 340008.0 and back.steady_throughput_samples_per_s == 640.0
    assert math.isnan(back.process_rss_bytes)
    assert [g.index for g in back.gpus] == [1, 5]
    assert back.gpus[0].utilization_percent == 97.0 and math.isnan(back.gpus[0].power_watts)
    assert back.gpus[1].power_watts == 250.0
    with pytest.raises(ValueError):
        decode(row[:-1])


def test_row_drops_gpus_beyond_the_fixed_width():
    gpus = tuple(GpuReading(i, float(i)) for i in range(MAX_GPUS_PER_RANK + 3))
    back = decode(encode(report(0, gpus=gpus)))
    assert len(back.gpus) == MAX_GPUS_PER_RANK


def test_round_metrics_sum_ranks_and_name_every_gpu_of_every_node():
    reports = [
        report(0, node=0, local=0, steps=10, samples=320, step_time_sum_s=0.5, collectives=10,
               comm_time_s=0.1, comm_bytes=3.4e6, exposed_comm_s=0.05,
               cpu_utilization_percent=80.0, host_memory_used_bytes=1e9,
               gpus=(GpuReading(0, 90.0, 2e10, 300.0),)),
        report(1, node=0, local=1, steps=10, samples=320, step_time_sum_s=0.4, collectives=10,
               comm_time_s=0.3, comm_bytes=3.4e6, exposed_comm_s=0.15,
               cpu_utilization_percent=81.0, gpus=(GpuReading(1, 70.0, 1e10, NAN),)),
        report(2, node=1, local=0, steps=5, samples=160, step_time_sum_s=0.5, collectives=5,
               comm_time_s=0.05, comm_bytes=1.7e6, exposed_comm_s=0.0,
               cpu_utilization_percent=20.0, gpus=(GpuReading(0, 50.0, NAN, 200.0),)),
    ]
    m = round_metrics(reports)
    assert m["gpuopt/rank_0/throughput_samples_per_s"] == pytest.approx(640.0)
    assert m["gpuopt/rank_1/throughput_samples_per_s"] == pytest.approx(800.0)
    assert m["gpuopt/rank_2/throughput_samples_per_s"] == pytest.approx(320.0)
    assert m["gpuopt/throughput_samples_per_s"] == pytest.approx(640.0 + 800.0 + 320.0)
    assert m["gpuopt/rank_2/step_time_s"] == pytest.approx(0.1)
    assert m["gpuopt/step_time_s"] == pytest.approx((0.05 + 0.04 + 0.1) / 3)
    assert m["gpuopt/comm_time_s"] == pytest.approx((0.01 + 0.03 + 0.01) / 3)
    assert m["gpuopt/comm_bytes"] == pytest.approx(3.4e5)
    assert m["gpuopt/exposed_comm_fraction"] == pytest.approx(0.2 / 1.4)
    assert m["gpuopt/node_0/gpu_0_utilization_percent"] == 90.0
    assert m["gpuopt/node_0/gpu_1_memory_used_bytes"] == 1e10
    assert "gpuopt/node_0/gpu_1_power_watts" not in m  # NaN: the device did not say
    assert m["gpuopt/node_1/gpu_0_power_watts"] == 200.0
    assert m["gpuopt/node_0/cpu_utilization_percent"] == 80.0  # the node's first rank says it
    assert m["gpuopt/node_1/cpu_utilization_percent"] == 20.0
    assert job_layout(reports).nodes == 2 and job_layout(reports).device_count == 3
    assert job_layout(reports).gpus_per_node == 2


def test_round_without_samples_or_collectives_logs_no_guess():
    reports = [report(0, steps=4, step_time_sum_s=0.2), report(1, steps=4, samples=64,
                                                                step_time_sum_s=0.2)]
    m = round_metrics(reports)
    assert "gpuopt/throughput_samples_per_s" not in m  # one rank's samples are unknown
    assert "gpuopt/comm_time_s" not in m and "gpuopt/exposed_comm_fraction" not in m
    assert m["gpuopt/rank_1/throughput_samples_per_s"] == pytest.approx(320.0)


def test_summary_is_sum_of_steady_throughputs_and_per_step_comm():
    reports = [
        report(0, steady_throughput_samples_per_s=600.0, steady_step_time_p50_s=0.05,
               steady_step_time_p90_s=0.07, comm_steps=20, comm_step_time_s=1.0,
               comm_collectives=20, comm_time_total_s=0.2, comm_bytes_total=20 * 340008.0,
               comm_exposed_total_s=0.1, peak_memory_bytes=5e8, energy_joules=100.0),
        report(1, steady_throughput_samples_per_s=500.0, steady_step_time_p50_s=0.06,
               steady_step_time_p90_s=0.08, comm_steps=20, comm_step_time_s=1.0,
               comm_collectives=20, comm_time_total_s=0.4, comm_bytes_total=20 * 340008.0,
               comm_exposed_total_s=0.3, peak_memory_bytes=7e8, energy_joules=NAN),
    ]
    m = job_summary(reports).metrics()
    assert m["gpuopt/summary/throughput_samples_per_s"] == pytest.approx(1100.0)
    assert m["gpuopt/summary/step_time_p50_s"] == pytest.approx(0.055)
    assert m["gpuopt/summary/comm_time_per_step_s"] == pytest.approx(0.015)
    assert m["gpuopt/summary/comm_bytes_per_step"] == pytest.approx(340008.0)
    assert m["gpuopt/summary/exposed_comm_fraction"] == pytest.approx(0.2)
    assert m["gpuopt/summary/peak_memory_bytes"] == 7e8
    assert m["gpuopt/summary/energy_joules"] == 100.0
    # a rank without a steady throughput: the job's is unknown, not a partial sum
    partial = job_summary([reports[0], report(1)])
    assert partial.throughput_samples_per_s is None
    assert "gpuopt/summary/throughput_samples_per_s" not in partial.metrics()


def test_combiner_keeps_last_round_and_job_step():
    c = JobCombiner()
    c.add_round([encode(report(0, steps_total=5, gpus=(GpuReading(0, 40.0),))),
                 encode(report(1, steps_total=6, gpus=(GpuReading(1, 60.0),)))])
    c.add_round([encode(report(0, steps_total=9, gpus=(GpuReading(0, 80.0),))),
                 encode(report(1, steps_total=9))])
    assert c.rounds == 2 and c.step == 9
    assert c.summary().gpu_utilization_mean_percent == pytest.approx(60.0)
    assert c.layout().world_size == 2


def test_combiner_carries_intervals_until_every_rank_has_stepped():
    """A timer-driven round can find a rank without a new step: no partial job sum is logged
    then, and the other ranks' interval is added to the next round's."""
    c = JobCombiner()
    first = c.add_round([
        encode(report(0, steps_total=12, steps=2, samples=64, step_time_sum_s=0.02,
                      cpu_utilization_percent=50.0)),
        encode(report(1, steps_total=10, steps=0))])
    assert not any("throughput" in k or "step_time" in k for k in first)
    assert first["gpuopt/node_0/cpu_utilization_percent"] == 50.0  # hardware still logged
    second = c.add_round([
        encode(report(0, steps_total=13, steps=1, samples=32, step_time_sum_s=0.01)),
        encode(report(1, steps_total=13, steps=3, samples=96, step_time_sum_s=0.06))])
    assert second["gpuopt/rank_0/throughput_samples_per_s"] == pytest.approx(96 / 0.03)
    assert second["gpuopt/rank_1/throughput_samples_per_s"] == pytest.approx(96 / 0.06)
    assert second["gpuopt/throughput_samples_per_s"] == pytest.approx(96 / 0.03 + 96 / 0.06)
    assert c.step == 13
    third = c.add_round([encode(report(0, steps_total=14, steps=1, samples=32,
                                       step_time_sum_s=0.01)),
                         encode(report(1, steps_total=14, steps=1, samples=32,
                                       step_time_sum_s=0.01))])
    assert third["gpuopt/rank_0/throughput_samples_per_s"] == pytest.approx(3200.0)  # reset


def test_a_rank_that_stops_stepping_does_not_hide_the_others():
    """After STALLED_ROUNDS rounds without a step from rank 1, rank 0's figures are logged
    over the rounds it waited, without a job sum that would leave rank 1 out silently."""
    from mlflow_gpuopt.tracking.distributed.rank_rows import STALLED_ROUNDS

    c = JobCombiner()
    out = []
    for i in range(STALLED_ROUNDS):
        out.append(c.add_round([
            encode(report(0, steps_total=10 * (i + 1), steps=10, samples=320,
                          step_time_sum_s=0.1)),
            encode(report(1, steps_total=3, steps=0))]))
    assert not any("throughput" in k for m in out[:-1] for k in m)
    last = out[-1]
    assert last["gpuopt/rank_0/throughput_samples_per_s"] == pytest.approx(3200.0)
    assert "gpuopt/rank_1/throughput_samples_per_s" not in last
    assert "gpuopt/throughput_samples_per_s" not in last  # not a partial sum
    assert c.stalled_ranks == (1,)
    both = c.add_round([encode(report(0, steps_total=40, steps=10, samples=320,
                                      step_time_sum_s=0.1)),
                        encode(report(1, steps_total=4, steps=1, samples=32,
                                      step_time_sum_s=0.01))])
    assert both["gpuopt/throughput_samples_per_s"] == pytest.approx(6400.0)
    assert c.stalled_ranks == ()


def test_context_from_torchrun_env():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
    ctx = DistributedContext.from_env(env)
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.node_rank, ctx.nodes) == (3, 4, 1, 1, 2)
    assert ctx.is_distributed and not ctx.is_logging_rank and ctx.strategy == "ddp"
    single = DistributedContext.from_env({})
    assert not single.is_distributed and single.is_logging_rank and single.strategy == "single"
    uneven = DistributedContext.from_env({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"})
    assert uneven.nodes == 2  # without GROUP_WORLD_SIZE: ceil(6 / 4)


def test_comm_meter_exposed_tail_per_step(monkeypatch):
    clock = iter([1.0, 1.5, 2.0, 2.6,  # step 1: launches at 1.0 and 1.5; ends at 2.0 and 2.6
                  10.0, 10.2])  # step 2: launch at 10.0, end at 10.2
    monkeypatch.setattr(comm_mod.time, "perf_counter", lambda: next(clock))
    meter = CommMeter()
    a = meter.launched()
    b = meter.launched()
    meter.completed(a, 100)
    meter.completed(b, 50)
    count, time_s, nbytes, exposed = meter.end_step()
    assert (count, nbytes) == (2, 150)
    assert time_s == pytest.approx(1.0 + 1.1)
    assert exposed == pytest.approx(2.6 - 1.5)  # after the last launch
    c = meter.launched()
    meter.completed(c, 10)
    assert meter.end_step()[3] == pytest.approx(1.1 + 0.2)
    assert meter.end_step()[3] == pytest.approx(1.3)  # a step without collectives adds none


def test_aggregator_turns_cumulative_comm_into_window_and_steady_sums():
    agg = StepAggregator(start_time_s=0.0, warmup_steps=1)
    records = deque([
        StepRecord(0.1, 32, 0, 1, None, CommTotals(1, 0.05, 1000, 0.02)),
        StepRecord(0.2, 32, 0, 1, None, CommTotals(2, 0.08, 2000, 0.03)),
        StepRecord(0.3, 32, 0, 1, None, CommTotals(3, 0.10, 3000, 0.05)),
    ])
    w = agg.consume(records)
    assert (w.steps, w.collectives, w.comm_bytes) == (3, 3, 3000)
    assert w.comm_time_s == pytest.approx(0.10) and w.exposed_comm_s == pytest.approx(0.05)
    assert w.step_time_max_s == pytest.approx(0.1)
    steady = agg.comm_summary()  # past warm-up: the steady steps only
    assert steady.steps == 2
    assert steady.totals.collectives == 2 and steady.totals.bytes == 2000  # warm-up left out
    assert steady.totals.time_s == pytest.approx(0.05)
    assert steady.step_time_s == pytest.approx(0.2)
    # single-process records (no comm) give a window without communication
    agg2 = StepAggregator(0.0, 0)
    w2 = agg2.consume(deque([StepRecord(0.1, 8, 0, 1, None, None)]))
    assert w2.steps == 1 and w2.comm_time_s == 0.0
