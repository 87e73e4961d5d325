"""Inputs and outputs of the scaling models: plain numbers in frozen dataclasses.

Nothing here knows about MLflow, torch or files; adapters at the edges build these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp", "pp", "tp")


@dataclass(frozen=True)
class Workload:
    """What one training sample costs, from ``profile.json`` or a user's ``workload.json``.

    Only ``params``, ``flops_per_sample`` and ``precision`` are required.
    """

    params: int  # total parameters
    flops_per_sample: float  # forward + backward FLOPs for one sample
    precision: str  # fp32 | tf32 | fp16 | bf16
    name: str = "workload"
    micro_batch: int | None = None  # per-GPU batch it was measured at
    grad_accum: int = 1
    optimizer: str | None = None
    optimizer_state_bytes_per_param: float | None = None  # e.g. 8 for Adam's m and v in fp32
    #: Whether each optimizer step first clips the gradients by their global norm
    #: (``torch.nn.utils.clip_grad_norm_``): a read of every gradient for the norm and a read
    #: and write to scale it (``compute.GRAD_CLIP_BYTES_PER_PARAM``); None / False: no.
    grad_clip: bool | None = None
    #: How a 16-bit job keeps its weights: "autocast" (fp32 weights, CUDA autocast's op lists
    #: pick each operator's type: ``torch.amp``) or "master_weights" (the model itself cast to
    #: 16 bits, every activation 16-bit, fp32 master weights in the optimizer: apex AMP O2,
    #: Megatron's fp16 module); None: autocast. See ``compute.mixed_precision_mode``.
    mixed_precision: str | None = None
    activation_bytes_per_sample: float | None = None
    tokens_per_sample: float | None = None  # sequence length for language models
    trainable_params: int | None = None
    num_layers: int | None = None
    largest_layer_params: int | None = None
    hidden_size: int | None = None
    memory_traffic_bytes_per_sample: float | None = None  # DRAM bytes moved per sample (roofline)
    #: the part of ``memory_traffic_bytes_per_sample`` the matmul and convolution kernels
    #: move (their activation operands and outputs), measured; None: not measured
    matmul_traffic_bytes_per_sample: float | None = None
    #: bytes of weights and their gradients one micro-step's operators move, measured (a
    #: recurrent cell reads its weights once per time step); None: 3 passes over the params
    weight_traffic_bytes_per_micro_step: float | None = None
    #: Σ over one micro-step's matrix products (forward and data gradient; a recurrent
    #: network's at every time step) of their reduction length K, measured: the GEMMs' wave
    #: quantisation (``compute.wave_tail_time_s``); None: not measured (no such term)
    gemm_reduction_per_micro_step: float | None = None
    #: ``memory_traffic_bytes_per_sample`` as the step moves it under CUDA autocast
    #: (fp16/bf16: fp32-list operators' outputs stay fp32, casts are kernels of their own),
    #: measured; used for a 16-bit prediction of an fp32/TF32 workload. None: half the
    #: fp32 figure
    amp_traffic_bytes_per_sample: float | None = None
    #: the part of ``amp_traffic_bytes_per_sample`` the matmul and convolution kernels move
    amp_matmul_traffic_bytes_per_sample: float | None = None
    #: FLOPs per sample of the forward operators the run's own recomputation (``recompute``)
    #: replayed, measured; ``flops_per_sample`` leaves them out (model FLOPs)
    recompute_flops_per_sample: float | None = None
    #: kernels launched by one forward+backward of a micro-batch (the profiler counts the
    #: operators dispatched in eager mode); bounds the batch-independent latency of a step
    kernels_per_micro_step: float | None = None
    #: ``kernels_per_micro_step`` under CUDA autocast (the eager count plus the cast kernels
    #: autocast launches before the operators), measured; used for a 16-bit prediction of an
    #: fp32/TF32 workload (``compute.kernel_count``). None: the count as it is
    amp_kernels_per_micro_step: float | None = None
    #: Architecture for the activation formula (:mod:`.activations`); with ``num_layers``,
    #: ``hidden_size`` and ``tokens_per_sample`` (the sequence length) it replaces the
    #: FLOPs-based activation estimate when no measured figure is given.
    num_heads: int | None = None
    #: key/value heads (grouped-query attention: fewer than ``num_heads``, dividing it);
    #: None: ``num_heads`` (multi-head attention)
    num_kv_heads: int | None = None
    #: elements per token of one layer's Q, K and V together as the attention kernel keeps
    #: them, where they are not ``(1 + 2 × kv_heads / heads) × hidden_size`` (multi-head
    #: latent attention: heads × (2 × query/key head + value head)); None: that formula
    qkv_width: int | None = None
    #: Sliding-window attention: ``sliding_window_layers`` of the layers (None: all of them)
    #: attend to the ``sliding_window`` tokens before each query only; their share of the
    #: attention FLOPs is T × min(T, 2 × window) of the whole square's T²
    #: (``compute.attention_flops_share``). None: every layer attends to the whole sequence
    sliding_window: int | None = None
    sliding_window_layers: int | None = None
    vocab_size: int | None = None
    ffn_hidden_size: int | None = None  # None: 4 × hidden (GELU MLP), 8/3 × hidden (SwiGLU)
    mlp: str | None = None  # "gelu" (two matrices) or "swiglu" (gated, three)
    attention: str | None = None  # "sdpa"/"flash" (default) or "eager"
    #: The fused attention kernel: "fa2" (FlashAttention-2, PyTorch SDPA's flash backend) or
    #: "fa3" (FlashAttention-3, Transformer Engine's cuDNN attention); None: fa2. Sets
    #: attention's speed per GPU generation (``compute.ATTENTION_KERNEL_EFFICIENCY``).
    attention_kernel: str | None = None
    dropout: float | None = None  # dropout probability; None: unknown (masks assumed kept)
    recompute: str | None = None  # how the job runs: "none", "selective" or "full"
    #: The layout it was measured with, as ``--strategy`` spells it (``tp2xfsdp``...)
    strategy: str | None = None
    #: Which FP8 implementation and scaling recipe the job runs: "te" (Transformer Engine,
    #: per-tensor delayed/current scaling), "tensorwise", "rowwise" or "rowwise_with_gw_hp"
    #: (torchao float8's recipes); None: te. See ``compute.FP8_RECIPE_EFFICIENCY`` and
    #: ``compute.FP8_CAST_BYTES_PER_ELEMENT``.
    fp8_recipe: str | None = None
    #: Whether the job overlaps its tensor-parallel collectives with the GEMMs around them
    #: (Megatron / NeMo ``tp_comm_overlap`` with Transformer Engine userbuffers, torchtitan's
    #: async TP); None / False: they sit on the critical path. See ``comm.tp_layer_exposed_s``.
    tp_comm_overlap: bool | None = None
    #: How the overlap is built (``comm.normalize_tp_overlap``): "userbuffers" (Transformer
    #: Engine's, Megatron / NeMo; the default) or "symm_mem" (PyTorch's async TP over
    #: symmetric memory, torchtitan ``enable_async_tensor_parallel``). See
    #: ``comm.pipelined_exposed_s``.
    tp_overlap: str | None = None
    #: Whether ZeRO-3/FSDP all-gathers the FP8 linear layers' weights in FP8 (torchao's
    #: ``enable_fsdp_float8_all_gather``, torchtitan ``float8.enable_fsdp_float8_all_gather``,
    #: tensor-wise scaling only); None / False: in bf16, torchtitan's default. See
    #: ``comm.fp8_gather_scale``.
    fp8_all_gather: bool | None = None
    #: How the loss treats the vocabulary-wide logits: "fp32" (``F.cross_entropy`` on fp32
    #: logits), "fused" (one fp32 softmax, gradient in place) or "chunked" (never whole);
    #: None: not known (the fused figure, with the others' spread). See ``.activations``.
    cross_entropy: str | None = None
    #: Storage of the frozen weights (``params − trainable_params``): "bf16", "fp32", "int8",
    #: "nf4" (4-bit QLoRA base)...; None: the compute precision's element.
    frozen_precision: str | None = None
    #: Mixture of experts (docs/models.md#mixture-of-experts): routed experts per MoE layer
    #: (None or 1: a dense model). ``params`` counts every expert, ``flops_per_sample`` the
    #: active ones (``experts_per_token`` of them, the shared experts and the router).
    num_experts: int | None = None
    experts_per_token: int | None = None  # top-k: routed experts each token visits
    #: Group-limited (node-limited) routing, DeepSeek's ``n_group`` / ``topk_group``: the
    #: experts form ``num_expert_groups`` equal blocks of consecutive experts and a token's
    #: ``experts_per_token`` are taken inside the ``expert_groups_per_token`` groups that score
    #: highest (docs/models.md#mixture-of-experts); None or 1: no limit
    num_expert_groups: int | None = None
    expert_groups_per_token: int | None = None
    #: Tensor-parallel degree of the routed experts (Megatron's
    #: ``expert_tensor_parallel_size``), dividing ``tp``: the experts split ``etp`` ways, their
    #: expert-parallel ranks placed ``gpus per node / etp`` to a node; None: ``tp``
    expert_tensor_parallel: int | None = None
    num_shared_experts: int | None = None  # experts every token visits (Qwen-MoE, DeepSeek)
    expert_ffn_hidden_size: int | None = None  # one expert's MLP inner width
    #: every n-th decoder layer is a MoE layer (1: all; 2: every other); None: 1
    moe_layer_freq: int | None = None
    #: dense decoder layers before the first MoE one (DeepSeek's ``first_k_dense_replace``);
    #: None: 0
    first_dense_layers: int | None = None
    #: tokens an expert takes, over its even share (Switch/GShard); None: dropless, planned
    #: at 1.0 (no imbalance)
    capacity_factor: float | None = None
    #: How a context-parallel job exchanges keys and values (docs/models.md#context-
    #: parallelism): "ring" (point-to-point, overlapped with attention: Megatron's ``p2p``,
    #: ring attention) or "allgather" (gathered at once, under the local chunk's attention
    #: only: torchtitan's ``context_parallel_rotate_method`` default); None: ring
    cp_exchange: str | None = None
    #: Memory format of a convolutional network's activations: "contiguous" (NCHW, PyTorch's
    #: default) or "channels_last" (NHWC); None: no convolutions stated. Contiguous
    #: tensor-core convolutions pay NCHW <-> NHWC transposes (``compute.transpose_time_s``).
    memory_format: str | None = None
    #: input + output bytes per sample of the forward convolutions that run channels-first
    #: (every 1-D convolution: PyTorch hands cuDNN its ``(N, C, L)`` tensors as NCHW; 2-D and
    #: 3-D ones in NCHW), measured by a tracked run; where given it, not ``memory_format``
    #: with the stored activations, sets the transposes (``compute.transpose_bytes_per_sample``)
    nchw_conv_bytes_per_sample: float | None = None
    #: parameter tensors the optimizer updates (a loop over them launches each one's
    #: kernels), measured by a tracked run; None: not known
    optimizer_param_tensors: int | None = None
    #: how the optimizer's step runs on the GPU: "for-loop", "foreach" or "fused"
    #: (``compute.OPTIMIZER_IMPLS``); a for-loop costs host time per tensor
    #: (``compute.optimizer_host_time_s``); None: not stated, none charged
    optimizer_impl: str | None = None
    #: How expert parallelism moves the tokens (docs/models.md#mixture-of-experts), in
    #: Megatron-Core's ``moe_token_dispatcher_type`` words: "alltoall" (NCCL all-to-all of
    #: every routed copy: Megatron's default, torchtitan's default expert parallel),
    #: "allgather" (every rank gathers the group's tokens) or "flex" (DeepEP / HybridEP
    #: kernels: one copy per destination rank and node); None: alltoall
    moe_dispatcher: str | None = None
    #: Where the router sends a token's experts: "random" (spread over the experts at
    #: random: learned routing, Megatron's ``moe_router_force_load_balancing`` random
    #: logits) or "round_robin" (token t to experts t·k … t·k+k−1: torchtitan's
    #: ``moe_force_load_balance``, AutoModel's ``fake_balanced_gate``); None: random
    moe_routing: str | None = None
    #: Whether expert parallelism's all-to-alls run under another micro-batch's compute:
    #: "1f1b" (Megatron-core's ``overlap_moe_expert_parallel_comm``, Megatron-Bridge's
    #: ``moe_a2a_overlap``: the forward of micro-batch i+1 paired with the backward of i,
    #: layer by layer, the communication on its own stream), "none", or "auto" (the planned
    #: run may turn it on or off: each layout runs it where Megatron can and it pays);
    #: None: none
    moe_a2a_overlap: str | None = None
    #: Micro-batches one run of the pipeline schedule takes: each gradient-accumulation step
    #: of torchtitan / NeMo AutoModel runs the schedule again over ``local_batch_size ÷``
    #: the pipeline micro-batch, filling and draining the pipeline each time; None: all of
    #: the optimizer step's (Megatron: one schedule per step)
    pp_microbatches: int | None = None
    #: Padded lengths the batches run at, where each batch is padded to its own longest
    #: sequence (sequence binning, dynamic padding): ((tokens, share of samples), ...),
    #: tokens at most ``tokens_per_sample`` (the longest, which sets memory), shares summing
    #: to 1; None: every sample runs at ``tokens_per_sample`` (``.sequence_bins``).
    sequence_bins: tuple[tuple[float, float], ...] | None = None


@dataclass(frozen=True)
class Hardware:
    """What the models need to know about one GPU type and the links around it.

    Built from the catalog (``GpuSpec`` + ``Offer``) by an adapter outside ``perfmodel``.
    """

    gpu: str  # canonical name
    memory_bytes: float  # per GPU
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: dict[str, float] = field(hash=False)  # by precision, dense
    intra_node_bytes_per_s: float  # GPU-to-GPU inside a node, per GPU, one direction
    inter_node_bytes_per_s: float  # node network per node, one direction
    gpus_per_node: int = 8
    tdp_w: float | None = None  # the board's thermal design power (what a power limit scales from)
    #: The power limit ``peak_flops_per_s`` is already scaled to (None: the TDP's clock);
    #: set by ``compute.power_capped``, so a second cap rescales rather than compounds.
    power_limit_w: float | None = None
    #: The GPU-to-GPU fabric inside the node, as the catalog spells it (``nvswitch``,
    #: ``nvlink``, ``pcie4``, ``infinity_fabric``...); "" where not known. Sets the share of the
    #: link's figure collectives reach (``comm.intra_bus_efficiency``).
    intra_node_link: str = ""


@dataclass(frozen=True)
class Observation:
    """One measured run: a throughput at a configuration."""

    gpu: str  # canonical name
    gpu_count: int  # total GPUs in the job
    throughput_samples_per_s: float  # global
    nodes: int = 1
    micro_batch: int | None = None
    strategy: str = "ddp"
    precision: str | None = None
    grad_accum: int = 1
    exposed_comm_fraction: float | None = None  # measured share of the step spent waiting on comms
    tp: int = 1  # tensor-parallel degree of the measured run
    pp: int = 1  # pipeline stages of the measured run
    recompute: str | None = None  # None: the workload's own
    #: The measured run's board power limit, W (``nvidia-smi -q -d POWER``); None: the TDP.
    power_limit_w: float | None = None
    #: The measured run's token dispatcher and routing (``Workload.moe_dispatcher`` /
    #: ``moe_routing`` words), which the fit reads it with whatever the planned run uses;
    #: None: the workload's own.
    moe_dispatcher: str | None = None
    moe_routing: str | None = None
    #: The measured run's all-to-all overlap (``Workload.moe_a2a_overlap``); None: the
    #: workload's own.
    moe_a2a_overlap: str | None = None
    #: The measured run's experts' tensor-parallel degree (``Workload.expert_tensor_parallel``);
    #: None: the workload's own.
    expert_tensor_parallel: int | None = None


@dataclass(frozen=True)
class ParallelConfig:
    """One configuration to predict."""

    gpus_per_node: int
    nodes: int = 1
    strategy: str = "ddp"
    micro_batch: int | None = None  # None = the workload's own
    grad_accum: int = 1
    precision: str | None = None  # None = the workload's own
    activation_checkpointing: bool = False  # True: full recomputation
    tp: int = 1  # tensor-parallel degree (inside a node)
    pp: int = 1  # pipeline stages
    #: "none", "selective" or "full"; None: full with ``activation_checkpointing``, else the
    #: workload's own
    recompute: str | None = None
    virtual_stages: int = 1  # interleaved pipeline: model chunks per stage (Narayanan et al.)

    def recompute_mode(self, workload_mode: str | None = None) -> str:
        """The recomputation this configuration runs with."""
        if self.recompute:
            return self.recompute
        if self.activation_checkpointing:
            return "full"
        return workload_mode or "none"

    @property
    def gpus(self) -> int:
        """Total GPUs in the job."""
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted memory per GPU, bytes."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    workspace_bytes: float  # allocator fragmentation, CUDA context, communication buffers
    #: standard deviation of the peak (the estimates' spreads in quadrature; 0: exact)
    sigma_bytes: float = 0.0
    #: context parallel: the key/value chunks received (and their gradients) held at the
    #: peak of one layer's backward (0 without context parallelism)
    cp_buffers_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        """Everything above added up."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.workspace_bytes + self.cp_buffers_bytes)


@dataclass(frozen=True)
class Prediction:
    """What one configuration is predicted to do, with an interval.

    ``low``/``high`` bound the global throughput (samples/s) at the fit's interval (about
    90%); ``log_sigma`` is the standard deviation of log(throughput), so callers can turn a
    deadline into a probability with a log-normal.
    """

    gpu: str
    config: ParallelConfig
    throughput_samples_per_s: float  # global, whole job
    low: float
    high: float
    log_sigma: float
    step_time_s: float  # one optimizer step (all accumulation micro-steps)
    compute_s: float  # per step: forward+backward compute
    exposed_comm_s: float  # per step: communication not hidden behind compute
    bubble_s: float  # per step: pipeline bubble
    memory: MemoryBreakdown
    memory_capacity_bytes: float  # per GPU
    fits: bool
    max_micro_batch: int  # largest micro-batch that fits (0 if even 1 does not)
    samples_per_step: int  # global batch: micro_batch × grad_accum × data-parallel ranks
    extrapolated: bool  # True when no observation was on this GPU type
    tokens_per_s: float | None = None  # throughput × tokens_per_sample, where known
    assumptions: tuple[str, ...] = ()  # what the model had to guess, in words
    #: Where the compute speed comes from: "measured" (a run on this GPU type),
    #: "transferred" (runs on other GPU types, carried over by the roofline) or "prior"
    #: (no GPU run at all: FLOPs / peak at a prior efficiency).
    basis: str = "measured"
    #: Probability that the peak fits the GPU (the memory estimate's own spread); ``fits`` is
    #: ``p_fits >= 0.5`` within ``memory_usable_bytes`` (None: not computed).
    p_fits: float | None = None
    #: What CUDA can allocate of ``memory_capacity_bytes`` (the datasheet's GB read as GiB,
    #: less the driver's share); None: ``memory_capacity_bytes``.
    memory_usable_bytes: float | None = None
    #: per step: expert-parallel all-to-all dispatch and combine (within ``exposed_comm_s``;
    #: 0 without expert parallelism)
    alltoall_s: float = 0.0
    #: per step: the context-parallel key/value exchange left on the critical path (within
    #: ``exposed_comm_s``; a ring hides what attention covers; 0 without context parallelism)
    cp_exchange_s: float = 0.0
    #: whether the plan runs the 1F1B all-to-all overlap (``Workload.moe_a2a_overlap`` 1f1b
    #: where the layout can run it, or auto where it also pays)
    a2a_overlap: bool = False
    #: The widths ``log_sigma`` combines in quadrature: (what the prediction had to assume,
    #: its standard deviation of log throughput), non-zero ones only
    #: (docs/models.md#uncertainty-uncertaintypy).
    width_terms: tuple[tuple[str, float], ...] = ()
