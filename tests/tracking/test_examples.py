"""The examples train for real (a few steps) and their runs hold the tracking contract."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient
from support.sqlite_store import sqlite_uri

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 5


@pytest.fixture
def examples(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return lambda name: importlib.import_module(name)


def check_contract(run_id: str) -> tuple[dict, dict, dict]:
    run = mlflow.get_run(run_id)
    assert run.info.status == "FINISHED"
    p, m = run.data.params, run.data.metrics
    for name in ("device", "device_count", "nodes", "world_size", "precision", "micro_batch",
                 "grad_accum", "strategy", "params", "flops_per_sample"):
        assert f"gpuopt.{name}" in p, name
    for name in ("throughput_samples_per_s", "step_time_p50_s", "step_time_p90_s",
                 "peak_memory_bytes"):
        assert m[f"gpuopt/summary/{name}"] > 0, name
    client = MlflowClient()
    for name in ("gpuopt/step_time_s", "gpuopt/throughput_samples_per_s",
                 "gpuopt/cpu_utilization_percent", "gpuopt/host_memory_used_bytes"):
        assert client.get_metric_history(run_id, name), name
    prof = mlflow.artifacts.load_dict(f"runs:/{run_id}/gpuopt/profile.json")
    assert prof["schema"] == "gpuopt.workload/1"
    assert prof["params"] == int(p["gpuopt.params"])
    assert prof["flops_per_sample"] == pytest.approx(float(p["gpuopt.flops_per_sample"]), rel=1e-5)
    return p, m, prof


def conv_linear_macs(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(total MACs, MACs of the first layer) of conv/linear layers, from their output shapes."""
    macs: list[int] = []

    def hook(mod, inp, out):
        if isinstance(mod, torch.nn.Conv2d):
            k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
            macs.append(out.numel() // out.shape[0] * k)
        else:
            macs.append(mod.in_features * mod.out_features)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model.eval()(x)
    for h in handles:
        h.remove()
    return sum(macs), macs[0]


def resnet_analytic_flops(train_resnet) -> float:
    cfg = train_resnet.ResNetConfig()
    model = train_resnet.SmallResNet(cfg)
    total, first = conv_linear_macs(model, torch.zeros(1, 3, cfg.image_size, cfg.image_size))
    # forward 2·MACs; backward 2·MACs for weight grads + 2·MACs for input grads, except the
    # first conv, whose input (the images) needs no gradient
    return 6.0 * total - 2.0 * first


def test_tiny_gpt(tracking_uri, examples):
    gpt = examples("train_tiny_gpt")
    run_id = gpt.main(["--steps", str(STEPS), "--interval", "0.2"])
    p, m, prof = check_contract(run_id)
    cfg = gpt.GPTConfig()
    assert prof["tokens_per_sample"] == cfg.seq_len
    assert prof["micro_batch"] == cfg.batch_size
    assert prof["optimizer"] == "AdamW"
    assert p["gpuopt.precision"] == ("bf16" if gpt.bf16_available("cpu") else "fp32")
    n_params = sum(x.numel() for x in gpt.TinyGPT(cfg).parameters())
    assert prof["params"] == n_params
    # the measured FLOPs are the example's formula from the model's dimensions (6·N·tokens
    # for the matmul weights N, plus attention's 12·L·T²·d): the profile counts model FLOPs
    analytic = gpt.analytic_flops_per_sample(cfg)
    assert prof["flops_per_sample"] == pytest.approx(analytic, rel=1e-6)
    assert m["gpuopt/summary/throughput_tokens_per_s"] == pytest.approx(
        cfg.seq_len * m["gpuopt/summary/throughput_samples_per_s"], rel=1e-6)


def test_resnet(tracking_uri, examples):
    resnet = examples("train_resnet")
    run_id = resnet.main(["--steps", str(STEPS), "--interval", "0.2"])
    p, m, prof = check_contract(run_id)
    assert prof["optimizer"] == "SGD" and p["gpuopt.precision"] == "fp32"
    assert prof["flops_per_sample"] == pytest.approx(resnet_analytic_flops(resnet), rel=0.10)
    assert prof["optimizer_state_bytes_per_param"] == pytest.approx(4.0, rel=0.01)  # momentum


def test_lightning_with_autolog_shares_one_run(tracking_uri, examples):
    import lightning  # noqa: F401 - the extra must be installed
    lit = examples("train_lightning")
    resnet = examples("train_resnet")
    try:
        run_id = lit.main(["--steps", str(STEPS), "--interval", "0.2"])
    finally:
        mlflow.autolog(disable=True)
    p, m, prof = check_contract(run_id)
    assert "train_loss" in m  # autolog logged into the same run
    assert "optimizer_name" in p
    assert m["gpuopt/summary/steps"] == STEPS
    assert prof["flops_per_sample"] == pytest.approx(resnet_analytic_flops(resnet), rel=0.10)
    runs = mlflow.search_runs(experiment_names=["gpuopt-examples"])
    assert len(runs) == 1


def test_demo_script_prints_what_was_measured(tmp_path):
    uri = sqlite_uri(tmp_path / "mlflow.db", str(tmp_path / "mlruns"))  # the script's cwd
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri,
           "GPUOPT_JOURNAL_DIR": str(tmp_path / "journal"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(EXAMPLES / "demo.py"), "--steps", "4"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    for text in ("run id", "throughput", "p50", "p90", "FLOPs/sample", "parameters"):
        assert text in out.stdout, text
    run_id = out.stdout.split("run id")[1].split()[0]
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    try:
        assert "gpuopt.flops_per_sample" in mlflow.get_run(run_id).data.params
    finally:
        mlflow.set_tracking_uri(None)
