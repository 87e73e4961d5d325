"""The run-context provider tags every new MLflow run with the hardware, cheaply and safely."""

from __future__ import annotations

import subprocess
import sys

import mlflow

from mlflow_gpuopt.devices import fingerprint
from mlflow_gpuopt.plugin import HardwareRunContextProvider
from mlflow_gpuopt.testing import FakeGPU, clear_caches, fake_nvml


def test_every_run_gets_hardware_tags_on_cpu(tracking_uri, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # a machine without NVML
    clear_caches()
    try:
        with mlflow.start_run() as run:
            pass
    finally:
        clear_caches()
    tags = mlflow.get_run(run.info.run_id).data.tags
    assert tags["gpuopt.hw.gpu"] == "cpu"
    assert tags["gpuopt.hw.gpu_count"] == "0"
    assert tags["gpuopt.hw.cpu"] == fingerprint.cpu_model()
    assert float(tags["gpuopt.hw.memory_gb"]) > 0.1


def test_gpu_model_and_count_from_nvml(tracking_uri, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with fake_nvml([FakeGPU("NVIDIA H100 80GB HBM3")] * 4), mlflow.start_run() as run:
        pass
    tags = mlflow.get_run(run.info.run_id).data.tags
    assert tags["gpuopt.hw.gpu"] == "NVIDIA H100 80GB HBM3"
    assert tags["gpuopt.hw.gpu_count"] == "2"


def test_probe_runs_once_per_process(monkeypatch):
    calls = []
    real = fingerprint.probe_hardware
    monkeypatch.setattr(fingerprint, "probe_hardware", lambda: calls.append(1) or real())
    clear_caches()
    provider = HardwareRunContextProvider()
    first = provider.tags()
    assert provider.tags() == first
    assert len(calls) == 1
    clear_caches()


def test_tags_never_raise(monkeypatch):
    def broken():
        raise RuntimeError("probe bug")

    monkeypatch.setattr(fingerprint, "hardware_fingerprint", broken)
    assert HardwareRunContextProvider().tags() == {}
    assert HardwareRunContextProvider().in_context() is True


def test_import_mlflow_stays_cheap_and_registers_provider():
    code = ("import sys, mlflow\n"
            "from mlflow.tracking.context.registry import _run_context_provider_registry as r\n"
            "names = [type(p).__name__ for p in r]\n"
            "assert 'HardwareRunContextProvider' in names, names\n"
            "assert 'torch' not in sys.modules, 'plugin import pulled in torch'\n"
            "assert 'pynvml' not in sys.modules, 'plugin import pulled in pynvml'\n"
            "from mlflow_gpuopt.devices import fingerprint\n"
            "assert fingerprint.hardware_fingerprint.cache_info().currsize == 0, 'probed'\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout
