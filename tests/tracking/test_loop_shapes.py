"""Loop shapes that are not one model, one forward and one optimizer step per step: skipped
GradScaler steps, ``tracker.step()`` beside an optimizer, GANs (a module called three times,
two optimizers), an LBFGS closure, optimizer wrappers, and forwards that bypass the tracked
module. Each test counts steps, samples, micro-batches and FLOPs itself and compares."""

from __future__ import annotations

import contextlib
import logging
import math
import time

import mlflow
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from support.tracking import gpuopt_warnings, logged, samples_per_step

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.tracking.optimizers import unwrap_optimizer

OPTS = {"interval_s": 0.1, "print_summary": False, "warmup_steps": 1}


def linear_flops(batch: int, n_in: int, n_out: int, grad_input: bool) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of one ``nn.Linear`` over ``batch`` rows: 2 per
    multiply-add; the backward computes the weight's gradient, and the input's when the
    input records gradients."""
    mm = 2 * batch * n_in * n_out
    return mm, mm * (2 if grad_input else 1)


def mlp_flops_per_sample(n_in: int, hidden: int, n_out: int) -> int:
    """Forward + backward FLOPs per sample of Linear(n_in, hidden) -> ReLU -> Linear(hidden,
    n_out) fed data that records no gradient."""
    f1, b1 = linear_flops(1, n_in, hidden, grad_input=False)
    f2, b2 = linear_flops(1, hidden, n_out, grad_input=True)
    return f1 + b1 + f2 + b2


def mlp(n_in=16, hidden=32, n_out=4) -> nn.Module:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


def test_unwrap_follows_optimizer_chains():
    opt = torch.optim.SGD(mlp().parameters(), lr=0.1)

    class Wrapper:  # how accelerate, Lightning and DeepSpeed hold the optimizer
        def __init__(self, inner):
            self.optimizer = inner

        def step(self):
            self.optimizer.step()

    assert unwrap_optimizer(Wrapper(Wrapper(opt))) is opt
    assert unwrap_optimizer(opt) is opt
    assert unwrap_optimizer(None) is None


def test_wrapped_optimizer_counts_steps_and_profile(tracking_uri):
    """A wrapper whose step() calls the inner optimizer's (the hook sees the inner one)."""

    class Wrapped:
        def __init__(self, inner):
            self.optimizer = inner

        @property
        def param_groups(self):
            return self.optimizer.param_groups

        def step(self):
            self.optimizer.step()

        def zero_grad(self):
            self.optimizer.zero_grad()

    torch.manual_seed(0)
    model = mlp()
    opt = Wrapped(torch.optim.Adam(model.parameters(), lr=1e-3))
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(6):
            F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
            opt.step()
            opt.zero_grad()
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == 6
    assert params["gpuopt.optimizer"] == "Adam"
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        mlp_flops_per_sample(16, 32, 4), rel=0.01)


def test_gradscaler_skipped_steps_are_steps_not_accumulation(tracking_uri):
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    skip = {0, 1, 2, 5}  # iterations whose gradients overflow (the scaler skips the update)
    n, batch = 8, 8
    before = [p.detach().clone() for p in model.parameters()]
    updated = []
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for i in range(n):
            loss = F.cross_entropy(model(torch.randn(batch, 16)), torch.randint(0, 4, (batch,)))
            scaler.scale(loss).backward()
            if i in skip:
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            now = [p.detach().clone() for p in model.parameters()]
            updated.append(any(not torch.equal(a, b) for a, b in zip(before, now, strict=True)))
            before = now
    assert [not u for u in updated] == [i in skip for i in range(n)]  # the scaler did skip
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == n
    assert metrics["gpuopt/summary/skipped_steps"] == len(skip)
    assert f"{n} steps ({len(skip)} skipped by the GradScaler" in t.summary.text()
    assert params["gpuopt.micro_batch"] == str(batch)
    assert params["gpuopt.grad_accum"] == "1"
    assert samples_per_step(metrics) == pytest.approx(batch)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        mlp_flops_per_sample(16, 32, 4), rel=0.01)


def test_optimizer_and_manual_step_agree(tracking_uri):
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    n, batch = 7, 8
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(n):
            F.cross_entropy(model(torch.randn(batch, 16)), torch.randint(0, 4, (batch,))).backward()
            opt.step()
            opt.zero_grad()
            t.step()
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == n
    assert params["gpuopt.grad_accum"] == "1"
    assert params["gpuopt.micro_batch"] == str(batch)
    assert samples_per_step(metrics) == pytest.approx(batch)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        mlp_flops_per_sample(16, 32, 4), rel=0.01)


# -- GAN: the discriminator runs three times per iteration, two optimizers step ---------------
Z, H, D_IN, B, ITERS = 8, 32, 16, 8, 6


def gan_iteration_flops_per_sample(window: str) -> int:
    """Matmul FLOPs per sample of the DCGAN-style iteration below (hand count). ``window``:
    "iteration" = everything between two discriminator steps (a whole iteration),
    "generator" = from the generator's forward to the generator's step."""
    d_fwd = sum(linear_flops(1, i, o, False)[0] for i, o in ((D_IN, H), (H, 1)))
    d_bwd_data = linear_flops(1, D_IN, H, False)[1] + linear_flops(1, H, 1, True)[1]
    d_bwd_through = linear_flops(1, D_IN, H, True)[1] + linear_flops(1, H, 1, True)[1]
    g_fwd = sum(linear_flops(1, i, o, False)[0] for i, o in ((Z, H), (H, D_IN)))
    g_bwd = linear_flops(1, Z, H, False)[1] + linear_flops(1, H, D_IN, True)[1]
    real = d_fwd + d_bwd_data
    fake_detached = d_fwd + d_bwd_data
    generator_loss = d_fwd + d_bwd_through + g_bwd
    if window == "iteration":
        return real + g_fwd + fake_detached + generator_loss
    return g_fwd + fake_detached + generator_loss


def run_gan(track_kwargs: dict) -> tuple[gpuopt.Tracker, int]:
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(Z, H), nn.ReLU(), nn.Linear(H, D_IN))
    disc = nn.Sequential(nn.Linear(D_IN, H), nn.LeakyReLU(0.2), nn.Linear(H, 1))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)
    data = torch.utils.data.TensorDataset(torch.randn(B * ITERS, D_IN))
    loader = torch.utils.data.DataLoader(data, batch_size=B)
    bce = nn.BCEWithLogitsLoss()
    models = {"G": gen, "D": disc}
    opts = {"G": opt_g, "D": opt_d}
    kwargs = {k: (models[v] if k == "model" else opts[v]) for k, v in track_kwargs.items()}
    d_calls = 0
    with gpuopt.track(**kwargs, **OPTS) as t:
        for (real,) in loader:  # the DCGAN tutorial's loop
            opt_d.zero_grad()
            bce(disc(real), torch.ones(B, 1)).backward()
            fake = gen(torch.randn(B, Z))
            bce(disc(fake.detach()), torch.zeros(B, 1)).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(disc(fake), torch.ones(B, 1)).backward()
            opt_g.step()
            d_calls += 3
    assert d_calls == 3 * ITERS
    return t, ITERS


@pytest.mark.parametrize("model,optimizer,window", [("D", "D", "iteration"),
                                                     ("G", "G", "generator")])
def test_gan_samples_from_the_data(tracking_uri, caplog, model, optimizer, window):
    t, iters = run_gan({"model": model, "optimizer": optimizer})
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == iters
    assert samples_per_step(metrics) == pytest.approx(B)
    assert params["gpuopt.micro_batch"] == str(B)
    assert params["gpuopt.grad_accum"] == "1"
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        gan_iteration_flops_per_sample(window), rel=0.01)
    assert gpuopt_warnings(caplog) == []


def test_gan_two_optimizers_none_named_warns_once(tracking_uri, caplog):
    caplog.set_level(logging.WARNING)
    t, iters = run_gan({"model": "G"})
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == iters  # the first optimizer's steps only
    assert samples_per_step(metrics) == pytest.approx(B)
    warnings = gpuopt_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "optimizer=" in warnings[0] and "two optimizers" in warnings[0]
    assert params["gpuopt.flops_per_sample"]  # the profile is kept


def test_lbfgs_closure_is_one_micro_batch(tracking_uri):
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    n, batch = 5, 8
    evaluations: list[int] = []
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(n):
            x, y = torch.randn(batch, 16), torch.randint(0, 4, (batch,))
            evaluations.append(0)

            def closure(x=x, y=y):
                evaluations[-1] += 1
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
    assert min(evaluations) > 1  # the closure really ran several times per step
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == n
    assert samples_per_step(metrics) == pytest.approx(batch)
    assert params["gpuopt.micro_batch"] == str(batch)
    assert params["gpuopt.grad_accum"] == "1"
    profiled = t.config.profile_step
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        evaluations[profiled] * mlp_flops_per_sample(16, 32, 4), rel=0.01)


def test_module_dict_that_never_runs_warns_once(tracking_uri, caplog):
    caplog.set_level(logging.WARNING)
    torch.manual_seed(0)
    nets = nn.ModuleDict({"enc": nn.Linear(16, 8), "head": nn.Linear(8, 4)})
    opt = torch.optim.SGD(nets.parameters(), lr=0.1)
    with gpuopt.track(model=nets, optimizer=opt, **OPTS):
        for _ in range(5):
            x = torch.randn(8, 16)
            F.cross_entropy(nets["head"](nets["enc"](x)), torch.randint(0, 4, (8,))).backward()
            opt.step()
            opt.zero_grad()
    warnings = gpuopt_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "never ran" in warnings[0] and "track(model=" in warnings[0]


def test_accumulation_chunks_of_one_batch(tracking_uri):
    """One DataLoader batch cut into accumulation chunks: the chunks are the micro-batches."""
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32 * 5, 16), torch.randint(0, 4, (160,)))
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for x, y in torch.utils.data.DataLoader(data, batch_size=32):
            for xc, yc in zip(x.chunk(4), y.chunk(4), strict=True):
                F.cross_entropy(model(xc), yc).backward()
            opt.step()
            opt.zero_grad()
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == 5
    assert params["gpuopt.micro_batch"] == "8"
    assert params["gpuopt.grad_accum"] == "4"
    assert samples_per_step(metrics) == pytest.approx(32)


def test_two_forwards_before_one_backward_are_one_micro_batch(tracking_uri):
    """A siamese loop: the model embeds both halves of each pair, then one backward."""
    torch.manual_seed(0)
    model = mlp(16, 32, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n, pairs = 6, 8
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for _ in range(n):
            a, b = model(torch.randn(pairs, 16)), model(torch.randn(pairs, 16))
            F.mse_loss(a, b).backward()
            opt.step()
            opt.zero_grad()
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == n
    assert samples_per_step(metrics) == pytest.approx(pairs)
    assert params["gpuopt.grad_accum"] == "1"
    # the step's FLOPs (both embeddings; the second input's layer-1 grad is not needed
    # either) per pair
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        2 * mlp_flops_per_sample(16, 32, 8), rel=0.01)


def test_gradient_penalty_on_a_leaf_input_trains_under_tracking(tracking_uri):
    """WGAN-GP: ``torch.autograd.grad(critic(x), x, create_graph=True)`` with ``x`` a leaf
    (``requires_grad_()`` on the interpolated batch), in the profiled step too. Autograd
    refuses that call when a multi-grad hook sits on a module's input, so tracking must not
    put one there; the training runs exactly as it would untracked."""

    def train(critic, opt, steps):
        torch.manual_seed(1)
        for _ in range(steps):
            real, fake = torch.randn(16, 8), torch.randn(16, 8)
            eps = torch.rand(16, 1)
            x = (eps * real + (1 - eps) * fake).requires_grad_(True)
            (g,) = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
            penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
            loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
            opt.zero_grad()
            loss.backward()
            opt.step()

    def fresh():
        torch.manual_seed(0)
        critic = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        return critic, torch.optim.Adam(critic.parameters(), 1e-3)

    untracked, opt = fresh()
    train(untracked, opt, steps=6)
    tracked, opt = fresh()
    with gpuopt.track(model=tracked, optimizer=opt, **OPTS) as t:
        train(tracked, opt, steps=6)
    assert t.summary is not None and t.summary.total_steps == 6
    for a, b in zip(untracked.parameters(), tracked.parameters(), strict=True):
        assert torch.equal(a, b)
    assert t.profile is not None and t.profile.flops_per_sample > 0
    # the penalty's backward builds a graph (every operator with gradients on): model work,
    # not a checkpoint's replay (which would also advise removing checkpointing)
    params, _ = logged(t.run_id)
    assert params["gpuopt.recompute"] == "none"
    assert "gpuopt.recompute_flops_per_sample" not in params
    assert t.profile.recompute_flops_per_sample == 0


def test_gan_step_framed_by_hand_is_profiled_whole(tracking_uri, caplog):
    """``tracker.begin_step(batch)`` … ``tracker.step()`` around a GAN iteration: one step per
    iteration, both optimizers' updates in the profile, although the tracked generator runs
    after the discriminator's first forward; no warning about the second optimizer."""
    caplog.set_level(logging.WARNING)
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(Z, H), nn.ReLU(), nn.Linear(H, D_IN))
    disc = nn.Sequential(nn.Linear(D_IN, H), nn.LeakyReLU(0.2), nn.Linear(H, 1))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(B * ITERS, D_IN)), batch_size=B)
    bce = nn.BCEWithLogitsLoss()
    with gpuopt.track(model=gen, **OPTS) as t:
        for batch in loader:
            t.begin_step(batch)
            (real,) = batch
            opt_d.zero_grad()
            bce(disc(real), torch.ones(B, 1)).backward()
            fake = gen(torch.randn(B, Z))
            bce(disc(fake.detach()), torch.zeros(B, 1)).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(disc(fake), torch.ones(B, 1)).backward()
            opt_g.step()
            t.step()
    params, metrics = logged(t.run_id)
    assert metrics["gpuopt/summary/steps"] == ITERS
    assert samples_per_step(metrics) == pytest.approx(B)
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(
        gan_iteration_flops_per_sample("iteration"), rel=0.01)
    assert gpuopt_warnings(caplog) == []


class _SlowOnCall(nn.Module):
    """A linear layer whose forward sleeps ``pause_s`` on call ``slow_call`` (0-based)."""

    def __init__(self, slow_call: int, pause_s: float) -> None:
        super().__init__()
        self.lin, self.calls, self.slow_call, self.pause_s = nn.Linear(16, 4), 0, slow_call, \
            pause_s

    def forward(self, x):
        if self.calls == self.slow_call:
            time.sleep(self.pause_s)
        self.calls += 1
        return self.lin(x)


@pytest.mark.parametrize("warmup,steps,steady", [(1, 10, 8), (0, 10, 9), (6, 4, 2)],
                         ids=["warmup-1", "warmup-0", "run-shorter-than-warmup"])
def test_the_profiled_step_is_left_out_of_the_steady_state(tracking_uri, warmup, steps,
                                                           steady):
    """The profiled step (``profile_step`` 1: FLOP counting, saved-tensor hooks and, first in
    a process, torch's FLOP-counter imports, ~2 s on a CPU) is not a steady step whatever
    ``warmup_steps`` is: with it in, a 10-step run's throughput read 1/100 of the truth.
    Here that step's forward also sleeps, so keeping it would show in the mean."""
    torch.manual_seed(0)
    model = _SlowOnCall(slow_call=1, pause_s=0.3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    own = []
    with gpuopt.track(model=model, optimizer=opt, interval_s=0.1, print_summary=False,
                      warmup_steps=warmup) as tracker:
        for _ in range(steps):
            start = time.perf_counter()
            opt.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            own.append(time.perf_counter() - start)
    _, m = logged(tracker.run_id)
    assert own[1] >= 0.3
    assert m["gpuopt/summary/steady_steps"] == steady
    assert m["gpuopt/summary/warmup_steps"] == steps - steady
    # the steps after warm-up but the profiled one (a run shorter than its warm-up: all
    # but the first and the profiled one), timed here
    first = warmup if warmup < steps else 1
    kept = [t for i, t in enumerate(own) if i >= first and i != 1]
    assert len(kept) == steady
    assert m["gpuopt/summary/step_time_mean_s"] < 0.3 / steady
    assert m["gpuopt/summary/throughput_samples_per_s"] == pytest.approx(
        8 * steady / sum(kept), rel=0.5)


def _slowed_once(monkeypatch, owner, name: str, pause_s: float = 0.3) -> list:
    """``owner.name`` sleeps ``pause_s`` on its first call; the list records the calls."""
    real = getattr(owner, name)
    calls = []

    def slow(self, *args, **kwargs):
        if not calls:
            time.sleep(pause_s)
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, slow)
    return calls


def _steady_mean_s(warmup: int, steps: int) -> tuple[int, float]:
    """(steady steps, their mean step time) of a tracked loop of sub-millisecond steps."""
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuopt.track(model=model, optimizer=opt, interval_s=5.0, print_summary=False,
                      warmup_steps=warmup) as tracker:
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
    _, m = logged(tracker.run_id)
    return m["gpuopt/summary/steady_steps"], m["gpuopt/summary/step_time_mean_s"]


def test_tracking_start_up_is_not_the_first_steps_time(tracking_uri, monkeypatch):
    """Step 0 starts when ``track()`` hands the loop control, not when its clock was made:
    the start sample (hardware read, its MLflow write) and the sampler thread come between,
    and with ``warmup_steps=0`` the first step is a steady one. Here the start sample takes
    0.3 s; kept in step 0 it would triple the mean of three sub-millisecond steps."""
    from mlflow_gpuopt.tracking.tracker import Tracker

    calls = _slowed_once(monkeypatch, Tracker, "_safe_tick")
    steady, mean_s = _steady_mean_s(warmup=0, steps=4)
    assert calls and calls[0] == ()  # the start sample (final=False) was the slow one
    assert steady == 3  # steps 0, 2, 3: the profiled one is out
    assert mean_s < 0.3 / 3 / 2


def test_the_profiles_finish_is_the_profiled_steps_time_not_the_next_ones(tracking_uri,
                                                                        monkeypatch):
    """Ending the profile (the FLOP counter's totals, the traffic count: milliseconds to
    seconds) happens at the profiled step's boundary; it is stamped after that work, so the
    next step, the first steady one, does not carry it. Here the finish takes 0.3 s."""
    from mlflow_gpuopt.tracking.profiler import WorkloadProfiler

    calls = _slowed_once(monkeypatch, WorkloadProfiler, "end_step")
    steady, mean_s = _steady_mean_s(warmup=1, steps=5)
    assert len(calls) == 1
    assert steady == 3  # steps 2-4: the profiled one, 1, is out
    assert mean_s < 0.3 / 3 / 2


class _Unpack(nn.Module):
    """Takes the batch as the hostile loops below hand it: a generator of rows, or a dict
    of a (tensor, name) tuple and non-tensor leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, batch):
        if isinstance(batch, dict):
            return self.lin(batch["x"][0]) * batch["meta"]["scale"]
        return self.lin(torch.stack(list(batch)))


def _hostile_loop(kind: str, model: nn.Module, opt, steps: int) -> list[float]:
    gen = torch.Generator().manual_seed(2)
    losses = []
    for i in range(steps):
        rows = 0 if kind == "zero-size" else 8
        x = torch.randn(rows, 16, generator=gen)
        if kind == "dtype-change" and i == 4:
            model.to(torch.float64)
        dtype = next(model.parameters()).dtype
        if kind == "generator":
            batch = (row for row in x)
        elif kind == "nested":
            batch = {"x": (x, "name"), "meta": {"scale": 2.0, "ids": [1, 2], "note": None}}
        else:
            batch = x.to(dtype)
        opt.zero_grad()
        # + 0 x the weights: a zero-row batch still gives every parameter a gradient
        loss = model(batch).sum() + sum(p.sum() for p in model.parameters()) * 0
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if kind == "raises" and i == 5:
            raise RuntimeError("the loop's own error")
    return losses


@pytest.mark.parametrize("kind", ["generator", "nested", "zero-size", "dtype-change",
                                  "raises"])
def test_hostile_loops_train_as_untracked_and_log_only_what_is_known(tracking_uri, kind):
    """A generator batch, a dict of tuples with non-tensor leaves, zero-row batches, a model
    cast to float64 mid-run and a step that raises: training runs exactly as without
    tracking (same losses; the loop's own exception comes out unchanged), every step is
    counted, and no metric is NaN, infinite or negative (a throughput the batch does not
    tell is left out, not guessed)."""
    def fresh():
        torch.manual_seed(0)
        model = _Unpack() if kind in ("generator", "nested") else nn.Linear(16, 4)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    steps = 8
    expect_error = pytest.raises(RuntimeError, match="the loop's own error") \
        if kind == "raises" else contextlib.nullcontext()
    model, opt = fresh()
    with expect_error:
        plain = _hostile_loop(kind, model, opt, steps)
    model, opt = fresh()
    tracked: list[float] = []
    with expect_error, gpuopt.track(model=model, optimizer=opt, **OPTS) as tracker:
        tracked = _hostile_loop(kind, model, opt, steps)
    if kind != "raises":
        assert tracked == plain
    _, m = logged(tracker.run_id)
    assert m["gpuopt/summary/steps"] == (6 if kind == "raises" else steps)
    assert all(math.isfinite(v) and v >= 0 for v in m.values()), m
    if kind == "zero-size":
        assert "gpuopt/summary/throughput_samples_per_s" not in m
    if kind == "raises":
        assert mlflow.get_run(tracker.run_id).info.status == "FAILED"
