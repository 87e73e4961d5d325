"""Plain words for a plan: the launch line, a one-line reason per candidate, and why the
winner beats the next ones (price per effective GPU-hour, scaling efficiency, memory
headroom, interconnect) and where its time goes.
"""

from __future__ import annotations

import json
import math

from mlflow_gpuopt.perfmodel.layout import (
    context_degree,
    expert_degree,
    parse_layout,
    without_degree,
)
from mlflow_gpuopt.perfmodel.types import ParallelConfig
from mlflow_gpuopt.perfmodel.vendor import is_amd
from mlflow_gpuopt.recommend.types import Candidate, Target

_STRATEGY_WORDS = {
    "single": "one GPU",
    "ddp": "DDP",
    "zero1": "DeepSpeed ZeRO-1",
    "zero2": "DeepSpeed ZeRO-2",
    "zero3": "DeepSpeed ZeRO-3",
    "fsdp": "FSDP (full shard)",
    "tp": "tensor parallel",
    "pp": "pipeline parallel",
}

_LINK_WORDS = {"nvswitch": "NVSwitch", "nvlink": "NVLink", "pcie3": "PCIe 3",
               "pcie4": "PCIe 4", "pcie5": "PCIe 5", "none": "no GPU link",
               "infinity_fabric": "Infinity Fabric"}


def money(usd: float) -> str:
    """'$1,234' for big sums, '$5.67' for small ones, '<$0.01' for crumbs."""
    if 0 < abs(usd) < 0.005:
        return "<$0.01"
    return f"${usd:,.0f}" if abs(usd) >= 100 else f"${usd:,.2f}"


def sig(x: float, digits: int = 3) -> str:
    """A number to about ``digits`` significant figures: '11,733', '15.1', '0.00667'."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def hours_text(h: float) -> str:
    """'52 min', '3.4 h', '36 h'."""
    if h < 1:
        return f"{h * 60:.0f} min" if h * 60 >= 1 else "<1 min"
    text = f"{h:.1f}".removesuffix(".0") if h < 10 else f"{h:,.0f}"
    return f"{text} h"


def hours_figure(h: float) -> str:
    """Hours as a bare figure for tables: '0.14', '3.4', '36'."""
    return sig(h, 2) if h < 10 else f"{h:,.0f}"


def seconds_text(s: float) -> str:
    """A step-sized duration: '1.36 ms', '57.5 ms', '2.31 s'."""
    return f"{sig(s)} s" if s >= 1 else f"{sig(s * 1e3)} ms"


def preemption_text(expected: float) -> str:
    """What a spot plan should expect: a chance when below one, a count above."""
    if expected < 0.95:
        return f"P(at least one preemption) ≈ {1 - math.exp(-expected):.0%}"
    return f"expect ~{expected:.0f} preemptions"


def strategy_label(config: ParallelConfig) -> str:
    """Short label for tables: ``ddp``, ``fsdp``, ``tp8``, ``tp8+pp2``, ``pp4``, ``fsdp+ac``;
    model-parallel layouts whose replicas shard more than DDP name it last:
    ``tp4+pp2+dp8+zero1``, with a context-parallel degree after the model-parallel ones
    (``tp4+cp8+zero1``); without tp/pp the strategy string is the label (``cp4xfsdp``)."""
    if config.strategy in ("tp", "pp") or config.tp > 1 or config.pp > 1:
        parts = []
        if config.tp > 1:
            parts.append(f"tp{config.tp}")
        if config.pp > 1:
            parts.append(f"pp{config.pp}")
        cp = context_degree(config.strategy)
        flavour = config.strategy
        if cp > 1:  # named with the model-parallel degrees; its ranks shard as dp's do
            parts.append(f"cp{cp}")
            flavour = without_degree(config.strategy, "cp")
        dp = data_parallel_ranks(config)
        if dp > 1:
            parts.append(f"dp{dp}")
        if dp * cp > 1 and flavour not in ("tp", "pp", "ddp"):
            parts.append(flavour)
        label = "+".join(parts) or config.strategy
    else:
        label = config.strategy
    return label + ("+ac" if config.activation_checkpointing else "")


def launch_line(candidate: Candidate) -> str:
    """The exact command to start this plan, with the strategy's settings."""
    cfg = candidate.config
    nodes, per_node = candidate.nodes, cfg.gpus_per_node
    head = f"torchrun --nnodes {nodes} --nproc-per-node {per_node}"
    if nodes > 1:
        head += " --node-rank $NODE_RANK --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500"
    mb, accum, prec = cfg.micro_batch, cfg.grad_accum, cfg.precision
    common = f"micro-batch {mb} per GPU, gradient accumulation {accum}, {prec}"
    if cfg.activation_checkpointing:
        common += ", activation checkpointing on"
    degree_words = _degree_words(cfg.strategy)
    if degree_words:
        common += f", {degree_words}"
    if candidate.prediction.a2a_overlap:
        common += (", the 1F1B all-to-all overlap on (Megatron --overlap-moe-expert-parallel-comm "
                   "--delay-wgrad-compute, CUDA_DEVICE_MAX_CONNECTIONS=32)")
    s = parse_layout(cfg.strategy)[0]  # the data-parallel flavour (or tp / pp)
    if s in ("tp", "pp") or cfg.tp > 1 or cfg.pp > 1:
        dp = data_parallel_ranks(cfg)
        layout = (f"tensor parallel {cfg.tp} inside each node "
                  f"(torch.distributed.tensor.parallel), pipeline {cfg.pp} stages "
                  f"(torch.distributed.pipelining, {accum} micro-batches), data parallel {dp}")
        if s in ("zero1", "zero2", "zero3"):  # Megatron-DeepSpeed: ZeRO over the replicas
            ds = {"zero_optimization": {"stage": int(s[-1])},
                  "train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": accum}
            if prec in ("bf16", "fp16"):
                ds[prec] = {"enabled": True}
            return (f"{head} train.py --deepspeed --deepspeed_config ds_config.json  # "
                    f"{layout} with ZeRO-{s[-1]}; ds_config.json: "
                    f"{json.dumps(ds, separators=(',', ':'))}"
                    + (f"; {degree_words}" if degree_words else ""))
        if s == "fsdp":
            return (f"{head} train.py  # {layout}, replicas sharded with FSDP "
                    f"(fully_shard / ShardingStrategy.FULL_SHARD); {common}")
        return f"{head} train.py  # {layout}; {common}"
    if s in ("zero1", "zero2", "zero3"):
        ds = {"zero_optimization": {"stage": int(s[-1])},
              "train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": accum}
        if prec in ("bf16", "fp16"):
            ds[prec] = {"enabled": True}
        return (f"{head} train.py --deepspeed --deepspeed_config ds_config.json"
                f"  # ds_config.json: {json.dumps(ds, separators=(',', ':'))}"
                + (f"; {degree_words}" if degree_words else ""))
    if s == "fsdp":
        mp = f", MixedPrecision(param_dtype={prec})" if prec in ("bf16", "fp16") else ""
        return (f"{head} train.py  # FSDP: fully_shard / ShardingStrategy.FULL_SHARD{mp}, "
                f"{common}")
    if s == "single":
        return f"{head} train.py  # single GPU, {common}"
    return f"{head} train.py  # DistributedDataParallel, {common}"


def _degree_words(strategy: str) -> str:
    """How to set the context- and expert-parallel degrees of ``strategy`` ('' for none)."""
    words = []
    cp, ep = context_degree(strategy), expert_degree(strategy)
    if cp > 1:
        words.append(f"context parallel {cp}: each sequence split over {cp} GPUs, load-balanced "
                     "(torch.distributed.tensor.experimental.context_parallel on a 'cp' mesh "
                     "dimension, or Megatron --context-parallel-size), micro-batch per group "
                     "of them")
    if ep > 1:
        words.append(f"expert parallel {ep}: each MoE layer's experts split over {ep} GPUs "
                     "(a DeviceMesh 'ep' dimension, or Megatron --expert-model-parallel-size)")
    return ", ".join(words)


def data_parallel_ranks(config: ParallelConfig) -> int:
    """Replicas that each take a share of the global batch (GPUs ÷ (tensor × pipeline ×
    context parallel))."""
    return max(1, config.gpus // (config.tp * config.pp * context_degree(config.strategy)))


def global_batch(config: ParallelConfig) -> int:
    """Samples per optimizer step: micro-batch × accumulation × data-parallel ranks."""
    return (config.micro_batch or 1) * config.grad_accum * data_parallel_ranks(config)


def batch_note(target: Target) -> str:
    """What the plans did with the batch (kept, set or per-GPU), in words."""
    if target.batch_mode == "per-gpu":
        return (f"per-GPU batch {target.per_rank_batch:,} kept on every GPU: each plan's "
                "global batch is that × its data-parallel ranks, so it grows with the GPU "
                "count (a different training hyper-parameter on more GPUs)")
    if target.batch_mode == "derived":
        return (f"global batch {target.global_batch_why}: every plan splits it into "
                "micro-batch × accumulation × data-parallel ranks (plans whose ranks do not "
                "divide it are left out)")
    how = "kept as measured" if target.batch_mode == "kept" else "as asked"
    return (f"global batch {target.global_batch:,} samples per optimizer step {how}: every "
            "plan splits it into micro-batch × accumulation × data-parallel ranks (plans "
            "whose ranks do not divide it are left out)")


def batch_line(c: Candidate, target: Target) -> str:
    """'Batch: global batch 64 = micro-batch 8 × accumulation 1 × 8 data-parallel ranks …'."""
    cfg = c.config
    dp = data_parallel_ranks(cfg)
    how = {"kept": "the measured run's, kept", "set": "as asked",
           "derived": "derived for LLM pre-training",
           "per-gpu": "the per-GPU batch kept, so it grows with the GPUs"}[target.batch_mode]
    return (f"Batch: global batch {global_batch(cfg):,} ({how}) = micro-batch "
            f"{cfg.micro_batch} × accumulation {cfg.grad_accum} × {dp} data-parallel "
            f"rank{'s' if dp > 1 else ''}.")


def describe(c: Candidate) -> str:
    """'2 × p4d.24xlarge (16 × A100-40GB-SXM4) on aws us-east-1, DDP, bf16, on-demand'."""
    flavour = parse_layout(c.config.strategy)[0]
    strategy = _STRATEGY_WORDS.get(flavour, flavour)
    for degree, words in ((context_degree(c.config.strategy), "context parallel"),
                          (expert_degree(c.config.strategy), "expert parallel")):
        if degree > 1:
            strategy += f", {words} {degree}"
    return (f"{c.nodes} × {c.offer.instance_type} ({c.gpus} × {c.offer.gpu}) on "
            f"{c.offer.provider} {c.offer.region}, {strategy}"
            f" [{strategy_label(c.config)}], micro-batch {c.config.micro_batch} × "
            f"{c.config.grad_accum}, {c.config.precision}, {c.pricing.replace('_', '-')}")


def headroom(c: Candidate) -> float:
    """Share of the GPU's usable memory left free by the plan's median peak (0..1)."""
    cap = c.prediction.memory_usable_bytes or c.prediction.memory_capacity_bytes
    return max(0.0, 1.0 - c.prediction.memory.total_bytes / cap) if cap > 0 else 0.0


def interconnect(c: Candidate) -> str:
    """'NVSwitch 300 GB/s per GPU + 400 Gbit/s RDMA between nodes'."""
    o = c.offer
    if c.gpus == 1:
        return "none needed (one GPU)"
    text = f"{_LINK_WORDS.get(o.intra_node_link, o.intra_node_link)} {o.intra_node_gb_per_s:g} GB/s"
    if c.nodes > 1:
        rdma = " RDMA" if o.inter_node_rdma else ""
        text += f" + {o.inter_node_gbps:g} Gbit/s{rdma} between nodes"
    return text


def effective_gpu_hour_usd(c: Candidate, efficiency: float | None) -> float:
    """$ per GPU-hour divided by scaling efficiency: what a perfectly used GPU-hour costs."""
    per_gpu = c.price_per_hour_usd / c.gpus
    return per_gpu / efficiency if efficiency else per_gpu


def one_line_why(c: Candidate, best: Candidate | None, rank: int, target: Target) -> str:
    """A short reason for one row of the table."""
    bits = []
    if rank == 1 and c.meets_deadline:
        bits.append("cheapest plan that meets the deadline"
                    if target.deadline_hours else "cheapest plan")
    elif best is not None and best is not c:
        d = c.cost_usd - best.cost_usd
        bits.append(f"{'+' if d >= 0 else '-'}{money(abs(d))} vs #1"
                    + (f", {hours_text(best.hours - c.hours)} faster"
                       if c.hours < best.hours * 0.99 else ""))
    if not c.meets_deadline and target.deadline_hours is not None:
        bits.append(f"P(meets {hours_text(target.deadline_hours)}) {c.p_meets_deadline:.0%} "
                    f"< {target.confidence:.0%}")
    if c.offer.pricing == "compute_units":
        bits.append(c.cost_basis)
    bits.append(f"${sig(c.usd_per_million_samples)}/M samples")
    bits.append(f"{headroom(c):.0%} memory free")
    if c.prediction.extrapolated:
        bits.append("extrapolated from other GPUs")
    if is_amd(c.offer.gpu):
        bits.append("AMD GPU: ROCm/RCCL")
    bits.extend(c.notes)
    return "; ".join(bits)


def _differences(win: Candidate, run: Candidate, e_win: float | None,
                 e_run: float | None) -> tuple[list[str], list[str], list[str]]:
    """Where the winner and the runner-up differ: (in its favour, against it, neutral)."""
    good: list[str] = []
    bad: list[str] = []
    neutral: list[str] = []

    def differ(a: float, b: float, rel: float = 0.02) -> bool:
        return abs(a - b) > rel * max(abs(a), abs(b), 1e-12)

    def side(better: bool, text: str) -> None:
        (good if better else bad).append(text)

    if win.pricing != run.pricing:
        neutral.append(f"{win.pricing.replace('_', '-')} vs {run.pricing.replace('_', '-')} "
                       "pricing")
    if (win.offer.pricing == "compute_units" and run.offer.pricing == "compute_units"
            and win.cost_basis != run.cost_basis):
        neutral.append(f"{win.cost_basis} vs {run.cost_basis}")
    g_win, g_run = effective_gpu_hour_usd(win, e_win), effective_gpu_hour_usd(run, e_run)
    if differ(g_win, g_run):
        side(g_win < g_run,
             f"${sig(g_win)} vs ${sig(g_run)} per GPU-hour" if win.gpus == run.gpus == 1
             else f"${sig(g_win)} vs ${sig(g_run)} per effective GPU-hour "
             "(price per GPU-hour ÷ scaling efficiency)")
    t_win = win.throughput_samples_per_s / win.gpus
    t_run = run.throughput_samples_per_s / run.gpus
    if differ(t_win, t_run):
        side(t_win > t_run, f"per-GPU throughput {sig(t_win)} vs {sig(t_run)} samples/s")
    if (win.gpus > 1 or run.gpus > 1) and e_win and e_run and abs(e_win - e_run) >= 0.01:
        side(e_win > e_run, f"scaling efficiency {e_win:.0%} vs {e_run:.0%}")
    h_win, h_run = headroom(win), headroom(run)
    if abs(h_win - h_run) >= 0.05:
        side(h_win > h_run, f"memory headroom {h_win:.0%} vs {h_run:.0%}")
    if differ(win.usd_per_million_samples, run.usd_per_million_samples):
        side(win.usd_per_million_samples < run.usd_per_million_samples,
             f"${sig(win.usd_per_million_samples)} vs ${sig(run.usd_per_million_samples)} "
             "per million samples of compute")
    o_win, o_run = win.overhead_hours, run.overhead_hours
    if differ(o_win, o_run, 0.1) and abs(o_win - o_run) * 60 >= 1:
        side(o_win < o_run, f"restarts and lost work {hours_text(o_win)} vs {hours_text(o_run)}")
    if differ(win.hours, run.hours, 0.05):
        delta = run.hours - win.hours
        side(delta > 0, f"{hours_text(abs(delta))} {'faster' if delta > 0 else 'slower'}")
    x_win, x_run = win.prediction.extrapolated, run.prediction.extrapolated
    if x_win != x_run:
        side(not x_win, "measured GPU type vs extrapolated" if not x_win
             else "extrapolated vs measured GPU type")
    i_win, i_run = interconnect(win), interconnect(run)
    if i_win != i_run:
        neutral.append(f"interconnect {i_win} vs {i_run}")
    return good, bad, neutral


def explain_winner(win: Candidate, runner_up: Candidate | None, target: Target,
                   efficiency: dict[int, float | None]) -> tuple[str, ...]:
    """Lines explaining the winner; ``efficiency`` maps id(candidate) -> scaling efficiency."""
    deadline = (f"P(done within {hours_text(target.deadline_hours)}) = "
                f"{win.p_meets_deadline:.0%}"
                if target.deadline_hours else "no deadline")
    lines = [
        f"Recommended: {describe(win)}.",
        f"Predicted {hours_text(win.hours)} ({hours_text(win.hours_low)}–"
        f"{hours_text(win.hours_high)}), {money(win.cost_usd)} ({money(win.cost_low_usd)}–"
        f"{money(win.cost_high_usd)}), {deadline}.",
    ]
    lines.append(f"GPU-hours: {win.gpus * win.hours:,.0f} ({win.gpus * win.hours_low:,.0f}–"
                 f"{win.gpus * win.hours_high:,.0f}) on {win.gpus:,} GPU"
                 f"{'s' if win.gpus > 1 else ''}.")
    if win.cost_basis:
        lines.append(f"Cost: {win.cost_basis}.")
    lines.append(batch_line(win, target))
    e_win = efficiency.get(id(win))
    if runner_up is not None:
        e_run = efficiency.get(id(runner_up))
        saving = runner_up.cost_usd - win.cost_usd
        good, bad, neutral = _differences(win, runner_up, e_win, e_run)
        parts = [f"saves {money(saving)}" if saving >= 0.005 else "same expected cost"]
        if good:
            parts.append("for it: " + ", ".join(good))
        if bad:
            parts.append("against it: " + ", ".join(bad))
        if neutral:
            parts.append("also differs: " + ", ".join(neutral))
        if not (good or bad or neutral):
            parts.append("otherwise alike")
        lines.append(
            f"Why it beats the next option ({describe(runner_up)}, {money(runner_up.cost_usd)}, "
            f"{hours_text(runner_up.hours)}): " + "; ".join(parts) + ".")
    p = win.prediction
    step = p.step_time_s if p.step_time_s > 0 else 1.0
    other = max(0.0, step - p.compute_s - p.exposed_comm_s - p.bubble_s)
    parts = [f"compute {seconds_text(p.compute_s)} ({p.compute_s / step:.0%})"]
    if win.gpus > 1 or p.exposed_comm_s > 0.005 * step:
        a2a = (f", of which the experts' all-to-all {seconds_text(p.alltoall_s)}"
               if p.alltoall_s > 0 else "")
        parts.append(f"exposed communication {seconds_text(p.exposed_comm_s)} "
                     f"({p.exposed_comm_s / step:.0%}{a2a})")
    if win.config.pp > 1 or p.bubble_s > 0.005 * step:
        parts.append(f"pipeline bubble {seconds_text(p.bubble_s)} ({p.bubble_s / step:.0%})")
    if other > 0.005 * step:
        parts.append(f"other {seconds_text(other)} ({other / step:.0%})")
    overhead = f"; plus start-up {hours_text(win.startup_hours)}"
    if win.overhead_hours * 60 >= 0.5:
        overhead += f" and restarts/lost work {hours_text(win.overhead_hours)}"
    lines.append(f"Where the time goes: per optimizer step {seconds_text(step)} = "
                 + ", ".join(parts) + overhead + " over the whole job.")
    usable = p.memory_usable_bytes or p.memory_capacity_bytes
    chance = f", P(fits) {p.p_fits:.0%}" if p.p_fits is not None else ""
    lines.append(f"Memory per GPU: {sig(p.memory.total_bytes / 1e9, 2)} GB of "
                 f"{sig(usable / 1e9, 3)} GB usable ({headroom(win):.0%} free{chance}); "
                 f"interconnect {interconnect(win)}.")
    lines.extend(f"Script change: {n.removeprefix('script change: ')}."
                 if n.startswith("script change: ") else
                 f"Risk: {n.removeprefix('risk: ')}." if n.startswith("risk: ")
                 else f"Note: {n}." for n in win.notes)
    if is_amd(win.offer.gpu):
        lines.append(f"Note: {win.offer.gpu} is an AMD GPU: ROCm/RCCL; PyTorch ROCm build "
                     "required (torch.cuda and the 'nccl' process-group backend map to HIP and "
                     "RCCL, so the training script runs unchanged).")
    if p.basis == "prior":
        lines.append("Note: no run was measured on a GPU; speed comes from the profile "
                     "(FLOPs, memory traffic, kernels launched) against the GPU's datasheet at "
                     "a prior efficiency (wide interval). One short tracked run on any GPU "
                     "narrows it.")
    elif p.extrapolated:
        moved = next((n for n in p.assumptions if "by operator class" in n), None)
        lines.append("Note: no run was measured on this GPU type; the prediction is "
                     "transferred from the measured GPUs (wider interval)"
                     + (f"; {moved}" if moved else "") + ".")
    lines.append(f"Launch: {win.launch}")
    return tuple(lines)
