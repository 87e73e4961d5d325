"""The workload profile, measured once on one real training step.

How: when the profiled step's first forward starts (a forward pre-hook on the model), a
``torch.utils.flop_counter.FlopCounterMode`` is entered; it is left at that step's optimizer
step (post-hook) or manual ``tracker.step()``. So it counts exactly the forward and backward
matmuls/convolutions of every micro-batch of that step — the user's own batch, no copy, no
extra forward — and divides by the samples they held. The counter only observes dispatch, so
training results are unchanged. Activation bytes come from the first forward of that step:
saved-for-backward tensors (``saved_tensors_hooks``, de-duplicated by storage, parameters
excluded), and on CUDA also the allocator's peak growth during the forward.

Kernels per micro-step: a second dispatch mode, entered beside the FLOP counter for the same
window, counts the operators dispatched in it less those of every optimizer's own ``step()``
(the step clock's optimizer hooks tell the profiler where each starts and ends; a closure
passed to ``step()`` is wrapped for the profiled step only, and its operators — the last
micro-batch's forward and backward under Lightning's automatic optimization — stay in),
divided by the forwards (micro-batches) in that window. In eager PyTorch each such operator
is about one kernel launch, which is what bounds a micro-step's batch-independent latency
(recurrent and autoregressive models launch thousands). Operators that launch nothing are
left out: views and in-place view ops (read from the operator's schema: ``view``, ``t``, ``expand``,
``as_strided``, ``detach``, ``split``, ``unsqueeze_``...) and the few in
``NON_KERNEL_OPS`` (uninitialised allocations, ``_unsafe_view``, size queries). It is a count
of operators, not of kernels: a cuDNN RNN over a sequence is one operator and many kernels,
and an ``LSTMCell`` is one fused kernel on CUDA but about ten element-wise operators on a CPU,
so a count taken on a CPU overstates the CUDA one for such cells. The optimizer's own
operators are not in it (the optimizer step has its own term in the models), but everything
else the training loop dispatches in that window is: the loss, gradient clipping, a
GradScaler's unscale, host-to-device copies of the next micro-batch, metrics computed on
tensors. That is deliberate: they cost launches on every step too.

Model FLOPs, not hardware FLOPs: ``flops_per_sample`` follows the convention of PaLM's
model FLOPs utilisation and Megatron's FLOPs formula (6·N·T + 12·L·T²·h for a decoder): the
work the model's mathematics needs, whatever the kernels redo. So (1) forward operators
replayed by activation checkpointing (dispatched inside the backward pass with gradients on,
:func:`.ops_seen.replaying_forward`) are counted aside, as ``recompute_flops_per_sample``
(hardware FLOPs = the two summed); the performance model adds recomputation itself, from the
run's ``recompute`` mode. (2) A fused attention backward is charged 2 × its forward, the four
gradient products, without the recomputation of QKᵀ that torch's formula counts (see
:func:`attention_backward_model_flops`); eager attention's backward is 2 × its forward anyway.

What ran: the kernel counter also shows each operator to an :class:`~.ops_seen.OpsSeen`,
which reads the attention kernel, activation recomputation and the precision of the products
(FP8 included) from them (see :mod:`.ops_seen`); the profile's ``precision`` is that, not the
autocast state at the forward pre-hook (frameworks enter autocast inside ``forward``).

Higher-order operators (``torch.cond`` and kin) pass through both modes; in eager mode they
run through a compiled wrapper that torch 2.13 cannot reuse once it was traced under dispatch
modes, so after a profiled step that ran one, Dynamo's caches are reset (see
:func:`_forget_hop_compilations`). A ``torch.compile``d model runs its profiled step eagerly
(Dynamo does not compile under these modes) and Dynamo's caches are reset after it as well,
or the model would stay eager (see :func:`_recompile_after_profile`); what its compiled
step launches is counted on another step (:mod:`.compiled`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import asdict, dataclass
from typing import Any

from mlflow_gpuopt import contract

logger = logging.getLogger(__name__)

SCHEMA = contract.PROFILE_SCHEMA


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
    #: operators that launch a kernel per forward+backward of one micro-batch (see module doc)
    kernels_per_micro_step: float | None = None
    #: attention kernel that ran: "sdpa" (fused, no s x s scores) or "eager"; None: none seen
    attention: str | None = None
    #: activation recomputation seen in the backward: none | selective | selective-op | full
    recompute: str | None = None
    #: FP8 scaling recipe where the FP8 layers say it: te | tensorwise | rowwise
    fp8_recipe: str | None = None
    #: distinct (M, K, N) of the matrix multiplies of the profiled step's first forward
    #: (see :func:`gemm_mnk`)
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

    def to_json(self, hardware: dict | None = None) -> dict:
        """The ``profile.json`` document: ``schema`` first, then the profile, then hardware."""
        doc: dict[str, Any] = {"schema": SCHEMA, **asdict(self)}
        if hardware is not None:
            doc["hardware"] = hardware
        return doc


#: Fused attention backward kernels that torch's FLOP registry counts (aten names).
SDPA_BACKWARD_OPS = (
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_backward", "_efficient_attention_backward",
)


def attention_backward_model_flops(counted: int, qk_head_dim: int, v_head_dim: int) -> int:
    """Model FLOPs of a fused attention backward, from torch's count of it.

    torch's formula (``sdpa_backward_flop_count``) charges five products of s_q·s_k·(head
    dim) per head: QKᵀ recomputed (d_qk), dP = dO·Vᵀ and dV = Pᵀ·dO (d_v each), dQ = dS·K and
    dK = dSᵀ·Q (d_qk each): 2·s_q·s_k·(3·d_qk + 2·d_v). The model-FLOPs convention (PaLM,
    Megatron: 12·L·T²·h per decoder) charges the four gradient products, 2 × the forward's
    QKᵀ and PV: 2·s_q·s_k·(2·d_qk + 2·d_v). The ratio depends on the head dims alone, so
    scaling torch's count is exact for padded, nested and variable-length batches alike.
    """
    return counted * 2 * (qk_head_dim + v_head_dim) // (3 * qk_head_dim + 2 * v_head_dim)


class ReplayedFlops:
    """FLOPs of forward operators replayed by activation checkpointing, kept out of the
    ``FlopCounterMode`` total (see :func:`model_flop_formulas`)."""

    def __init__(self) -> None:
        self.flops = 0


def _raw(fn: Any) -> Any:
    fn._get_raw = True  # FlopCounterMode passes the operator's own arguments, not shapes
    return fn


class _TotalOnly:
    """Stands in for ``FlopCounterMode``'s module tracker: every FLOP is counted under
    "Global", the total this profile needs.

    The tracker puts a multi-grad hook on every module's inputs, and ``torch.autograd.grad``
    with a leaf among its ``inputs`` (a gradient penalty: WGAN-GP, R1, Jacobian
    regularisation) then raises "A leaf node was passed to _will_engine_execute_node" inside
    the user's own call: the profiled step would crash training.
    """

    parents = ("Global",)

    def __enter__(self) -> _TotalOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def model_flop_formulas(replayed: ReplayedFlops) -> dict:
    """``custom_mapping`` for ``FlopCounterMode`` that makes it count model FLOPs.

    Every formula of torch's registry, plus the CPU flash-attention kernels it lacks, with
    fused attention backwards at the model convention
    (:func:`attention_backward_model_flops`); each formula gives 0 for an operator replayed
    by activation checkpointing (:func:`.ops_seen.replaying_forward`) and adds its FLOPs to
    ``replayed`` instead.
    """
    import torch
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

    from mlflow_gpuopt.tracking.ops_seen import replaying_forward

    aten = torch.ops.aten
    formulas = dict(flop_registry)  # each takes the operator's arguments and out_val=

    def cpu_forward(q, k, v, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return sdpa_flop_count(q.shape, k.shape, v.shape)

    def cpu_backward(grad_out, q, k, v, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)

    for name, fn in (("_scaled_dot_product_flash_attention_for_cpu", cpu_forward),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward", cpu_backward)):
        op = getattr(aten, name, None)
        if op is not None:
            formulas[op] = fn

    def model_backward(torch_formula: Any) -> Any:
        def count(grad_out, q, k, v, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
            counted = torch_formula(grad_out, q, k, v, *args, out_val=out_val, **kwargs)
            return attention_backward_model_flops(counted, q.shape[-1], v.shape[-1])
        return count

    for name in (*SDPA_BACKWARD_OPS, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        op = getattr(aten, name, None)
        if op in formulas:
            formulas[op] = model_backward(formulas[op])

    def split(formula: Any) -> Any:
        def count(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
            flops = formula(*args, out_val=out_val, **kwargs)
            if replaying_forward():
                replayed.flops += flops
                return 0
            return flops
        return _raw(count)

    return {op: split(fn) for op, fn in formulas.items()}


#: Operators that launch no kernel although their schema does not mark them as views:
#: uninitialised allocations, views the schema calls new tensors (``_unsafe_view``,
#: ``unsafe_split``/``unsafe_chunk``, used by the RNN cells), storage/metadata setters and
#: size queries, the profiler's markers.
NON_KERNEL_OPS = frozenset({
    "_unsafe_view", "_reshape_alias", "unsafe_split", "unsafe_split_with_sizes",
    "unsafe_chunk", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "resize_", "set_", "is_same_size", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset",
    # the profiler's record_function markers (an optimizer's step() opens one)
    "_record_function_enter", "_record_function_enter_new", "_record_function_exit",
})


def is_kernel_op(func: Any) -> bool:
    """Whether dispatching ``func`` (an ``OpOverload``) launches work on the device: not a
    view (its output aliases an input without writing it), not an in-place view op, not in
    ``NON_KERNEL_OPS``."""
    import torch

    if getattr(func, "is_view", False):
        return False
    if torch.Tag.inplace_view in getattr(func, "tags", ()):
        return False
    name = func._schema.name.split("::", 1)[-1]
    return name not in NON_KERNEL_OPS


@functools.cache
def _kernel_count_mode_class() -> type:
    """A ``TorchDispatchMode`` that counts kernel-launching operators (defined on first use,
    so importing this module does not import torch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch._ops import OpOverload

    class KernelCountMode(TorchDispatchMode):
        # Higher-order operators (torch.cond, while_loop, checkpointed regions under
        # torch.compile) must pass through, or a mode without a rule for them makes the
        # user's forward raise; they are not kernels themselves.
        supports_higher_order_operators = True

        def __init__(self, ops: Any = None) -> None:
            super().__init__()
            self.count = 0
            self.ops = ops  # an OpsSeen, or None
            self.higher_order_ops: set[str] = set()
            self._is_kernel: dict[Any, bool] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            if not isinstance(func, OpOverload):  # a higher-order operator: run it as is
                self.higher_order_ops.add(getattr(func, "__name__", repr(func)))
                return func(*args, **(kwargs or {}))
            kernel = self._is_kernel.get(func)
            if kernel is None:
                try:
                    kernel = is_kernel_op(func)
                except Exception as exc:  # an operator we cannot classify: not counted
                    logger.debug("gpuopt: cannot classify %r: %s", func, exc)
                    kernel = False
                self._is_kernel[func] = kernel
            if kernel:
                self.count += 1
            out = func(*args, **(kwargs or {}))
            if kernel and self.ops is not None:
                try:
                    self.ops.observe(func, args, kwargs, out)
                except Exception as exc:  # never break training: stop looking instead
                    logger.debug("gpuopt: operator census stopped at %r: %s", func, exc)
                    self.ops.failed = True
                    self.ops = None
            return out

    return KernelCountMode


def _forget_hop_compilations(names: set[str]) -> None:
    """Drop what Dynamo compiled while the profiler's dispatch modes were on.

    In eager mode ``torch.cond`` and its kin run through a ``torch.compile``d wrapper. In
    torch 2.13 the code it traced under dispatch modes (FlopCounterMode, the kernel
    counter) fails on the next call without them ("torch.* op returned non-Tensor:
    _len_torch_dispatch_stack"), which would stop training at the step after the profiled
    one. ``torch._dynamo.reset()`` forgets those compilations; its price is one
    recompilation of the user's own ``torch.compile``d code, paid only by models that use a
    higher-order operator.
    """
    import torch

    logger.debug("gpuopt: higher-order operators %s ran while profiling; resetting Dynamo's "
                 "caches", sorted(names))
    torch._dynamo.reset()


def has_compiled_module(model: Any) -> bool:
    """Whether ``model`` or a submodule is ``torch.compile``d (``OptimizedModule``, or
    ``Module.compile()`` in place)."""
    if model is None:
        return False
    for m in model.modules():
        if type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None):
            return True
    return False


def _recompile_after_profile() -> None:
    """Let compiled code run compiled again after the profiled step.

    Dynamo does not compile under a dispatch mode that must see every operator (the FLOP
    counter, the kernel counter): it runs those frames eagerly, and in torch 2.13 it keeps
    running them eagerly after the modes are gone, so without this a compiled model would
    train eagerly from the profiled step on, and the run would measure the eager speed.
    ``torch._dynamo.reset()`` forgets that; the next step recompiles (from Inductor's
    on-disk caches where they hold the graphs), inside the default warm-up steps.
    """
    import torch

    logger.debug("gpuopt: resetting Dynamo after the profiled step of a compiled model")
    torch._dynamo.reset()


#: At most this many distinct matmul shapes are kept from the profiled step.
MAX_GEMM_SHAPES = 256


def gemm_mnk(name: str, args: tuple) -> tuple[int, int, int] | None:
    """(M, K, N) of a matrix multiply operator (``mm``, ``addmm``, ``bmm``, ``baddbmm``;
    batched ones by their per-matrix shape), or ``None`` for any other operator. The
    advice's tensor-core alignment rule reads K and N, the layer's own sizes."""
    if name in ("mm", "bmm"):
        a, b = args[0], args[1]
    elif name in ("addmm", "baddbmm"):
        a, b = args[1], args[2]
    else:
        return None
    try:
        return int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
    except (AttributeError, IndexError, TypeError):
        return None


@functools.cache
def _gemm_shape_mode_class() -> type:
    """A ``TorchDispatchMode`` that records the distinct matmul shapes it sees."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class GemmShapeMode(TorchDispatchMode):
        supports_higher_order_operators = True

        def __init__(self) -> None:
            super().__init__()
            self.shapes: dict[tuple[int, int, int], None] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            schema = getattr(func, "_schema", None)
            if schema is not None and len(self.shapes) < MAX_GEMM_SHAPES:
                mnk = gemm_mnk(schema.name.split("::", 1)[-1], args)
                if mnk is not None:
                    self.shapes[mnk] = None
            return func(*args, **(kwargs or {}))

    return GemmShapeMode


def kernel_count_mode(ops: Any = None) -> Any:
    """A fresh kernel-counting dispatch mode; enter it, run, read ``.count``. With ``ops``
    (an :class:`~.ops_seen.OpsSeen`), every kernel operator is also shown to it."""
    return _kernel_count_mode_class()(ops)


def count_params(model: Any) -> tuple[int, int]:
    """(total, trainable) parameter counts, shared parameters counted once."""
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return total, trainable


def adapter_of(model: Any) -> str | None:
    """``"lora"`` when the model holds LoRA adapters under PEFT's module names
    (``lora_A``/``lora_B``), ``"qlora"`` when some sit on 4-bit base layers (bitsandbytes'
    ``Linear4bit``); else ``None``."""
    lora = four_bit = False
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("lora_A", "lora_B"):
            lora = True
        if "4bit" in type(module).__name__:
            four_bit = True
    if not lora:
        return None
    return "qlora" if four_bit else "lora"


def largest_leaf_params(model: Any) -> int | None:
    best = None
    for m in model.modules():
        if next(m.children(), None) is None:
            n = sum(p.numel() for p in m.parameters(recurse=False))
            if n and (best is None or n > best):
                best = n
    return best


def detect_precision(model: Any, device_type: str) -> str:
    """Precision the forward runs in: autocast dtype if on, else the parameters' dtype."""
    import torch

    try:
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
    except Exception as exc:  # older torch or an unknown device type
        logger.debug("gpuopt: autocast query failed: %s", exc)
    p = next(iter(model.parameters()), None) if model is not None else None
    dtype = p.dtype if p is not None else torch.float32
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    from mlflow_gpuopt.tracking.ops_seen import tf32_matmul_flags

    if tf32_matmul_flags():  # on any device: the plan's GPUs would run TF32
        return "tf32"
    if device_type == "cuda":
        has_conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
        if has_conv and torch.backends.cudnn.allow_tf32:
            return "tf32"
    return "fp32"


def optimizer_state_bytes_per_param(optimizer: Any) -> float | None:
    """Bytes of optimizer state per trainable parameter (Adam fp32: ~8), after a step."""
    import torch

    n_params = 0
    state_bytes = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            n_params += p.numel()
            for v in optimizer.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    state_bytes += v.numel() * v.element_size()
    return state_bytes / n_params if n_params else None


def _storage_ptr(t: Any) -> int | None:
    """Address of a tensor's storage; ``None`` for storage it cannot show (FSDP2's freed
    unsharded parameters, DTensors, tensor subclasses)."""
    try:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.untyped_storage().data_ptr()
    except Exception:  # not measurable: leave it out
        return None


def first_tensor(args: tuple, kwargs: dict | None) -> Any:
    """The batch tensor of a forward call: first tensor positional arg, else first tensor kwarg."""
    import torch

    for a in args:
        if isinstance(a, torch.Tensor):
            return a
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                return a
    return None


class WorkloadProfiler:
    """State machine driven by the step clock's hooks; see the module docstring."""

    def __init__(self, model: Any, optimizer: Any, name: str | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        from mlflow_gpuopt.tracking.architecture import unwrap_model

        # the user's class, not a wrapper's (OptimizedModule, DistributedDataParallel,
        # PeftModelForCausalLM)
        self.name = name or type(unwrap_model(model)).__name__
        self._flop_mode: Any = None
        self._kernel_mode: Any = None
        #: operators of the window outside every optimizer's own step() (set when it ends)
        self.micro_step_kernels: int | None = None
        #: launches per micro-batch of the compiled graphs (set by the step clock)
        self.compiled_kernels_per_micro_step: float | None = None
        self.padding_fraction: float | None = None  # set by the step clock
        self._optimizer_kernels = 0  # operators inside optimizers' step(), closures left out
        self._step_pre_count: int | None = None  # kernel count when an optimizer step began
        self._closure_kernels = 0  # operators of closures run by the current step()
        self._in_optimizer_step = False
        self._gemm_mode: Any = None
        self.gemm_shapes: tuple[tuple[int, int, int], ...] | None = None
        self._saved_ctx: Any = None
        self._saved_bytes = 0
        self._seen_storages: set[int] = set()
        self._param_storages: set[int] = set()
        self._forward_batch: int | None = None
        self._cuda_base: float | None = None
        self._cuda_delta: float | None = None
        self._cuda_device: Any = None
        self.peak_reserved_before_reset_bytes: float | None = None
        self.precision: str | None = None
        self.ops: Any = None  # OpsSeen of the profiled step
        self._device_type = "cpu"
        self.tokens_per_sample: int | None = None
        self.flops: float | None = None  # model FLOPs of the profiled step
        self._replayed: ReplayedFlops | None = None
        self.recompute_flops: float | None = None  # replayed forward operators' FLOPs
        self.active = False
        self.done = False

    # called from the model's forward pre-hook, first forward of the profiled step
    def begin_step(self, batch: Any) -> None:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        self.active = True
        device_type = batch.device.type if batch is not None else "cpu"
        self.precision = detect_precision(self.model, device_type)
        self._device_type = device_type
        if batch is not None and batch.dim() >= 1:
            self._forward_batch = int(batch.shape[0])
            if batch.dim() == 2 and not batch.is_floating_point():
                self.tokens_per_sample = int(batch.shape[1])  # token ids (batch, sequence)
        self._param_storages = {ptr for ptr in map(_storage_ptr, self.model.parameters()) if ptr}
        self._saved_ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_ctx.__enter__()
        if device_type == "cuda":
            self._cuda_device = batch.device
            self.peak_reserved_before_reset_bytes = float(
                torch.cuda.max_memory_reserved(batch.device))
            torch.cuda.reset_peak_memory_stats(batch.device)
            self._cuda_base = float(torch.cuda.memory_allocated(batch.device))
        try:
            self._replayed = ReplayedFlops()
            formulas = model_flop_formulas(self._replayed)
        except Exception as exc:  # a torch whose FLOP registry differs: its own formulas
            logger.debug("gpuopt: FLOPs counted as torch counts them: %s", exc)
            self._replayed, formulas = None, {}
        self._flop_mode = FlopCounterMode(display=False, custom_mapping=formulas)
        if hasattr(self._flop_mode, "mod_tracker"):
            self._flop_mode.mod_tracker = _TotalOnly()
        self._flop_mode.__enter__()
        from mlflow_gpuopt.tracking.ops_seen import OpsSeen

        self.ops = OpsSeen()
        self._kernel_mode = kernel_count_mode(self.ops)
        self._kernel_mode.__enter__()
        self._gemm_mode = _gemm_shape_mode_class()()
        self._gemm_mode.__enter__()
        if self._in_optimizer_step:  # begun in a closure: the step's operators so far are 0
            self._step_pre_count = 0

    def on_optimizer_step_pre(self, optimizer: Any, args: tuple,
                              kwargs: dict) -> tuple[tuple, dict] | None:
        """An optimizer's ``step()`` starts (while this profile is pending or active): its
        own operators are left out of the micro-steps' count, and a closure it was given is
        wrapped so that the closure's operators stay in. Returns the (args, kwargs) with the
        wrapped closure, as a global step pre-hook may, or ``None``."""
        self._in_optimizer_step = True
        self._closure_kernels = 0
        self._step_pre_count = self._kernel_mode.count if self._kernel_mode is not None \
            else None
        if args and callable(args[0]):
            return (self._wrap_closure(args[0]), *args[1:]), kwargs
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._wrap_closure(kwargs["closure"])}
        return None

    def _wrap_closure(self, closure: Any) -> Any:
        def counted_closure(*a: Any, **kw: Any) -> Any:
            mode = self._kernel_mode
            start = mode.count if mode is not None else 0
            try:
                return closure(*a, **kw)
            finally:
                now = self._kernel_mode
                if now is not None:  # begun inside this closure: counted from 0
                    self._closure_kernels += now.count - (start if now is mode else 0)

        return counted_closure

    def on_optimizer_step_post(self, optimizer: Any) -> None:
        """An optimizer's ``step()`` ended: its operators, closures left out, are the
        optimizer's."""
        self._in_optimizer_step = False
        mode = self._kernel_mode
        if mode is not None and self._step_pre_count is not None:
            self._optimizer_kernels += max(
                0, mode.count - self._step_pre_count - self._closure_kernels)
        self._step_pre_count = None
        self._closure_kernels = 0

    def _exit_gemm_mode(self) -> None:
        """Leave the matmul shape recorder (entered last in begin_step: left first)."""
        mode, self._gemm_mode = self._gemm_mode, None
        if mode is not None:
            mode.__exit__(None, None, None)
            self.gemm_shapes = tuple(mode.shapes)

    def _exit_kernel_mode(self) -> None:
        """Leave the kernel counter (entered in begin_step)."""
        if self._kernel_mode is not None:
            mode, self._kernel_mode = self._kernel_mode, None
            mode.__exit__(None, None, None)
            self.micro_step_kernels = max(0, mode.count - self._optimizer_kernels)
            if mode.higher_order_ops:
                _forget_hop_compilations(mode.higher_order_ops)
            elif self.compiled_kernels_per_micro_step is not None or has_compiled_module(
                    self.model):
                _recompile_after_profile()

    def _pack(self, t: Any) -> Any:
        try:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self._seen_storages and ptr not in self._param_storages:
                self._seen_storages.add(ptr)
                self._saved_bytes += t.untyped_storage().nbytes()
        except Exception as exc:  # e.g. a tensor subclass without storage
            logger.debug("gpuopt: saved tensor not measured: %s", exc)
        return t

    @staticmethod
    def _unpack(t: Any) -> Any:
        return t

    # called from the model's forward hook (after the first forward of the profiled step)
    def end_forward(self, output: Any = None) -> None:
        if self.ops is not None:
            self.ops.forward = False  # the first forward ended: what follows is loss+backward
        # the forward's matmuls fix the backward's (the same K and N, transposed, with the
        # batch as the reduction dimension of the weight gradient): keep the forward's only
        self._exit_gemm_mode()
        if self._saved_ctx is not None:
            ctx, self._saved_ctx = self._saved_ctx, None
            ctx.__exit__(None, None, None)
            if self._cuda_base is not None:
                import torch

                dev = self._cuda_device
                self._cuda_delta = float(torch.cuda.max_memory_allocated(dev)) - self._cuda_base

    # called at the step boundary (optimizer post-hook or manual step)
    def end_step(self) -> None:
        self.end_forward()
        self._exit_kernel_mode()  # entered after the FLOP counter: left before it
        if self._flop_mode is not None:
            mode, self._flop_mode = self._flop_mode, None
            mode.__exit__(None, None, None)
            self.flops = float(mode.get_total_flops())
            if self._replayed is not None:
                self.recompute_flops = float(self._replayed.flops)
        self.active = False
        self.done = True
        self._seen_storages.clear()
        self._param_storages.clear()

    def abort(self) -> None:
        """Leave every mode still entered (training raised, or tracking stopped mid-step),
        each even if leaving another one failed: a mode left on the dispatch stack would
        slow every later operator of the training run."""
        with contextlib.ExitStack() as stack:  # callbacks run last-in first-out
            stack.callback(setattr, self, "active", False)
            stack.callback(setattr, self, "micro_step_kernels", None)  # no count
            flop, self._flop_mode = self._flop_mode, None
            if flop is not None:
                stack.callback(flop.__exit__, None, None, None)
            stack.callback(self._exit_kernel_mode)
            stack.callback(self._exit_gemm_mode)  # entered last: left first
            ctx, self._saved_ctx = self._saved_ctx, None
            if ctx is not None:
                stack.callback(ctx.__exit__, None, None, None)

    def result(self, step_samples: int | None, step_forwards: int | None,
               overrides: dict | None = None) -> WorkloadProfile:
        """The profile, from this step's counts and the samples/forwards the step held."""
        o = overrides or {}
        total, trainable = count_params(self.model)
        micro = o.get("micro_batch") or self._forward_batch
        grad_accum = o.get("grad_accum") or step_forwards or 1
        samples = step_samples or ((micro or 0) * grad_accum) or None
        flops_ps = self.flops / samples if (self.flops and samples) else None
        recompute_ps = (self.recompute_flops / samples
                        if flops_ps is not None and self.recompute_flops is not None else None)
        saved_ps = self._saved_bytes / self._forward_batch if self._forward_batch else None
        forwards = step_forwards or grad_accum
        eager_kernels = (self.micro_step_kernels / forwards
                         if self.micro_step_kernels and forwards else None)
        compiled = self.compiled_kernels_per_micro_step
        kernels = compiled if compiled else eager_kernels
        cuda_ps = (self._cuda_delta / self._forward_batch
                   if self._cuda_delta is not None and self._forward_batch else None)
        precision, fp8_recipe = self.ran_precision()
        from mlflow_gpuopt.tracking.architecture import architecture_of

        from mlflow_gpuopt.tracking.moe_layers import moe_fields_of

        arch = architecture_of(self.model)
        shape = {"params": total, "trainable_params": trainable,
                 **(arch.as_dict() if arch is not None else {})}
        shape.update(moe_fields_of(self.model, shape))  # experts, active params
        return WorkloadProfile(
            name=self.name,
            flops_per_sample=flops_ps,
            precision=o.get("precision") or precision or "fp32",
            micro_batch=micro,
            grad_accum=int(grad_accum),
            optimizer=type(self.optimizer).__name__ if self.optimizer is not None else None,
            optimizer_state_bytes_per_param=(optimizer_state_bytes_per_param(self.optimizer)
                                             if self.optimizer is not None else None),
            activation_bytes_per_sample=cuda_ps if cuda_ps is not None else saved_ps,
            activation_saved_bytes_per_sample=saved_ps,
            tokens_per_sample=o.get("tokens_per_sample") or self.tokens_per_sample,
            largest_layer_params=largest_leaf_params(self.model),
            kernels_per_micro_step=kernels,
            attention=self.ops.attention if self.ops is not None else None,
            recompute=self.ops.recompute if self.ops is not None else None,
            fp8_recipe=fp8_recipe if (o.get("precision") or precision) == "fp8" else None,
            gemm_shapes=self.gemm_shapes or None,
            recompute_flops_per_sample=recompute_ps,
            adapter=adapter_of(self.model),
            padding_fraction=self.padding_fraction,
            compiled=True if compiled else None,
            eager_kernels_per_micro_step=eager_kernels if compiled else None,
            **shape,
        )

    def ran_precision(self) -> tuple[str | None, str | None]:
        """``(precision, fp8_recipe)`` of the profiled step: FP8 layers that ran FP8, else
        the dtype of the matmul operands the dispatch saw, else the autocast state / parameter
        dtype at the first forward (:func:`detect_precision`)."""
        from mlflow_gpuopt.tracking.ops_seen import fp8_modules

        fp8, recipe = fp8_modules(self.model)
        if fp8:
            return "fp8", recipe
        seen = self.ops.precision(self._device_type) if self.ops is not None else None
        return seen or self.precision, None
