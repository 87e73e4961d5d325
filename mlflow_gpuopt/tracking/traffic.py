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

#: Out-of-place operators whose output accumulates their inputs: autograd sums the gradients
#: of a weight used several times (an RNN cell's, once per time step) with ``add`` before
#: storing the total in ``.grad``.
ACCUMULATING_OPS = frozenset({"add"})


def _storages(tree: Any, into: dict[int, int]) -> None:
    """Add each tensor of ``tree`` (nested tuples/lists/dicts) to ``into`` as storage address
    -> bytes it spans (numel × element size, at most its storage's size; the largest view
    of a storage an operator is given)."""
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


class TrafficCount:
    """Bytes the profiled step's operators read and write (see the module doc)."""

    def __init__(self, weight_storages: set[int] | None = None) -> None:
        #: parameter storages and their gradients' at the start (never re-allocated)
        self._fixed = set(weight_storages or ())
        #: storages holding weights or something computed from weights alone
        self._weights = set(self._fixed)
        self.activation_bytes = 0
        self.weight_bytes = 0
        self.matmul_bytes = 0  # activation bytes of MATMUL_TRAFFIC_OPS
        self.paused = False  # inside an optimizer's own step(): not counted
        self.failed = False
        #: activation bytes (all, matrix products') charged to each storage since it was
        #: last allocated
        self._since: dict[int, list[int]] = {}

    def observe(self, name: str, args: tuple, kwargs: dict | None, out: Any) -> None:
        """One kernel operator (``name`` without namespace), its arguments and output."""
        if self.paused:
            return
        ins: dict[int, int] = {}
        _storages(args, ins)
        if kwargs:
            _storages(kwargs, ins)
        outs: dict[int, int] = {}
        _storages(out, outs)
        from_weights = bool(ins) and all(p in self._weights for p in ins)
        matmul = name in MATMUL_TRAFFIC_OPS
        moved = 0
        for ptr, nbytes in ins.items():
            if ptr in self._weights:
                self.weight_bytes += nbytes
            else:
                moved += nbytes
                self._charge(ptr, nbytes, matmul, fresh=False)
        for ptr, nbytes in outs.items():
            fresh = ptr not in ins  # a new allocation: whatever held the address is gone
            if fresh and ptr not in self._fixed:
                self._weights.discard(ptr)
            if from_weights:
                self._weights.add(ptr)
                self.weight_bytes += nbytes
            elif ptr in self._weights:
                self.weight_bytes += nbytes
            else:
                moved += nbytes
                self._charge(ptr, nbytes, matmul, fresh)
        self.activation_bytes += moved
        if matmul:
            self.matmul_bytes += moved
        if from_weights:
            return
        for ptr in outs:
            # in place, or a sum (autograd adds a weight's gradients from its uses, then
            # stores the total in .grad): what it took in joins it
            if ptr in ins or name in ACCUMULATING_OPS:
                self._merge(ptr, [p for p in ins if p != ptr and p not in self._weights])

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
                mine = self._since.setdefault(ptr, [0, 0])
                mine[0] += since[0]
                mine[1] += since[1]

    def _to_weights(self, since: list[int]) -> None:
        self.activation_bytes -= since[0]
        self.matmul_bytes -= since[1]
        self.weight_bytes += since[0]

    def _charge(self, ptr: int, nbytes: int, matmul: bool, fresh: bool) -> None:
        since = self._since.get(ptr)
        if since is None or fresh:
            since = self._since[ptr] = [0, 0]
        since[0] += nbytes
        if matmul:
            since[1] += nbytes

    def finish(self, gradient_storages: set[int]) -> None:
        """At the end of the step: the bytes charged to the parameters' gradients' storages
        since they were allocated are weight traffic (their writes, accumulation, clipping)."""
        for ptr in gradient_storages:
            if ptr in self._weights:
                continue
            self._to_weights(self._since.pop(ptr, [0, 0]))
        self._since.clear()
