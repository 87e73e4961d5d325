"""AMD GPUs: the real AMD SMI code path against a fake ``amdsmi``, backend choice, a tracked run."""

from __future__ import annotations

import sys
import time

import mlflow
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.catalog import resolve_gpu
from mlflow_gpuopt.devices import get_gpus
from mlflow_gpuopt.devices.amd import (
    AmdSmiGPUs,
    amdsmi_importable,
    infinity_fabric_active,
    visible_physical_indices,
)
from mlflow_gpuopt.devices.errors import DeviceError, DeviceInitError
from mlflow_gpuopt.devices.fingerprint import hardware_fingerprint
from mlflow_gpuopt.devices.nvml import NvmlGPUs
from mlflow_gpuopt.testing import FakeAmdGPU, FakeGPU, fake_amdsmi, fake_nvml

MI300X = "AMD Instinct MI300X"
MI250X = "AMD Instinct MI250X"
HIP_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@pytest.fixture
def no_visible(monkeypatch):
    for var in HIP_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("env,expected", [
    ({}, [0, 1, 2, 3]),
    ({"HIP_VISIBLE_DEVICES": "2,0"}, [2, 0]),
    ({"CUDA_VISIBLE_DEVICES": "3"}, [3]),  # HIP honours CUDA_VISIBLE_DEVICES too
    ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "3"}, [1]),  # HIP's own wins
    ({"ROCR_VISIBLE_DEVICES": "1,3"}, [1, 3]),
    ({"ROCR_VISIBLE_DEVICES": "1,3", "HIP_VISIBLE_DEVICES": "1"}, [3]),  # HIP indexes ROCR's
    ({"ROCR_VISIBLE_DEVICES": "2", "HIP_VISIBLE_DEVICES": "1"}, []),  # out of range: none
    ({"HIP_VISIBLE_DEVICES": ""}, []),
])
def test_visible_physical_indices(env, expected):
    assert visible_physical_indices(4, env) == expected


def test_series_read_in_amdsmi_units(no_visible):
    gpu = FakeAmdGPU(MI300X, utilization_series=[10, 55, 98], vram_used_mib_series=[1024, 4096],
                     power_w_series=[180, 420, 705], gfx_clock_mhz=1900)
    with fake_amdsmi([gpu]) as smi:
        gpus = AmdSmiGPUs()
        assert gpus.backend == "amdsmi" and len(gpus) == 1 and gpus.name(0) == MI300X
        samples = [gpus.sample(0) for _ in range(3)]
        gpus.close()
        assert smi.refs == 0 and smi.initialized is False  # released
    assert [s.utilization_percent for s in samples] == [10.0, 55.0, 98.0]
    assert [s.memory_used_bytes for s in samples] == [1024 * 2**20, 4096 * 2**20, 4096 * 2**20]
    assert [s.power_watts for s in samples] == [180.0, 420.0, 705.0]
    s = samples[-1]
    assert s.memory_total_bytes == 196_592 * 2**20  # MiB → bytes
    assert s.sm_clock_mhz == 1900.0
    assert s.energy_joules == pytest.approx(65_359_477 * 15.3e-6)  # counter × µJ
    assert gpu.calls["amdsmi_get_gpu_activity"] == 3


def test_mi200_power_key_and_missing_readings(no_visible):
    """MI250X reports ``average_socket_power``; "N/A" and NOT_SUPPORTED read as None."""
    old = FakeAmdGPU(MI250X, power_key="average_socket_power", socket_power_w=380,
                     gfx_activity="N/A", supports_energy=False)
    with fake_amdsmi([old]) as smi:
        gpus = AmdSmiGPUs()
        s = gpus.sample(0)
        assert s.power_watts == 380.0
        assert s.utilization_percent is None
        assert s.energy_joules is None
        smi.fail("amdsmi_get_power_info",
                 smi.AmdSmiLibraryException(smi.AMDSMI_STATUS_NOT_SUPPORTED))
        assert gpus.sample(0).power_watts is None  # not offered: None, never 0
        smi.fail("amdsmi_get_gpu_vram_usage", smi.AmdSmiLibraryException(smi.AMDSMI_STATUS_INVAL))
        with pytest.raises(DeviceError, match="AMD SMI"):  # a real failure is a DeviceError
            gpus.sample(0)
        gpus.close()
        gpus.close()  # twice is safe
        assert smi.refs == 0


@pytest.mark.parametrize("env,names", [
    ({}, [MI300X, MI250X, MI300X]),
    ({"HIP_VISIBLE_DEVICES": "1"}, [MI250X]),
    ({"ROCR_VISIBLE_DEVICES": "2,1", "HIP_VISIBLE_DEVICES": "1,0"}, [MI250X, MI300X]),
    ({"CUDA_VISIBLE_DEVICES": "2,1"}, [MI300X, MI250X]),
])
def test_backend_honours_visible_devices(monkeypatch, no_visible, env, names):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    fakes = [FakeAmdGPU(MI300X), FakeAmdGPU(MI250X, socket_power_w=400), FakeAmdGPU(MI300X)]
    with fake_amdsmi(fakes):
        gpus = get_gpus()
        assert isinstance(gpus, AmdSmiGPUs)
        assert [gpus.name(i) for i in range(len(gpus))] == names
        assert [gpus.sample(i).index for i in range(len(gpus))] == list(range(len(names)))
        gpus.close()


def test_uuid_entry_and_hidden_gpus(monkeypatch, no_visible):
    with fake_amdsmi([FakeAmdGPU(MI300X), FakeAmdGPU(MI250X)]) as smi:
        monkeypatch.setenv("HIP_VISIBLE_DEVICES", "GPU-" + smi.gpus[1].uuid[:8])
        gpus = AmdSmiGPUs()
        assert [gpus.name(0)] == [MI250X]
        gpus.close()
        monkeypatch.setenv("HIP_VISIBLE_DEVICES", "-1")
        with pytest.raises(DeviceInitError, match="no visible GPU"):
            AmdSmiGPUs()
        assert smi.refs == 0  # a failed start releases the library


def test_selection_prefers_amd_then_nvml_then_empty(monkeypatch, no_visible):
    """get_gpus(): AMD SMI when amdsmi imports and reports GPUs, else NVML, else empty."""
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    with fake_nvml([FakeGPU()]):
        with fake_amdsmi([FakeAmdGPU(MI300X), FakeAmdGPU(MI300X)]):
            assert amdsmi_importable()
            gpus = get_gpus()
            assert gpus.backend == "amdsmi" and len(gpus) == 2
            gpus.close()
        with fake_amdsmi([]):  # amdsmi installed on an NVIDIA machine: no AMD GPU
            gpus = get_gpus()
            assert isinstance(gpus, NvmlGPUs)
            gpus.close()
        with fake_amdsmi([FakeAmdGPU()]) as smi:  # driver not loaded
            smi.fail("amdsmi_init", smi.AmdSmiLibraryException(smi.AMDSMI_STATUS_DRIVER_NOT_LOADED))
            gpus = get_gpus()
            assert gpus.backend == "nvml"
            gpus.close()
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # not installed: import fails
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr("mlflow_gpuopt.devices.torch_cuda.torch_cuda_available", lambda: False)
    assert not amdsmi_importable()
    assert get_gpus().backend == "empty"


@pytest.mark.parametrize("visible,expected", [("0", True), ("2", False), ("2,1", False)])
def test_infinity_fabric_seen_through_amdsmi_topology(monkeypatch, no_visible, visible,
                                                      expected):
    """Physical GPUs 0 and 1 share an xGMI link; GPU 2 sits on PCIe only."""
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", visible)
    fakes = [FakeAmdGPU(MI300X), FakeAmdGPU(MI300X), FakeAmdGPU(MI300X, xgmi=False)]
    with fake_amdsmi(fakes) as smi:
        assert infinity_fabric_active([0]) is expected
        assert smi.refs == 0  # released
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # amdsmi not installed
    assert infinity_fabric_active([0]) is False  # nothing seen, nothing raised


def test_fingerprint_names_the_amd_gpu(no_visible):
    with fake_amdsmi([FakeAmdGPU(MI300X) for _ in range(8)]):
        fp = hardware_fingerprint()
    assert fp.gpu == MI300X and fp.gpu_count == 8
    assert fp.gpu_memory_bytes == 196_592 * 2**20


@pytest.mark.parametrize("name,canonical", [
    (MI300X, "MI300X"),
    ("AMD Instinct MI300X OAM", "MI300X"),
    ("MI300X", "MI300X"),
    ("AMD Instinct MI300X 192GB", "MI300X"),
    (MI250X, "MI250X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI325X OAM", "MI325X"),
])
def test_amd_names_resolve_to_the_catalog_gpu(name, canonical):
    assert resolve_gpu(name) == canonical


def test_tracked_run_holds_amd_series(tracking_uri, no_visible, monkeypatch):
    """A run tracked on (fake) MI300X GPUs: AMD SMI series, the device, MFU from its peak."""
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    fakes = [FakeAmdGPU(MI300X, socket_power_w=300),
             FakeAmdGPU(MI300X, power_w_series=[650, 700, 710], vram_used_mib_series=[2048, 3072],
                        utilization_series=[60, 90, 95])]
    with fake_amdsmi(fakes) as smi:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
            for _ in range(6):
                loss = model(torch.randn(32, 64)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                time.sleep(0.02)  # a step's time: 6 steps span the 0.1 s sampling interval
        assert smi.refs == 0  # released at exit
    run = mlflow.get_run(t.run_id)
    p, m, tags = run.data.params, run.data.metrics, run.data.tags
    assert p["gpuopt.device"] == MI300X and p["gpuopt.device_count"] == "1"
    assert p["gpuopt.gpu_backend"] == "amdsmi"
    assert tags["gpuopt.hw.gpu"] == MI300X
    assert resolve_gpu(p["gpuopt.device"]) == "MI300X"
    history = MlflowClient().get_metric_history(t.run_id, "gpuopt/gpu_0_power_watts")
    watts = [h.value for h in history]
    assert watts and set(watts) <= {650.0, 700.0, 710.0}  # physical GPU 1's series only
    assert m["gpuopt/gpu_0_memory_used_bytes"] in (2048 * 2**20, 3072 * 2**20)
    assert "gpuopt/gpu_1_power_watts" not in m
    expected_mfu = (float(p["gpuopt.flops_per_sample"])
                    * m["gpuopt/summary/throughput_samples_per_s"] / 163.4e12)  # MI300X fp32
    assert m["gpuopt/summary/mfu"] == pytest.approx(expected_mfu, rel=1e-6)
