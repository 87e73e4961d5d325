"""The eager step's DRAM traffic, counted from the operators of the profiled step.

Eager PyTorch runs each kernel-launching operator as its own kernel(s), which read their
tensor inputs from memory and write their outputs. :class:`TrafficCount` sums, over the
operators the kernel counter shows it (:mod:`.dispatch_count`; views launch nothing and are
not shown), the bytes of each operator's tensor inputs and of its outputs: a storage counted
once per operator on each side (``mul(x, x)`` reads ``x`` once; an in-place ``add_`` reads
and writes its ``self``). It is the step's DRAM traffic to first order: L2 hits lower it
(a small tensor consumed by the next kernel while still cached), and fused GPU kernels move
less than the operators the CPU splits them into (docs/tracking.md#what-it-does).

The bytes are split the way the compute model uses them (docs/models.md#compute-of-one-
micro-step-computepy):

* **weights**: reads of parameter storages, what is computed from parameters alone (an
  autocast copy, a weight-norm product), writes and reads of the parameters' gradients.
  The model charges those per micro-step (``compute.weight_traffic_time_s``), not per
  sample, so they are kept out of ``memory_traffic_bytes_per_sample``;
* **activations** (everything else): per sample, ``memory_traffic_bytes_per_sample``. The
  matrix-product and convolution operators' share of it is kept too (``matmul_bytes``):
  the model hides that share under those kernels' arithmetic
  (``compute.hidden_traffic_share``), so their operand bytes belong in the total.

A gradient is known only once the backward has stored it in ``.grad``, after the operator
that wrote it ran: the bytes charged to each storage since it was last allocated are kept
(with those of what was added into it: ``grad += new_grad`` under gradient accumulation, and
the ``add`` that sums a weight's gradients from its several uses), and at the end those of
the parameters' gradients move from activations to weights.

**Under CUDA autocast** (``amp_*``, the same operators counted a second way): the bytes
the step would move with ``torch.autocast("cuda", dtype=float16/bfloat16)``, by PyTorch's
documented CUDA op policy (docs/metrics.md#artifacts-and-profilejson). The lower-precision
list (``AMP_LOWER_OPS``: matrix products, convolutions, RNN cells, fused attention, and
their backward operators) writes 16-bit outputs and casts each fp32 input first (a cast
kernel reading 4 and writing 2 bytes an element, then the operator reading 2): a weight once
a forward (autocast caches its cast), an activation at every forward use; the backward reads
the copy its forward saved and casts only gradients. The float32 list (``AMP_FP32_OPS``:
softmax, log_softmax, layer/group norm, the losses, exp/log/pow, sum/prod/cumsum, norms,
upsampling, and their backward operators) casts 16-bit inputs up (read 2, write 4, read 4;
the backward reads the saved fp32 copy) and writes fp32; autocast is off in the backward,
so there only their backward operators do (the others, a bias gradient's ``sum``, run at
their inputs' type). Every other operator reads each
input at its own width and writes the widest floating input's (type promotion; 0-dim
scalars do not promote; batch norm writes its input's, as cuDNN's mixed kernel does). Only
fp32 tensors change width.

Each of those casts is a kernel of its own (``aten::_to_copy``) that the fp32 step did not
launch: ``amp_casts`` counts them (a weight's once a forward, autocast's cache lasting one
autocast region: :meth:`TrafficCount.new_forward`; an activation's at every forward use; a
gradient's on its way into a lower-precision backward operator or up into a float32-list
one). Mixed-dtype inputs of every other operator are converted inside its kernel (CUDA's
TensorIterator casts as it loads), so they launch nothing more.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

#: Matrix products and convolutions (aten names, no namespace), forward and backward.
MATMUL_TRAFFIC_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm",
    "convolution", "_convolution", "convolution_backward", "cudnn_convolution",
    "mkldnn_convolution", "_slow_conv2d_forward", "_slow_conv2d_backward",
    "slow_conv3d_forward", "mkldnn_rnn_layer", "mkldnn_rnn_layer_backward",
    "_cudnn_rnn", "_cudnn_rnn_backward",
})

#: Convolution operators as a forward dispatches them (``conv1d``/``conv2d``/``conv3d`` and the
#: transposed ones arrive as ``convolution``).
CONVOLUTION_FORWARD_OPS = frozenset({"convolution", "_convolution"})

#: CUDA autocast's lower-precision (float16/bfloat16) list as the dispatch mode sees it (aten
#: names after decomposition: ``linear`` arrives as ``addmm``, ``conv2d`` as
#: ``convolution``), with the backward operators of those products, which run at their
#: forward's 16-bit dtypes. https://pytorch.org/docs/stable/amp.html#cuda-ops-that-can-autocast-to-float16
AMP_LOWER_OPS = MATMUL_TRAFFIC_OPS | frozenset({
    "addmv", "addr", "mv", "prelu", "_prelu_kernel", "_prelu_kernel_backward",
    "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_thnn_fused_lstm_cell",
    "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell",
    "_thnn_fused_gru_cell_backward", "_cudnn_rnn", "_cudnn_rnn_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward", "_flash_attention_backward",
    "_efficient_attention_forward", "_efficient_attention_backward",
})

#: CUDA autocast's float32 list as dispatched (``layer_norm`` arrives as
#: ``native_layer_norm``, ``cross_entropy`` as ``_log_softmax`` + ``nll_loss_forward``), with
#: their backward operators, which take the forward's fp32 tensors.
#: https://pytorch.org/docs/stable/amp.html#cuda-ops-that-can-autocast-to-float32
AMP_FP32_OPS = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "softplus_backward",
    "layer_norm", "native_layer_norm", "native_layer_norm_backward",
    "group_norm", "native_group_norm", "native_group_norm_backward",
    "frobenius_norm", "nuclear_norm", "norm", "linalg_vector_norm", "linalg_matrix_norm",
    "renorm", "dist", "cdist", "_cdist_forward", "_cdist_backward", "pdist",
    "_pdist_forward", "_pdist_backward", "cosine_similarity", "logsumexp",
    "softmax", "_softmax", "_softmax_backward_data", "log_softmax", "_log_softmax",
    "_log_softmax_backward_data", "sum", "prod", "cumsum", "cumprod",
    "nll_loss", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
    "nll_loss2d_backward", "nll_loss_nd", "cross_entropy_loss", "mse_loss",
    "mse_loss_backward", "l1_loss", "smooth_l1_loss", "smooth_l1_loss_backward",
    "huber_loss", "huber_loss_backward", "kl_div", "soft_margin_loss",
    "soft_margin_loss_backward", "multilabel_margin_loss_forward",
    "multilabel_margin_loss_backward", "multi_margin_loss", "multi_margin_loss_backward",
    "margin_ranking_loss", "hinge_embedding_loss", "poisson_nll_loss",
    "cosine_embedding_loss", "triplet_margin_loss", "binary_cross_entropy_with_logits",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    "upsample_nearest1d_backward", "upsample_nearest2d_backward",
    "upsample_nearest3d_backward", "upsample_linear1d_backward",
    "upsample_bilinear2d_backward", "upsample_trilinear3d_backward",
    "upsample_bicubic2d_backward",
})

#: Operators that write their (first) input's dtype whatever their fp32 parameters are:
#: batch norm (cuDNN's kernel takes 16-bit data with fp32 scale, shift and statistics).
AMP_INPUT_DTYPE_OPS = frozenset({
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "miopen_batch_norm",
    "native_batch_norm_backward", "cudnn_batch_norm_backward", "batch_norm_backward",
})

#: Out-of-place operators whose output accumulates their inputs: autograd sums the gradients
#: of a weight used several times (an RNN cell's, once per time step) with ``add`` before
#: storing the total in ``.grad``.
ACCUMULATING_OPS = frozenset({"add"})


def _storages(tree: Any, into: dict[int, int], fp32: dict[int, bool] | None = None) -> None:
    """Add each tensor of ``tree`` (nested tuples/lists/dicts) to ``into`` as storage address
    -> bytes it spans (numel × element size, at most its storage's size; the largest view
    of a storage an operator is given). ``fp32``: storage address -> whether a view of it
    with dimensions is there, for each fp32 storage (autocast changes only those; a 0-dim
    one, a scalar, does not promote)."""
    import torch
    from torch.utils._pytree import tree_leaves

    for t in tree_leaves(tree):
        if not isinstance(t, torch.Tensor):
            continue
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            nbytes = min(t.numel() * t.element_size(), storage.nbytes())
        except Exception:  # a tensor subclass or a storage-less tensor: not counted
            continue
        if ptr and nbytes > into.get(ptr, 0):
            into[ptr] = nbytes
        if ptr and fp32 is not None and t.dtype == torch.float32:
            fp32[ptr] = fp32.get(ptr, False) or t.dim() > 0


def _first_storage(args: tuple) -> int | None:
    """Storage address of the first tensor argument, or None."""
    import torch

    for a in args:
        if isinstance(a, torch.Tensor):
            try:
                return a.untyped_storage().data_ptr()
            except Exception:
                return None
    return None


def channels_first_convolution(args: tuple) -> bool:
    """Whether a ``convolution(input, weight, ...)`` call runs channels-first on CUDA, as
    PyTorch hands it to cuDNN: a 1-D convolution always (PyTorch views its ``(N, C, L)``
    tensors as NCHW ``(N, C, 1, L)``; 3-D tensors have no channels-last format), a 2-D or
    3-D one unless its input or weight is channels-last, which makes cuDNN run it NHWC
    (PyTorch's ``cudnn_conv_suggest_memory_format``)."""
    import torch

    if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
        return False
    x, w = args[0], args[1]
    if x.dim() == 3:
        return True
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    if fmt is None:
        return False
    try:
        return not any(t.dim() == x.dim() and t.is_contiguous(memory_format=fmt)
                       and not t.is_contiguous() for t in (x, w))
    except Exception:  # a tensor subclass whose strides cannot be read
        return False


def _in_backward() -> bool:
    """Whether the operator being dispatched runs inside an autograd graph task."""
    import torch

    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


class TrafficCount:
    """Bytes the profiled step's operators read and write, as they ran and as they would
    under CUDA autocast (``amp_*``; see the module doc)."""

    def __init__(self, weight_storages: set[int] | None = None) -> None:
        #: parameter storages and their gradients' at the start (never re-allocated)
        self._fixed = set(weight_storages or ())
        #: storages holding weights or something computed from weights alone
        self._weights = set(self._fixed)
        self.activation_bytes = 0
        self.weight_bytes = 0
        self.matmul_bytes = 0  # activation bytes of MATMUL_TRAFFIC_OPS
        #: input + output bytes of the forward convolutions whose activations are laid out
        #: channels-first (:func:`channels_first_convolution`)
        self.nchw_conv_bytes = 0
        #: the same under CUDA autocast (float: 16-bit elements are half an fp32 one)
        self.amp_activation_bytes = 0.0
        self.amp_weight_bytes = 0.0
        self.amp_matmul_bytes = 0.0
        #: cast kernels autocast would launch before the operators (see the module doc)
        self.amp_casts = 0
        #: fp32 storages that hold 16-bit data under autocast
        self._half: set[int] = set()
        #: storages whose cast autocast keeps: an fp32 one's 16-bit copy (a weight's, cached
        #: for the forward; an activation's, saved for the backward), a 16-bit one's fp32
        #: copy (saved for the backward of a float32-list operator)
        self._copies: set[int] = set()
        self.paused = False  # inside an optimizer's own step(): not counted
        self.failed = False
        #: activation bytes (all, matrix products', and the two under autocast) charged to
        #: each storage since it was last allocated
        self._since: dict[int, list[float]] = {}

    def observe(self, name: str, args: tuple, kwargs: dict | None, out: Any) -> None:
        """One kernel operator (``name`` without namespace), its arguments and output."""
        if self.paused:
            return
        ins: dict[int, int] = {}
        fp32: dict[int, bool] = {}
        _storages(args, ins, fp32)
        if kwargs:
            _storages(kwargs, ins, fp32)
        outs: dict[int, int] = {}
        out_fp32: dict[int, bool] = {}
        _storages(out, outs, out_fp32)
        from_weights = bool(ins) and all(p in self._weights for p in ins)
        matmul = name in MATMUL_TRAFFIC_OPS
        policy = ("lower" if name in AMP_LOWER_OPS else "fp32" if name in AMP_FP32_OPS
                  else "input" if name in AMP_INPUT_DTYPE_OPS else "promote")
        backward = policy in ("lower", "fp32") and _in_backward()
        if backward and policy == "fp32" and "backward" not in name:
            policy = "promote"  # autocast is off in the backward: a bias gradient's sum
        moved = 0
        amp_moved = 0.0
        for ptr, nbytes in ins.items():
            amp = self._amp_read(ptr, nbytes, ptr in fp32, policy, backward)
            if ptr in self._weights:
                self.weight_bytes += nbytes
                self.amp_weight_bytes += amp
            else:
                moved += nbytes
                amp_moved += amp
                self._charge(ptr, nbytes, amp, matmul, fresh=False)
        half_out = self._half_output(policy, args, fp32)
        for ptr, nbytes in outs.items():
            fresh = ptr not in ins  # a new allocation: whatever held the address is gone
            if fresh:
                self._copies.discard(ptr)
                if ptr in out_fp32 and half_out:
                    self._half.add(ptr)
                else:
                    self._half.discard(ptr)
            # in place: the tensor keeps its dtype
            amp = nbytes / 2 if ptr in self._half else float(nbytes)
            if fresh and ptr not in self._fixed:
                self._weights.discard(ptr)
            if from_weights:
                self._weights.add(ptr)
            if ptr in self._weights:
                self.weight_bytes += nbytes
                self.amp_weight_bytes += amp
            else:
                moved += nbytes
                amp_moved += amp
                self._charge(ptr, nbytes, amp, matmul, fresh)
        self.activation_bytes += moved
        self.amp_activation_bytes += amp_moved
        if matmul:
            self.matmul_bytes += moved
            self.amp_matmul_bytes += amp_moved
        if name in CONVOLUTION_FORWARD_OPS and channels_first_convolution(args):
            self.nchw_conv_bytes += sum(n for p, n in ins.items() if p not in self._weights)
            self.nchw_conv_bytes += sum(n for p, n in outs.items() if p not in self._weights)
        if from_weights:
            return
        for ptr in outs:
            # in place, or a sum (autograd adds a weight's gradients from its uses, then
            # stores the total in .grad): what it took in joins it
            if ptr in ins or name in ACCUMULATING_OPS:
                self._merge(ptr, [p for p in ins if p != ptr and p not in self._weights])

    def allocated_like(self, src: Any, out: Any) -> None:
        """``out`` was allocated like ``src`` (``empty_like``): under autocast it has
        ``src``'s dtype, which the in-place operators that fill it keep."""
        import torch

        if self.paused or not isinstance(src, torch.Tensor) or not isinstance(
                out, torch.Tensor):
            return
        ptr = out.untyped_storage().data_ptr()
        self._copies.discard(ptr)
        if out.dtype == torch.float32 and src.untyped_storage().data_ptr() in self._half:
            self._half.add(ptr)
        else:
            self._half.discard(ptr)

    def new_forward(self) -> None:
        """A forward of the next micro-batch begins: autocast's cache of the weights' 16-bit
        copies lasts one autocast region (``torch.autocast`` clears it on exit, and a
        training loop enters one per forward), so this forward casts the weights again."""
        self._copies -= self._weights

    def _amp_read(self, ptr: int, nbytes: int, is_fp32: bool, policy: str,
                  backward: bool) -> float:
        """Bytes under autocast of reading ``nbytes`` (as they ran) of storage ``ptr`` by an
        operator of ``policy``, the cast kernel autocast puts before it included."""
        if not is_fp32:
            return float(nbytes)
        half = ptr in self._half
        if policy == "lower" and not half:
            # the 16-bit copy made before: a weight's, cached by autocast; an activation's,
            # saved for the backward (the forward casts an activation at every use; the
            # backward casts an fp32 gradient on its way in)
            if ptr in self._copies and (backward or ptr in self._weights):
                return nbytes / 2
            self._copies.add(ptr)
            self.amp_casts += 1
            return nbytes + nbytes / 2 + nbytes / 2  # cast: read 4, write 2; then read 2
        if policy == "fp32" and half:
            if ptr in self._copies and backward:  # the fp32 copy saved for the backward
                return float(nbytes)
            self._copies.add(ptr)
            self.amp_casts += 1
            return nbytes / 2 + nbytes + nbytes  # cast up: read 2, write 4; then read 4
        return nbytes / 2 if half else float(nbytes)

    def _half_output(self, policy: str, args: tuple, fp32: dict[int, bool]) -> bool:
        """Whether the operator's fp32 outputs are 16-bit under autocast."""
        if policy == "lower":
            return True
        if policy == "fp32":
            return False
        if policy == "input":
            first = _first_storage(args)
            return first is not None and first in self._half
        # 0-dim scalars do not promote tensors with dimensions (a loss's ones_like does)
        wide = [p for p, dims in fp32.items() if dims] or list(fp32)
        return bool(wide) and all(p in self._half for p in wide)

    def _merge(self, ptr: int, others: list[int]) -> None:
        """``others`` went into ``ptr`` in place (``grad += new_grad`` accumulating a
        gradient): their charges follow ``ptr``'s, as weights where ``ptr`` holds weights."""
        for other in others:
            since = self._since.pop(other, None)
            if since is None:
                continue
            if ptr in self._weights:
                self._to_weights(since)
            else:
                mine = self._since.setdefault(ptr, [0, 0, 0.0, 0.0])
                for i, v in enumerate(since):
                    mine[i] += v

    def _to_weights(self, since: list[float]) -> None:
        self.activation_bytes -= int(since[0])
        self.matmul_bytes -= int(since[1])
        self.weight_bytes += int(since[0])
        self.amp_activation_bytes -= since[2]
        self.amp_matmul_bytes -= since[3]
        self.amp_weight_bytes += since[2]

    def _charge(self, ptr: int, nbytes: int, amp: float, matmul: bool, fresh: bool) -> None:
        since = self._since.get(ptr)
        if since is None or fresh:
            since = self._since[ptr] = [0, 0, 0.0, 0.0]
        since[0] += nbytes
        since[2] += amp
        if matmul:
            since[1] += nbytes
            since[3] += amp

    def finish(self, gradient_storages: set[int]) -> None:
        """At the end of the step: the bytes charged to the parameters' gradients' storages
        since they were allocated are weight traffic (their writes, accumulation, clipping)."""
        for ptr in gradient_storages:
            if ptr in self._weights:
                continue
            self._to_weights(self._since.pop(ptr, [0, 0, 0.0, 0.0]))
        self._since.clear()
