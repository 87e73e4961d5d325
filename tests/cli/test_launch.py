"""Launch artefacts of a plan: the torchrun script, the SkyPilot YAML and the time estimator.

The torchrun script is checked three ways: ``bash -n``; run with a ``torchrun`` on PATH that
records its arguments and environment (a multi-node launch needs several machines); and run
for real with the tiny GPT example on two gloo processes into a sqlite store. The SkyPilot
YAML and the estimator are checked by SkyPilot itself (tests/support/skypilot_check.py), offline.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
from support.ports import free_port
from support.skypilot import skypilot_check
from support.sqlite_store import sqlite_uri

from mlflow_gpuopt.catalog import load_catalog
from mlflow_gpuopt.launch import (
    LaunchContext,
    LaunchError,
    parse_plan_id,
    plan_id,
    public_tracking_uri,
    skypilot_time_estimator,
    skypilot_yaml,
    torchrun_script,
)
from mlflow_gpuopt.perfmodel.types import Workload

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: A 125M-parameter GPT-like workload (6·N·tokens FLOPs at 1024 tokens), bf16, AdamW.
GPT = Workload(params=125_000_000, flops_per_sample=6 * 125e6 * 1024, precision="bf16",
               name="gpt-125m", micro_batch=8, tokens_per_sample=1024, optimizer="adamw")
SAMPLES = 1e7


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def estimator(catalog):
    return skypilot_time_estimator(workload=GPT, target=SAMPLES, catalog=catalog)


def _plan(estimator, instance_type, **config):
    plan = estimator.plan_for(instance_type=instance_type)
    if config:
        plan = replace(plan, nodes=config.get("nodes", plan.nodes),
                       config=replace(plan.config, **config))
    return plan


def test_plan_ids_round_trip_and_reject_what_is_not_one():
    assert plan_id("0a1b2c", 3) == "0a1b2c:3" and parse_plan_id("0a1b2c:3") == ("0a1b2c", 3)
    assert plan_id(None, 2) == "2" and parse_plan_id("2") == (None, 2)
    for bad in ("0a1b:0", "abc", "x:1:2", ""):
        with pytest.raises(ValueError):
            parse_plan_id(bad)
    with pytest.raises(ValueError):
        plan_id("r", 0)


def test_credentials_never_reach_the_artefact():
    assert public_tracking_uri("https://alice:s3cret@mlflow.example.com:5000/x?y=1") == (
        "https://mlflow.example.com:5000/x?y=1", True)
    assert public_tracking_uri("sqlite:////tmp/m.db") == ("sqlite:////tmp/m.db", False)


def _record_torchrun(tmp_path) -> Path:
    """A ``torchrun`` that writes its arguments and the GPUOPT/MLflow environment as JSON."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    record = tmp_path / "torchrun.json"
    tool = fake_bin / "torchrun"
    tool.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': {{k: v for k, v in os.environ.items() "
        f"if k.startswith(('GPUOPT_', 'MLFLOW_'))}}}}, open({str(record)!r}, 'w'))\n")
    tool.chmod(0o755)
    return fake_bin


def test_torchrun_script_is_the_exact_multi_node_invocation(tmp_path, estimator):
    plan = _plan(estimator, "p4d.24xlarge", micro_batch=4, grad_accum=3, nodes=2)
    ctx = LaunchContext(plan_id="feed:2", tracking_uri="sqlite:////tmp/my store/mlflow.db",
                        experiment_name="exp one", script="train it.py")
    path = tmp_path / "launch.sh"
    path.write_text(torchrun_script(plan, ctx))
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    fake_bin = _record_torchrun(tmp_path)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.7"}
    out = subprocess.run(["bash", str(path), "--steps", "100", "a b"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "torchrun.json").read_text())
    assert rec["argv"] == ["--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1",
                           "--master-addr", "10.0.0.7", "--master-port", "29500",
                           "train it.py", "--steps", "100", "a b"]
    assert rec["env"] == {"MLFLOW_TRACKING_URI": "sqlite:////tmp/my store/mlflow.db",
                          "MLFLOW_EXPERIMENT_NAME": "exp one", "GPUOPT_PLAN": "feed:2",
                          "GPUOPT_MICRO_BATCH": "4", "GPUOPT_GRAD_ACCUM": "3",
                          "GPUOPT_PRECISION": plan.config.precision,
                          "GPUOPT_STRATEGY": plan.config.strategy}
    # the user's own tracking URI, port and script win; the plan's settings do not move
    env.update(MLFLOW_TRACKING_URI="http://tracking:5000", MASTER_PORT="40000",
               GPUOPT_SCRIPT="other.py", GPUOPT_MICRO_BATCH="99")
    assert subprocess.run(["bash", str(path)], env=env, timeout=60).returncode == 0
    rec = json.loads((tmp_path / "torchrun.json").read_text())
    assert rec["argv"][rec["argv"].index("--master-port") + 1] == "40000"
    assert rec["argv"][-1] == "other.py"
    assert rec["env"]["MLFLOW_TRACKING_URI"] == "http://tracking:5000"
    assert rec["env"]["GPUOPT_MICRO_BATCH"] == "4"


def test_torchrun_script_without_a_recorded_script_asks_for_one(tmp_path, estimator):
    path = tmp_path / "launch.sh"
    path.write_text(torchrun_script(_plan(estimator, "p5.48xlarge"),
                                    LaunchContext(plan_id="3")))
    fake_bin = _record_torchrun(tmp_path)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin"}
    out = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "GPUOPT_SCRIPT" in out.stderr
    assert not (tmp_path / "torchrun.json").exists()
    env["GPUOPT_SCRIPT"] = "train.py"
    assert subprocess.run(["bash", str(path)], env=env, timeout=60).returncode == 0
    rec = json.loads((tmp_path / "torchrun.json").read_text())
    assert rec["argv"][-1] == "train.py" and rec["env"]["GPUOPT_PLAN"] == "3"


@pytest.mark.slow
def test_emitted_script_trains_tiny_gpt_on_two_gloo_processes_as_the_plan(tmp_path, estimator):
    """1 node × 2 processes on CPU: the job sees the plan and trains at its micro-batch."""
    import mlflow

    plan = _plan(estimator, "p4d.24xlarge", gpus_per_node=2, nodes=1, micro_batch=4,
                 grad_accum=2, precision="fp32", strategy="ddp")
    uri = sqlite_uri(tmp_path / "mlflow.db", str(tmp_path / "mlruns"))
    ctx = LaunchContext(plan_id="rec123:1", tracking_uri=uri, experiment_name="plan-runs",
                        script=str(REPO / "examples" / "train_tiny_gpt.py"))
    path = tmp_path / "launch.sh"
    path.write_text(torchrun_script(plan, ctx))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO), "GPUOPT_JOURNAL_DIR": str(tmp_path / "journal"),
           "MASTER_PORT": str(free_port()), "PYTHONWARNINGS": "ignore"}
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        env.pop(name, None)
    out = subprocess.run(["bash", str(path), "--steps", "4", "--interval", "0.2",
                          "--precision", "fp32"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    assert "gpuopt plan rec123:1: micro-batch 4 × 2, 2 process(es)" in out.stdout
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("plan-runs")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1  # one run for the job, not one per process
    p = runs[0].data.params
    assert p["gpuopt.micro_batch"] == "4" and p["gpuopt.grad_accum"] == "2"
    assert p["gpuopt.world_size"] == "2" and p["batch_size"] == "4"


@pytest.mark.parametrize("instance_type, spot, nodes", [
    ("p4d.24xlarge", True, 2), ("a2-highgpu-8g", False, 1), ("gpu_8x_h100_sxm5", False, 1),
    ("Standard_ND96isr_H100_v5", False, 4)])
def test_skypilot_yaml_is_accepted_by_skypilot(tmp_path, estimator, instance_type, spot, nodes):
    plan = _plan(estimator, instance_type, nodes=nodes)
    if spot:
        plan = replace(plan, pricing="spot")
    ctx = LaunchContext(plan_id="abc:1", tracking_uri="https://mlflow.example.com",
                        experiment_name="e", script="examples/train_tiny_gpt.py")
    path = tmp_path / "task.yaml"
    path.write_text(skypilot_yaml(plan, ctx))
    got = skypilot_check("task", str(path))
    offer = plan.offer
    assert got["instance_type"] == offer.instance_type
    assert got["num_nodes"] == nodes and got["use_spot"] is spot
    assert got["cloud"] == {"aws": "aws", "gcp": "gcp", "lambda": "lambda",
                            "azure": "azure"}[offer.provider]
    assert got["region"] == (None if offer.region == "global" else offer.region)
    (acc, count), = got["accelerators"].items()
    assert count == offer.gpu_count
    assert acc == {"A100-40GB-SXM4": "A100", "H100-SXM5-80GB": "H100"}[offer.gpu]
    assert got["envs"]["GPUOPT_PLAN"] == "abc:1"
    assert got["envs"]["GPUOPT_MICRO_BATCH"] == str(plan.config.micro_batch)
    assert got["envs"]["MLFLOW_TRACKING_URI"] == "https://mlflow.example.com"
    for var in ("SKYPILOT_NODE_RANK", "SKYPILOT_NUM_NODES", "SKYPILOT_NODE_IPS",
                "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert var in got["run"]
    assert subprocess.run(["bash", "-n"], input=got["run"], text=True).returncode == 0


def test_skypilot_run_starts_torchrun_from_skypilot_variables(tmp_path, estimator):
    """SkyPilot's ``run`` on node 1 of 2: the head address is the first line of the IPs."""
    import yaml

    plan = _plan(estimator, "p4d.24xlarge", nodes=2)
    doc = yaml.safe_load(skypilot_yaml(plan, LaunchContext(plan_id="p:1", script="t.py")))
    fake_bin = _record_torchrun(tmp_path)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", **doc["envs"],
           "GPUOPT_SCRIPT_ARGS": "--steps 7", "SKYPILOT_NODE_RANK": "1",
           "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "8",
           "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2"}
    assert subprocess.run(["bash", "-c", doc["run"]], env=env, timeout=60).returncode == 0
    rec = json.loads((tmp_path / "torchrun.json").read_text())
    assert rec["argv"] == ["--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1",
                           "--master-addr", "10.0.0.1", "--master-port", "29500", "t.py",
                           "--steps", "7"]
    assert rec["env"]["GPUOPT_PLAN"] == "p:1"


def test_colab_plan_cannot_be_a_skypilot_task(estimator, catalog):
    colab = next(o for o in catalog.offers if o.provider == "colab")
    plan = replace(_plan(estimator, "p4d.24xlarge", gpus_per_node=1, nodes=1), offer=colab)
    with pytest.raises(LaunchError, match="colab plans cannot be launched by SkyPilot"):
        skypilot_yaml(plan, LaunchContext(plan_id="1"))


def test_estimator_maps_machines_to_predicted_compute_seconds(estimator):
    p5 = estimator.seconds_for(instance_type="p5.48xlarge")
    p4d = estimator.seconds_for(instance_type="p4d.24xlarge")
    assert 0 < p5 < p4d  # 8 × H100 beats 8 × A100-40GB on a bf16 GPT
    plan = estimator.plan_for(instance_type="p4d.24xlarge")
    # whole optimizer steps at the predicted step time: samples / throughput, rounded up
    steps = math.ceil(SAMPLES / (plan.config.micro_batch * plan.config.grad_accum * plan.gpus))
    assert p4d == pytest.approx(steps * plan.prediction.step_time_s, rel=1e-6)
    # by accelerators alone, the same machine (AWS's 8 × H100 is p5.48xlarge)
    assert estimator.seconds_for(accelerators={"H100": 8}, cloud="AWS") == pytest.approx(p5)
    with pytest.raises(LaunchError, match="no catalog offer for m7i.large"):
        estimator.seconds_for(instance_type="m7i.large")
    lenient = replace(estimator, default_seconds=3600.0)
    assert lenient(type("R", (), {"instance_type": "m7i.large", "accelerators": None,
                                  "cloud": None})()) == 3600.0


def test_estimator_on_more_nodes_is_faster_and_lambda_has_no_multi_node(catalog):
    one = skypilot_time_estimator(workload=GPT, target=SAMPLES, catalog=catalog)
    two = skypilot_time_estimator(workload=GPT, target=SAMPLES, catalog=catalog, nodes=2)
    assert two.seconds_for(instance_type="p5.48xlarge") < one.seconds_for(
        instance_type="p5.48xlarge")
    with pytest.raises(LaunchError, match="at most 1 node"):
        two.seconds_for(instance_type="gpu_8x_h100_sxm5")
    with pytest.raises(ValueError, match="run_id or workload"):
        skypilot_time_estimator(target=1e6)


def test_estimator_on_skypilot_resources(estimator):
    """``sky.Resources`` built by SkyPilot (offline: cloud + accelerators) -> seconds."""
    site = sysconfig.get_paths()["purelib"]
    got = skypilot_check("estimate", str(REPO), site, str(SAMPLES), "aws:H100:8",
                         "gcp:A100:8", "aws:A100-80GB:8",
                         stdin=json.dumps({"params": GPT.params,
                                           "flops_per_sample": GPT.flops_per_sample,
                                           "precision": GPT.precision, "name": GPT.name,
                                           "micro_batch": GPT.micro_batch,
                                           "tokens_per_sample": GPT.tokens_per_sample,
                                           "optimizer": GPT.optimizer}))
    assert got["aws:H100:8"] == pytest.approx(
        estimator.seconds_for(instance_type="p5.48xlarge"))
    assert got["gcp:A100:8"] == pytest.approx(
        estimator.seconds_for(instance_type="a2-highgpu-8g"))
    assert got["aws:A100-80GB:8"] == pytest.approx(
        estimator.seconds_for(instance_type="p4de.24xlarge"))
    assert got["aws:H100:8"] < got["gcp:A100:8"]


def test_examples_read_the_plan_but_flags_win(monkeypatch):
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import _common
    finally:
        sys.path.remove(str(REPO / "examples"))
    import argparse

    monkeypatch.setenv("GPUOPT_MICRO_BATCH", "6")
    monkeypatch.setenv("GPUOPT_GRAD_ACCUM", "3")
    parser = argparse.ArgumentParser()
    _common.add_batch_args(parser, micro_batch=16)
    assert vars(parser.parse_args([])) == {"batch": 6, "grad_accum": 3}
    assert vars(parser.parse_args(["--batch", "2"])) == {"batch": 2, "grad_accum": 3}
    monkeypatch.setenv("GPUOPT_GRAD_ACCUM", "zero")
    with pytest.raises(SystemExit, match="GPUOPT_GRAD_ACCUM"):
        _common.add_batch_args(argparse.ArgumentParser(), micro_batch=16)
