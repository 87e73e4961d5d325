"""What the profiled step's operators say about how the model runs: the attention kernel,
activation recomputation, and the precision of its matrix products.

The profiler's kernel-counting dispatch mode (:mod:`.dispatch_count`) hands every operator of
the profiled step to an :class:`OpsSeen`, with the phase it is in (the first forward, or what
follows it until the optimizer steps: the loss and the backward pass). Read at the end
(values and their meaning: docs/metrics.md#params, ``gpuopt.attention``,
``gpuopt.recompute``, ``gpuopt.precision``):

- **attention**: ``sdpa`` when one of SDPA's fused kernels ran, or its math fallback
  (recognised by ``_safe_softmax``, which only that path dispatches); ``eager`` when a softmax
  ran over the last two dimensions of a batched product of the same forward; else ``None``.
- **recompute**: operators run *inside* the backward pass *with gradients enabled* are
  forward operators replayed by activation checkpointing (``torch.utils.checkpoint``
  recomputes under ``enable_grad``; the backward's own run with gradients off), except in a
  backward that builds a graph (``create_graph``). Weight products replayed: ``full``; the
  attention core only: ``selective``; element-wise only: ``selective-op``; none: ``none``.
- **precision**: the dtype holding most matrix-product operand elements of the forward, what
  ran whatever enabled it (``tf32`` where the script asks for TF32 matmuls, on any device,
  since a CPU run is planned on GPUs).
- **FP8 modules**: Transformer Engine layers with FP8 on (their GEMMs run outside aten, so
  the dispatch cannot see them) or torchao float8 layers, whose config names the scaling
  recipe. Found by class name: neither library is imported here.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

#: Fused attention kernels (aten names without the namespace), forward and backward.
SDPA_OPS = frozenset({
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
    "_efficient_attention_forward", "_cudnn_attention_forward",
})
#: Products of weights with activations (the ops a Linear/Conv layer dispatches).
WEIGHT_MATMUL_OPS = frozenset({"mm", "addmm", "convolution", "_convolution", "_scaled_mm",
                               "cudnn_convolution", "mkldnn_convolution"})
#: Products of two activations (attention's Q·Kᵀ and P·V in eager attention).
BATCHED_MATMUL_OPS = frozenset({"bmm", "baddbmm"})
SOFTMAX_OPS = frozenset({"_softmax", "_safe_softmax"})
#: Dispatched only by SDPA's math fallback (``_scaled_dot_product_attention_math``).
SDPA_MATH_OPS = frozenset({"_safe_softmax"})
FP8_DTYPE_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


class _GraphTasks:
    """Which autograd graph tasks (backward passes) build a graph of their own
    (``create_graph=True``: a gradient penalty, higher-order gradients).

    Such a task runs every backward operator with gradients on, from its first operator;
    an ordinary backward runs its first operator (the loss's own backward) with gradients off
    and turns them on only inside a checkpoint's replay. ``create_graph`` also keeps the graph
    (``retain_graph`` defaults to it), which an ordinary ``loss.backward()`` does not, so both
    are asked. A few hundred ids are remembered (one profiled step runs a handful).
    """

    _LIMIT = 256

    def __init__(self) -> None:
        self._creates_graph: dict[int, bool] = {}

    def creates_graph(self, task_id: int, grad_enabled: bool) -> bool:
        seen = self._creates_graph.get(task_id)
        if seen is None:
            import torch

            keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
            seen = bool(grad_enabled and (keep is None or keep()))
            self._creates_graph[task_id] = seen
            if len(self._creates_graph) > self._LIMIT:
                self._creates_graph.pop(next(iter(self._creates_graph)))
        return seen


_TASKS = _GraphTasks()


def replaying_forward() -> bool:
    """Whether the operator being dispatched now is a forward operator replayed by activation
    checkpointing: it runs inside an autograd graph task (the backward pass) with gradients
    enabled (``torch.utils.checkpoint`` recomputes under ``enable_grad``; the backward's own
    operators run with gradients off), and the task is not one that builds a graph itself
    (:class:`_GraphTasks`: there every operator runs with gradients on, and it is model work).
    Call it from a dispatch mode, for every operator of the backward, on the thread that runs
    the operator."""
    import torch

    task_id = getattr(torch._C, "_current_graph_task_id", None)
    if task_id is None:
        return False
    tid = task_id()
    if tid == -1:
        return False
    grad = torch.is_grad_enabled()
    builds_graph = _TASKS.creates_graph(tid, grad)  # every operator: the first one decides
    return grad and not builds_graph


def _op_name(func: Any) -> str:
    return func._schema.name.split("::", 1)[-1]


def _tensors(args: tuple, kwargs: dict | None) -> list[Any]:
    import torch

    out = [a for a in args if isinstance(a, torch.Tensor)]
    if kwargs:
        out += [a for a in kwargs.values() if isinstance(a, torch.Tensor)]
    return out


class OpsSeen:
    """Accumulates what the operators of the profiled step show (see the module doc)."""

    def __init__(self) -> None:
        self.forward = True  # set False by the profiler when the first forward ends
        self.failed = False  # an operator could not be read: nothing here is reported
        self.sdpa_ops: set[str] = set()
        self.product_shapes: set[tuple[int, int]] = set()  # last two dims of bmm outputs
        self.eager_softmax = False
        self.operand_elements: dict[str, int] = {}  # dtype name -> matmul operand elements
        self.conv_fp32 = False
        self.scaled_mm = False
        self.replayed_weight_products = 0
        self.replayed_attention = 0
        self.replayed_other = 0
        self.after_forward_ops = 0  # operators seen after the first forward (loss, backward)
        #: bytes the operators move (a :class:`~.traffic.TrafficCount`, set by the profiler)
        self.traffic: Any = None

    def observe(self, func: Any, args: tuple, kwargs: dict | None, out: Any) -> None:
        """One dispatched operator (``func`` an ``OpOverload``) and its output."""
        import torch

        name = _op_name(func)
        traffic = self.traffic
        if traffic is not None and not traffic.failed:
            try:
                traffic.observe(name, args, kwargs, out)
            except Exception as exc:  # stop counting bytes; the rest of the census goes on
                logger.debug("gpuopt: traffic count stopped at %r: %s", func, exc)
                traffic.failed = True
        if not self.forward:
            self.after_forward_ops += 1
            if replaying_forward():
                self._replayed(name)
            return
        if name in SDPA_OPS or name in SDPA_MATH_OPS:
            self.sdpa_ops.add(name)
        elif name in BATCHED_MATMUL_OPS and isinstance(out, torch.Tensor) and out.dim() >= 3:
            self.product_shapes.add(tuple(out.shape[-2:]))
        elif name in SOFTMAX_OPS and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            if x.dim() >= 3 and tuple(x.shape[-2:]) in self.product_shapes:
                self.eager_softmax = True
        if name in WEIGHT_MATMUL_OPS or name in BATCHED_MATMUL_OPS or name in SDPA_OPS:
            self._operands(name, _tensors(args, kwargs))

    def allocated_like(self, args: tuple, out: Any) -> None:
        """An allocation like ``args[0]`` (``LIKE_ALLOCATION_OPS``), for the byte count."""
        traffic = self.traffic
        if traffic is not None and not traffic.failed and args:
            try:
                traffic.allocated_like(args[0], out)
            except Exception as exc:  # stop counting bytes; the rest of the census goes on
                logger.debug("gpuopt: traffic count stopped at an allocation: %s", exc)
                traffic.failed = True

    def _replayed(self, name: str) -> None:
        if name in WEIGHT_MATMUL_OPS:
            self.replayed_weight_products += 1
        elif name in SDPA_OPS or name in BATCHED_MATMUL_OPS or name in SOFTMAX_OPS:
            self.replayed_attention += 1
        else:
            self.replayed_other += 1

    def _operands(self, name: str, tensors: list[Any]) -> None:
        if name == "_scaled_mm":
            self.scaled_mm = True
        floats = [t for t in tensors if t.is_floating_point() and t.dim() >= 2]
        for t in floats[:2]:  # the two operands (addmm's bias is 1-D or left out)
            key = str(t.dtype).removeprefix("torch.")
            self.operand_elements[key] = self.operand_elements.get(key, 0) + t.numel()
            if key == "float32" and "conv" in name:
                self.conv_fp32 = True

    # -- what the step showed ----------------------------------------------------------------
    @property
    def attention(self) -> str | None:
        """``sdpa``, ``eager`` or None (no attention seen)."""
        if self.sdpa_ops:
            return "sdpa"
        return "eager" if self.eager_softmax else None

    @property
    def recompute(self) -> str | None:
        """``none``, ``selective-op``, ``selective`` or ``full`` (see the module doc); None
        when no operator ran after the forward (no backward seen)."""
        if not self.after_forward_ops:
            return None
        if self.replayed_weight_products:
            return "full"
        if self.replayed_attention:
            return "selective"
        if self.replayed_other:
            return "selective-op"
        return "none"

    def precision(self, device_type: str) -> str | None:
        """The precision of the forward's matrix products, or None when none ran."""
        if self.scaled_mm or any(self.operand_elements.get(n) for n in FP8_DTYPE_NAMES):
            return "fp8"
        if not self.operand_elements:
            return None
        dtype = max(self.operand_elements, key=self.operand_elements.__getitem__)
        if dtype == "bfloat16":
            return "bf16"
        if dtype == "float16":
            return "fp16"
        if dtype == "float32" and (tf32_matmul_flags() or (
                device_type == "cuda" and self.conv_fp32 and _cudnn_tf32())):
            return "tf32"
        return "fp32" if dtype in ("float32", "float64") else None


def tf32_matmul_flags() -> bool:
    """Whether the script asked for TF32 matmuls (``torch.backends.cuda.matmul.allow_tf32``
    or ``torch.set_float32_matmul_precision("high"/"medium")``): on any device, since a
    run measured on a CPU is planned on GPUs, where those flags make fp32 products TF32."""
    import torch

    return bool(torch.backends.cuda.matmul.allow_tf32
                or torch.get_float32_matmul_precision() != "highest")


def _cudnn_tf32() -> bool:
    """Whether cuDNN runs fp32 convolutions on TF32 tensor cores (its default on CUDA)."""
    import torch

    return bool(torch.backends.cudnn.allow_tf32)


def fp8_modules(model: Any) -> tuple[bool, str | None]:
    """``(fp8, recipe)`` from the model's FP8 layers: Transformer Engine modules that ran with
    FP8 on (recipe ``te``), torchao float8 layers (recipe ``tensorwise`` / ``rowwise`` from
    their config's scaling granularity, None when it cannot be read)."""
    if model is None:
        return False, None
    for m in model.modules():
        cls = type(m)
        where = cls.__module__ or ""
        if where.startswith("transformer_engine") and getattr(m, "fp8", False) is True:
            return True, "te"
        if cls.__name__ == "Float8Linear" or where.startswith("torchao.float8"):
            return True, _torchao_recipe(m)
    return False, None


def _torchao_recipe(module: Any) -> str | None:
    """``tensorwise`` or ``rowwise`` from a torchao ``Float8Linear``'s config
    (``config.cast_config_input.scaling_granularity``: ``TENSORWISE`` / ``AXISWISE``)."""
    config = getattr(module, "config", None)
    cast = getattr(config, "cast_config_input", None)
    granularity = getattr(cast, "scaling_granularity", None)
    if granularity is None:
        return None
    text = str(getattr(granularity, "value", granularity)).lower()
    if "axis" in text or "row" in text:
        return "rowwise"
    if "tensor" in text:
        return "tensorwise"
    return None
