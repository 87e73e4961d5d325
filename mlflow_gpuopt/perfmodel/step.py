"""One optimizer step put together: compute, communication, overlap, accumulation, bubble.

    T_grad  = a + b·m (+ FP8 casts)                       per micro-step, per GPU (compute.py)
    T_step  = s·T_grad + exposed(T_allreduce) + T_opt + T_straggle   DDP / ZeRO-1/2: 25 MB
                                                   buckets under the last backward (comm.py)
    T_step  = s·(T_grad + exposed(T_gather, T_rs)) + T_opt + T_straggle   ZeRO-3 / FSDP: per
                                                   unit, every micro-step (comm.py)
    T_step  = s·(T_grad + P_exposed) + (p−1)/v·(T_grad + T_p2p) + exposed T_comm + ...
                                                   pipeline (1F1B / interleaved), bubble
                                                   (p−1)/(v·s) of ideal; its data-parallel
                                                   traffic by Pollux's overlap
                                                   (T_stage^γ + T_comm^γ)^(1/γ)

Context parallel (``cp``) splits each sample's sequence: a GPU's per-sample work ``b`` is
divided by ``tp·pp·cp``, its tensor-parallel and pipeline messages carry ``seq/cp`` tokens, and
the key/value exchange adds what attention does not hide (``context.py``); the data-parallel
group that reduces the gradients is the replicas × ``cp``.

The pipeline bubble (once per run of the schedule, :func:`pipeline_flushes`) is Narayanan et
al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
Sec. 2.2): (p−1)/m of the ideal time for 1F1B with m
micro-batches, (p−1)/(v·m) with the interleaved schedule's v model chunks per device, whose
point-to-point traffic ``T_p2p`` grows v-fold (each micro-batch crosses v times as many stage
boundaries). Each GPU sends 1/tp of the ``b·s·h`` boundary (sequence parallelism,
:func:`pp_boundary_bytes`); the interleaved schedule overlaps its sends and receives with
compute, 1F1B does not (``P_exposed``, :func:`pp_exposed_p2p_s`); the fill and drain cross
p−1 boundaries each way in the open.

Calibration factors (fitted in fitting.py) scale the priors: ``compute_scale`` all compute,
``fixed_scale`` the batch-independent part ``a`` alone, latency-bound work adds at the GPU's
SM count × clock. ``a`` = host-side overhead + weight traffic; the overhead (kernel dispatch,
CPU time) is the same on every GPU type, so a calibration carried to another GPU scales it by
what was fitted where it was measured (``overhead_scale``), not by the target's factors.
``comm_scale`` scales communication and the straggler share together (one or two multi-GPU
runs cannot tell them apart). Pure arithmetic, no allocation beyond the
result: the recommender calls this thousands of times.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlflow_gpuopt.perfmodel import comm, context, moe
from mlflow_gpuopt.perfmodel.compute import (
    dispatch_time_s,
    fp8_cast_time_s,
    kernel_count,
    latency_time_s,
    linear_gemm_times_s,
    normalize_fp8_recipe,
    optimizer_host_time_s,
    optimizer_time_prior_s,
    per_sample_time_prior_s,
    wave_tail_time_s,
    weight_traffic_time_s,
)
from mlflow_gpuopt.perfmodel.layout import Layout
from mlflow_gpuopt.perfmodel.precision import COMM_ELEMENT_BYTES, is_mixed
from mlflow_gpuopt.perfmodel.shape import Shape
from mlflow_gpuopt.perfmodel.types import Hardware, Workload


@dataclass(frozen=True)
class Calibration:
    """Multipliers on the priors, fitted from observations (1.0 = the prior as is)."""

    compute_scale: float = 1.0
    fixed_scale: float = 1.0
    comm_scale: float = 1.0
    gamma: float = comm.GAMMA_PRIOR
    #: Latency-bound work beyond the roofline, in FP32-rate FLOP-equivalents: per micro-step
    #: and per sample (see compute.py); scales with the GPU's SM count × clock
    #: (``compute.latency_rate_flops_per_s``), not its tensor peak.
    latency_fixed_flops: float = 0.0
    latency_per_sample_flops: float = 0.0
    #: Scale of the optimizer step; None = ``compute_scale``.
    optimizer_scale: float | None = None
    #: Scale of the host-side overhead in ``a`` (kernel dispatch: CPU time, the same on every
    #: GPU); None = ``compute_scale × fixed_scale``, as on the measured GPU. A calibration carried
    #: to another GPU type sets it to the measured product, so dispatch seconds do not move.
    overhead_scale: float | None = None


@dataclass(frozen=True)
class StepTerms:
    """Where one optimizer step's time goes, seconds (critical path of one GPU)."""

    step_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    samples_per_step: float
    #: per step: expert-parallel all-to-alls (dispatch and combine) on the critical path,
    #: within ``exposed_comm_s`` (under the 1F1B overlap: what it adds to the compute, the
    #: paired GEMMs' lost efficiency included), and their own seconds, hidden or not
    alltoall_s: float = 0.0
    alltoall_total_s: float = 0.0
    #: whether the step ran the 1F1B all-to-all overlap (``moe_a2a_overlap`` 1f1b on a layout
    #: that can run it, or auto where it pays)
    a2a_overlapped: bool = False
    #: per step: the context-parallel key/value exchange on the critical path (within
    #: ``exposed_comm_s``), and all of it, hidden or not
    cp_exchange_s: float = 0.0
    cp_exchange_total_s: float = 0.0


def pp_boundary_bytes(micro_batch: float, shape: Shape, act_bytes: int, tp: int,
                      cp: int = 1) -> float:
    """Bytes one GPU sends across one pipeline-stage boundary per micro-batch, one direction:
    the residual stream ``b·s·h``, split over the ``tp`` ranks of the stage by sequence
    parallelism (each rank sends its ``s/tp`` rows on its own link). Megatron-Core's schedules
    communicate ``(s/tp, b, h)`` under ``--sequence-parallel`` (``schedules.py``
    ``get_tensor_shapes``); torchtitan's tensor-parallel plan keeps the residual stream
    sequence-sharded (``SequenceParallel`` norms, ``Shard(1)`` block outputs) between stages.
    Sequence parallelism is taken on wherever tp > 1, as the activation memory takes it
    (``activations.py``); context parallelism keeps ``s/cp`` of each sample on a rank."""
    return (micro_batch * shape.seq_len * shape.hidden_size * act_bytes
            / (max(1, tp) * max(1, cp)))


def pp_exposed_p2p_s(t_p2p: float, t_micro: float, vp: int) -> float:
    """Seconds one micro-step's pipeline sends and receives ``t_p2p`` (all ``v`` chunks, both
    directions) add to it in the steady state.

    The interleaved schedule (``v > 1``) posts the next chunk's receive and this chunk's send
    asynchronously and computes meanwhile (Megatron's ``overlap_p2p_comm``, on by default and
    only possible with interleaving: ``arguments.py`` turns it off for the non-interleaved
    schedule; PyTorch's ``ScheduleInterleaved1F1B`` posts the receives one action ahead), so
    only what the micro-step's compute cannot cover adds. The non-interleaved 1F1B schedule
    sends and receives as one blocking batch between its forward and backward passes: all of
    it adds."""
    if t_p2p <= 0:
        return 0.0
    if vp > 1:
        return max(0.0, t_p2p - t_micro)
    return t_p2p


def pipeline_flushes(workload: Workload, micro_steps: int) -> int:
    """Runs of the pipeline schedule in one optimizer step of ``micro_steps`` micro-batches:
    1 (Megatron's schedule takes them all), or ``⌈micro_steps / pp_microbatches⌉`` where each
    gradient-accumulation step runs the schedule again (torchtitan, NeMo AutoModel)."""
    m = workload.pp_microbatches
    if not m or m <= 0:
        return 1
    return max(1, -(-int(micro_steps) // int(m)))


def a2a_overlapped(workload: Workload, layout: Layout) -> bool:
    """True where the workload asks for the 1F1B all-to-all overlap (``1f1b``, or ``auto``
    where it pays, which the step decides) and ``layout`` can run it
    (:func:`.moe.a2a_overlap_blocker`; ``predict`` refuses the others in one line under
    ``1f1b``, the search plans them without it)."""
    return (moe.normalize_a2a_overlap(workload.moe_a2a_overlap) in ("1f1b", "auto")
            and moe.a2a_overlap_blocker(workload, layout) is None)


def a2a_unpaired_share(workload: Workload, layout: Layout, micro_steps: int) -> float:
    """Share of a step's forwards and backwards the 1F1B all-to-all overlap cannot pair:
    without a pipeline the first forward and the last backward (one micro-step's worth of
    ``micro_steps``); with the interleaved schedule each run of it warms up with
    ``(pp − 1) + (vp − 1)·pp + 1`` chunk forwards on average over the stages (Megatron's
    ``(pp − rank − 1)·2 + (vp − 1)·pp``, one more with the overlap) and cools down with as
    many chunk backwards, of its ``m·vp`` (``m`` micro-batches a run,
    :func:`pipeline_flushes`)."""
    s = max(1, int(micro_steps))
    if layout.pp <= 1:
        return 1.0 / s
    vp = max(1, layout.vp)
    m = s / pipeline_flushes(workload, s)
    warmup = (layout.pp - 1) + (vp - 1) * layout.pp + 1
    return min(1.0, warmup / (m * vp))


def fsdp_gather_scales(workload: Workload, precision: str) -> tuple[float, float]:
    """The ZeRO-3/FSDP all-gathers' bytes relative to bf16, (whole model, one decoder block),
    where the workload gathers its FP8 weights in FP8 (``fp8_all_gather``; torchao allows it
    with tensor-wise scaling only): every decoder-block weight is an FP8 linear layer's; the
    input embedding and the output projection (``2 · vocab · hidden``; torchtitan's float8
    ``filter_fqns = ["output"]``) stay bf16 (:func:`.comm.fp8_gather_scale`). Mixture-of-
    experts weights are not torchao ``Float8Linear`` layers: no change there."""
    if (precision != "fp8" or not workload.fp8_all_gather
            or normalize_fp8_recipe(workload.fp8_recipe) != "tensorwise"
            or (workload.num_experts or 0) > 1):
        return 1.0, 1.0
    params = float(workload.params)
    outside = 2.0 * float(workload.vocab_size or 0) * float(workload.hidden_size or 0)
    return comm.fp8_gather_scale(params, params - outside), comm.fp8_gather_scale(1.0, 1.0)


def _tp_exposed_s(workload: Workload, hardware: Hardware, precision: str, layout: Layout,
                  micro_batch: float, seq_local: float, shape: Shape, t_tp: float,
                  t_grad: float, act_bytes: float, gather_bytes: float, k: float,
                  kappa: float, full_recompute: bool) -> float:
    """Seconds a micro-step's tensor-parallel collectives (``t_tp`` in all) add. Without
    ``tp_comm_overlap`` all of them; with it each one against the GEMM it is fused with, the
    way ``tp_overlap`` builds the overlap (``comm.tp_layer_exposed_s``, the GEMMs at the
    calibrated compute scale ``k``), or against the micro-step's compute where the workload
    does not give the architecture (``comm.tp_exposed_s``)."""
    tp = layout.tp
    if t_tp <= 0 or not workload.tp_comm_overlap or tp <= 1:
        return t_tp
    gemms = linear_gemm_times_s(workload, hardware, precision, micro_batch * seq_local, tp)
    if gemms is None:
        return comm.tp_exposed_s(t_tp, t_grad, tp, True)
    layers = max(1, shape.num_layers // layout.pp)
    # One all-gather or reduce-scatter is half of an all-reduce of its element size.
    gather = kappa * comm.tp_allreduce_s(1, micro_batch, seq_local, shape.hidden_size,
                                         gather_bytes, tp, hardware, gather_bytes) / 8.0
    scatter = kappa * comm.tp_allreduce_s(1, micro_batch, seq_local, shape.hidden_size,
                                          act_bytes, tp, hardware, act_bytes) / 8.0
    return layers * comm.tp_layer_exposed_s(gather, scatter, tuple(k * g for g in gemms), tp,
                                            2.0 if full_recompute else 1.0,
                                            comm.normalize_tp_overlap(workload.tp_overlap))


def step_terms(workload: Workload, hardware: Hardware, precision: str, layout: Layout,
               micro_batch: float, grad_accum: int, shape: Shape, optimizer_state_bytes: float,
               calib: Calibration, recompute_factor: float = 1.0,
               full_recompute: bool = False) -> StepTerms:
    """Time of one optimizer step (``grad_accum`` micro-steps of ``micro_batch`` per GPU).

    ``recompute_factor`` stretches each micro-step's compute for activation recomputation
    (4/3 for full: the forward runs twice, its kernel dispatch and weight reads included), and
    full recomputation re-runs the forward's two tensor-parallel all-reduces per layer."""
    tp, pp, dp, cp = layout.tp, layout.pp, layout.dp, layout.cp
    shards = tp * pp
    seq_local = shape.seq_len / cp  # tokens of each sample on this GPU
    s = max(1, int(grad_accum))
    params_shard = moe.params_per_shard(workload, layout)  # experts also split by ep
    # The routed experts' gradients are reduced over their own expert data-parallel group.
    routed = moe.expert_sync(workload, layout, hardware.gpus_per_node)
    dense_shard = params_shard - (routed[0] if routed else 0.0)
    k = calib.compute_scale
    kr = k * calib.fixed_scale
    # Each pipeline stage's process dispatches its own layers' kernels; tensor parallelism
    # splits each kernel but still dispatches all of them. Counted, or from the architecture;
    # apex O1's wrappers around the stage's calls with them.
    kernels, _ = kernel_count(workload, precision)
    overhead = dispatch_time_s(workload, precision, kernels / pp if kernels else None)
    a = (kr * (weight_traffic_time_s(params_shard, hardware, precision, workload)
               + wave_tail_time_s(workload, hardware, precision) / pp)
         + (kr if calib.overhead_scale is None else calib.overhead_scale) * overhead)
    b = k * per_sample_time_prior_s(workload, hardware, precision) / (shards * cp)
    # FP8 scale-and-cast kernels of this GPU's linear layers: their shapes shrink with tp.
    t_cast = k * fp8_cast_time_s(workload, hardware, precision, micro_batch * seq_local, tp,
                                 1.0 / pp)
    t_grad = a + b * micro_batch + t_cast + moe.layer_time_s(  # MoE layers beyond their dense part
        workload, layout, hardware, precision, micro_batch, seq_local, k,
        kr if calib.overhead_scale is None else calib.overhead_scale)
    if calib.latency_fixed_flops or calib.latency_per_sample_flops:
        # Each stage runs its share of the kernels; tensor parallelism splits each kernel.
        t_grad += latency_time_s(calib.latency_fixed_flops / pp,
                                 calib.latency_per_sample_flops / (shards * cp), micro_batch,
                                 hardware)
    t_grad *= recompute_factor
    opt_params = (moe.optimizer_params_per_gpu(workload, layout)
                  if layout.dp_strategy in ("zero1", "zero2", "zero3", "fsdp") else params_shard)
    k_opt = k if calib.optimizer_scale is None else calib.optimizer_scale
    t_opt = k_opt * optimizer_time_prior_s(opt_params, optimizer_state_bytes, hardware,
                                           precision, workload)
    # A for-loop optimizer issues each parameter tensor's kernels from the host, faster than
    # the GPU runs them where the tensors are small: the step takes the longer of the two.
    # Each pipeline stage's process loops over its own layers' tensors.
    t_opt = max(t_opt, (kr if calib.overhead_scale is None else calib.overhead_scale)
                * optimizer_host_time_s(workload, 1.0 / pp))

    act_bytes = COMM_ELEMENT_BYTES[precision]
    kappa = calib.comm_scale
    # torchao tensor-wise FP8 gathers the sequence-parallel activations in FP8.
    gather_bytes = comm.tp_gather_element_bytes(
        precision, normalize_fp8_recipe(workload.fp8_recipe), act_bytes)
    t_tp = kappa * comm.tp_allreduce_s(max(1, shape.num_layers // pp), micro_batch,
                                       seq_local, shape.hidden_size, act_bytes, tp,
                                       hardware, gather_bytes)
    if full_recompute:
        t_tp *= 1.5  # the forward's 2 all-reduces per layer again, next to the 4
    grad_bytes = comm.grad_comm_bytes_per_param(is_mixed(precision), layout.dp_strategy)
    experts = None if routed is None else (routed[0] * grad_bytes, routed[1])
    t_a2a = kappa * moe.alltoall_s(workload, layout, hardware, micro_batch, seq_local,
                                   act_bytes)
    if full_recompute:
        t_a2a *= 1.5  # the forward's dispatch and combine again
    t_a2a_total = t_a2a
    overlapped = False
    if a2a_overlapped(workload, layout):
        paired = moe.overlapped_alltoall_s(workload, layout, t_a2a, t_grad,
                                           a2a_unpaired_share(workload, layout, s), seq_local)
        # auto: the job may leave it off, and does where it costs more than it hides
        asked = moe.normalize_a2a_overlap(workload.moe_a2a_overlap) == "1f1b"
        if asked or paired < t_a2a:
            overlapped, t_a2a = True, paired
    t_cp_total, t_cp = context.exchange_s(workload, layout, hardware, precision, micro_batch,
                                          shape.seq_len, act_bytes, k, kappa)
    if full_recompute:  # the forward's exchange again: 4 volumes of 3
        t_cp_total *= 4.0 / 3.0
        t_cp *= 4.0 / 3.0
    t_micro = (t_grad + _tp_exposed_s(workload, hardware, precision, layout, micro_batch,
                                      seq_local, shape, t_tp, t_grad, act_bytes, gather_bytes,
                                      k, kappa, full_recompute)
               + t_a2a + t_cp)
    # One multi-GPU run cannot tell a slower collective from more time lost to
    # synchronisation: the fitted scale takes both (comm.sync_overhead_s).
    t_straggle = comm.sync_overhead_s(t_micro, dp, kappa)

    bubble = 0.0
    if pp > 1:
        vp = max(1, layout.vp)
        boundary = pp_boundary_bytes(micro_batch, shape, act_bytes, tp, cp)
        t_p2p = kappa * vp * comm.pp_p2p_s(boundary, layout, hardware)
        # Steady state: each micro-step waits for its sends unless the schedule overlaps them.
        t_stage = t_micro + pp_exposed_p2p_s(t_p2p, t_micro, vp)
        # Fill and drain: p−1 chunk times (1/v of a micro-step each) and p−1 boundary
        # crossings each way, which nothing hides (Narayanan et al. 2021, Sec. 2.2), once per
        # run of the schedule (pipeline_flushes).
        bubble = pipeline_flushes(workload, s) * (pp - 1) * (t_micro + t_p2p) / vp
        pipe = s * t_stage + bubble
        t_dp = kappa * comm.dp_sync_s(dense_shard, grad_bytes, layout, hardware,
                                      fsdp_gather_scales(workload, precision)[0], experts)
        # Each run of the schedule reduces its gradients after its last backward
        # (torch.distributed.pipelining's REDUCE_GRAD, ``perform_reduce_grad``: FSDP's
        # post-backward and reshard; DDP's sync on the run's last chunk), so a step that
        # runs the schedule again per accumulation step pays the sync once per run.
        exposed_dp = pipeline_flushes(workload, s) * (
            comm.overlap_s(t_stage, t_dp, calib.gamma) - t_stage)
        step = pipe + exposed_dp + t_opt + t_straggle
    elif comm.sharded_params(layout):
        # Per wrapped unit (decoder block): gathers prefetched under the forward and backward,
        # reduce-scatters under the backward (comm.fsdp_exposed_s).
        fwd = (1.0 - comm.BACKWARD_SHARE) * t_micro
        exposed_dp = comm.fsdp_exposed_s(
            dense_shard * grad_bytes,
            moe.largest_unit_params(workload, layout, shape.largest_layer_params) / tp
            * grad_bytes,
            max(1, shape.num_layers // pp), layout, hardware, fwd, t_micro - fwd, kappa,
            *fsdp_gather_scales(workload, precision), experts=experts)
        step = s * (t_micro + exposed_dp) + t_opt + t_straggle
    else:
        # DDP's 25 MB buckets all-reduced as the last micro-step's backward fills them; the
        # last (the input embedding's gradient where it is larger) after it (comm.ddp_exposed_s).
        embedding = float(workload.vocab_size or 0) * float(workload.hidden_size or 0) / tp
        exposed_dp = comm.ddp_exposed_s(
            dense_shard * grad_bytes, embedding * grad_bytes, layout, hardware,
            comm.BACKWARD_SHARE * t_micro, kappa, experts)
        step = s * t_micro + exposed_dp + t_opt + t_straggle
    compute = s * t_grad + t_opt
    exposed = max(0.0, step - compute - bubble)
    return StepTerms(step_s=step, compute_s=compute, exposed_comm_s=exposed, bubble_s=bubble,
                     samples_per_step=micro_batch * s * layout.replicas, alltoall_s=s * t_a2a,
                     alltoall_total_s=s * t_a2a_total, a2a_overlapped=overlapped,
                     cp_exchange_s=s * t_cp, cp_exchange_total_s=s * t_cp_total)
