"""The ``--shape-gemm`` prototype (benchmarks/gemm_shape.py): its shape factor against
hand-counted tiles and waves, and that it patches perfmodel only inside its block."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mlflow_gpuopt.perfmodel import compute, step

_SPEC = importlib.util.spec_from_file_location(
    "gemm_shape", Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_shape.py")
gemm_shape = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gemm_shape)


def test_large_gemm_on_h100_counts_waves_and_k_loop():
    # 8192 x 4096 output in 128 x 256 tiles: 64 x 16 = 1024 tiles; 132 SMs run them in 8
    # waves (1056 slots); K = 4096 against a 4 x 64 prologue/epilogue
    expected = (1024 / 1056) * (4096 / (4096 + 256))
    assert gemm_shape.gemm_shape_factor(8192, 4096, 4096, 132) == pytest.approx(expected)


def test_one_tile_leaves_the_other_sms_idle_and_pads_a_partial_tile():
    # 100 x 200 fits one 128 x 256 tile (padding 100*200 / (128*256)); 1 of 108 SMs busy
    expected = (100 * 200 / (128 * 256)) * (1 / 108) * (512 / (512 + 256))
    assert gemm_shape.gemm_shape_factor(100, 200, 512, 108) == pytest.approx(expected)


def test_smaller_hidden_size_reaches_less_of_the_large_gemm_rate():
    from mlflow_gpuopt.perfmodel.types import Workload

    def llm(h):
        return Workload(name="t", params=12 * h * h * 24, flops_per_sample=1e12, precision="bf16",
                        num_layers=24, hidden_size=h, tokens_per_sample=2048)

    big = gemm_shape.linear_gemm_factor(llm(8192), "H100-SXM5-80GB", 4096)
    small = gemm_shape.linear_gemm_factor(llm(1024), "H100-SXM5-80GB", 4096)
    assert 0 < small < big < 1


def test_installed_only_inside_its_block():
    shipped = (compute.tensor_efficiency, compute._tensor_time_s, step.step_terms)
    with gemm_shape.installed():
        assert compute.tensor_efficiency("A100-80GB", "bf16") == pytest.approx(
            gemm_shape.GEMM_EFFICIENCY_LARGE[("ampere", "bf16")])
        assert step.step_terms is not shipped[2]
    assert (compute.tensor_efficiency, compute._tensor_time_s, step.step_terms) == shipped
