"""track() on real CPU training into a real sqlite MLflow store: the logged contract."""

from __future__ import annotations

import threading
import time

import mlflow
import pytest
import torch
import torch.nn as nn
from mlflow.tracking import MlflowClient

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.testing import FakeGPU, fake_nvml

D_IN, HIDDEN, D_OUT, BATCH = 32, 64, 8, 16


def make_model(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D_OUT))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model, opt, steps: int, accum: int = 1, batch: int = BATCH, sleep_s: float = 0.0):
    gen = torch.Generator().manual_seed(123)
    losses = []
    for _ in range(steps):
        for _ in range(accum):
            x = torch.randn(batch, D_IN, generator=gen)
            loss = model(x).pow(2).mean() / accum
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if sleep_s:
            time.sleep(sleep_s)
    return losses


def analytic_mlp_flops_per_sample() -> float:
    # forward 2·MACs; backward: weight grads 2·MACs for both layers, input grads only for the
    # second layer (the batch itself needs no gradient)
    macs1, macs2 = D_IN * HIDDEN, HIDDEN * D_OUT
    return 2 * (macs1 + macs2) + 2 * (macs1 + macs2) + 2 * macs2


def artifact(run_id: str, path: str) -> dict:
    return mlflow.artifacts.load_dict(f"runs:/{run_id}/{path}")


def test_contract_is_logged(tracking_uri):
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=12, sleep_s=0.01)
    run = mlflow.get_run(t.run_id)
    assert run.info.status == "FINISHED"
    p, m = run.data.params, run.data.metrics
    assert p["gpuopt.device"] == "cpu" and p["gpuopt.device_count"] == "0"
    assert p["gpuopt.nodes"] == "1" and p["gpuopt.world_size"] == "1"
    assert p["gpuopt.strategy"] == "single" and p["gpuopt.precision"] == "fp32"
    assert p["gpuopt.micro_batch"] == str(BATCH) and p["gpuopt.grad_accum"] == "1"
    n_params = sum(x.numel() for x in model.parameters())
    assert p["gpuopt.params"] == str(n_params)
    assert float(p["gpuopt.flops_per_sample"]) == pytest.approx(analytic_mlp_flops_per_sample())
    for name in ("throughput_samples_per_s", "step_time_p50_s", "step_time_p90_s",
                 "peak_memory_bytes"):
        assert m[f"gpuopt/summary/{name}"] > 0, name
    assert "gpuopt/summary/mfu" not in m  # no known peak on a CPU
    assert m["gpuopt/summary/steps"] == 12 and m["gpuopt/summary/steady_steps"] == 9
    assert 0.01 <= m["gpuopt/summary/step_time_p50_s"] < 0.5
    assert m["gpuopt/summary/throughput_samples_per_s"] == pytest.approx(
        BATCH / m["gpuopt/summary/step_time_mean_s"], rel=1e-6)
    client = MlflowClient()
    hist = client.get_metric_history(t.run_id, "gpuopt/step_time_s")
    assert len(hist) >= 2 and max(h.step for h in hist) == 12
    for name in ("gpuopt/cpu_utilization_percent", "gpuopt/host_memory_used_bytes",
                 "gpuopt/throughput_samples_per_s"):
        assert client.get_metric_history(t.run_id, name), name
    # a sample at start (step 0) and one at the end (last step)
    steps = {h.step for h in client.get_metric_history(t.run_id, "gpuopt/host_memory_used_bytes")}
    assert 0 in steps and 12 in steps
    prof = artifact(t.run_id, "gpuopt/profile.json")
    assert prof["schema"] == "gpuopt.workload/1"
    assert prof["params"] == n_params and prof["precision"] == "fp32"
    assert prof["optimizer"] == "AdamW"
    assert prof["optimizer_state_bytes_per_param"] == pytest.approx(8.0, rel=0.01)
    # saved for backward per sample: the input (D_IN) and the ReLU output (HIDDEN), fp32
    assert prof["activation_bytes_per_sample"] == pytest.approx(4 * (D_IN + HIDDEN))
    assert prof["hardware"]["gpu"] == "cpu" and prof["hardware"]["cpu_count"] >= 1
    assert prof["kernels_per_micro_step"] > 0
    assert float(p["gpuopt.kernels_per_micro_step"]) == prof["kernels_per_micro_step"]
    assert t.summary.steady.steps == 9


def test_tracking_does_not_change_training(tracking_uri):
    model_a, opt_a = make_model()
    plain = train(model_a, opt_a, steps=6)
    model_b, opt_b = make_model()
    with gpuopt.track(model_b, opt_b, interval_s=0.1, print_summary=False,
                      profile_step=1) as t:
        tracked = train(model_b, opt_b, steps=6)
    assert tracked == plain  # bit-identical losses, profiled step included
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)
    assert t.profile is not None and t.profile.flops_per_sample > 0


def test_compiled_model_is_tracked_and_profiled(tracking_uri):
    """``torch.compile`` (the ``aot_eager`` backend: no C++ toolchain needed) changes how the
    forward runs, not what it computes: the steps, micro-batch and FLOPs are the same."""
    model, opt = make_model()
    compiled = torch.compile(model, backend="aot_eager")
    with gpuopt.track(compiled, opt, interval_s=0.1, print_summary=False) as t:
        train(compiled, opt, steps=8)
    p = mlflow.get_run(t.run_id).data.params
    assert p["gpuopt.micro_batch"] == str(BATCH)
    assert int(p["gpuopt.params"]) == sum(x.numel() for x in model.parameters())
    assert float(p["gpuopt.flops_per_sample"]) == pytest.approx(analytic_mlp_flops_per_sample())
    assert t.summary.total_steps == 8 and t.profile.kernels_per_micro_step > 0
    torch._dynamo.reset()  # later tests start without this test's compiled code


class CondGate(nn.Module):
    """A forward with a higher-order operator (``torch.cond``) on a path autograd does not
    need: the profiler's dispatch modes must let it through."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(D_IN, D_OUT)

    def forward(self, x):
        with torch.no_grad():
            gate = torch.cond(x.sum() > 0, lambda t: t.new_ones(()), lambda t: t.new_zeros(()),
                              (x,))
        return self.lin(x) * (1 + gate)


def test_higher_order_operator_in_the_profiled_step(tracking_uri):
    model = CondGate()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=6)  # steps after the profiled one run cond without the modes
    assert t.summary.total_steps == 6
    # forward 2·in·out, weight gradient 2·in·out (the input needs no gradient); cond: none
    assert t.profile.flops_per_sample == pytest.approx(4 * D_IN * D_OUT)
    assert t.profile.kernels_per_micro_step > 0


def test_abort_leaves_every_mode_even_when_one_exit_fails():
    """A profiled step cut short: every dispatch mode and hook goes, even if leaving the
    saved-tensor hooks raised first (a mode left behind would slow every later operator)."""
    from mlflow_gpuopt.tracking.profiler import WorkloadProfiler

    model, opt = make_model()
    profiler = WorkloadProfiler(model, opt)
    before = torch._C._len_torch_dispatch_stack()
    profiler.begin_step(torch.randn(BATCH, D_IN))
    assert torch._C._len_torch_dispatch_stack() == before + 3  # FLOPs, kernels, GEMM shapes

    class Broken:
        def __exit__(self, *exc):
            raise RuntimeError("saved-tensor hooks would not leave")

    profiler._saved_ctx.__exit__(None, None, None)  # the real hooks go; a failing one stands in
    profiler._saved_ctx = Broken()
    with pytest.raises(RuntimeError, match="would not leave"):
        profiler.abort()
    assert torch._C._len_torch_dispatch_stack() == before
    assert not profiler.active
    assert profiler.micro_step_kernels is None


def test_joins_active_run_and_leaves_it_open(tracking_uri):
    model, opt = make_model()
    with mlflow.start_run() as outer:
        with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
            train(model, opt, steps=4)
        assert t.run_id == outer.info.run_id
        assert mlflow.active_run().info.run_id == outer.info.run_id
        mlflow.log_metric("after", 1.0)
    run = mlflow.get_run(outer.info.run_id)
    assert run.data.metrics["after"] == 1.0
    assert "gpuopt.flops_per_sample" in run.data.params


def test_starts_and_ends_its_own_run_failed_on_exception(tracking_uri):
    model, opt = make_model()
    with (pytest.raises(RuntimeError, match="user bug"),
          gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t):
        train(model, opt, steps=3)
        raise RuntimeError("user bug")
    assert mlflow.active_run() is None
    run = mlflow.get_run(t.run_id)
    assert run.info.status == "FAILED"
    assert run.data.metrics["gpuopt/summary/steps"] == 3


def test_explicit_run_id(tracking_uri):
    run = MlflowClient().create_run(mlflow.get_experiment_by_name("Default").experiment_id)
    model, opt = make_model()
    with gpuopt.track(model, opt, run_id=run.info.run_id, interval_s=0.1, print_summary=False):
        train(model, opt, steps=3)
    assert mlflow.active_run() is None
    assert mlflow.get_run(run.info.run_id).data.params["gpuopt.device"] == "cpu"


def test_grad_accumulation_and_flops_per_sample(tracking_uri):
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=5, accum=4, batch=8)
    p = mlflow.get_run(t.run_id).data.params
    assert p["gpuopt.grad_accum"] == "4" and p["gpuopt.micro_batch"] == "8"
    assert float(p["gpuopt.flops_per_sample"]) == pytest.approx(analytic_mlp_flops_per_sample())
    assert t.summary.steady.throughput_samples_per_s == pytest.approx(
        32 / t.summary.steady.step_time_mean_s, rel=1e-6)
    # per micro-step: the step's four forwards+backwards are divided by four (each micro-step
    # of train() also makes its batch, divides the loss, and adds into .grad: a few more
    # kernels than a bare forward+backward, far from four times as many)
    single = kernels_per_micro_step(make_model()[0], torch.optim.AdamW, accum=1, batch=8)
    assert single < t.profile.kernels_per_micro_step < 1.5 * single


class CellLoop(nn.Module):
    """``steps`` steps of one LSTM cell: a tiny autoregressive decoder. ``views`` adds view and
    metadata-only operations to every step, which launch no kernel."""

    def __init__(self, steps: int, views: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.steps, self.views = steps, views
        self.cell = nn.LSTMCell(D_IN, HIDDEN)
        self.out = nn.Linear(HIDDEN, D_OUT)

    def forward(self, x):
        h = c = x.new_zeros(x.shape[0], HIDDEN)
        for _ in range(self.steps):
            if self.views:
                x = x.view(x.shape).t().t().expand(x.shape[0], -1).unsqueeze(1).squeeze(1)
            h, c = self.cell(x, (h, c))
        return self.out(h)


def kernels_per_micro_step(model, optimizer_cls=torch.optim.SGD, accum=1, batch=BATCH):
    """The profiler driven by hand over one step of ``accum`` micro-batches of ``batch``
    (told where the optimizer's step starts and ends, as the step clock's hooks tell it)."""
    from mlflow_gpuopt.tracking.profiler import WorkloadProfiler

    opt = optimizer_cls(model.parameters(), lr=1e-2)
    profiler = WorkloadProfiler(model, opt)
    x = torch.randn(batch, D_IN, generator=torch.Generator().manual_seed(1))
    profiler.begin_step(x)
    for _ in range(accum):
        model(x).pow(2).mean().backward()
        profiler.end_forward()
    profiler.on_optimizer_step_pre(opt, (), {})
    opt.step()
    profiler.on_optimizer_step_post(opt)
    profiler.end_step()
    return profiler.result(batch * accum, accum).kernels_per_micro_step


def test_kernel_count_grows_with_the_steps_of_a_recurrent_loop():
    counts = {k: kernels_per_micro_step(CellLoop(k)) for k in (1, 4, 16)}
    per_step = (counts[4] - counts[1]) / 3
    assert per_step > 10  # an LSTM cell step forward + backward is a few tens of kernels
    assert counts[16] - counts[4] == pytest.approx(12 * per_step)  # the same every step
    assert counts[16] > 10 * counts[1]  # about k times one step: the loop dominates


def test_kernel_count_leaves_out_views_and_the_optimizer():
    from mlflow_gpuopt.tracking.dispatch_count import is_kernel_op

    aten = torch.ops.aten
    for op in (aten.view.default, aten.t.default, aten._unsafe_view.default,
               aten.detach.default, aten.expand.default, aten.as_strided.default,
               aten.empty.memory_format, aten.unsqueeze_.default):
        assert not is_kernel_op(op), op
    for op in (aten.addmm.default, aten.add_.Tensor, aten.copy_.default, aten.zeros.default):
        assert is_kernel_op(op), op
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    hooks_before = len(_global_optimizer_pre_hooks)
    plain = kernels_per_micro_step(CellLoop(4))
    assert kernels_per_micro_step(CellLoop(4, views=True)) == plain
    assert kernels_per_micro_step(CellLoop(4), torch.optim.Adam) == plain
    assert len(_global_optimizer_pre_hooks) == hooks_before  # the profiler's hook is removed


def test_manual_steps_without_optimizer(tracking_uri):
    tracker = gpuopt.Tracker(interval_s=0.1, warmup_steps=1, print_summary=False).start()
    for _ in range(6):
        time.sleep(0.01)  # the step's work: its time is what the throughput divides by
        tracker.step(samples=10, tokens=640)
    summary = tracker.stop()
    assert summary.total_steps == 6 and summary.steady.steps == 5
    assert summary.steady.throughput_samples_per_s == pytest.approx(
        10 / summary.steady.step_time_mean_s, rel=1e-6)
    assert summary.steady.throughput_tokens_per_s == pytest.approx(
        64 * summary.steady.throughput_samples_per_s, rel=1e-6)
    m = mlflow.get_run(tracker.run_id).data.metrics
    assert m["gpuopt/summary/throughput_tokens_per_s"] > 0


def test_manual_step_takes_over_from_optimizer_hook(tracking_uri):
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        for _ in range(4):
            train(model, opt, steps=2)  # two optimizer steps ...
            t.step(samples=2 * BATCH)  # ... reported as one training step
    # the two optimizer steps before the first step() were counted by the hook, and that
    # step() ends the second of them (nothing ran since) instead of adding an empty step;
    # after it, only step() counts: 2 + 3
    assert t.summary.total_steps == 2 + 3


def test_other_optimizers_are_ignored_and_hooks_removed(tracking_uri):
    model, opt = make_model()
    other = torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=3)
        other.step()
        samplers = [th for th in threading.enumerate() if th.name == "GpuOptSampler"]
        assert samplers
    assert t.summary.total_steps == 3
    train(model, opt, steps=2)  # after exit: nothing counts any more
    assert t._clock.steps == 3
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert not any(th.is_alive() for th in samplers)  # the exit joined its sampler


def test_fake_gpu_series_device_and_mfu(tracking_uri, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpus = [FakeGPU("NVIDIA H100 80GB HBM3"), FakeGPU("NVIDIA A100-SXM4-80GB", power_mw=400_000)]
    with fake_nvml(gpus) as nvml:
        model, opt = make_model()
        with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as t:
            train(model, opt, steps=6, sleep_s=0.01)
        assert nvml.initialized is False  # released at exit
    run = mlflow.get_run(t.run_id)
    p, m = run.data.params, run.data.metrics
    assert p["gpuopt.device"] == "NVIDIA A100-SXM4-80GB" and p["gpuopt.device_count"] == "1"
    assert p["gpuopt.gpu_backend"] == "nvml"
    assert m["gpuopt/gpu_0_power_watts"] == pytest.approx(400.0)
    assert m["gpuopt/gpu_0_utilization_percent"] == 87.0
    assert m["gpuopt/gpu_0_memory_used_bytes"] == 10 * 2**30
    assert m["gpuopt/summary/peak_memory_bytes"] == 10 * 2**30
    expected_mfu = (float(p["gpuopt.flops_per_sample"])
                    * m["gpuopt/summary/throughput_samples_per_s"]
                    / 19.5e12)  # A100 dense fp32
    assert m["gpuopt/summary/mfu"] == pytest.approx(expected_mfu, rel=1e-6)
    assert "gpuopt/gpu_1_power_watts" not in m  # only the visible GPU


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="interval"):
        gpuopt.Tracker(intervall_s=1)
    with pytest.raises(ValueError):
        gpuopt.TrackConfig(precision="fp64")


def test_resumed_job_continues_the_run_step_axis(tracking_uri):
    """A job restarted from its checkpoint into its run (``run_id=``): the run's series go
    on after the steps the first session logged, rather than starting again at step 1."""
    model, opt = make_model()
    with gpuopt.track(model, opt, interval_s=0.1, print_summary=False) as first:
        train(model, opt, steps=5)
    run_id = first.run_id
    client = MlflowClient()
    first_steps = [m.step for m in client.get_metric_history(run_id, "gpuopt/step_time_s")]
    assert max(first_steps) == 5
    with gpuopt.track(model, opt, run_id=run_id, interval_s=0.1, print_summary=False) as t:
        train(model, opt, steps=3)
    assert t.run_id == run_id
    history = client.get_metric_history(run_id, "gpuopt/step_time_s")
    later = sorted(m.step for m in history if m.step not in first_steps)
    assert later and min(later) > 5 and max(later) == 5 + 3
    summary = client.get_metric_history(run_id, "gpuopt/summary/steps")
    assert sorted((m.step, m.value) for m in summary) == [(5, 5.0), (8, 3.0)]


def test_tracker_start_stop_around_a_while_true_loop(tracking_uri):
    """The ``while True:`` pattern of docs/tracking.md: start(), a loop left by ``break``,
    stop() in ``finally``; the run it started ends FINISHED with every step."""
    model, opt = make_model()
    gen = torch.Generator().manual_seed(5)
    tracker = gpuopt.Tracker(model, opt, run_name="pretrain", interval_s=0.1,
                             print_summary=False).start()
    steps = 0
    try:
        while True:
            model(torch.randn(BATCH, D_IN, generator=gen)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps == 7:
                break
    finally:
        tracker.stop()
    run = mlflow.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "pretrain"
    assert run.data.metrics["gpuopt/summary/steps"] == 7
    assert mlflow.active_run() is None


def test_beside_mlflow_system_metrics_both_sample_the_host(tracking_uri):
    """docs/tracking.md: with MLflow's system metrics on, the run holds both CPU series;
    tracking's own are complete and its steps unaffected."""
    from mlflow.system_metrics import (
        disable_system_metrics_logging,
        enable_system_metrics_logging,
        set_system_metrics_samples_before_logging,
        set_system_metrics_sampling_interval,
    )

    enable_system_metrics_logging()
    set_system_metrics_sampling_interval(0.2)
    set_system_metrics_samples_before_logging(1)
    try:
        model, opt = make_model()
        with (mlflow.start_run() as run,
              gpuopt.track(model, opt, interval_s=0.1, print_summary=False)):
            train(model, opt, steps=6, sleep_s=0.2)
    finally:
        disable_system_metrics_logging()
        set_system_metrics_sampling_interval(None)
        set_system_metrics_samples_before_logging(None)
    client = MlflowClient()
    assert client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert client.get_metric_history(run.info.run_id, "gpuopt/cpu_utilization_percent")
    assert mlflow.get_run(run.info.run_id).data.metrics["gpuopt/summary/steps"] == 6
