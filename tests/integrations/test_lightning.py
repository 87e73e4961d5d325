"""Lightning: GpuOptCallback tracks into the run of the trainer's MLFlowLogger."""

from __future__ import annotations

import logging

import mlflow
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias

import lightning as L  # noqa: N812 - Lightning's conventional alias
import mlflow_gpuopt as gpuopt
from support.tracking import gpuopt_warnings, logged, samples_per_step


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_callback_joins_the_mlflow_logger_run(tracking_uri):
    from lightning.pytorch.loggers import MLFlowLogger

    from mlflow_gpuopt.integrations.lightning import GpuOptCallback

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 16), torch.randint(0, 4, (48,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    mlf = MLFlowLogger(experiment_name="lit", tracking_uri=tracking_uri)
    cb = GpuOptCallback(interval_s=0.1, print_summary=False)
    trainer = L.Trainer(max_steps=6, logger=mlf, callbacks=[cb], accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(Tiny(), loader)
    assert cb.tracker.run_id == mlf.run_id
    run = mlflow.get_run(mlf.run_id)
    assert run.data.params["gpuopt.micro_batch"] == "8"
    assert run.data.params["gpuopt.optimizer"] == "Adam"
    assert run.data.metrics["gpuopt/summary/steps"] == 6
    assert "loss" in run.data.metrics  # Lightning's own logging, same run
    assert len(mlflow.search_runs(experiment_names=["lit"])) == 1


# -- accumulation, trainer settings, several optimizers -------------------------------------

D_IN, HIDDEN, D_OUT, DEPTH, BATCH, STEPS = 16, 32, 4, 6, 8, 6


def deep_mlp() -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(D_IN, HIDDEN), nn.ReLU()]
    for _ in range(DEPTH - 2):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(HIDDEN, D_OUT))


def deep_mlp_flops_per_sample() -> int:
    """Forward + backward matmul FLOPs per sample of ``deep_mlp`` on data without gradients:
    2 per multiply-add; each layer's backward computes its weight's gradient, and its input's
    for every layer but the first."""
    shapes = [(D_IN, HIDDEN)] + [(HIDDEN, HIDDEN)] * (DEPTH - 2) + [(HIDDEN, D_OUT)]
    total = 0
    for i, (n_in, n_out) in enumerate(shapes):
        mm = 2 * n_in * n_out
        total += mm + mm * (1 if i == 0 else 2)
    return total


class Deep(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = deep_mlp()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def lightning_run(tracking_uri, module, callback, n_batches, **trainer_kwargs):
    from lightning.pytorch.loggers import MLFlowLogger

    data = torch.utils.data.TensorDataset(torch.randn(n_batches * BATCH, D_IN),
                                          torch.randint(0, D_OUT, (n_batches * BATCH,)))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    mlf = MLFlowLogger(experiment_name="lit", tracking_uri=tracking_uri)
    trainer = L.Trainer(logger=mlf, callbacks=[callback], accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **trainer_kwargs)
    trainer.fit(module, loader)
    return logged(mlf.run_id)


def plain_loop_kernels(tracking_uri, accumulate: int) -> float:
    """kernels_per_micro_step of the same model and accumulation in a hand-written loop (the
    operator count the eager loop tests check), for comparison with Lightning's."""
    torch.manual_seed(0)
    net = deep_mlp()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    with gpuopt.track(net, opt, interval_s=0.1, print_summary=False, warmup_steps=1) as t:
        for _ in range(STEPS):
            for _ in range(accumulate):
                x, y = torch.randn(BATCH, D_IN), torch.randint(0, D_OUT, (BATCH,))
                (F.cross_entropy(net(x), y) / accumulate).backward()
            opt.step()
            opt.zero_grad()
    params, _ = logged(t.run_id)
    return float(params["gpuopt.kernels_per_micro_step"])


@pytest.mark.parametrize("accumulate", [1, 2, 4])
def test_accumulate_grad_batches_counts_every_micro_batch(tracking_uri, caplog, accumulate):
    """Lightning runs the step's last micro-batch inside the closure it passes to
    ``optimizer.step()``: it is a micro-batch like the others, and its operators are the
    micro-step's, not the optimizer's."""
    from mlflow_gpuopt.integrations.lightning import GpuOptCallback

    caplog.set_level(logging.WARNING)
    torch.manual_seed(0)
    cb = GpuOptCallback(interval_s=0.1, print_summary=False, warmup_steps=1)
    params, metrics = lightning_run(tracking_uri, Deep(), cb, STEPS * accumulate,
                                    max_steps=STEPS, accumulate_grad_batches=accumulate)
    assert metrics["gpuopt/summary/steps"] == STEPS
    assert samples_per_step(metrics) == pytest.approx(BATCH * accumulate)
    assert params["gpuopt.grad_accum"] == str(accumulate)
    assert params["gpuopt.micro_batch"] == str(BATCH)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        deep_mlp_flops_per_sample(), rel=0.01)
    # Lightning's bookkeeping adds a few operators per micro-step (the loss's detached copy);
    # Adam's own (tens of operators on 12 tensors) or a lost micro-step (a quarter of ~60 at
    # k=4) would be far outside this bound
    kernels = float(params["gpuopt.kernels_per_micro_step"])
    assert abs(kernels - plain_loop_kernels(tracking_uri, accumulate)) <= 5, kernels
    assert gpuopt_warnings(caplog) == []


def test_callback_reads_the_trainers_precision(tracking_uri):
    from mlflow_gpuopt.integrations.lightning import GpuOptCallback, precision_of

    assert [precision_of(p) for p in ("32-true", "bf16-mixed", "bf16-true", "16-mixed",
                                      "transformer-engine", "64-true")] == [
        None, "bf16", "bf16", "fp16", "fp8", None]
    torch.manual_seed(0)
    cb = GpuOptCallback(interval_s=0.1, print_summary=False, warmup_steps=1)
    params, _ = lightning_run(tracking_uri, Deep(), cb, 4, max_steps=4, precision="bf16-mixed")
    assert params["gpuopt.precision"] == "bf16"
    assert params["gpuopt.grad_accum"] == "1"


# A GAN under manual optimization: the generator's and the discriminator's updates in one
# training_step, each with its own optimizer; only the generator is called through forward.
Z, GAN_H = 8, 32


class GAN(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.gen = nn.Sequential(nn.Linear(Z, GAN_H), nn.ReLU(), nn.Linear(GAN_H, D_IN))
        self.disc = nn.Sequential(nn.Linear(D_IN, GAN_H), nn.LeakyReLU(0.2),
                                  nn.Linear(GAN_H, 1))

    def forward(self, z):
        return self.gen(z)

    def training_step(self, batch, batch_idx):
        real = batch[0]
        opt_g, opt_d = self.optimizers()
        bce = nn.BCEWithLogitsLoss()
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        fake = self(torch.randn(len(real), Z))
        opt_g.zero_grad()
        self.manual_backward(bce(self.disc(fake), ones))
        opt_g.step()
        opt_d.zero_grad()
        self.manual_backward(bce(self.disc(real), ones) + bce(self.disc(fake.detach()), zeros))
        opt_d.step()

    def configure_optimizers(self):
        return (torch.optim.Adam(self.gen.parameters(), lr=2e-4),
                torch.optim.Adam(self.disc.parameters(), lr=2e-4))


def gan_step_flops_per_sample() -> int:
    """Model FLOPs per sample of GAN.training_step, counted by hand (2 per multiply-add)."""
    def fwd(n_in, n_out):
        return 2 * n_in * n_out

    d_fwd = fwd(D_IN, GAN_H) + fwd(GAN_H, 1)
    d_bwd_data = fwd(D_IN, GAN_H) + 2 * fwd(GAN_H, 1)  # real / detached input: no dX at layer 1
    d_bwd_through = 2 * fwd(D_IN, GAN_H) + 2 * fwd(GAN_H, 1)  # down into the generator
    g_fwd = fwd(Z, GAN_H) + fwd(GAN_H, D_IN)
    g_bwd = fwd(Z, GAN_H) + 2 * fwd(GAN_H, D_IN)
    generator_update = g_fwd + d_fwd + d_bwd_through + g_bwd
    discriminator_update = 2 * (d_fwd + d_bwd_data)
    return generator_update + discriminator_update


@pytest.mark.parametrize("optimizer", [None, 1])
def test_manual_optimization_two_optimizers_profiles_the_whole_step(tracking_uri, caplog,
                                                                    optimizer):
    """Each batch is one step (or each step of the optimizer named), profiled whole: both
    optimizers' halves, no warning."""
    from mlflow_gpuopt.integrations.lightning import GpuOptCallback

    caplog.set_level(logging.WARNING)
    torch.manual_seed(0)
    cb = GpuOptCallback(interval_s=0.1, print_summary=False, warmup_steps=1,
                        optimizer=optimizer)
    params, metrics = lightning_run(tracking_uri, GAN(), cb, STEPS,
                                    max_steps=2 * STEPS)  # Lightning counts both optimizers
    assert metrics["gpuopt/summary/steps"] == STEPS
    assert samples_per_step(metrics) == pytest.approx(BATCH)
    assert params["gpuopt.micro_batch"] == str(BATCH)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        gan_step_flops_per_sample(), rel=0.01)
    assert gpuopt_warnings(caplog) == []


def test_optimizer_option_names_the_clock(tracking_uri):
    """``optimizer=0`` (the generator's): a step ends at its step(), so the profile holds the
    generator's update only."""
    from mlflow_gpuopt.integrations.lightning import GpuOptCallback

    torch.manual_seed(0)
    cb = GpuOptCallback(interval_s=0.1, print_summary=False, warmup_steps=1, optimizer=0)
    params, metrics = lightning_run(tracking_uri, GAN(), cb, STEPS, max_steps=2 * STEPS)
    assert metrics["gpuopt/summary/steps"] == STEPS
    g_update = (2 * Z * GAN_H + 2 * GAN_H * D_IN) + (2 * D_IN * GAN_H + 2 * GAN_H) \
        + (4 * D_IN * GAN_H + 4 * GAN_H) + (2 * Z * GAN_H + 4 * GAN_H * D_IN)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(g_update, rel=0.01)
