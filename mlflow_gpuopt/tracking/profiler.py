"""The workload profile, measured once on one real training step (docs/tracking.md#what-it-does).

:class:`WorkloadProfiler` is driven by the step clock's hooks (:mod:`.steps`). At the profiled
step's first forward (a forward pre-hook) it enters the counters of :mod:`.dispatch_count`;
it leaves them at that step's optimizer step (post-hook) or manual ``tracker.step()``. So it
counts the forward and backward of every micro-batch of that step on the user's own batch (no
copy, no extra forward) and divides by the samples they held.

* Kernels per micro-step: the operators dispatched in that window less those of every
  optimizer's own ``step()`` (a closure passed to ``step()`` is wrapped for the profiled step
  only and its operators stay in), divided by the forwards. The loss, gradient clipping, a
  GradScaler's unscale and host-to-device copies stay in: they cost launches every step.
* Kernels under CUDA autocast: that count plus the cast kernels autocast would put before
  the operators of an fp32/TF32 step (:class:`~.traffic.TrafficCount`'s ``amp_casts``), per
  micro-step; a step that ran 16-bit launched its casts already and keeps its own count.
* Activation bytes, from the first forward: saved-for-backward tensors
  (``saved_tensors_hooks``, de-duplicated by storage, parameters excluded), and on CUDA the
  allocator's peak growth during the forward.
* What ran (attention kernel, recomputation, precision, FP8 included) is read from the
  dispatched operators by :class:`~.ops_seen.OpsSeen`, not from the autocast state at the
  pre-hook (frameworks enter autocast inside ``forward``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from mlflow_gpuopt.tracking.batch_dim import sample_dim, samples_in, sequence_length_of
from mlflow_gpuopt.tracking.dispatch_count import (
    ReplayedFlops,
    TotalOnly,
    forget_hop_compilations,
    gemm_shape_mode_class,
    kernel_count_mode,
    model_flop_formulas,
    recompile_after_profile,
)
from mlflow_gpuopt.tracking.model_facts import (
    adapter_of,
    count_params,
    detect_precision,
    has_compiled_module,
    largest_leaf_params,
    memory_format_of,
    optimizer_state_bytes_per_param,
    storage_ptr,
)
from mlflow_gpuopt.tracking.optimizers import optimizer_loop_facts
from mlflow_gpuopt.tracking.workload_profile import WorkloadProfile

logger = logging.getLogger(__name__)


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
        #: reduction lengths of the first forward's matrix products and their data gradients
        #: by the products' output rows (:func:`.dispatch_count.gemm_shape_mode_class`);
        #: None: not recorded
        self.gemm_reduction_by_rows: dict[int, int] | None = None
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
        #: the batch was a DTensor: its shape (so the token count) is the global one
        self.batch_is_dtensor = False
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
        self.batch_is_dtensor = hasattr(batch, "placements")
        if batch is not None and batch.dim() >= 1:
            dim = sample_dim(self.model)  # time-major inputs: (sequence, batch, ...)
            self._forward_batch = samples_in(batch, dim)
            if batch.dim() == 2 and not batch.is_floating_point():
                self.tokens_per_sample = sequence_length_of(batch, dim)  # token ids
        self._param_storages = {ptr for ptr in map(storage_ptr, self.model.parameters()) if ptr}
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
            self._flop_mode.mod_tracker = TotalOnly()
        self._flop_mode.__enter__()
        from mlflow_gpuopt.tracking.ops_seen import OpsSeen

        self.ops = OpsSeen()
        from mlflow_gpuopt.tracking.traffic import TrafficCount

        self.ops.traffic = TrafficCount(self._param_storages | self._grad_storages())
        self._kernel_mode = kernel_count_mode(self.ops)
        self._kernel_mode.__enter__()
        self._gemm_mode = gemm_shape_mode_class()()
        self._gemm_mode.__enter__()
        if self._in_optimizer_step:  # begun in a closure: the step's operators so far are 0
            self._step_pre_count = 0

    def new_forward(self) -> None:
        """The forward of another micro-batch of the profiled step begins (after the first):
        autocast would cast the weights again (:meth:`~.traffic.TrafficCount.new_forward`)."""
        traffic = self.ops.traffic if self.ops is not None else None
        if traffic is not None:
            traffic.new_forward()

    def _grad_storages(self) -> set[int]:
        """Storages of the parameters' gradients as they are now."""
        grads = (p.grad for p in self.model.parameters() if p.grad is not None)
        return {ptr for ptr in map(storage_ptr, grads) if ptr}

    def _pause_traffic(self, paused: bool) -> None:
        """Bytes are not counted inside an optimizer's own ``step()`` (its closures are)."""
        traffic = self.ops.traffic if self.ops is not None else None
        if traffic is not None:
            traffic.paused = paused

    def on_optimizer_step_pre(self, optimizer: Any, args: tuple,
                              kwargs: dict) -> tuple[tuple, dict] | None:
        """An optimizer's ``step()`` starts (while this profile is pending or active): its
        own operators are left out of the micro-steps' count, and a closure it was given is
        wrapped so that the closure's operators stay in. Returns the (args, kwargs) with the
        wrapped closure, as a global step pre-hook may, or ``None``."""
        self._in_optimizer_step = True
        self._pause_traffic(True)
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
            self._pause_traffic(False)
            try:
                return closure(*a, **kw)
            finally:
                self._pause_traffic(True)
                now = self._kernel_mode
                if now is not None:  # begun inside this closure: counted from 0
                    self._closure_kernels += now.count - (start if now is mode else 0)

        return counted_closure

    def on_optimizer_step_post(self, optimizer: Any) -> None:
        """An optimizer's ``step()`` ended: its operators, closures left out, are the
        optimizer's."""
        self._in_optimizer_step = False
        self._pause_traffic(False)
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
            self.gemm_reduction_by_rows = dict(mode.reduction_by_rows)

    def _exit_kernel_mode(self) -> None:
        """Leave the kernel counter (entered in begin_step)."""
        if self._kernel_mode is not None:
            mode, self._kernel_mode = self._kernel_mode, None
            mode.__exit__(None, None, None)
            self.micro_step_kernels = max(0, mode.count - self._optimizer_kernels)
            if mode.higher_order_ops:
                forget_hop_compilations(mode.higher_order_ops)
            elif self.compiled_kernels_per_micro_step is not None or has_compiled_module(
                    self.model):
                recompile_after_profile()

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
        traffic = self.ops.traffic if self.ops is not None else None
        if traffic is not None and not traffic.failed:
            traffic.finish(self._grad_storages())
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

    def _batch_row_reduction(self, micro: int | None) -> float | None:
        """Σ K of the products whose output rows are at most the micro-batch's samples (a
        recurrent step's, fewer where a packed sequence's shorter samples have ended, a
        bidirectional layer's two directions once; a per-sample head's): those stay under a
        wave or two at a training batch (docs/models.md#wave-quantisation-of-the-gemms). None
        when there are none, or the batch is not known."""
        by_rows = self.gemm_reduction_by_rows
        if not by_rows or not micro:
            return None
        return float(sum(r for rows, r in by_rows.items() if rows <= micro)) or None

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
        traffic_ps, matmul_ps, weight_ms = self._traffic(samples, forwards, compiled)
        loop_tensors, loop_impl = (optimizer_loop_facts(self.optimizer)
                                   if self.optimizer is not None else (None, None))
        nchw_conv_ps = (self.ops.traffic.nchw_conv_bytes / samples
                        if traffic_ps is not None else None)
        cuda_ps = (self._cuda_delta / self._forward_batch
                   if self._cuda_delta is not None and self._forward_batch else None)
        precision, fp8_recipe = self.ran_precision()
        amp_ps, amp_matmul_ps = self._amp_traffic(samples, traffic_ps, matmul_ps,
                                                  o.get("precision") or precision)
        amp_kernels = self._amp_kernels(eager_kernels, forwards, traffic_ps,
                                        o.get("precision") or precision)
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
            gemm_reduction_per_micro_step=self._batch_row_reduction(micro),
            recompute_flops_per_sample=recompute_ps,
            adapter=adapter_of(self.model),
            memory_format=memory_format_of(self.model),
            padding_fraction=self.padding_fraction,
            compiled=True if compiled else None,
            eager_kernels_per_micro_step=eager_kernels if compiled else None,
            memory_traffic_bytes_per_sample=traffic_ps,
            matmul_traffic_bytes_per_sample=matmul_ps,
            weight_traffic_bytes_per_micro_step=weight_ms,
            amp_traffic_bytes_per_sample=amp_ps,
            amp_matmul_traffic_bytes_per_sample=amp_matmul_ps,
            nchw_conv_bytes_per_sample=nchw_conv_ps,
            optimizer_param_tensors=loop_tensors,
            optimizer_impl=loop_impl,
            amp_kernels_per_micro_step=amp_kernels,
            **shape,
        )

    def _traffic(self, samples: int | None, forwards: int | None, compiled: float | None
                 ) -> tuple[float | None, float | None, float | None]:
        """(activation bytes per sample, their matmul part, weight bytes per micro-step) of
        the profiled step (:mod:`.traffic`); Nones when not counted, and for a compiled
        step, whose Inductor kernels move less than the eager operators counted here."""
        traffic = self.ops.traffic if self.ops is not None else None
        if (traffic is None or traffic.failed or self.ops.failed or compiled or not samples
                or not self.done or traffic.activation_bytes <= 0):
            return None, None, None
        return (traffic.activation_bytes / samples, traffic.matmul_bytes / samples,
                traffic.weight_bytes / max(1, forwards or 1))

    def _amp_traffic(self, samples: int | None, traffic_ps: float | None,
                     matmul_ps: float | None, precision: str | None
                     ) -> tuple[float | None, float | None]:
        """(activation bytes per sample under CUDA autocast, their matmul part): counted
        beside the measured bytes (:class:`~.traffic.TrafficCount`) for an fp32/TF32 step;
        the measured bytes themselves where the step ran 16-bit already (autocast, a
        half-precision model), whose casts and fp32 ops the operators showed."""
        if traffic_ps is None or not samples:
            return None, None
        if precision in ("fp16", "bf16", "fp8"):
            return traffic_ps, matmul_ps
        traffic = self.ops.traffic
        return traffic.amp_activation_bytes / samples, traffic.amp_matmul_bytes / samples

    def _amp_kernels(self, eager_kernels: float | None, forwards: int,
                     traffic_ps: float | None, precision: str | None) -> float | None:
        """Kernels per micro-step under CUDA autocast: the eager count plus the casts
        autocast would launch (:class:`~.traffic.TrafficCount`'s ``amp_casts``) for an
        fp32/TF32 step; the eager count itself where the step ran 16-bit (its casts were
        dispatched and counted). None where the operators' census is not complete
        (``traffic_ps`` None: a compiled step, a census that failed)."""
        if eager_kernels is None or traffic_ps is None:
            return None
        if precision in ("fp16", "bf16", "fp8"):
            return eager_kernels
        return eager_kernels + self.ops.traffic.amp_casts / max(1, forwards)

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
