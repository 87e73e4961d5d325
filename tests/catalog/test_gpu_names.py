"""The GPU-name resolver over NVML/torch, provider, benchmark and canonical spellings."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from mlflow_gpuopt.catalog import UnknownGpuError, load_gpus, resolve_gpu

NVML_NAMES = {
    "NVIDIA A100-SXM4-40GB": "A100-40GB-SXM4",
    "NVIDIA A100-SXM4-80GB": "A100-80GB-SXM4",
    "NVIDIA A100 80GB PCIe": "A100-80GB-PCIe",
    "NVIDIA A100-PCIE-40GB": "A100-40GB-PCIe",
    "Tesla V100-SXM2-16GB": "V100-SXM2-16GB",
    "Tesla V100-SXM2-32GB": "V100-SXM2-32GB",
    "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB",
    "NVIDIA H100 PCIe": "H100-PCIe-80GB",
    "NVIDIA GeForce RTX 3090": "RTX-3090",
    "NVIDIA GeForce RTX 4090": "RTX-4090",
    "NVIDIA RTX A6000": "RTX-A6000",
    "NVIDIA A10": "A10",
    "NVIDIA A10G": "A10G",
    "NVIDIA L4": "L4",
    "Tesla T4": "T4",
    "NVIDIA H200": "H200-SXM-141GB",
    "NVIDIA A40": "A40",
    "NVIDIA L40S": "L40S",
}

PROVIDER_NAMES = {
    "gpu_8x_a100_80gb_sxm4": "A100-80GB-SXM4",
    "gpu_1x_h100_pcie": "H100-PCIe-80GB",
    "gpu_8x_h100_sxm5": "H100-SXM5-80GB",
    "gpu_1x_a6000": "RTX-A6000",
    "nvidia-tesla-a100": "A100-40GB-SXM4",
    "nvidia-a100-80gb": "A100-80GB-SXM4",
    "nvidia-h100-80gb": "H100-SXM5-80GB",
    "nvidia-h100-mega-80gb": "H100-SXM5-80GB",
    "nvidia-l4": "L4",
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-v100": "V100-SXM2-16GB",
    "A100-80GB": "A100-80GB-SXM4",
    "A100 (40 GB SXM4)": "A100-40GB-SXM4",
    # documented defaults for ambiguous short names
    "A100": "A100-40GB-SXM4",
    "V100": "V100-SXM2-16GB",
    "H100": "H100-SXM5-80GB",
    # reference-data spellings
    "A10G-24GB": "A10G",
    "L4-24GB": "L4",
    "RTX-A6000-48GB": "RTX-A6000",
    "H100-80GB-SXM5": "H100-SXM5-80GB",
    "V100-16GB-SXM2": "V100-SXM2-16GB",
    "V100-32GB-SXM2": "V100-SXM2-32GB",
    "V100-32GB-SXM3": "V100-SXM2-32GB",
}


@pytest.mark.parametrize(("name", "canonical"), sorted({**NVML_NAMES, **PROVIDER_NAMES}.items()))
def test_known_spellings_resolve(name, canonical):
    assert resolve_gpu(name) == canonical
    assert resolve_gpu(name.upper()) == canonical
    assert resolve_gpu(name.lower()) == canonical


def test_every_canonical_name_resolves_to_itself():
    for name in load_gpus():
        assert resolve_gpu(name) == name
        assert resolve_gpu(f"  {name.lower()} ") == name


def test_benchmark_csv_gpu_names_all_resolve():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "nvidia_dle_benchmarks.csv"
    names = {row["gpu"] for row in csv.DictReader(path.open())}
    resolved = {n: resolve_gpu(n) for n in names}
    assert len(names) >= 5  # the benchmark table (kept in the repository) was read
    assert resolved["A100-80GB-SXM4"] == "A100-80GB-SXM4"
    assert resolved["V100-16GB-SXM2"] == "V100-SXM2-16GB"


@pytest.mark.parametrize(
    ("name", "expected_first"),
    [("NVIDIA H100 NVL", "H100"), ("Tesla V100-PCIE-16GB", "V100"), ("A100-16GB", "A100")],
)
def test_unknown_names_list_closest(name, expected_first):
    with pytest.raises(UnknownGpuError) as info:
        resolve_gpu(name)
    assert isinstance(info.value, ValueError)
    assert info.value.closest and info.value.closest[0].startswith(expected_first)
    assert "closest known" in str(info.value) and name in str(info.value)


def test_nonsense_name_lists_known_names():
    with pytest.raises(UnknownGpuError) as info:
        resolve_gpu("potato")
    assert info.value.closest


@pytest.mark.parametrize("name", ["", "   ", "A100-48GB", "L4-80GB"])
def test_wrong_memory_or_empty_is_rejected(name):
    with pytest.raises(UnknownGpuError):
        resolve_gpu(name)
