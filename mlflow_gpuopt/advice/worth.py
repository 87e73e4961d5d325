"""What each finding is worth on the recommended plan, from the scaling models.

For every finding the plan is predicted twice with the same offer, GPU count and global
batch: once as the script runs now (its precision and micro-batch: the *baseline*) and once
with the fix applied; the difference in predicted wall hours and expected cost for the
user's target is the finding's worth. How each rule's fix changes the prediction is the
"worth" column of docs/advise.md#the-rules; the constants here are its figures
(``UNALIGNED_SLOWDOWN``, ``COMPILED_LAUNCHES_PER_MICRO_STEP``).

Pure: predictor, plan and costing in, :class:`~.types.Finding` with hours/dollars out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.advice import rules
from mlflow_gpuopt.advice.types import Evidence, Finding, NotEvaluated, RunFacts

#: Slowdown of a 16-bit GEMM whose K or N is not a multiple of 8 against an aligned one.
#: An assumption of the order NVIDIA's "Matrix Multiplication Background" guide shows for
#: unaligned shapes (cuBLAS then picks kernels without 16-byte vector loads); the true
#: factor depends on the kernel chosen, so this finding's worth is an estimate.
UNALIGNED_SLOWDOWN = 2.0
#: Consumer GPUs (GeForce) have no ECC on their GDDR memory; a bit flip in a multi-day job
#: corrupts weights silently. Names as the catalog spells them.
NON_ECC_GPU_MARKERS = ("RTX-3090", "RTX-4090", "RTX-5090", "RTX-3080", "RTX-4080", "GEFORCE")
#: A job longer than this is "multi-day" for the ECC rule.
LONG_JOB_HOURS = 48.0
#: Predicted communication above this share of the step makes PCIe-only nodes a finding.
COMM_HEAVY_SHARE = 0.25
#: The sharded data-parallel layouts the sharding rule tries, in order.
SHARDED_STRATEGIES = ("zero2", "fsdp")
FIX_FSDP = ("model = torch.distributed.fsdp.fully_shard(model)  # instead of "
            "DistributedDataParallel(model); fully_shard each block first to overlap")
FIX_ZERO2 = ("deepspeed.initialize(model=model, optimizer=optimizer, config={..., "
             "\"zero_optimization\": {\"stage\": 2}})  # instead of DistributedDataParallel")


@dataclass(frozen=True)
class PlanContext:
    """The recommended plan and what predicting it needs."""

    plan: Any  # recommend.types.Candidate
    predictor: Any  # perfmodel Predictor
    hardware: Any  # perfmodel Hardware of the plan's offer
    spec: Any  # catalog GpuSpec of the plan's GPU
    target: Any  # recommend.types.Target
    costing: Any  # recommend.types.Costing
    #: perfmodel Hardware of the measured GPU in a node of the run's world size (``None``:
    #: measured on a CPU or a GPU the catalog lacks: the run cannot be predicted as measured)
    measured_hardware: Any = None


#: Launches per micro-step of a model compiled with ``mode="reduce-overhead"``: a CUDA
#: graph replay for the forward and one for the backward.
COMPILED_LAUNCHES_PER_MICRO_STEP = 2.0


def _scaled(pred: Any, step_s: float) -> Any:
    """``pred`` with its step taking ``step_s`` (throughput and interval scaled alike)."""
    f = pred.step_time_s / step_s
    return replace(pred, step_time_s=step_s, throughput_samples_per_s=
                   pred.throughput_samples_per_s * f, low=pred.low * f, high=pred.high * f)


def _hours_usd(ctx: PlanContext, config: Any, pred: Any) -> tuple[float, float] | None:
    from mlflow_gpuopt.recommend.cost import evaluate

    p = ctx.plan
    c = evaluate(p.offer, p.nodes, config, pred, p.pricing, ctx.target, ctx.costing)
    return (c.hours, c.cost_usd) if c is not None else None


def _predict(ctx: PlanContext, config: Any) -> Any | None:
    try:
        pred = ctx.predictor.predict(config, ctx.hardware)
    except (ValueError, ArithmeticError):
        return None
    return pred if pred.fits else None


def baseline_config(ctx: PlanContext, facts: RunFacts) -> Any:
    """The plan's shape as the script runs now: its precision and measured micro-batch
    (same samples per rank and step as the plan, so the same global batch)."""
    cfg = ctx.plan.config
    per_rank = (cfg.micro_batch or 1) * cfg.grad_accum
    mb = facts.micro_batch
    base = replace(cfg, precision=facts.precision or cfg.precision)
    if mb and per_rank % mb == 0:
        base = replace(base, micro_batch=mb, grad_accum=per_rank // mb)
    if _predict(ctx, base) is None:  # the measured micro-batch does not fit this GPU
        base = replace(cfg, precision=facts.precision or cfg.precision)
    return base


def baseline_summary(ctx: PlanContext, facts: RunFacts) -> dict[str, Any] | None:
    """What every saving is measured from: the plan's offer and GPUs running the script as
    it runs now (:func:`baseline_config`), its ``precision``, ``micro_batch``,
    ``grad_accum``, ``hours`` and ``cost_usd``; ``None`` when that cannot be predicted."""
    base = baseline_config(ctx, facts)
    pred = _predict(ctx, base)
    priced = _hours_usd(ctx, base, pred) if pred is not None else None
    if priced is None:
        return None
    return {"precision": base.precision, "micro_batch": base.micro_batch,
            "grad_accum": base.grad_accum, "hours": priced[0], "cost_usd": priced[1]}


def _priced(f: Finding, before: tuple[float, float] | None,
            after: tuple[float, float] | None, note: str = "") -> Finding:
    if before is None or after is None:
        return replace(f, worth_note=note or "the plan cannot be predicted with this change")
    return replace(f, hours_saved=before[0] - after[0], usd_saved=before[1] - after[1],
                   worth_note=note)


def price(f: Finding, ctx: PlanContext, facts: RunFacts, base: Any) -> Finding:
    """``f`` with its worth on the plan (``hours_saved``/``usd_saved``), or a note why not."""
    pred = _predict(ctx, base)
    if pred is None:
        return replace(f, worth_note="the plan cannot be predicted as the script runs now")
    before = _hours_usd(ctx, base, pred)
    step = pred.step_time_s
    if f.change == "precision":
        fixed_cfg = replace(base, precision=f.params["precision"])
        fixed = _predict(ctx, fixed_cfg)
        return _priced(f, before, _hours_usd(ctx, fixed_cfg, fixed) if fixed else None)
    if f.change in ("micro_batch", "recompute"):
        fixed_cfg = replace(base, **f.params)
        fixed = _predict(ctx, fixed_cfg)
        return _priced(f, before, _hours_usd(ctx, fixed_cfg, fixed) if fixed else None)
    if f.change == "input_wait":
        if not facts.input_wait_mean_s or not facts.micro_batch:
            return replace(f, worth_note="no input-wait figure to price")
        measured_samples = facts.micro_batch * max(1, facts.grad_accum)
        wait_s = (facts.input_wait_mean_s / measured_samples
                  * (base.micro_batch or facts.micro_batch) * base.grad_accum)
        if pred.basis == "measured":  # fitted on runs of this GPU: the wait is inside
            if wait_s >= step:
                return replace(f, worth_note="the measured wait exceeds the predicted step")
            return _priced(f, before, _hours_usd(ctx, base, _scaled(pred, step - wait_s)),
                           f"{wait_s * 1e3:.1f} ms of waiting per step removed")
        slow = _scaled(pred, step + wait_s)
        return _priced(f, _hours_usd(ctx, base, slow), before,
                       f"{wait_s * 1e3:.1f} ms of waiting per step on the plan "
                       f"({facts.input_wait_mean_s / measured_samples * 1e3:.2f} ms per "
                       "sample, as measured)")
    if f.change == "gemm_alignment":
        p16 = base.precision if base.precision in ("bf16", "fp16", "fp8") else (
            "bf16" if ctx.spec.bf16_tflops else "fp16")
        cfg16 = replace(base, precision=p16)
        pred16 = _predict(ctx, cfg16)
        peak = ctx.hardware.peak_flops_per_s.get(p16)
        flops = ctx.predictor.workload.flops_per_sample
        if pred16 is None or not peak:
            return replace(f, worth_note="the plan cannot be predicted in 16-bit")
        # the unaligned GEMMs' FLOPs of one rank's step at the datasheet peak: a lower bound
        # of their time, so the saving is too
        gemm_s = (flops * (cfg16.micro_batch or 1) * cfg16.grad_accum
                  * f.params["unaligned_flops_share"] / peak)
        extra = gemm_s * (UNALIGNED_SLOWDOWN - 1)
        return _priced(f, _hours_usd(ctx, cfg16, _scaled(pred16, pred16.step_time_s + extra)),
                       _hours_usd(ctx, cfg16, pred16),
                       f"at {p16}: {gemm_s * 1e3:.2f} ms of unaligned GEMMs per step at peak, "
                       f"assumed {UNALIGNED_SLOWDOWN:g}x slower (an estimate)")
    if f.change == "ddp":
        n = base.gpus_per_node
        if n <= 1:
            return replace(f, hours_saved=0.0, usd_saved=0.0,
                           worth_note="the plan has one GPU per node: DataParallel costs "
                                      "nothing there, but cannot use a second GPU well")
        params = facts.params or ctx.predictor.workload.params
        # fp32 master weights out, fp32 gradients back, for each of the other GPUs
        extra = (base.grad_accum * 2 * (n - 1) * params * 4
                 / ctx.hardware.intra_node_bytes_per_s)
        return _priced(f, _hours_usd(ctx, base, _scaled(pred, step + extra)), before,
                       f"{extra * 1e3:.1f} ms per step of weight broadcast and gradient "
                       f"gather over GPU 0's link ({n} GPUs)")
    if f.change == "sharding":
        ddp = replace(base, strategy="ddp")
        p0 = _predict(ctx, ddp)
        fixed_cfg = replace(base, **f.params)
        fixed = _predict(ctx, fixed_cfg)
        if p0 is None:
            return replace(f, worth_note="the plan cannot be predicted as DDP")
        return _priced(f, _hours_usd(ctx, ddp, p0),
                       _hours_usd(ctx, fixed_cfg, fixed) if fixed else None,
                       f"{f.params['strategy']} at micro-batch {fixed_cfg.micro_batch} × "
                       f"accumulation {fixed_cfg.grad_accum} against DDP at "
                       f"{ddp.micro_batch} × {ddp.grad_accum}")
    if f.change == "exposed_comm":
        e = f.params["excess_share"]
        if base.gpus <= 1 or e >= 1.0:
            return replace(f, hours_saved=0.0, usd_saved=0.0,
                           worth_note="the plan has one GPU: no gradient communication there")
        return _priced(f, _hours_usd(ctx, base, _scaled(pred, step / (1.0 - e))), before,
                       f"{e:.1%} of the step beyond the modelled share, on the plan's "
                       f"{step * 1e3:.1f} ms step")
    if f.change == "dispatch":
        compiled = replace(ctx, predictor=ctx.predictor.with_kernels_per_micro_step(
            COMPILED_LAUNCHES_PER_MICRO_STEP))
        after = _predict(compiled, base)
        if after is None:
            return replace(f, worth_note="the plan cannot be predicted compiled")
        return _priced(f, before, _hours_usd(ctx, base, after),
                       f"the model's step compiled ({COMPILED_LAUNCHES_PER_MICRO_STEP:g} "
                       f"launches per micro-step, CUDA graphs): {after.step_time_s * 1e3:.2f} "
                       f"ms against {step * 1e3:.2f} ms eager")
    return replace(f, worth_note="not priced: the models have no term for this change")


def modelled_comm_share(facts: RunFacts, ctx: PlanContext) -> float | None:
    """The share of the step the fitted model predicts as exposed communication for the run
    as it was measured (its GPU, world size, strategy, micro-batch and precision), or
    ``None`` where the model cannot place the run (a CPU, a GPU the catalog lacks)."""
    hw = ctx.measured_hardware
    if hw is None or facts.world_size <= 1:
        return None
    from mlflow_gpuopt.perfmodel.types import STRATEGIES, ParallelConfig

    per_node = max(1, min(facts.world_size, hw.gpus_per_node))
    strategy = (facts.strategy or "ddp").lower()
    cfg = ParallelConfig(gpus_per_node=per_node,
                         nodes=max(1, math.ceil(facts.world_size / per_node)),
                         strategy=strategy if strategy in STRATEGIES else "ddp",
                         micro_batch=facts.micro_batch, grad_accum=facts.grad_accum,
                         precision=facts.precision or None)
    try:
        pred = ctx.predictor.predict(cfg, hw)
    except (ValueError, ArithmeticError):
        return None
    return pred.exposed_comm_s / pred.step_time_s if pred.step_time_s > 0 else None


def _larger_micro_batches(mb: int, accum: int) -> list[int]:
    """Micro-batches above ``mb`` that keep the samples per rank and step (``mb × accum``),
    largest first; with no accumulation, twice ``mb`` (the global batch doubles)."""
    if accum <= 1:
        return [2 * mb]
    per_rank = mb * accum
    out, m = [], 2 * mb
    while m <= per_rank:
        if per_rank % m == 0:
            out.append(m)
        m *= 2
    return out[::-1]


def sharding(facts: RunFacts, ctx: PlanContext, base: Any) -> list[Finding | NotEvaluated]:
    """DDP whose replicated optimizer state and gradients keep the micro-batch small (or
    the recomputation on): ZeRO-2 / FSDP on the plan's data-parallel ranks would fit a larger
    micro-batch, and the plan predicts faster with it."""
    measured = (facts.strategy or "ddp").lower()
    if measured not in ("ddp", "single"):
        return []  # already sharded, or a tensor/pipeline layout
    if base.tp > 1 or base.pp > 1:
        return []
    if base.gpus <= 1:
        return [NotEvaluated("sharded_optimizer", "the plan has one GPU: no ranks to shard "
                             "the optimizer state over")]
    ddp = replace(base, strategy="ddp")
    pred = _predict(ctx, ddp)
    if pred is None:
        return [NotEvaluated("sharded_optimizer", "the plan cannot be predicted as DDP at "
                             "the measured micro-batch")]
    mb = ddp.micro_batch or 1
    mode = ddp.recompute_mode(ctx.predictor.workload.recompute)
    before = pred.step_time_s / pred.samples_per_step  # seconds per sample
    best = None
    for strat in SHARDED_STRATEGIES:
        trials = [(m, "none") for m in _larger_micro_batches(mb, ddp.grad_accum)]
        if mode != "none":
            trials += [(m, mode) for m in _larger_micro_batches(mb, ddp.grad_accum)]
            trials.append((mb, "none"))
        for m, rc in trials:
            accum = max(1, mb * ddp.grad_accum // m)
            if _predict(ctx, replace(ddp, micro_batch=m, grad_accum=accum, recompute=rc,
                                     activation_checkpointing=False)) is not None:
                continue  # DDP fits this too: sharding is not what it needs
            params = {"strategy": strat, "micro_batch": m, "grad_accum": accum,
                      "recompute": rc, "activation_checkpointing": False}
            p = _predict(ctx, replace(ddp, **params))
            if p is None:
                continue
            # every micro-batch DDP cannot fit is priced, not just the largest: a larger
            # micro-batch amortises the per-micro-step work, but the step predicted for it
            # can expose more besides (twice the seconds at 64 as at 32 on the advice tests'
            # MLP), so the largest is not always the fastest
            per_sample = p.step_time_s / p.samples_per_step
            if per_sample < before and (best is None or per_sample < best[0]):
                best = (per_sample, params, p)
    if best is None:
        return []
    _, params, p = best
    replicated = pred.memory.optimizer_bytes + pred.memory.gradients_bytes
    ev = (Evidence("predicted_ddp_optimizer_and_gradient_bytes", round(replicated),
                   f"DDP keeps {replicated / 2**30:.2f} GiB of optimizer state and gradients "
                   f"on each of {base.gpus} {ctx.spec.name}s (of "
                   f"{pred.memory_capacity_bytes / 2**30:.0f} GiB)"),
          Evidence("predicted_max_micro_batch", pred.max_micro_batch,
                   f"DDP fits micro-batch {pred.max_micro_batch} at most; "
                   f"{params['strategy']} fits {p.max_micro_batch}"))
    what = [f"micro-batch {params['micro_batch']}"] if params["micro_batch"] != mb else []
    if params["recompute"] == "none" and mode != "none":
        what.append("no activation checkpointing")
    fix = FIX_FSDP if params["strategy"] == "fsdp" else FIX_ZERO2
    return [Finding(
        "sharded_optimizer", f"DDP replicates the optimizer state: {params['strategy']} "
                             f"would fit {' and '.join(what)}",
        ev, f"{fix}; batch_size={params['micro_batch']}"
            + (f"; accumulation_steps={params['grad_accum']}" if ddp.grad_accum > 1 else
               "  # doubles the global batch: retune the learning rate"),
        change="sharding", share=max(0.0, 1.0 - p.step_time_s / p.samples_per_step / before),
        params=params,
        detail="ZeRO-2 / FSDP keep 1/N of the optimizer state and gradients on each of N "
               "ranks; the memory freed holds the activations of a larger micro-batch")]


def plan_findings(facts: RunFacts, ctx: PlanContext, base: Any
                  ) -> list[Finding | NotEvaluated]:
    """The rules that need the plan: memory headroom (micro-batch, recomputation), kernel
    dispatch on the plan's GPU, PCIe-only nodes, ECC for long jobs."""
    out: list[Finding | NotEvaluated] = []
    pred = _predict(ctx, base)
    if pred is None:
        return [NotEvaluated("memory_headroom", "the plan cannot be predicted as the script "
                             "runs now")]
    mb = base.micro_batch or 1
    if pred.max_micro_batch >= 2 * mb and base.grad_accum % 2 == 0:
        out.append(Finding(
            "memory_headroom", "the micro-batch could double (accumulation halves)",
            (Evidence(contract.PARAM_MICRO_BATCH, mb, f"micro-batch {mb} × accumulation "
                      f"{base.grad_accum}"),
             Evidence("predicted_max_micro_batch", pred.max_micro_batch,
                      f"up to {pred.max_micro_batch} fits a {ctx.spec.name} "
                      f"({pred.memory.total_bytes / 2**30:.1f} of "
                      f"{pred.memory_capacity_bytes / 2**30:.0f} GiB at {mb})")),
            f"batch_size={2 * mb}; accumulation_steps={base.grad_accum // 2}  # same global "
            "batch", change="micro_batch", share=0.1,
            params={"micro_batch": 2 * mb, "grad_accum": base.grad_accum // 2}))
    elif pred.max_micro_batch >= 2 * mb:
        out.append(Finding(
            "memory_headroom", "the micro-batch could double",
            (Evidence(contract.PARAM_MICRO_BATCH, mb, f"micro-batch {mb}, no accumulation"),
             Evidence("predicted_max_micro_batch", pred.max_micro_batch,
                      f"up to {pred.max_micro_batch} fits a {ctx.spec.name}")),
            f"batch_size={2 * mb}  # doubles the global batch: retune the learning rate",
            change="micro_batch", share=0.1, params={"micro_batch": 2 * mb}))
    mode = base.recompute_mode(ctx.predictor.workload.recompute)
    if mode != "none":
        nore = replace(base, recompute="none", activation_checkpointing=False)
        if _predict(ctx, nore) is not None:
            out.append(Finding(
                "checkpointing", "activation checkpointing that memory does not need",
                (Evidence("recompute", mode, f"recompute {mode}, and the step fits a "
                          f"{ctx.spec.name} without it"),),
                "remove torch.utils.checkpoint.checkpoint(...) around the blocks",
                change="recompute", share=0.2,
                params={"recompute": "none", "activation_checkpointing": False}))
    out += rules.compile_dispatch(facts, pred.step_time_s, base.grad_accum)
    out += sharding(facts, ctx, base)
    out += rules.exposed_comm(facts, modelled_comm_share(facts, ctx))
    plan = ctx.plan
    comm_share = pred.exposed_comm_s / pred.step_time_s if pred.step_time_s else 0.0
    if plan.config.gpus > 1 and not ctx.spec.nvlink_gb_per_s and comm_share >= COMM_HEAVY_SHARE:
        out.append(Finding(
            "pcie_only", f"{plan.config.gpus} GPUs without NVLink for a communication-heavy "
                         "job",
            (Evidence("predicted_exposed_comm_share", round(comm_share, 3),
                      f"{comm_share:.0%} of the predicted step is exposed communication"),),
            "recommend --provider ... on an NVLink/SXM instance, or fewer GPUs",
            change="none", share=comm_share))
    if plan.hours >= LONG_JOB_HOURS and any(m in plan.offer.gpu.upper()
                                            for m in NON_ECC_GPU_MARKERS):
        out.append(Finding(
            "no_ecc", f"a {plan.hours / 24:.1f}-day job on {plan.offer.gpu}s without ECC",
            (Evidence("predicted_hours", round(plan.hours, 1),
                      f"{plan.hours:.0f} h predicted"),),
            "checkpoint every hour (torch.save of model and optimizer state) or rent a "
            "data-centre GPU with ECC", change="none", share=0.0))
    return out


def advise_plan(facts: RunFacts, ctx: PlanContext) -> list[Finding | NotEvaluated]:
    """Every rule, each finding priced on the plan; findings ranked by dollars saved."""
    base = baseline_config(ctx, facts)
    items: list[Finding | NotEvaluated] = [
        *rules.input_pipeline(facts), *rules.precision(facts, ctx.spec),
        *rules.gemm_shapes(facts), *rules.data_parallel(facts),
        *plan_findings(facts, ctx, base)]
    return [_not_a_loss(price(x, ctx, facts, base)) if isinstance(x, Finding) else x
            for x in items]


def _not_a_loss(f: Finding) -> Finding | NotEvaluated:
    """A change the plan's prediction prices as slower is not advice: it is listed among the
    rules not acted on, with the hours it would add (a dispatch-bound step, for one, gets
    slower under autocast, whose casts are kernels too)."""
    if f.hours_saved is None or f.hours_saved >= 0:
        return f
    return NotEvaluated(f.rule, f"{f.title}: the plan's prediction with the change is "
                                f"{-f.hours_saved:.3g} h slower, so it is not advised")


def ranked(items: list[Finding | NotEvaluated]) -> list[Finding]:
    """Findings, largest saving first (unpriced ones after, by their step-time share)."""
    found = [x for x in items if isinstance(x, Finding)]

    def key(x: Finding) -> tuple:
        usd = x.usd_saved if x.usd_saved is not None and math.isfinite(x.usd_saved) else None
        return (0, -usd, -(x.hours_saved or 0.0)) if usd is not None else (1, -x.share, 0.0)

    return sorted(found, key=key)
