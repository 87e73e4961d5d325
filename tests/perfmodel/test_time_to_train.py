"""Time to train: hand-computed hours, interval and breakdown; target conversions; the
``predict`` flags that ask for it."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import (
    MemoryBreakdown,
    ParallelConfig,
    PerfModelError,
    Prediction,
    samples_for_target,
    time_to_train,
)

PRED = Prediction(
    gpu="A100-80GB-SXM4", config=ParallelConfig(gpus_per_node=8),
    throughput_samples_per_s=512.0, low=400.0, high=640.0, log_sigma=0.1, step_time_s=0.5,
    compute_s=0.4, exposed_comm_s=0.08, bubble_s=0.02,
    memory=MemoryBreakdown(1.0, 1.0, 1.0, 1.0, 1.0), memory_capacity_bytes=80e9, fits=True,
    max_micro_batch=64, samples_per_step=256, extrapolated=False)


def test_hours_interval_and_breakdown_hand_computed():
    t = time_to_train(PRED, samples=1e6, startup_s=300.0)
    # ceil(1e6 / 256) = 3907 steps x 0.5 s = 1953.5 s, + 300 s start-up
    assert t.steps == 3907
    assert t.hours == pytest.approx((1953.5 + 300) / 3600)
    # interval on throughput 400..640 around 512: time x 512/640 .. x 512/400
    assert t.hours_low == pytest.approx((1953.5 * 0.8 + 300) / 3600)
    assert t.hours_high == pytest.approx((1953.5 * 1.28 + 300) / 3600)
    assert t.compute_hours == pytest.approx(3907 * 0.4 / 3600)
    assert t.exposed_comm_hours == pytest.approx(3907 * 0.08 / 3600)
    assert t.bubble_hours == pytest.approx(3907 * 0.02 / 3600)
    assert t.compute_hours + t.exposed_comm_hours + t.bubble_hours == pytest.approx(
        (t.hours * 3600 - 300) / 3600)


def test_exact_multiple_of_the_global_batch_is_not_rounded_up():
    assert time_to_train(PRED, samples=256 * 10).steps == 10


@pytest.mark.parametrize("kwargs, expected", [
    ({"samples": 5e6}, 5e6),
    ({"epochs": 90, "dataset_size": 1_281_167}, 90 * 1_281_167),
    ({"tokens": 2e9, "tokens_per_sample": 1024}, 2e9 / 1024),
    ({"steps": 1000, "samples_per_step": 512}, 512_000),
])
def test_samples_for_target(kwargs, expected):
    assert samples_for_target(**kwargs) == pytest.approx(expected)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "no training target"),
    ({"samples": 1e6, "steps": 10, "samples_per_step": 8}, "not samples and steps"),
    ({"epochs": 3}, "dataset size"),
    ({"tokens": 1e9}, "tokens_per_sample"),
    ({"steps": 100}, "global batch"),
    ({"samples": -5}, "positive"),
    ({"epochs": 2, "dataset_size": 0}, "positive"),
])
def test_samples_for_target_errors(kwargs, message):
    with pytest.raises(PerfModelError, match=message):
        samples_for_target(**kwargs)


def test_negative_startup_is_refused():
    with pytest.raises(PerfModelError, match="startup"):
        time_to_train(PRED, samples=1e6, startup_s=-1)


# -- predict flags ----------------------------------------------------------------------------
WORKLOAD = {"schema": "gpuopt.workload/1", "name": "gpt-small", "params": 125_000_000,
            "flops_per_sample": 7.7e11, "precision": "bf16", "micro_batch": 16,
            "optimizer": "AdamW", "optimizer_state_bytes_per_param": 8,
            "tokens_per_sample": 1024}
OBS = ("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,precision\n"
       "NVIDIA A100-SXM4-80GB,1,1,16,150,single,bf16\n")


@pytest.fixture
def args(tmp_path):
    w = tmp_path / "workload.json"
    w.write_text(json.dumps(WORKLOAD))
    o = tmp_path / "obs.csv"
    o.write_text(OBS)
    return ["predict", "--workload", str(w), "--observations", str(o), "--gpu",
            "A100-80GB-SXM4", "--gpus", "8"]


def _json(argv):
    r = CliRunner().invoke(gpuopt, [*argv, "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_predict_tokens_target_json(args):
    out = _json([*args, "--tokens", "2B"])
    samples = 2e9 / 1024
    steps = math.ceil(samples / out["samples_per_step"])
    assert out["target_samples"] == pytest.approx(samples)
    assert out["time_to_train_hours"] == pytest.approx(steps * out["step_time_s"] / 3600)
    assert out["time_to_train_hours_low"] < out["time_to_train_hours"] \
        < out["time_to_train_hours_high"]
    b = out["time_breakdown_hours"]
    assert set(b) == {"compute", "exposed_comm", "bubble"}
    assert b["compute"] == pytest.approx(steps * out["time_breakdown"]["compute_s"] / 3600)
    assert b["exposed_comm"] > 0  # 8-GPU DDP has some exposed all-reduce
    assert b["compute"] + b["exposed_comm"] + b["bubble"] == pytest.approx(
        out["time_to_train_hours"], rel=1e-6)


def test_predict_targets_agree(args):
    per_step = _json(args)["samples_per_step"]
    by_steps = _json([*args, "--steps", "1000"])
    by_samples = _json([*args, "--samples", str(1000 * per_step)])
    by_epochs = _json([*args, "--epochs", "4", "--dataset-size", str(250 * per_step)])
    assert by_steps["time_to_train_hours"] == pytest.approx(by_samples["time_to_train_hours"])
    assert by_epochs["time_to_train_hours"] == pytest.approx(by_samples["time_to_train_hours"])
    assert "time_to_train_hours" not in _json(args)


def test_predict_human_output_says_where_the_time_goes(args):
    r = CliRunner().invoke(gpuopt, [*args, "--samples", "1.5M"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "time to train" in r.output and "1,500,000 samples" in r.output
    assert "exposed communication" in r.output and "pipeline bubble" in r.output


@pytest.mark.parametrize("extra, message", [
    (["--tokens", "2Q"], "--tokens"),
    (["--epochs", "3"], "--epochs needs --dataset-size"),
    (["--dataset-size", "1M"], "--dataset-size goes with --epochs"),
    (["--samples", "1M", "--steps", "10"], "give exactly one target"),
    (["--samples", "0"], "positive"),
])
def test_predict_target_errors_exit_2_with_one_line(args, extra, message):
    r = CliRunner().invoke(gpuopt, [*args, *extra])
    assert r.exit_code == 2
    assert message in r.stderr
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1
