"""What the profiled step dispatches: model FLOPs, kernel-launching operators, matmul shapes.

Three ``TorchDispatchMode``-style counters, entered by :mod:`.profiler` for one training step;
they only observe dispatch, so training results are unchanged (docs/tracking.md#what-it-does):

* model FLOPs (:func:`model_flop_formulas` for ``FlopCounterMode``): the work the model's
  mathematics needs (PaLM's MFU and Megatron's 6·N·T + 12·L·T²·h convention), so forward
  operators replayed by activation checkpointing are counted aside and a fused attention
  backward is charged 2 × its forward (:func:`attention_backward_model_flops`);
* operators that launch a kernel (:func:`kernel_count_mode`): views, in-place view ops and
  ``NON_KERNEL_OPS`` left out. In eager PyTorch each is about one launch, which bounds a
  micro-step's batch-independent latency; it is a count of operators, not kernels (a cuDNN
  RNN is one operator and many kernels, an ``LSTMCell`` one CUDA kernel but ~10 CPU ops);
* distinct matmul shapes (:func:`gemm_shape_mode_class`) for the tensor-core alignment advice,
  and the reduction lengths of all of them by their output rows, for the wave quantisation
  of the GEMMs whose rows are the batch alone (``compute.wave_tail_time_s``).

Higher-order operators (``torch.cond`` and kin) pass through; Dynamo's caches are reset after
a profiled step that ran one, or that ran a ``torch.compile``d model eagerly under these modes
(:func:`forget_hop_compilations`, :func:`recompile_after_profile`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)


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


def rnn_layer_flops(input: Any, weights: Any) -> int:
    """FLOPs of a fused recurrent operator's forward (``mkldnn_rnn_layer``, cuDNN's
    ``_cudnn_rnn``), which torch's FLOP registry lacks: every 2-D weight of ``weights`` (the
    input and hidden projections of each layer and direction; biases are 1-D) multiplies
    the input of every time step of every sequence, 2 FLOPs per multiply-add:
    2 × (time steps × batch) × Σ weight elements. The gates' element-wise work is left out,
    as for the other operators."""
    import torch

    steps = input.numel() // max(1, input.shape[-1])
    return 2 * steps * sum(w.numel() for w in weights
                           if isinstance(w, torch.Tensor) and w.dim() == 2)


class ReplayedFlops:
    """FLOPs of forward operators replayed by activation checkpointing, kept out of the
    ``FlopCounterMode`` total (see :func:`model_flop_formulas`)."""

    def __init__(self) -> None:
        self.flops = 0


def _raw(fn: Any) -> Any:
    fn._get_raw = True  # FlopCounterMode passes the operator's own arguments, not shapes
    return fn


class TotalOnly:
    """Stands in for ``FlopCounterMode``'s module tracker: every FLOP is counted under
    "Global", the total this profile needs.

    The tracker puts a multi-grad hook on every module's inputs, and ``torch.autograd.grad``
    with a leaf among its ``inputs`` (a gradient penalty: WGAN-GP, R1, Jacobian
    regularisation) then raises "A leaf node was passed to _will_engine_execute_node" inside
    the user's own call: the profiled step would crash training.
    """

    parents = ("Global",)

    def __enter__(self) -> TotalOnly:
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

    # mkldnn_rnn_layer(input, w_ih, w_hh, ...): one layer, one direction;
    # _cudnn_rnn(input, [weights of every layer and direction], ...). Backward: the data
    # and the weight gradients, 2 x the forward.
    def mkldnn_forward(input, w_ih, w_hh, *args: Any, out_val: Any = None,
                       **kwargs: Any) -> int:
        return rnn_layer_flops(input, (w_ih, w_hh))

    def mkldnn_backward(input, w_ih, w_hh, *args: Any, out_val: Any = None,
                        **kwargs: Any) -> int:
        return 2 * rnn_layer_flops(input, (w_ih, w_hh))

    def cudnn_forward(input, weights, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return rnn_layer_flops(input, weights)

    def cudnn_backward(input, weights, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
        return 2 * rnn_layer_flops(input, weights)

    for name, fn in (("_scaled_dot_product_flash_attention_for_cpu", cpu_forward),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward", cpu_backward),
                     ("mkldnn_rnn_layer", mkldnn_forward),
                     ("mkldnn_rnn_layer_backward", mkldnn_backward),
                     ("_cudnn_rnn", cudnn_forward), ("_cudnn_rnn_backward", cudnn_backward)):
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


#: Allocations shaped and typed like their first argument, shown to the operator census
#: although they launch nothing: the dtype a later in-place fill writes is the argument's
#: (dropout's mask on the CPU: ``empty_like(x).bernoulli_(p)``; :mod:`.traffic`'s autocast
#: count follows it).
LIKE_ALLOCATION_OPS = frozenset({"empty_like"})


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
def kernel_count_mode_class() -> type:
    """A ``TorchDispatchMode`` that counts kernel-launching operators (defined on first use,
    so importing this module does not import torch)."""
    import torch
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
            aten = torch.ops.aten
            self._like = {getattr(aten, n).default for n in LIKE_ALLOCATION_OPS
                          if hasattr(aten, n)}

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
            if self.ops is not None and (kernel or func in self._like):
                try:
                    if kernel:
                        self.ops.observe(func, args, kwargs, out)
                    else:
                        self.ops.allocated_like(args, out)
                except Exception as exc:  # never break training: stop looking instead
                    logger.debug("gpuopt: operator census stopped at %r: %s", func, exc)
                    self.ops.failed = True
                    self.ops = None
            return out

    return KernelCountMode



def kernel_count_mode(ops: Any = None) -> Any:
    """A fresh kernel-counting dispatch mode; enter it, run, read ``.count``. With ``ops``
    (an :class:`~.ops_seen.OpsSeen`), every kernel operator is also shown to it."""
    return kernel_count_mode_class()(ops)



def forget_hop_compilations(names: set[str]) -> None:
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



def recompile_after_profile() -> None:
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


def gemm_rows(name: str, args: tuple) -> int | None:
    """Output rows of a matrix multiply operator's kernel (M; a batched one's M × its batch
    of matrices), or ``None`` for any other operator."""
    mnk = gemm_mnk(name, args)
    if mnk is None:
        return None
    a = args[0] if name in ("mm", "bmm") else args[1]
    count = 1
    for d in a.shape[:-2]:
        count *= int(d)
    return mnk[0] * count


def rnn_reduction(name: str, args: tuple) -> list[tuple[int, int]]:
    """(output rows, reduction length) of the matrix products a fused recurrent forward
    (``mkldnn_rnn_layer``: one layer and direction; ``_cudnn_rnn``: all of them) and its
    data gradient run, one time step after another, as cuDNN runs them: per layer and
    direction the input projection once for all steps (rows batch × steps; K = input size,
    its data gradient K = 4·hidden for an LSTM, the gates' width) and, at every time step,
    the hidden-to-hidden product (rows: the batch; K = hidden) and its data gradient (K =
    gates' width). A bidirectional layer's reverse direction runs its steps' products beside
    the forward direction's, the two independent, so their tiles share the same waves (one
    partial wave per step for both, docs/models.md#wave-quantisation-of-the-gemms): its
    per-step products are not counted again. Empty for any other operator."""
    import torch

    if name == "mkldnn_rnn_layer":
        inp, weights = args[0], (args[1], args[2])
    elif name == "_cudnn_rnn":
        inp, weights = args[0], args[1]
    else:
        return []
    try:
        # mkldnn_rnn_layer is handed the input time-major whatever its batch_first flag;
        # _cudnn_rnn the module's own (batch-major under batch_first). A packed sequence's
        # input is 2-D with one batch size per time step, the first the largest.
        mkldnn = name == "mkldnn_rnn_layer"
        batch_sizes = args[8] if mkldnn else args[14]
        batch_first = False if mkldnn else bool(args[10])
        bidirectional = bool(args[13])
        # mkldnn_rnn_layer: one direction a call, ``reverse`` (args[7]) the second one's;
        # _cudnn_rnn: every layer's forward then reverse direction in its weight list
        reverse_call = mkldnn and bidirectional and bool(args[7])
        if batch_sizes:
            steps, batch = len(batch_sizes), int(batch_sizes[0])
            rows = int(inp.shape[0])
        elif batch_first and inp.dim() == 3:
            batch, steps = int(inp.shape[0]), int(inp.shape[1])
            rows = batch * steps
        else:
            steps = int(inp.shape[0])
            batch = int(inp.shape[1]) if inp.dim() == 3 else 1
            rows = batch * steps
        mats = [w for w in weights if isinstance(w, torch.Tensor) and w.dim() == 2]
    except (AttributeError, IndexError, TypeError):
        return []
    out = []
    # (gates × input), (gates × hidden) per layer and direction (an LSTM with proj_size adds
    # a third 2-D weight, its projection, which this pairing does not follow)
    for i, (w_ih, w_hh) in enumerate(zip(mats[0::2], mats[1::2], strict=False)):
        gates = int(w_ih.shape[0])
        out.append((rows, int(w_ih.shape[1]) + gates))
        if not (reverse_call or (not mkldnn and bidirectional and i % 2 == 1)):
            out.append((batch, steps * (int(w_hh.shape[1]) + gates)))
    return out


@functools.cache
def gemm_shape_mode_class() -> type:
    """A ``TorchDispatchMode`` that records the distinct matmul shapes it sees and the
    reduction lengths of every matrix product it sees by the product's output rows
    (``reduction_by_rows``: K + N per product, the forward's K and its data gradient's, which
    reduces over N; a fused RNN's per time step, :func:`rnn_reduction`), and their sum
    (``reduction``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class GemmShapeMode(TorchDispatchMode):
        supports_higher_order_operators = True

        def __init__(self) -> None:
            super().__init__()
            self.shapes: dict[tuple[int, int, int], None] = {}
            self.reduction_by_rows: dict[int, int] = {}
            self.reduction = 0

        def _add(self, rows: int, reduction: int) -> None:
            self.reduction_by_rows[rows] = self.reduction_by_rows.get(rows, 0) + reduction
            self.reduction += reduction

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            schema = getattr(func, "_schema", None)
            if schema is not None:
                name = schema.name.split("::", 1)[-1]
                mnk = gemm_mnk(name, args)
                if mnk is not None:
                    self._add(gemm_rows(name, args) or mnk[0], mnk[1] + mnk[2])
                    if len(self.shapes) < MAX_GEMM_SHAPES:
                        self.shapes[mnk] = None
                else:
                    for rows, reduction in rnn_reduction(name, args):
                        self._add(rows, reduction)
            return func(*args, **(kwargs or {}))

    return GemmShapeMode

