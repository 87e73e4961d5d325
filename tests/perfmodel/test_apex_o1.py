"""apex AMP O1 (``mixed_precision: apex_o1``): autocast's casts and traffic, plus the host time
of its Python wrappers (``compute.apex_o1_host_s``): 0.125 wrapped calls per counted
operator, each 4.7 eager operators of 10 µs, as ``benchmarks/workloads/
measure_apex_o1_overhead.py`` measured on a Tacotron 2 step; worked out here by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.types import Workload

#: Tacotron 2-like fp32 profile: 77,632 operators, 80,536 under autocast
TACO = Workload(params=28_200_000, flops_per_sample=8.6e10, precision="fp32",
                kernels_per_micro_step=77_632, amp_kernels_per_micro_step=80_536,
                mixed_precision="apex_o1")


@pytest.mark.parametrize("name", ["apex_o1", "O1", "apex-o1", " APEX O1 "])
def test_the_spellings_of_apex_o1(name):
    assert compute.normalize_mixed_precision(name) == "apex_o1"
    # apex O2 keeps its own mode
    assert compute.normalize_mixed_precision("apex_o2") == "master_weights"


def test_an_unknown_mode_names_apex_o1():
    with pytest.raises(ValueError, match="apex_o1"):
        compute.normalize_mixed_precision("o3")


def test_the_wrappers_host_time_per_micro_step():
    # 80,536 kernels under autocast's casts: 0.125 of them wrapped calls, 4.7 x 10 us each
    assert compute.apex_o1_host_s(TACO, "fp16", 80_536) == pytest.approx(
        80_536 * 0.125 * 4.7 * 10e-6)
    assert compute.apex_o1_host_s(TACO, "fp16", 80_536) == pytest.approx(0.47315, rel=1e-4)
    # without a count: the flat 1 ms stands for 100 operators
    assert compute.apex_o1_host_s(TACO, "bf16", None) == pytest.approx(100 * 0.125 * 4.7e-5)
    # the whole host time: the dispatch plus the wrappers
    assert compute.dispatch_time_s(TACO, "fp16", 80_536) == pytest.approx(
        80_536 * 10e-6 * (1 + 0.125 * 4.7))


@pytest.mark.parametrize("precision, mode", [("fp32", "apex_o1"), ("tf32", "apex_o1"),
                                             ("fp16", "autocast"), ("fp16", None),
                                             ("fp16", "master_weights")])
def test_no_wrapper_time_outside_16_bit_apex_o1(precision, mode):
    w = dataclasses.replace(TACO, mixed_precision=mode)
    assert compute.apex_o1_host_s(w, precision, 80_536) == 0.0
    assert compute.dispatch_time_s(w, precision, 80_536) == pytest.approx(0.80536)
    assert compute.apex_o1_host_s(None, "fp16", 80_536) == 0.0


def test_apex_o1_casts_as_autocast_does():
    # the 16-bit count is autocast's (casts included), not the eager one O2's 16-bit model keeps
    assert compute.kernel_count(TACO, "fp16") == (80_536.0, "measured")
    o2 = dataclasses.replace(TACO, mixed_precision="master_weights")
    assert compute.kernel_count(o2, "fp16") == (77_632.0, "measured")
    # fp32 weights: the optimizer writes the 16-bit copy (2 bytes), not master weights (12)
    assert compute.optimizer_bytes_per_param(8, "fp16", TACO) == 2 * (4 + 8) + 4 + 2


def _predict(tmp_path, extra: dict, flags: list[str]) -> dict:
    doc = {"name": "net", "params": 1_000_000, "flops_per_sample": 1e9, "precision": "fp32",
           "optimizer": "Adam", "kernels_per_micro_step": 10_000,
           "memory_traffic_bytes_per_sample": 1e6, **extra}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                    "A100-80GB-SXM4", "--gpus", "1", "--micro-batch", "8",
                                    "--precision", "fp16", *flags, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_predict_adds_the_wrappers_host_time(tmp_path):
    base = _predict(tmp_path, {}, [])
    flag = _predict(tmp_path, {}, ["--mixed-precision", "apex_o1"])
    key = _predict(tmp_path, {"mixed_precision": "apex_o1"}, [])
    # 10,000 operators: 1,250 wrapped calls at 47 us each, 58.75 ms a micro-step
    assert flag["step_time_s"] - base["step_time_s"] == pytest.approx(10_000 * 0.125 * 47e-6,
                                                                      rel=1e-6)
    assert key["step_time_s"] == pytest.approx(flag["step_time_s"], rel=1e-12)
    # the prediction says what it added
    assert any("apex AMP O1" in a and "47 us" in a for a in flag["assumptions"]), \
        flag["assumptions"]
    assert not any("apex AMP O1" in a for a in base["assumptions"])
    # the flag overrides the file: autocast takes the wrappers off again
    back = _predict(tmp_path, {"mixed_precision": "apex_o1"}, ["--mixed-precision", "amp"])
    assert back["step_time_s"] == pytest.approx(base["step_time_s"], rel=1e-12)


def test_an_unknown_mode_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"params": 1e6, "flops_per_sample": 1e9, "precision": "fp32"}))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                    "A100-80GB-SXM4", "--gpus", "1", "--mixed-precision", "o3"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "--mixed-precision" in lines[0], r.output
    assert "Traceback" not in r.output
