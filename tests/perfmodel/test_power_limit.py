"""``compute.power_capped``: FLOP/s at (limit / TDP)^(1/3) of full, memory bandwidth as it is,
and a second cap rescales from the first instead of compounding."""

from __future__ import annotations

import pytest

from mlflow_gpuopt.perfmodel.compute import power_capped
from mlflow_gpuopt.perfmodel.types import Hardware

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"bf16": 989.4e12, "fp32": 67e12}, intra_node_bytes_per_s=450e9,
                inter_node_bytes_per_s=400e9, tdp_w=700.0)


def test_cap_scales_flops_by_the_cube_root_of_the_power_share():
    capped = power_capped(H100, 500.0)
    assert capped.peak_flops_per_s["bf16"] == pytest.approx(989.4e12 * (500 / 700) ** (1 / 3))
    assert capped.peak_flops_per_s["fp32"] == pytest.approx(67e12 * (500 / 700) ** (1 / 3))
    assert capped.memory_bandwidth_bytes_per_s == H100.memory_bandwidth_bytes_per_s
    assert capped.power_limit_w == 500.0


def test_a_second_cap_replaces_the_first():
    twice = power_capped(power_capped(H100, 350.0), 500.0)
    assert twice.peak_flops_per_s["bf16"] == pytest.approx(
        power_capped(H100, 500.0).peak_flops_per_s["bf16"])
    assert power_capped(power_capped(H100, 350.0), 700.0).peak_flops_per_s["bf16"] == \
        pytest.approx(989.4e12)


def test_no_limit_or_no_tdp_leaves_it_as_it_is():
    assert power_capped(H100, None) is H100
    assert power_capped(H100, 900.0).peak_flops_per_s == H100.peak_flops_per_s
    no_tdp = Hardware(gpu="x", memory_bytes=1e9, memory_bandwidth_bytes_per_s=1e11,
                      peak_flops_per_s={"fp32": 1e13}, intra_node_bytes_per_s=1e9,
                      inter_node_bytes_per_s=1e9)
    assert power_capped(no_tdp, 100.0) is no_tdp
