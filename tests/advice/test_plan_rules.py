"""The advice rules that need the fitted model, on real CPU training tracked into a real
sqlite store (a fake NVML A100, so the models can place the measured run):

* ``sharded_optimizer`` — a wide MLP under AdamW on a DDP plan whose GPU memory the
  replicated optimizer state fills: ZeRO-2/FSDP would fit a larger micro-batch, priced on
  the plan; a narrow, activation-heavy MLP under plain SGD gets no such finding.
* ``exposed_comm`` — the run's measured exposed-communication share against the share the
  fitted model predicts for the measured configuration. The tracked run is one process, so
  its world size, strategy and exposed share are set on its facts (the measurement a
  torchrun job on GPUs would log); everything else is the tracked run's.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.advice import Finding, PlanContext, advise_plan
from mlflow_gpuopt.advice.worth import modelled_comm_share
from mlflow_gpuopt.catalog import resolve_gpu
from mlflow_gpuopt.cli.options import parse_target
from mlflow_gpuopt.hardware import hardware_for_gpu, hardware_for_offer
from mlflow_gpuopt.mlflow_io.advice import load_run_facts
from mlflow_gpuopt.perfmodel.memory import usable_memory_bytes
from mlflow_gpuopt.perfmodel.types import ParallelConfig
from mlflow_gpuopt.planning.advising import search_for_run
from mlflow_gpuopt.recommend import Costing
from mlflow_gpuopt.testing import FakeGPU, fake_nvml

MB = 16  # the measured micro-batch
ACCUM = 4  # the plan's accumulation: 64 samples per rank and step


def mlp(layers: list[int]) -> nn.Module:
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for a, b in zip(layers, layers[1:], strict=False):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def convnet() -> nn.Module:
    """Few parameters, many activations: 32×32 feature maps of 32 channels."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 16))


def tracked_run(model: nn.Module, optimizer: str, sample: tuple[int, ...]) -> str:
    """Train ``model`` for real on the CPU under a fake A100 on random ``sample``-shaped
    inputs and 16 classes; its run id."""
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=1e-2))
    gen = torch.Generator().manual_seed(0)
    with (contextlib.redirect_stdout(io.StringIO()), fake_nvml([FakeGPU()]),
          gpuopt.track(model, opt, interval_s=0.1) as t):
        for _ in range(8):
            x = torch.randn(MB, *sample, generator=gen)
            y = torch.randint(0, 16, (MB,), generator=gen)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return t.run_id


def ddp_plan(run_id: str, memory: str = "tight"):
    """The run's facts and a PlanContext: the recommended offer's GPU type on an 8-GPU node
    running DDP at the measured micro-batch × ``ACCUM`` (an 8-GPU A100 node where the catalog
    has no 8-GPU offer of that type). ``memory="tight"``: a GPU whose
    memory holds the DDP step at the measured micro-batch and half again its activations
    (so DDP cannot double the micro-batch); else the catalog's memory."""
    facts = load_run_facts(run_id)
    target = parse_target(samples="100M", epochs=None, dataset_size=None, tokens=None,
                          steps=None, required=True)
    rec, predictor, catalog, _ = search_for_run(run_id, target, None, 0.9)
    plan = rec.winner or rec.cheapest
    eights = [o for o in catalog.offers if o.gpu_count == 8]
    offer = next((o for o in eights if o.gpu == plan.offer.gpu),
                 next(o for o in eights if o.gpu == "A100-80GB-SXM4"))
    spec = catalog.gpus[offer.gpu]
    hw = hardware_for_offer(spec, offer)
    cfg = ParallelConfig(gpus_per_node=8, strategy="ddp", micro_batch=MB, grad_accum=ACCUM,
                         precision=facts.precision)
    if memory == "tight":
        # what CUDA can allocate of the stated memory (GiB, less the driver's share)
        usable = usable_memory_bytes(hw.gpu, 1e9) / 1e9
        for _ in range(20):  # the allocator reserve grows with the card: a fixed point
            m1 = predictor.predict(cfg, hw).memory.total_bytes
            m2 = predictor.predict(replace(cfg, micro_batch=2 * MB), hw).memory.total_bytes
            hw = replace(hw, memory_bytes=(m1 + 0.5 * (m2 - m1)) / usable)
    pred = predictor.predict(cfg, hw)
    assert pred.fits
    plan = replace(plan, offer=offer, nodes=1, config=cfg, prediction=pred,
                   pricing="on_demand")
    ctx = PlanContext(plan=plan, predictor=predictor, hardware=hw, spec=spec,
                      target=rec.target, costing=Costing(),
                      measured_hardware=hardware_for_gpu(
                          catalog.gpus[resolve_gpu(facts.device)], gpus_per_node=8))
    return facts, ctx, pred


def found(items) -> dict[str, Finding]:
    return {x.rule: x for x in items if isinstance(x, Finding)}


def test_adamw_state_on_a_full_gpu_is_a_sharding_finding(tracking_uri):
    # 6.3M parameters in seven layers, AdamW's 8 bytes of state each: a step with
    # per-micro-step work a larger micro-batch amortises (a three-layer MLP of the same size
    # is compute-bound, and its larger micro-batch gains less than sharding costs)
    run_id = tracked_run(mlp([1024] * 7 + [16]), "adamw", (1024,))
    facts, ctx, pred = ddp_plan(run_id)
    assert pred.max_micro_batch < 2 * MB  # DDP cannot double it on this GPU
    assert pred.memory.optimizer_bytes >= 8 * facts.params * 0.99
    shard = found(advise_plan(facts, ctx))["sharded_optimizer"]
    assert shard.params["strategy"] in ("zero2", "fsdp")
    assert shard.params["micro_batch"] > pred.max_micro_batch
    assert shard.params["micro_batch"] * shard.params["grad_accum"] == MB * ACCUM
    ev = {e.name: e.value for e in shard.evidence}
    assert ev["predicted_max_micro_batch"] == pred.max_micro_batch
    assert ev["predicted_ddp_optimizer_and_gradient_bytes"] == pytest.approx(
        pred.memory.optimizer_bytes + pred.memory.gradients_bytes, rel=1e-6)
    assert ("fully_shard" in shard.fix or "\"stage\": 2" in shard.fix)
    assert f"batch_size={shard.params['micro_batch']}" in shard.fix
    # priced: DDP at the measured micro-batch against the sharded plan at the larger one,
    # each as recommend.cost.evaluate prices a plan (the cost is the expected one, over the
    # plan's interval: an unobserved strategy's is wider, so a saving of a minute or two of
    # the CPU run's fitted time can cost more; its sign is left to the timing)
    from mlflow_gpuopt.recommend.cost import evaluate

    assert shard.hours_saved > 0
    sharded = ctx.predictor.predict(replace(ctx.plan.config, **shard.params), ctx.hardware)
    assert sharded.fits
    p = ctx.plan
    before = evaluate(p.offer, p.nodes, p.config, pred, p.pricing, ctx.target, ctx.costing)
    after = evaluate(p.offer, p.nodes, replace(p.config, **shard.params), sharded, p.pricing,
                     ctx.target, ctx.costing)
    assert shard.hours_saved == pytest.approx(before.hours - after.hours, rel=1e-9)
    assert shard.usd_saved == pytest.approx(before.cost_usd - after.cost_usd, rel=1e-9)
    assert (sharded.step_time_s / sharded.samples_per_step
            < pred.step_time_s / pred.samples_per_step)


def test_small_optimizer_state_is_no_sharding_finding(tracking_uri):
    # plain SGD keeps no state; a small convnet's feature maps dominate memory
    run_id = tracked_run(convnet(), "sgd", (3, 32, 32))
    facts, ctx, pred = ddp_plan(run_id)
    assert pred.memory.optimizer_bytes == 0
    # what ZeRO-2 frees on 8 ranks is less than the doubled micro-batch's activations
    freed = pred.memory.gradients_bytes * 7 / 8
    act_per_mb = (ctx.predictor.predict(replace(ctx.plan.config, micro_batch=2 * MB),
                                        ctx.hardware).memory.total_bytes
                  - pred.memory.total_bytes)
    assert freed < act_per_mb / 2
    assert "sharded_optimizer" not in found(advise_plan(facts, ctx))
    # and with the GPU's own memory DDP doubles the micro-batch by itself
    wide = tracked_run(mlp([1024, 2048, 2048, 16]), "adamw", (1024,))
    facts, ctx, pred = ddp_plan(wide, memory="own")
    assert pred.max_micro_batch >= 4 * MB
    assert "sharded_optimizer" not in found(advise_plan(facts, ctx))


def test_exposed_comm_against_the_modelled_share(tracking_uri):
    wide = tracked_run(mlp([1024, 2048, 2048, 16]), "adamw", (1024,))
    facts, ctx, _ = ddp_plan(wide, memory="own")
    assert facts.device != "cpu"  # the fake A100: the model can place the run
    dist = replace(facts, world_size=8, strategy="ddp")
    modelled = modelled_comm_share(dist, ctx)
    pred = ctx.predictor.predict(ParallelConfig(
        gpus_per_node=8, strategy="ddp", micro_batch=facts.micro_batch,
        precision=facts.precision), ctx.measured_hardware)
    assert modelled == pytest.approx(pred.exposed_comm_s / pred.step_time_s)
    assert 0.0 <= modelled < 0.85
    # within the margin of the model's share: no finding
    near = found(advise_plan(replace(dist, exposed_comm_fraction=modelled + 0.05), ctx))
    assert "exposed_comm" not in near
    # 15 points beyond it: a finding, priced as those 15 points removed from the plan's step
    far = found(advise_plan(replace(dist, exposed_comm_fraction=modelled + 0.15), ctx))
    comm = far["exposed_comm"]
    ev = {e.name: e.value for e in comm.evidence}
    assert ev["gpuopt/summary/exposed_comm_fraction"] == pytest.approx(modelled + 0.15)
    assert ev["predicted_exposed_comm_share"] == pytest.approx(modelled, abs=1e-4)
    assert comm.params["excess_share"] == pytest.approx(0.15)
    assert "bucket_cap_mb" in comm.fix and "gradient_as_bucket_view=True" in comm.fix
    assert comm.hours_saved > 0 and comm.usd_saved > 0
    # the plan's hours as the script runs now are its predicted hours slowed by 1/(1-0.15);
    # the fix saves that difference (less the fixed start-up time, hence the tolerance)
    from mlflow_gpuopt.advice.worth import _hours_usd, baseline_config

    cfg = baseline_config(ctx, dist)
    now = _hours_usd(ctx, cfg, ctx.predictor.predict(cfg, ctx.hardware))
    assert now is not None
    assert comm.hours_saved == pytest.approx(now[0] * 0.15 / 0.85, rel=0.05)


def test_compile_saving_is_the_models_eager_minus_compiled_step(tracking_uri, monkeypatch):
    """A deep, narrow MLP: hundreds of small kernels per micro-step. The compile finding's
    saving is the difference between the plan predicted eager and the same fitted model with
    the compiled launches (a CUDA graph replay each for forward and backward), and never more
    than the plan takes. The plan's step is fitted to this CPU's timing (under a fake A100),
    which a loaded machine stretches, so the finding's share threshold is lowered: what is
    checked here is the saving's arithmetic, not where the threshold falls."""
    from mlflow_gpuopt.advice import rules
    from mlflow_gpuopt.advice.worth import COMPILED_LAUNCHES_PER_MICRO_STEP
    from mlflow_gpuopt.recommend.cost import evaluate

    monkeypatch.setattr(rules, "DISPATCH_SHARE_MIN", 0.01)
    run_id = tracked_run(mlp([64] * 40 + [16]), "adamw", (64,))
    facts, ctx, pred = ddp_plan(run_id, memory="catalog")
    assert facts.kernels_per_micro_step > 200
    comp = found(advise_plan(facts, ctx))["compile"]
    compiled = ctx.predictor.with_kernels_per_micro_step(COMPILED_LAUNCHES_PER_MICRO_STEP)
    after = compiled.predict(ctx.plan.config, ctx.hardware)
    assert after.step_time_s < pred.step_time_s
    p = ctx.plan

    def hours(prediction):
        return evaluate(p.offer, p.nodes, p.config, prediction, p.pricing, ctx.target,
                        ctx.costing).hours

    assert comp.hours_saved == pytest.approx(hours(pred) - hours(after), rel=1e-9)
    assert 0 < comp.hours_saved < hours(pred)
    assert comp.usd_saved > 0


def test_compiled_run_gets_no_compile_finding(tracking_uri, monkeypatch):
    from mlflow_gpuopt.advice import rules

    monkeypatch.setattr(rules, "DISPATCH_SHARE_MIN", 0.01)  # as above: not timing-bound
    run_id = tracked_run(mlp([64] * 40 + [16]), "adamw", (64,))
    facts, ctx, _ = ddp_plan(run_id, memory="catalog")
    assert "compile" in found(advise_plan(facts, ctx))
    assert "compile" not in found(advise_plan(replace(facts, compiled=True), ctx))


def test_a_change_priced_as_a_loss_is_not_advised():
    """A finding whose priced saving is negative becomes a rule not acted on, naming the
    hours it would add; a saving (or an unpriced finding) stays a finding."""
    from mlflow_gpuopt.advice import NotEvaluated
    from mlflow_gpuopt.advice.worth import _not_a_loss

    f = Finding("precision_amp", "fp32 on a H100 with bf16 tensor cores", (), "use autocast",
                change="precision", share=0.5)
    loss = _not_a_loss(replace(f, hours_saved=-0.25, usd_saved=-3.0))
    assert isinstance(loss, NotEvaluated) and loss.rule == "precision_amp"
    assert "0.25 h slower" in loss.reason and "H100" in loss.reason
    gain = replace(f, hours_saved=2.0, usd_saved=20.0)
    assert _not_a_loss(gain) is gain
    assert _not_a_loss(f) is f  # unpriced
