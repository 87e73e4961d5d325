"""Fault injection: whatever fails inside tracking, training finishes and the rest is logged."""

from __future__ import annotations

import errno
import http.server
import logging
import threading

import mlflow
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.devices.samples import GpuSample
from mlflow_gpuopt.testing import FakeGPU, FakeGPUs, fake_nvml
from support.tracking import train as support_train

pytestmark = pytest.mark.faults

STEPS = 8


def make_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train(model, opt, steps=STEPS):
    return support_train(model, opt, steps)


def gpuopt_warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and text in r.getMessage()]


def test_nvml_error_mid_run(tracking_uri, caplog, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with fake_nvml([FakeGPU()]) as nvml:
        model, opt = make_model()
        with gpuopt.track(model, opt, interval_s=0.02, print_summary=False) as t:
            train(model, opt, steps=2)
            nvml.fail("nvmlDeviceGetUtilizationRates", nvml.NVMLError(nvml.NVML_ERROR_GPU_IS_LOST))
            losses = train(model, opt, steps=STEPS)
            threading.Event().wait(0.2)  # several sampler ticks while the GPU is "lost"
    assert len(losses) == STEPS
    m = mlflow.get_run(t.run_id).data.metrics
    assert m["gpuopt/summary/steps"] == STEPS + 2
    assert "gpuopt/host_memory_used_bytes" in m and "gpuopt/step_time_s" in m
    assert m["gpuopt/gpu_0_power_watts"] == pytest.approx(312.0)  # from before the failure
    assert len(gpuopt_warnings(caplog, "GPU 0 reading failed")) == 1  # said once, not per tick


class BuggyGPUs(FakeGPUs):
    def sample(self, index: int) -> GpuSample:
        raise ZeroDivisionError("bug in a backend")


def test_backend_bug(tracking_uri, caplog, monkeypatch):
    import mlflow_gpuopt.devices as devices

    monkeypatch.setattr(devices, "get_gpus", lambda visible_devices=None: BuggyGPUs())
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.02, print_summary=False) as t:
        losses = train(model, opt)
    assert len(losses) == STEPS
    run = mlflow.get_run(t.run_id)
    assert run.data.params["gpuopt.device"] == "NVIDIA A100-SXM4-80GB"
    assert run.data.metrics["gpuopt/summary/steps"] == STEPS
    assert "gpuopt/cpu_utilization_percent" in run.data.metrics
    assert gpuopt_warnings(caplog, "bug in a backend")


def test_host_backend_failure(tracking_uri, caplog, monkeypatch):
    from mlflow_gpuopt.devices.host import HostMonitor

    def broken(self):
        raise OSError("psutil broke")

    monkeypatch.setattr(HostMonitor, "sample", broken)
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.02, print_summary=False) as t:
        train(model, opt)
    m = mlflow.get_run(t.run_id).data.metrics
    assert m["gpuopt/summary/throughput_samples_per_s"] > 0
    assert "gpuopt/host_memory_used_bytes" not in m
    assert len(gpuopt_warnings(caplog, "psutil broke")) == 1


def test_exception_inside_the_step_hook(tracking_uri, caplog):
    model, opt = make_model()
    train(model, opt, steps=2)
    expected = train(model, opt, steps=STEPS - 2)
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.02, print_summary=False) as t:
        train(model, opt, steps=2)

        def broken_clock():
            raise RuntimeError("hook bug")

        t._clock._perf = broken_clock  # the next optimizer step's hook raises
        losses = train(model, opt, steps=STEPS - 2)
        clock = t._clock
        assert clock.broken
        before = (clock.pending_forwards, clock.pending_samples, clock.steps)
        train(model, opt, steps=3)  # the hook stays cheap: it returns at once
        assert (clock.pending_forwards, clock.pending_samples, clock.steps) == before
    assert losses == expected  # training itself is untouched
    run = mlflow.get_run(t.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["gpuopt.device"] == "cpu"
    assert "gpuopt.flops_per_sample" in run.data.params  # profiled at step 1, before the bug
    assert run.data.metrics["gpuopt/summary/steps"] == 2  # the steps before the failure
    assert "gpuopt/cpu_utilization_percent" in run.data.metrics
    assert len(gpuopt_warnings(caplog, "hook bug")) == 1


def test_exception_inside_the_profiler(tracking_uri, caplog, monkeypatch):
    from mlflow_gpuopt.tracking.profiler import WorkloadProfiler

    model, opt = make_model()
    expected = train(model, opt)
    model, opt = make_model()

    def broken(self, batch):
        raise RuntimeError("profiler bug")

    monkeypatch.setattr(WorkloadProfiler, "begin_step", broken)
    with gpuopt.track(model, opt, interval_s=0.02, print_summary=False) as t:
        losses = train(model, opt)
    assert losses == expected
    run = mlflow.get_run(t.run_id)
    assert run.data.metrics["gpuopt/summary/steps"] == STEPS  # steps still counted
    assert "gpuopt.params" in run.data.params  # what the profile could still tell
    assert len(gpuopt_warnings(caplog, "profiler bug")) == 1


def test_sampler_tick_bug(tracking_uri, caplog, monkeypatch):
    from mlflow_gpuopt.tracking.aggregate import StepAggregator

    def broken(self, records, final=False):
        raise KeyError("aggregator bug")

    monkeypatch.setattr(StepAggregator, "consume", broken)
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.02, print_summary=False) as t:
        losses = train(model, opt)
    assert len(losses) == STEPS
    m = mlflow.get_run(t.run_id).data.metrics
    assert "gpuopt/host_memory_used_bytes" in m
    assert "gpuopt.flops_per_sample" in mlflow.get_run(t.run_id).data.params
    assert gpuopt_warnings(caplog, "aggregator bug")


def test_full_disk_for_artifacts(tracking_uri, caplog, monkeypatch):
    def no_space(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(MlflowClient, "log_dict", no_space)
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False, flush_timeout_s=2.0) as t:
        losses = train(model, opt)
    assert len(losses) == STEPS
    run = mlflow.get_run(t.run_id)
    assert run.data.metrics["gpuopt/summary/steps"] == STEPS  # logged before the artifact
    assert run.data.params["gpuopt.precision"] == "fp32"
    assert not MlflowClient().list_artifacts(t.run_id, "gpuopt")
    assert gpuopt_warnings(caplog, "No space left")


def test_store_refuses_metric_writes(tracking_uri, tmp_path, caplog, monkeypatch):
    from mlflow.exceptions import MlflowException

    def refuse(self, *args, **kwargs):
        raise MlflowException("writes are disabled", error_code="PERMISSION_DENIED")

    monkeypatch.setattr(MlflowClient, "log_batch", refuse)
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False, flush_timeout_s=1.0) as t:
        losses = train(model, opt)
    assert len(losses) == STEPS
    assert t.summary is not None and t.summary.total_steps == STEPS
    assert mlflow.active_run() is None  # the run it started was ended
    assert mlflow.get_run(t.run_id).info.status == "FINISHED"
    assert list((tmp_path / "journal").glob("*")), "undelivered records kept in a journal"


class _Forbidden(http.server.BaseHTTPRequestHandler):
    def _deny(self):
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        body = b'{"error_code": "PERMISSION_DENIED", "message": "read-only server"}'
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # BaseHTTPRequestHandler dispatches to these names
    do_GET = do_POST = do_PATCH = do_DELETE = _deny  # noqa: N815

    def log_message(self, *args):
        pass


def test_tracking_server_refuses_writes(monkeypatch, tmp_path, caplog):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("GPUOPT_JOURNAL_DIR", str(tmp_path / "journal"))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    mlflow.set_tracking_uri(uri)
    try:
        model, opt = make_model()
        with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
            losses = train(model, opt)
    finally:
        mlflow.set_tracking_uri(None)
        server.shutdown()
    assert len(losses) == STEPS
    assert t.run_id is None
    assert t.summary.total_steps == STEPS  # measured anyway, just not logged
    assert t.summary.steady.throughput_samples_per_s > 0
    assert gpuopt_warnings(caplog, "no MLflow run")


def test_writer_cannot_start(tracking_uri, caplog, monkeypatch):
    import mlflow_gpuopt.mlflow_io.writer as writer

    def broken(*args, **kwargs):
        raise PermissionError("journal dir not writable")

    monkeypatch.setattr(writer, "RunWriter", broken)
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        losses = train(model, opt)
    assert len(losses) == STEPS and t.summary.total_steps == STEPS
    assert mlflow.active_run() is None
    assert gpuopt_warnings(caplog, "journal dir not writable")
