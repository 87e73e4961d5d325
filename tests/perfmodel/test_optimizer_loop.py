"""A for-loop optimizer step's host time (``compute.optimizer_host_time_s``): parameter
tensors × PyTorch's own per-tensor timing of the loop (pytorch/pytorch#45299), taken where it
is longer than the step's memory traffic; worked out here from the published milliseconds."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.types import Workload

#: WaveGlow-like: 938 parameter tensors stepped by Adam
NET = Workload(params=268_294_760, flops_per_sample=1.568e12, precision="fp32",
               optimizer="Adam", optimizer_param_tensors=938, optimizer_impl="for-loop")


def test_tensors_times_the_published_per_tensor_time_of_the_loop():
    # Adam over ResNet-101's 314 tensors took 42.69 ms as a for-loop
    assert compute.optimizer_host_time_s(NET) == pytest.approx(938 * 42.69e-3 / 314)
    assert compute.optimizer_host_time_s(NET) == pytest.approx(0.12753, rel=1e-4)
    # SGD's loop: 6.28 ms over the same 314 tensors; a class not timed takes Adam's
    sgd = dataclasses.replace(NET, optimizer="SGD")
    assert compute.optimizer_host_time_s(sgd) == pytest.approx(938 * 6.28e-3 / 314)
    assert compute.optimizer_host_time_s(dataclasses.replace(NET, optimizer="sgd")) == \
        pytest.approx(938 * 6.28e-3 / 314)  # a workload file's spelling
    lion = dataclasses.replace(NET, optimizer="Lion")
    assert compute.optimizer_host_time_s(lion) == compute.optimizer_host_time_s(NET)
    # a pipeline stage's process loops over its share of the tensors
    assert compute.optimizer_host_time_s(NET, 0.25) == pytest.approx(938 / 4 * 42.69e-3 / 314)


@pytest.mark.parametrize("impl, tensors", [("foreach", 938), ("fused", 938), (None, 938),
                                           ("for-loop", None)])
def test_no_per_tensor_time_for_list_kernels_or_without_the_facts(impl, tensors):
    w = dataclasses.replace(NET, optimizer_impl=impl, optimizer_param_tensors=tensors)
    assert compute.optimizer_host_time_s(w) == 0.0


def _predict(tmp_path, extra: dict, flags: list[str]) -> dict:
    doc = {"name": "net", "params": 1_000_000, "flops_per_sample": 1e9, "precision": "fp32",
           "optimizer": "Adam", "kernels_per_micro_step": 100,
           "memory_traffic_bytes_per_sample": 1e6, **extra}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                    "A100-80GB-SXM4", "--gpus", "1", "--micro-batch", "8",
                                    "--precision", "tf32", *flags, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_predict_adds_the_loop_where_it_outlasts_the_optimizers_memory_traffic(tmp_path):
    base = _predict(tmp_path, {"optimizer_param_tensors": 1000}, [])
    loop = _predict(tmp_path, {"optimizer_param_tensors": 1000}, ["--optimizer-impl", "loop"])
    same = _predict(tmp_path, {"optimizer_param_tensors": 1000, "optimizer_impl": "for-loop"},
                    [])
    # 1e6 fp32 Adam parameters: read and write weights and two moments, read the gradient,
    # 28 bytes each at 75 % of the A100-80GB's 2,039 GB/s: 18 us; the loop over 1,000
    # tensors: 1000 x 42.69 ms / 314 = 136 ms, which the step takes instead
    memory_s = 28e6 / (0.75 * 2039e9)
    host_s = 1000 * 42.69e-3 / 314
    assert loop["step_time_s"] - base["step_time_s"] == pytest.approx(host_s - memory_s,
                                                                      rel=1e-6)
    assert same["step_time_s"] == pytest.approx(loop["step_time_s"], rel=1e-12)
    fused = _predict(tmp_path, {"optimizer_param_tensors": 1000, "optimizer_impl": "for-loop"},
                     ["--optimizer-impl", "fused"])
    assert fused["step_time_s"] == pytest.approx(base["step_time_s"], rel=1e-12)


def test_an_unknown_implementation_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"params": 1e6, "flops_per_sample": 1e9, "precision": "fp32"}))
    for args in (["--optimizer-impl", "loopy"], []):
        if not args:
            path.write_text(json.dumps({"params": 1e6, "flops_per_sample": 1e9,
                                        "precision": "fp32", "optimizer_impl": "loopy"}))
        r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                        "A100-80GB-SXM4", "--gpus", "1", *args])
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and "optimizer_impl" in lines[0], r.output
        assert "Traceback" not in r.output


def _recommend(tmp_path, extra: dict, flags: list[str]) -> dict:
    doc = {"name": "net", "params": 1_000_000, "flops_per_sample": 1e9, "precision": "fp32",
           "optimizer": "Adam", "kernels_per_micro_step": 100, "micro_batch": 8,
           "memory_traffic_bytes_per_sample": 1e6, "optimizer_param_tensors": 1000, **extra}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(gpuopt, ["recommend", "--workload", str(path), "--samples", "1e7",
                                    "--provider", "aws", "--no-log", "--json", *flags])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["winner"]


def test_recommend_takes_the_run_flags_predict_takes(tmp_path):
    """``recommend --optimizer-impl`` (and the other run flags) say what the workload key
    says, as ``predict``'s do: the loop's 136 ms a step then sets every plan's step."""
    base = _recommend(tmp_path, {}, [])
    flag = _recommend(tmp_path, {}, ["--optimizer-impl", "for-loop"])
    key = _recommend(tmp_path, {"optimizer_impl": "for-loop"}, [])
    assert flag == key
    assert flag["step_time_s"] > 1000 * 42.69e-3 / 314 > 50 * base["step_time_s"]
    back = _recommend(tmp_path, {"optimizer_impl": "for-loop"}, ["--optimizer-impl", "fused"])
    assert back["step_time_s"] == pytest.approx(base["step_time_s"], rel=1e-12)


@pytest.mark.parametrize("flag, word, key", [("--optimizer-impl", "loopy", "optimizer_impl"),
                                             ("--mixed-precision", "o3", "mixed_precision")])
def test_recommend_refuses_an_unknown_run_flag_word_in_one_line(tmp_path, flag, word, key):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"params": 1e6, "flops_per_sample": 1e9, "precision": "fp32"}))
    r = CliRunner().invoke(gpuopt, ["recommend", "--workload", str(path), "--samples", "1e7",
                                    "--no-log", flag, word])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert flag in lines[0] and key in lines[0], r.output
