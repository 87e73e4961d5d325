"""``mlflow gpuopt predict`` end to end: files, runs, errors, and a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = {"schema": "gpuopt.workload/1", "name": "resnet50", "params": 25557032,
            "flops_per_sample": 2.46e10, "precision": "fp16", "micro_batch": 256,
            "optimizer": "SGD", "optimizer_state_bytes_per_param": 4,
            "activation_bytes_per_sample": 1.1e8, "tokens_per_sample": None}
OBS = ("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,precision\n"
       "NVIDIA A100-SXM4-80GB,1,1,256,2470,single,fp16\n"
       "NVIDIA A100-SXM4-80GB,8,1,256,16621,ddp,fp16\n")
# (the ``files`` fixture of tests/conftest.py writes WORKLOAD and OBS for each test)
KEYS = {"gpu", "gpus", "nodes", "strategy", "micro_batch", "throughput_samples_per_s", "low",
        "high", "step_time_s", "memory_per_gpu_bytes", "fits"}


def _run(args):
    return CliRunner().invoke(gpuopt, ["predict", *args], catch_exceptions=False)


def test_json_from_files_reproduces_the_observation(files):
    w, o = files
    r = _run(["--workload", w, "--observations", o, "--gpu", "A100-80GB-SXM4", "--gpus", "8",
              "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) >= KEYS
    assert out["gpu"] == "A100-80GB-SXM4" and out["gpus"] == 8 and out["nodes"] == 1
    assert out["strategy"] == "ddp" and out["micro_batch"] == 256
    assert out["throughput_samples_per_s"] == pytest.approx(16621, rel=0.02)
    assert out["low"] < out["throughput_samples_per_s"] < out["high"]
    assert out["fits"] is True and out["memory_per_gpu_bytes"] < 80e9
    assert out["max_micro_batch"] >= 256


def test_json_names_the_pieces_of_its_interval(files):
    # measured on A100 and carried to H100: the interval is the quadrature sum of the
    # pieces the JSON names (the fit, another GPU type, ...), 90 % at z = 1.645
    w, o = files
    r = _run(["--workload", w, "--observations", o, "--gpu", "H100-SXM5-80GB", "--gpus", "8",
              "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    terms = {t["term"]: t["log_sigma"] for t in out["width_terms"]}
    assert "another GPU type" in terms and "fit" in terms
    assert all(v > 0 for v in terms.values())
    sigma = sum(v * v for v in terms.values()) ** 0.5
    assert out["log_sigma"] == pytest.approx(sigma)
    mid = out["throughput_samples_per_s"]
    assert out["high"] / mid == pytest.approx(2.718281828459045 ** (1.6448536269514722 * sigma))
    assert mid / out["low"] == pytest.approx(out["high"] / mid)


def test_human_output_and_nvml_name(files):
    w, o = files
    r = _run(["--workload", w, "--observations", o, "--gpu", "NVIDIA H100 80GB HBM3",
              "--gpus", "16", "--strategy", "zero2", "--micro-batch", "128"])
    assert r.exit_code == 0, r.output
    assert "16 x H100-SXM5-80GB (2 node(s)), zero2" in r.output
    assert "samples/s" in r.output and "extrapolated" in r.output


@pytest.mark.parametrize("args, message", [
    (["--gpu", "A1000-XYZ", "--gpus", "8"], "unknown GPU"),
    (["--gpu", "A100-80GB-SXM4", "--gpus", "8", "--strategy", "tp16"], "tensor-parallel"),
    (["--gpu", "A100-80GB-SXM4", "--gpus", "8", "--strategy", "warp"], "unknown strategy"),
    (["--gpu", "A100-80GB-SXM4", "--gpus", "6", "--nodes", "4"], "does not split"),
    (["--gpu", "A100-80GB-SXM4", "--gpus", "8", "--precision", "fp3"], "unknown precision"),
    (["--gpu", "H100", "--gpus", "16", "--nodes", "1", "--strategy", "tp"],
     "16 H100-SXM5-80GB per node; no H100-SXM5-80GB machine in the catalog or the runs has "
     "more than 8"),
])
def test_bad_input_is_one_line_exit_2(files, args, message):
    w, o = files
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", w, "--observations", o, *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("which, content, message", [
    ("workload", b"\xff\xfe{}", "not UTF-8"),
    ("observations", b"gpu,gpu_count,throughput_samples_per_s\n\xff,1,100\n", "not UTF-8"),
    ("observations", b"gpu,gpu_count,throughput_samples_per_s\nA100,1,100,5\n",
     "row 2: more cells than the header"),
])
def test_unreadable_files_are_one_line_exit_2(tmp_path, files, which, content, message):
    w, o = files
    bad = tmp_path / "bad"
    bad.write_bytes(content)
    paths = {"workload": w, "observations": o, which: str(bad)}
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", paths["workload"],
                                    "--observations", paths["observations"],
                                    "--gpu", "A100-80GB-SXM4", "--gpus", "1"])
    assert r.exit_code == 2, r.output
    assert message in r.output and len(r.output.strip().splitlines()) == 1


def test_workload_missing_required_field(tmp_path, files):
    _, o = files
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"params": 10, "precision": "fp32"}))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(bad), "--observations", o,
                                    "--gpu", "A100-80GB-SXM4", "--gpus", "1"])
    assert r.exit_code == 2
    assert "missing required field(s) flops_per_sample" in r.output


def test_profile_kernel_count_round_trips_through_a_workload_file(tmp_path, files):
    from mlflow_gpuopt.tracking.workload_profile import WorkloadProfile
    from mlflow_gpuopt.workload_files import WorkloadFileError, load_workload

    profile = WorkloadProfile(
        name="rnn", params=1000, trainable_params=1000, flops_per_sample=2e6,
        precision="fp32", micro_batch=4, grad_accum=1, optimizer="Adam",
        optimizer_state_bytes_per_param=8.0, activation_bytes_per_sample=None,
        activation_saved_bytes_per_sample=None, tokens_per_sample=None,
        largest_layer_params=800, kernels_per_micro_step=4567.5)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile.to_json(hardware={"gpu": "cpu"})))
    assert load_workload(path).kernels_per_micro_step == 4567.5
    w, _ = files  # written without the key
    assert load_workload(w).kernels_per_micro_step is None
    path.write_text(json.dumps({**WORKLOAD, "kernels_per_micro_step": "many"}))
    with pytest.raises(WorkloadFileError, match="'kernels_per_micro_step' must be a number"):
        load_workload(path)


def test_conflicting_or_missing_sources(files):
    w, o = files
    r = CliRunner().invoke(gpuopt, ["predict", "--run-id", "abc", "--workload", w,
                                    "--observations", o, "--gpu", "A100-80GB-SXM4",
                                    "--gpus", "1"])
    assert r.exit_code == 2 and "not both" in r.output
    r = CliRunner().invoke(gpuopt, ["predict", "--gpu", "A100-80GB-SXM4", "--gpus", "1"])
    assert r.exit_code == 2 and "--run-id" in r.output


def _measured_run(tracking_uri: str) -> str:
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri)
    exp = c.create_experiment("p")
    rid = c.create_run(exp).info.run_id
    for k, v in {"gpuopt.device": "NVIDIA A100-SXM4-80GB", "gpuopt.device_count": 1,
                 "gpuopt.world_size": 1, "gpuopt.nodes": 1, "gpuopt.precision": "fp16",
                 "gpuopt.micro_batch": 256, "gpuopt.grad_accum": 1, "gpuopt.strategy": "single",
                 "gpuopt.params": 25557032, "gpuopt.flops_per_sample": "2.46e+10"}.items():
        c.log_param(rid, k, v)
    c.log_metric(rid, "gpuopt/summary/throughput_samples_per_s", 2470.0)
    c.log_dict(rid, WORKLOAD, "gpuopt/profile.json")
    return rid


def test_from_run_id(tracking_uri):
    rid = _measured_run(tracking_uri)
    r = _run(["--run-id", rid, "--gpu", "A100-80GB-SXM4", "--gpus", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["throughput_samples_per_s"] == pytest.approx(2470, rel=0.02)
    assert out["run_ids"] == [rid]
    r = CliRunner().invoke(gpuopt, ["predict", "--run-id", "nope0000", "--gpu", "A100",
                                    "--gpus", "1"])
    assert r.exit_code == 2 and "unknown run id" in r.output


@pytest.mark.slow
def test_real_subprocess(files):
    w, o = files
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mlflow_gpuopt", "predict", "--workload", w, "--observations", o,
         "--gpu", "V100", "--gpus", "8", "--json"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["gpu"] == "V100-SXM2-16GB" and out["extrapolated"] is True
    bad = subprocess.run(
        [sys.executable, "-m", "mlflow_gpuopt", "predict", "--workload", w, "--gpu", "Z9",
         "--gpus", "1"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith("Error: unknown GPU") and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_real_subprocess_from_run_id_keeps_stderr_clean(tracking_uri):
    """Reading the run downloads gpuopt/profile.json: no MLflow progress bar on stderr."""
    rid = _measured_run(tracking_uri)
    env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI=tracking_uri)
    env.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "mlflow_gpuopt", "predict", "--run-id", rid, "--gpu", "A100",
         "--gpus", "1"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "samples/s" in proc.stdout
    assert "Downloading artifacts" not in proc.stderr and "it/s]" not in proc.stderr


def test_node_sizes_beyond_the_catalog_that_exist_are_allowed(tmp_path, files):
    """4 x T4 in one server (the catalog sells T4s singly) and a measured 16-GPU V100 node
    (DGX-2) are real machines; only nodes beyond both the usual 8 and any run are refused."""
    w, _ = files
    obs = tmp_path / "dgx2.csv"
    obs.write_text("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy\n"
                   "V100-SXM2-32GB,16,1,256,12000,ddp\n")
    r = _run(["--workload", w, "--observations", str(obs), "--gpu", "T4", "--gpus", "4",
              "--nodes", "1", "--json"])
    assert r.exit_code == 0, r.output
    r = _run(["--workload", w, "--observations", str(obs), "--gpu", "V100-SXM2-32GB",
              "--gpus", "16", "--nodes", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["nodes"] == 1
    r = _run(["--workload", w, "--observations", str(obs), "--gpu", "V100-SXM2-32GB",
              "--gpus", "32", "--nodes", "1"])
    assert r.exit_code == 2 and "more than 16" in r.output
