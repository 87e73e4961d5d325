"""Device backends: the real NVML code path against a fake pynvml, host, empty, fingerprint."""

from __future__ import annotations

import sys

import pytest

from mlflow_gpuopt.devices import DeviceError, EmptyGPUs, get_gpus
from mlflow_gpuopt.devices.errors import DeviceInitError
from mlflow_gpuopt.devices.fingerprint import HardwareFingerprint, cloud_instance, cpu_model
from mlflow_gpuopt.devices.host import HostMonitor
from mlflow_gpuopt.devices.nvml import NvmlGPUs, parse_visible_devices
from mlflow_gpuopt.testing import FakeGPU, fake_nvml

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("value,count,expected", [
    (None, 3, [0, 1, 2]),
    ("", 3, []),
    ("2,0", 3, [2, 0]),
    ("1,7,0", 3, [1]),  # out of range ends the list, as in CUDA
    ("0,x,1", 3, [0]),  # invalid entry ends the list
    ("-1", 3, []),
    ("GPU-abc,1", 3, ["GPU-abc", 1]),
])
def test_parse_visible_devices(value, count, expected):
    assert parse_visible_devices(value, count) == expected


@pytest.mark.parametrize("visible,names", [
    (None, [A100, H100, A100]),
    ("1", [H100]),
    ("2,1", [A100, H100]),
    ("GPU-fake-0001", [H100]),
])
def test_nvml_honours_cuda_visible_devices(monkeypatch, visible, names):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with fake_nvml([FakeGPU(A100), FakeGPU(H100, power_mw=700_000), FakeGPU(A100)]):
        gpus = get_gpus()
        assert isinstance(gpus, NvmlGPUs)
        assert [gpus.name(i) for i in range(len(gpus))] == names
        gpus.close()


def test_nvml_sample_units_and_unsupported_energy(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGPU(A100, memory_used_bytes=3 * 2**30, utilization_percent=55, power_mw=250_500,
                  sm_clock_mhz=1200, energy_mj=7_250_000)
    old = FakeGPU(A100, supports_energy=False)
    with fake_nvml([gpu, old]) as nvml:
        gpus = NvmlGPUs()
        s = gpus.sample(0)
        assert s.index == 0
        assert s.utilization_percent == 55.0
        assert s.memory_used_bytes == 3 * 2**30
        assert s.memory_total_bytes == 80 * 2**30
        assert s.power_watts == pytest.approx(250.5)
        assert s.sm_clock_mhz == 1200.0
        assert s.energy_joules == pytest.approx(7250.0)
        assert gpus.sample(1).energy_joules is None  # NotSupported -> None, not an error
        gpus.close()
        assert nvml.initialized is False


def test_nvml_errors_are_translated(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with fake_nvml([FakeGPU()]) as nvml:
        gpus = NvmlGPUs()
        nvml.fail("nvmlDeviceGetPowerUsage", nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST))
        with pytest.raises(DeviceError) as info:
            gpus.sample(0)
        assert not isinstance(info.value, nvml.NVMLError)
        nvml.heal("nvmlDeviceGetPowerUsage")
        assert gpus.sample(0).power_watts == pytest.approx(312.0)


def test_factory_degrades_to_empty(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with fake_nvml([FakeGPU()]) as nvml:
        nvml.fail("nvmlInit", nvml.NVMLError(nvml.NVML_ERROR_LIBRARY_NOT_FOUND))
        with pytest.raises(DeviceInitError):
            NvmlGPUs()
        assert isinstance(get_gpus(), EmptyGPUs)
    with fake_nvml([]):
        assert isinstance(get_gpus(), EmptyGPUs)  # NVML works but no GPU
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert isinstance(get_gpus(), EmptyGPUs)


def test_hidden_gpus_mean_no_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with fake_nvml([FakeGPU()]):
        assert len(get_gpus()) == 0


def test_empty_gpus():
    e = EmptyGPUs()
    assert len(e) == 0
    with pytest.raises(IndexError):
        e.sample(0)


def test_subset_reindexes(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with fake_nvml([FakeGPU(A100), FakeGPU(H100)]):
        sub = NvmlGPUs().select([1])
        assert len(sub) == 1 and sub.name(0) == H100 and sub.sample(0).index == 0
        with pytest.raises(IndexError):
            NvmlGPUs().select([5])


def test_host_monitor_reads_this_process():
    h = HostMonitor().sample()
    assert h.process_rss_bytes > 10 * 2**20
    assert 0 < h.host_memory_used_bytes <= h.host_memory_total_bytes
    assert 0.0 <= h.cpu_utilization_percent <= 100.0


def test_cloud_instance_from_dmi(tmp_path):
    (tmp_path / "board_vendor").write_text("Amazon EC2\n")
    (tmp_path / "product_name").write_text("p4d.24xlarge\n")
    assert cloud_instance(tmp_path, env={}) == ("aws", "p4d.24xlarge")
    (tmp_path / "board_vendor").write_text("Google\n")
    (tmp_path / "product_name").write_text("Google Compute Engine\n")
    assert cloud_instance(tmp_path, env={}) == ("gcp", None)
    assert cloud_instance(tmp_path / "missing", env={}) == (None, None)
    assert cloud_instance(tmp_path, env={"COLAB_RELEASE_TAG": "release-2025", "COLAB_GPU": "1"}) \
        == ("colab", "colab-gpu1")


def test_cpu_model_reads_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8275CL\n")
    assert cpu_model(f) == "Intel(R) Xeon(R) Platinum 8275CL"


def test_fingerprint_tags():
    fp = HardwareFingerprint(gpu=A100, gpu_count=8, cpu="Xeon", cpu_count=96,
                             memory_bytes=1152e9, cloud="aws", instance_type="p4d.24xlarge")
    assert fp.tags() == {"gpuopt.hw.gpu": A100, "gpuopt.hw.gpu_count": "8", "gpuopt.hw.cpu": "Xeon",
                         "gpuopt.hw.cpu_count": "96", "gpuopt.hw.memory_gb": "1152.0",
                         "gpuopt.hw.cloud": "aws", "gpuopt.hw.instance_type": "p4d.24xlarge"}


@pytest.mark.parametrize("visible, expected", [("1", "nvlink"), ("0", "pcie"),
                                               ("GPU-fake-0001", "nvlink")])
def test_interconnect_reads_nvlink_of_the_visible_gpu(monkeypatch, visible, expected):
    from mlflow_gpuopt.tracking.distributed.job import interconnect

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with fake_nvml([FakeGPU(), FakeGPU(nvlink_active=True)]) as nvml:
        # process-visible GPU 0 is physical GPU 1 (or 0): only GPU 1 has an active NVLink
        assert interconnect([0], gpus_per_node=2, nodes=1) == expected
        assert interconnect([0], gpus_per_node=2, nodes=2) == expected + "+network"
        assert nvml.refs == 0  # NVML released
