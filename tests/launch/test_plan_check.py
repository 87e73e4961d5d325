"""A plan's predictions against a job's measurements: ratios and the off-plan line (pure)."""

from __future__ import annotations

import pytest

from mlflow_gpuopt import contract
from mlflow_gpuopt.launch.plan_check import (
    MEMORY_MARGIN,
    Measured,
    PlanPrediction,
    outlier_line,
    plan_from_candidate,
    prediction_metrics,
    prediction_ratios,
)
from mlflow_gpuopt.tracking.plan_link import plan_id_for, plan_tags

ROW = {"rank": 2, "provider": "aws", "instance_type": "p4d.24xlarge", "gpu": "A100-40GB-SXM4",
       "nodes": 1, "gpus": 8, "gpus_per_node": 8, "strategy": "ddp", "micro_batch": 16,
       "grad_accum": 2, "precision": "bf16", "throughput_samples_per_s": 1000.0,
       "throughput_low_samples_per_s": 800.0, "throughput_high_samples_per_s": 1250.0,
       "step_time_s": 0.256, "memory_per_gpu_bytes": 20e9, "predicted_hours": 10.5,
       "predicted_hours_low": 8.5, "predicted_hours_high": 13.0, "predicted_cost_usd": 350.0,
       "startup_hours": 0.5, "overhead_hours": 0.0, "exposed_comm_fraction": 0.05,
       "global_batch": 256}


def _plan(**changes) -> PlanPrediction:
    return plan_from_candidate({**ROW, **changes}, plan_id="rec:2", recommendation_run_id="rec",
                               target={"total_samples": 3.6e7}, source_run_ids=("src",))


def test_plan_from_a_candidate_row_and_its_metrics():
    p = _plan()
    assert (p.rank, p.throughput_samples_per_s, p.step_time_s, p.fixed_hours) == (2, 1000.0,
                                                                                   0.256, 0.5)
    m = prediction_metrics(p)
    assert m[contract.PREDICTED_THROUGHPUT_SAMPLES] == 1000.0
    assert m[contract.PREDICTED_HOURS] == 10.5 and m[contract.PREDICTED_COST_USD] == 350.0
    assert m[contract.PREDICTED_MEMORY_PER_GPU_BYTES] == 20e9
    assert m[contract.PREDICTED_STEP_TIME_S] == 0.256


def test_older_rows_get_interval_from_hours_and_step_time_from_the_batch():
    row = {k: v for k, v in ROW.items() if k not in (
        "throughput_low_samples_per_s", "throughput_high_samples_per_s", "step_time_s")}
    p = plan_from_candidate(row, plan_id="rec:2", recommendation_run_id="rec")
    # compute hours 10 at 1000/s: 12.5 compute hours at the slow end, 8 at the fast end
    assert p.throughput_low_samples_per_s == pytest.approx(1000 * 10 / 12.5)
    assert p.throughput_high_samples_per_s == pytest.approx(1000 * 10 / 8)
    assert p.step_time_s == pytest.approx(256 / 1000)


def test_ratios_are_measured_over_predicted_and_memory_only_when_measured():
    p = _plan()
    r = prediction_ratios(Measured(throughput_samples_per_s=900.0, step_time_s=0.3,
                                   peak_memory_per_gpu_bytes=25e9), p)
    assert r == {contract.SUMMARY_PREDICTION_RATIO_THROUGHPUT: pytest.approx(0.9),
                 contract.SUMMARY_PREDICTION_RATIO_STEP_TIME: pytest.approx(0.3 / 0.256),
                 contract.SUMMARY_PREDICTION_RATIO_MEMORY: pytest.approx(1.25)}
    cpu = prediction_ratios(Measured(throughput_samples_per_s=900.0), p)
    assert set(cpu) == {contract.SUMMARY_PREDICTION_RATIO_THROUGHPUT}


def test_inside_the_interval_and_margin_says_nothing():
    p = _plan()
    assert outlier_line(Measured(throughput_samples_per_s=800.0,
                                 peak_memory_per_gpu_bytes=20e9 * (1 + MEMORY_MARGIN)), p) is None
    assert outlier_line(Measured(throughput_samples_per_s=1250.0), p) is None


def test_slow_with_a_busy_host_points_at_the_input_pipeline():
    line = outlier_line(Measured(throughput_samples_per_s=500.0, gpu_utilization_percent=40.0,
                                 cpu_utilization_percent=95.0, micro_batch=16,
                                 precision="bf16", exposed_comm_fraction=0.06), _plan())
    assert line is not None and "\n" not in line
    assert "below plan rec:2's 90% interval (800-1250)" in line
    assert "input pipeline starving the GPU (GPU 40% busy, CPU 95%)" in line
    assert "micro-batch" not in line and "communication" not in line


def test_different_batch_precision_and_exposed_comm_are_named():
    line = outlier_line(Measured(throughput_samples_per_s=1500.0, micro_batch=8,
                                 precision="fp32", exposed_comm_fraction=0.30,
                                 gpu_utilization_percent=95.0, cpu_utilization_percent=95.0),
                        _plan())
    assert "above plan rec:2's 90% interval" in line
    assert "micro-batch 8, the plan's is 16" in line
    assert "precision fp32, the plan's is bf16" in line
    assert "communication exposed for 30% of a step, the model's share is 5%" in line
    assert "input pipeline" not in line  # the GPU was busy


def test_memory_over_the_margin_alone_is_said_without_a_cause():
    line = outlier_line(Measured(throughput_samples_per_s=1000.0,
                                 peak_memory_per_gpu_bytes=23e9), _plan())
    assert "peak memory 21.42 GiB per GPU is over the predicted 18.63 GiB by more than 10%" \
        in line
    assert line.endswith("no cause stands out in the measurements")


def test_plan_id_from_the_argument_or_the_environment(monkeypatch):
    monkeypatch.setenv("GPUOPT_PLAN", "abc:3")
    assert plan_id_for(None) == "abc:3" and plan_id_for("x:1") == "x:1"
    monkeypatch.delenv("GPUOPT_PLAN")
    assert plan_id_for(None) is None
    assert plan_tags("abc:3") == {contract.TAG_PLAN: "abc:3", contract.TAG_PLAN_RANK: "3",
                                  contract.TAG_RECOMMENDATION_RUN_ID: "abc"}
    assert plan_tags("4") == {contract.TAG_PLAN: "4", contract.TAG_PLAN_RANK: "4"}
    assert plan_tags("not a plan") == {}
