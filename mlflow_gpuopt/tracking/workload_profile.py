"""The workload profile: what one training sample costs, from one measured training step.

:class:`WorkloadProfile` is the run's ``profile.json`` artifact (every field and its unit:
docs/metrics.md#artifacts-and-profilejson); :mod:`.profiler` measures it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from mlflow_gpuopt import contract


@dataclass(frozen=True)
class WorkloadProfile:
    """What one training sample costs (the ``profile.json`` of the design's contract)."""

    name: str
    params: int
    trainable_params: int
    #: model FLOPs of forward + backward (2 per multiply-add), recomputation left out
    flops_per_sample: float | None
    precision: str  # fp32 | tf32 | fp16 | bf16 | fp8 (what the step's matmuls ran in)
    micro_batch: int | None  # samples per forward
    grad_accum: int  # forwards per optimizer step
    optimizer: str | None
    optimizer_state_bytes_per_param: float | None
    activation_bytes_per_sample: float | None
    activation_saved_bytes_per_sample: float | None  # saved-for-backward tensors only
    tokens_per_sample: int | None  # sequence length for token-id inputs
    largest_layer_params: int | None  # largest leaf module (e.g. the embedding)
    #: operators that launch a kernel per forward+backward of one micro-batch (see
    #: :mod:`.dispatch_count`)
    kernels_per_micro_step: float | None = None
    #: attention kernel that ran: "sdpa" (fused, no s x s scores) or "eager"; None: none seen
    attention: str | None = None
    #: activation recomputation seen in the backward: none | selective | selective-op | full
    recompute: str | None = None
    #: FP8 scaling recipe where the FP8 layers say it: te | tensorwise | rowwise
    fp8_recipe: str | None = None
    #: distinct (M, K, N) of the matrix multiplies of the profiled step's first forward
    #: (see :func:`.dispatch_count.gemm_mnk`)
    gemm_shapes: tuple[tuple[int, int, int], ...] | None = None
    #: FLOPs of the forward operators activation checkpointing replayed in the backward, per
    #: sample (0.0: none replayed); hardware FLOPs = flops_per_sample + this
    recompute_flops_per_sample: float | None = None
    #: share of the profiled step's token positions that are padding (attention mask
    #: zeros; 0.0: none); None: no token ids, or no mask given
    padding_fraction: float | None = None
    #: parameter-efficient adapters found: "lora" (PEFT's ``lora_A``/``lora_B`` modules),
    #: "qlora" (those over 4-bit base layers); None: none
    adapter: str | None = None
    #: whether compiled (Inductor) graphs ran the step (see :mod:`.compiled`); None: no
    #: compiled graph seen
    compiled: bool | None = None
    #: operators per micro-step the eager model dispatches (the profiled step's count) where
    #: ``kernels_per_micro_step`` is the compiled graphs' launches
    eager_kernels_per_micro_step: float | None = None
    #: the architecture the model's ``config`` declares (see :mod:`.architecture`); None:
    #: not declared
    num_layers: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None  # grouped-query attention's key/value heads
    ffn_hidden_size: int | None = None  # MLP inner width
    mlp: str | None = None  # gelu (two matrices) | swiglu | geglu (gated, three)
    vocab_size: int | None = None
    #: mixture of experts, read from the model's MoE blocks (see :mod:`.moe_layers`); None:
    #: a dense model. ``params`` counts every expert, ``active_params`` what one token uses
    num_experts: int | None = None
    experts_per_token: int | None = None
    num_shared_experts: int | None = None
    expert_ffn_hidden_size: int | None = None
    moe_layer_freq: int | None = None
    active_params: int | None = None
    #: context parallelism: the degree one rank's slice of each sample was scaled up by
    #: (:func:`whole_sample`), and what that slice held as measured; None: not split
    sequence_split: int | None = None
    rank_tokens_per_sample: int | None = None
    rank_flops_per_sample: float | None = None
    #: memory format of the model's 2-D convolutions, from their weights' strides
    #: (:func:`.model_facts.memory_format_of`): contiguous (NCHW) | channels_last (NHWC);
    #: None: no Conv2d layers
    memory_format: str | None = None
    #: DRAM bytes per sample the eager step's operators move, weights and their gradients
    #: left out (:mod:`.traffic`); None: not counted (a compiled step, a census that failed)
    memory_traffic_bytes_per_sample: float | None = None
    #: the part of it moved by matrix products and convolutions
    matmul_traffic_bytes_per_sample: float | None = None
    #: weight and gradient bytes the step's operators moved, per micro-step
    weight_traffic_bytes_per_micro_step: float | None = None
    #: Σ over one micro-step's matrix products (forward and data gradient; a fused RNN's at
    #: every time step) of their reduction length K: what the GEMMs' wave quantisation
    #: costs (``compute.wave_tail_time_s``); None: not recorded
    gemm_reduction_per_micro_step: float | None = None
    #: ``memory_traffic_bytes_per_sample`` as the step would move it under CUDA autocast
    #: (fp16/bf16; :mod:`.traffic`): counted for an fp32/TF32 step, the measured figure for
    #: a step that ran 16-bit
    amp_traffic_bytes_per_sample: float | None = None
    #: the part of it moved by matrix products and convolutions
    amp_matmul_traffic_bytes_per_sample: float | None = None
    #: input + output bytes per sample of the forward convolutions that run channels-first
    #: (1-D ones always, NCHW 2-D/3-D ones; :func:`.traffic.channels_first_convolution`):
    #: what cuDNN's tensor-core kernels transpose; None: not counted
    nchw_conv_bytes_per_sample: float | None = None
    #: parameter tensors the optimizer updates, and how its step runs on CUDA (for-loop,
    #: foreach, fused: :func:`.optimizers.optimizer_loop_facts`); None: not known
    optimizer_param_tensors: int | None = None
    optimizer_impl: str | None = None
    #: ``kernels_per_micro_step`` as the step would launch them under CUDA autocast: the
    #: eager count plus the cast kernels autocast puts before the operators (:mod:`.traffic`)
    #: for an fp32/TF32 step, the count itself for a step that ran 16-bit; None: not counted
    amp_kernels_per_micro_step: float | None = None
    #: padded lengths the run's steps ran at, ``((tokens, share of samples), ...)`` by
    #: length, where they varied (:func:`.padded_lengths.observed_bins`); the per-sample
    #: figures above are the profiled step's, at its own ``tokens_per_sample``; None: one
    #: length (or no token ids)
    sequence_bins: tuple[tuple[int, float], ...] | None = None

    def to_json(self, hardware: dict | None = None) -> dict:
        """The ``profile.json`` document: ``schema`` first, then the profile, then hardware."""
        doc: dict[str, Any] = {"schema": contract.PROFILE_SCHEMA, **asdict(self)}
        if self.sequence_bins is not None:  # [[tokens, share], ...]: the workload key's form
            doc["sequence_bins"] = [list(b) for b in self.sequence_bins]
        if hardware is not None:
            doc["hardware"] = hardware
        return doc


def whole_sample(profile: WorkloadProfile, cp: int, rank_tokens: int | None,
                 tokens_given: bool = False) -> WorkloadProfile:
    """A whole sample's profile from that of one rank of a context-parallel group of ``cp``,
    which holds ``seq / cp`` of every sample's tokens (``rank_tokens``: what its batch held;
    None without token ids). ``tokens_given``: ``tokens_per_sample`` is the user's, kept.

    Tokens, FLOPs (model and recomputed) and activation bytes are multiplied by ``cp``. The
    per-token work (projections, MLP, head) is linear in the slice. Attention's quadratic
    part is too under load-balanced CP: a rank's queries meet every key (all-gather) or,
    with a causal mask, zig-zag chunks give each rank 1/cp of the causal triangle, so the
    whole sample's attention is cp x a rank's. Without load balancing the first rank of a
    causal split does least, and the figure is low. Activation bytes: the models divide a
    sample's by cp to find a rank's (docs/models.md#context-parallelism).
    """
    def times(x: float | None) -> float | None:
        return x * cp if x is not None else None

    tokens = profile.tokens_per_sample
    if not tokens_given and rank_tokens is not None:
        tokens = rank_tokens * cp
    return replace(
        profile, tokens_per_sample=tokens, flops_per_sample=times(profile.flops_per_sample),
        recompute_flops_per_sample=times(profile.recompute_flops_per_sample),
        activation_bytes_per_sample=times(profile.activation_bytes_per_sample),
        activation_saved_bytes_per_sample=times(profile.activation_saved_bytes_per_sample),
        memory_traffic_bytes_per_sample=times(profile.memory_traffic_bytes_per_sample),
        matmul_traffic_bytes_per_sample=times(profile.matmul_traffic_bytes_per_sample),
        amp_traffic_bytes_per_sample=times(profile.amp_traffic_bytes_per_sample),
        amp_matmul_traffic_bytes_per_sample=times(profile.amp_matmul_traffic_bytes_per_sample),
        nchw_conv_bytes_per_sample=times(profile.nchw_conv_bytes_per_sample),
        sequence_split=cp, rank_tokens_per_sample=rank_tokens,
        rank_flops_per_sample=profile.flops_per_sample)
