"""The step clock: the only tracking code on the training thread's hot path.

Each training step appends one record (the fields of :class:`StepRecord`) to a bounded deque
(``comm``: the :class:`~.distributed.comm_meter.CommMeter`'s cumulative :class:`CommTotals` in
a distributed job, else ``None``); everything else (step times, quantiles, throughput) is
computed by the sampler thread from that deque. A step is an optimizer step (global post-hook,
matched against the innermost optimizer of a wrapper chain), a GradScaler step that skipped
the optimizer (inf/NaN gradients: a step that did no update, not accumulation), or a manual
``mark()`` — once ``mark()`` is called, it is the only step clock; a ``mark()`` right after
the optimizer's step ends that same step rather than a new one. With no optimizer named, the
first one to step is the clock and a second one is ignored (one warning says what to pass).

Samples come from the data, not from module calls. A forward of the tracked model starts a
new micro-batch only when it is the step's first, or when a backward ran since the previous
one (``torch.autograd.backward``, see :mod:`.loop_watch`). Inside the optimizer's own
``step()`` only the closure's first forward can start one: an LBFGS closure's evaluations are
one micro-batch, while the closure Lightning passes to ``step()`` under automatic
optimization runs the step's last micro-batch (with ``accumulate_grad_batches=k``, the first
k-1 run before ``step()``). Where the loop iterates
a ``DataLoader`` (see :mod:`.loop_watch`) and the model ran more micro-batches than the step
fetched batches (in every step so far), or none, the step's samples are those of the batches
it fetched, and its micro-batches are those batches unless the counted forwards split them
exactly (a batch cut into accumulation chunks). So a discriminator called three times per
step is one micro-batch of the data's size, while loaders that fetch a batch ahead
(accelerate's, Lightning's) do not shift samples between steps when the forwards agree with
the data.

A micro-batch of token ids also adds its samples to ``samples_by_length`` under its padded
length, the ids' sequence dimension (a shape read, every step: :mod:`.padded_lengths`).

Any exception in a hook switches the clock off (one warning) and training goes on with a hook
that returns at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from mlflow_gpuopt.tracking.batch_dim import samples_in, sequence_length_of
from mlflow_gpuopt.tracking.optimizers import unwrap_optimizer
from mlflow_gpuopt.tracking.profiler import WorkloadProfiler, first_tensor

if TYPE_CHECKING:
    from mlflow_gpuopt.tracking.distributed.comm_meter import CommMeter

logger = logging.getLogger(__name__)


class CommTotals(NamedTuple):
    """A communication meter's cumulative totals (or the difference of two)."""

    collectives: int
    time_s: float  # sum of collective launch -> completion times
    bytes: int  # payload bytes this rank sent into collectives
    exposed_s: float  # communication the steps waited on (not hidden by compute)

    def minus(self, earlier: CommTotals) -> CommTotals:
        return CommTotals(self.collectives - earlier.collectives, self.time_s - earlier.time_s,
                          self.bytes - earlier.bytes, self.exposed_s - earlier.exposed_s)

    def plus(self, other: CommTotals) -> CommTotals:
        return CommTotals(self.collectives + other.collectives, self.time_s + other.time_s,
                          self.bytes + other.bytes, self.exposed_s + other.exposed_s)


NO_COMM = CommTotals(0, 0.0, 0, 0.0)


class StepRecord(NamedTuple):
    """One step boundary, as the training thread leaves it for the sampler thread."""

    t_s: float  # perf_counter at the boundary
    samples: int  # samples of the step (0 = unknown)
    tokens: int
    forwards: int  # gradient-recording forwards of the step (micro-batches)
    cuda_event: Any  # a recorded torch.cuda.Event (GPU-side timing), or None
    comm: CommTotals | None  # the meter's cumulative totals (distributed jobs), or None


_MAX_BATCH_DEPTH = 4  # nesting of a batch (dict of lists of tensors...) searched for a tensor


def batch_tensor_of(batch: Any, tensor_type: type, depth: int = 0) -> Any:
    """The first tensor of at least one dimension in a DataLoader batch (tensor, sequence,
    mapping, or an object with ``.items()`` like transformers' ``BatchEncoding``), or
    ``None``."""
    if isinstance(batch, tensor_type):
        return batch if batch.dim() >= 1 else None
    if depth >= _MAX_BATCH_DEPTH:
        return None
    if isinstance(batch, (list, tuple)):
        items: Any = batch
    elif hasattr(batch, "items"):
        items = (v for _, v in batch.items())
    else:
        return None
    for item in items:
        t = batch_tensor_of(item, tensor_type, depth + 1)
        if t is not None:
            return t
    return None


def batch_size_of(batch: Any, tensor_type: type) -> int | None:
    """Leading dimension of the first tensor in a DataLoader batch (see
    :func:`batch_tensor_of`)."""
    t = batch_tensor_of(batch, tensor_type)
    return int(t.shape[0]) if t is not None else None


class StepClock:
    """Counts and timestamps training steps; drives the one-off workload profiler."""

    def __init__(self, optimizer: Any = None, profiler: WorkloadProfiler | None = None,
                 profile_step: int = 1, cuda_events: bool = False, maxlen: int = 1_000_000,
                 on_error: Callable[[str, BaseException], None] | None = None,
                 comm_meter: CommMeter | None = None,
                 warn: Callable[..., None] | None = None,
                 samples_per_step: int | None = None, has_model: bool = True,
                 sample_dim: int = 0) -> None:
        # plain tuples in StepRecord's field order (see _mark)
        self.records: deque[tuple] = deque(maxlen=maxlen)
        self.dropped = 0  # step records pushed out of a full ``records`` (more than maxlen
        # steps between two sampler ticks)
        self._comm_step = comm_meter.end_step if comm_meter is not None else None
        self.optimizer = unwrap_optimizer(optimizer)
        self._named_optimizer = optimizer is not None
        self.profiler = profiler
        self.profile_step = profile_step if profiler is not None else -1
        self.steps = 0  # completed steps
        self.manual = False
        self.broken = False
        self.pending_samples = 0
        self.pending_tokens: Any = 0  # an int, or a device tensor (attention masks' sums)
        self.pending_padded_tokens = 0  # token positions, padding included
        self._masked = False  # an attention mask came with this step's token ids
        #: samples of every step's micro-batches of token ids by their padded length (the
        #: ids' sequence dimension; :mod:`.padded_lengths`)
        self.samples_by_length: dict[int, int] = {}
        self.pending_forwards = 0  # micro-batches counted from forwards
        self.pending_batches = 0  # DataLoader batches fetched in this step
        self.pending_batch_samples = 0
        self.total_calls = 0  # gradient-recording forwards of the tracked model, all steps
        self.skipped_steps = 0  # GradScaler steps that skipped the optimizer
        self.optimizer_steps = 0  # post-hook calls of the clock's optimizer
        self._backward_seen = False  # a backward ran since the last counted forward
        self._in_step = False  # inside the clock's optimizer's step() (closures)
        self._counted_in_step = False  # a forward inside this step() started a micro-batch
        self._last_from_hook = False  # the last boundary was the optimizer's, not mark()'s
        self._warn = warn
        self._samples_per_step = samples_per_step
        self._has_model = has_model
        self._sample_dim = sample_dim  # the model input's samples dimension (batch_dim.py)
        self._data_seen = False  # a DataLoader batch was seen
        self._forwards_match_data = False  # a step's micro-batches were its loader batches
        self._profiled_index = -1  # the step the profile was taken on
        self.last_step_samples = 0
        self.last_step_forwards = 0
        self.profile_samples: int | None = None
        self.profile_forwards: int | None = None
        # input wait: from a step's end to the next step's first forward (see _note_input_wait)
        self.input_wait_s = 0.0  # summed over the steps from input_wait_from_step on
        self.input_waits = 0  # steps in that sum
        self.recent_input_waits_s: deque[float] = deque(maxlen=4096)  # the last waits
        self.input_wait_from_step = 0  # the tracker's warm-up: the profile, first ticks
        self._last_mark_s: float | None = None
        self._event_cls: Any = None
        self._on_error = on_error
        self._perf = time.perf_counter
        import torch

        self._grad_enabled = torch.is_grad_enabled
        self._tensor = torch.Tensor
        #: launches of compiled graphs, counted on the step before the profiled one (see
        #: :mod:`.compiled`), while that step runs
        self._compiled: Any = None
        if self.profile_step == 1:
            self._count_compiled()
        self.start_time = self._perf()
        self.start_event: Any = None
        if cuda_events:
            self._event_cls = torch.cuda.Event
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.start_event.record()

    def restart(self) -> None:
        """Step 0 starts now: called when tracking's own start-up (the first sample, its
        MLflow write, the sampler thread) is done, so that work is not read as the first
        step's. A no-op once a step has ended."""
        if self.steps or self.records:
            return
        self.start_time = self._perf()
        if self._event_cls is not None:
            self.start_event = self._event_cls(enable_timing=True)
            self.start_event.record()

    def _fail(self, where: str, exc: BaseException) -> None:
        """A hook failed: the clock is off for the rest of the run (and so is the profile)."""
        self.broken = True
        self.remove()
        self._stop_profiling(where, exc)

    def _count_compiled(self) -> None:
        """Count the launches of compiled graphs during the step that starts now."""
        from mlflow_gpuopt.tracking.compiled import CompiledLaunchCounter

        counter = CompiledLaunchCounter()
        if counter.start():
            self._compiled = counter

    def _end_compiled_count(self, forwards: int) -> None:
        """The counted step ended: hand its compiled launches per micro-batch to the
        profiler (nothing when no compiled graph ran)."""
        counter, self._compiled = self._compiled, None
        counter.stop()
        if counter.graphs and forwards and self.profiler is not None:
            self.profiler.compiled_kernels_per_micro_step = counter.launches / forwards

    def remove(self) -> None:
        """Undo what the clock patched (the compiled-graph counter); a hook handle's
        ``remove``."""
        counter, self._compiled = self._compiled, None
        if counter is not None:
            counter.stop()

    def _stop_profiling(self, where: str, exc: BaseException) -> None:
        self.profile_step = -1
        if self.profiler is not None:
            try:
                self.profiler.abort()
            except Exception as inner:  # already failing: just record it
                logger.debug("gpuopt: profiler abort failed: %s", inner)
        if self._on_error is not None:
            self._on_error(where, exc)

    # -- hooks (training thread) ---------------------------------------------------------------
    def on_forward_pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        """Model forward pre-hook: count the micro-batch (gradient-recording forwards that
        start one: see the module docstring)."""
        if self.broken:
            return None
        try:
            if not self._grad_enabled():
                return None
            if self.pending_forwards == 0:
                if self._last_mark_s is not None:
                    self._note_input_wait()
                if self._compiled is not None:
                    self._compiled.begin()
            if args and isinstance(args[0], self._tensor):
                x = args[0]
            else:
                x = first_tensor(args, kwargs)
            self.total_calls += 1
            if self.pending_forwards == 0 or (self._backward_seen and not (
                    self._in_step and self._counted_in_step)):
                self._backward_seen = False
                self._counted_in_step = self._in_step
                if x is not None and x.dim() >= 1:
                    n = samples_in(x, self._sample_dim)
                    self.pending_samples += n
                    if x.dim() == 2 and not x.is_floating_point():
                        self._count_tokens(x, kwargs)
                        self._count_length(x, n)
                self.pending_forwards += 1
                if self.profiler is not None and self.profiler.active:
                    self.profiler.new_forward()  # another micro-batch of the profiled step
        except Exception as exc:
            self._fail("forward hook", exc)
            return None
        if self.steps == self.profile_step and not self.profiler.active and not self.profiler.done:
            try:
                self.profiler.begin_step(x)
            except Exception as exc:
                self._profile_failed(exc)
        return None

    def _count_length(self, ids: Any, samples: int) -> None:
        """Add a micro-batch of token ids to ``samples_by_length`` under its padded length
        (a shape read); one whose length cannot be read is skipped."""
        try:
            length = sequence_length_of(ids, self._sample_dim)
        except Exception:  # an unusual tensor subclass: its length is left out, nothing else
            return
        self.samples_by_length[length] = self.samples_by_length.get(length, 0) + samples

    def _count_tokens(self, ids: Any, kwargs: dict | None) -> None:
        """A micro-batch of token ids: its real tokens are the attention mask's ones where
        the forward is given a mask of the ids' shape (padding left out), else every id.
        The mask's sum stays a device tensor (no synchronisation on the training thread):
        the sampler thread reads it once the step's CUDA event completed."""
        padded = ids.shape[0] * ids.shape[1]
        self.pending_padded_tokens += padded
        mask = kwargs.get("attention_mask") if kwargs else None
        if isinstance(mask, self._tensor) and mask.shape == ids.shape:
            self.pending_tokens = self.pending_tokens + mask.sum()
            self._masked = True
        else:
            self.pending_tokens = self.pending_tokens + padded

    def _note_input_wait(self) -> None:
        """The first forward of a step: the host time since the previous step ended (the
        optimizer step post-hook or ``mark()``) is the wait for the next batch (the loader,
        collation, host-to-device copies, ``zero_grad``); an evaluation forward in between
        restarts it (see :meth:`on_forward`). On CUDA the GPU may still be running
        the previous step meanwhile, so it is an upper bound of the GPU's idle time."""
        if self.steps >= self.input_wait_from_step:
            wait = self._perf() - self._last_mark_s
            self.input_wait_s += wait
            self.input_waits += 1
            self.recent_input_waits_s.append(wait)
        self._last_mark_s = None

    def _profile_failed(self, exc: BaseException) -> None:
        """The one-off profiler failed: drop the profile, keep counting steps."""
        self._stop_profiling("workload profiler", exc)

    def on_forward(self, module: Any, args: tuple, output: Any) -> None:
        """Model forward hook: closes the profiler's activation window; restarts the input
        wait after an evaluation forward between steps."""
        if self._last_mark_s is not None and not self._grad_enabled():
            # A forward of the tracked model with gradients off between a step's end and the
            # next step's first forward is an evaluation (nanoGPT's estimate_loss every
            # eval_interval iterations, a validation pass between epochs): model time, not
            # waiting for the next batch, so the wait starts again when it ends. Counted, it
            # reads as a starved input pipeline and the advice blames the DataLoader.
            self._last_mark_s = self._perf()
        if self.profile_step == self.steps and not self.broken and self.profiler.active:
            try:
                self.profiler.end_forward(output)
            except Exception as exc:
                self._profile_failed(exc)

    def _is_clock_optimizer(self, optimizer: Any) -> bool:
        """Whether ``optimizer``'s steps are the clock's; with none named, the first one to
        step becomes it (a second one is then ignored, with one warning)."""
        if self.optimizer is None:
            self.optimizer = optimizer
            if self.profiler is not None and self.profiler.optimizer is None:
                self.profiler.optimizer = optimizer
            return True
        if optimizer is self.optimizer:
            return True
        if not self._named_optimizer and self._warn is not None:
            self._warn("two-optimizers",
                       "two optimizers step (%s, %s) and track() was given none: training "
                       "steps are the first one's; pass track(model=..., optimizer=<the "
                       "optimizer that ends a training step>) (under Lightning: "
                       "GpuOptCallback(optimizer=...))",
                       type(self.optimizer).__name__, type(optimizer).__name__)
        return False

    def on_optimizer_step_pre(self, optimizer: Any, args: tuple,
                              kwargs: dict) -> tuple[tuple, dict] | None:
        """Global optimizer step pre-hook: of the forwards inside ``step()`` (closures), only
        the first can start a micro-batch; in the profiled step, the profiler sees every
        optimizer's step begin (and may wrap its closure: the returned args/kwargs)."""
        if self.broken:
            return None
        if optimizer is self.optimizer or (self.optimizer is None and not self.manual):
            self._in_step = True
            self._counted_in_step = False
        if self._compiled is not None:
            self._compiled.optimizer_step(True)
        profiler = self.profiler
        if self.steps == self.profile_step and profiler is not None and not profiler.done:
            try:
                return profiler.on_optimizer_step_pre(optimizer, args, kwargs)
            except Exception as exc:
                self._profile_failed(exc)
        return None

    def on_optimizer_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        """Global optimizer step post-hook."""
        if self.broken:
            return
        self._in_step = False
        if self._compiled is not None:
            self._compiled.optimizer_step(False)
        profiler = self.profiler
        if self.steps == self.profile_step and profiler is not None and not profiler.done:
            try:
                profiler.on_optimizer_step_post(optimizer)
            except Exception as exc:
                self._profile_failed(exc)
        if self.manual:
            return
        if not self._is_clock_optimizer(optimizer):
            return
        self.optimizer_steps += 1
        self._last_from_hook = True
        self._mark(0, 0)

    # -- loop_watch listener (training thread) -------------------------------------------------
    def on_backward(self) -> None:
        """A backward started: the next forward of the tracked model is a new micro-batch."""
        self._backward_seen = True

    def on_batch(self, batch: Any) -> None:
        """A ``DataLoader`` yielded ``batch`` (counted when gradients are recorded)."""
        if self.broken or not self._grad_enabled():
            return
        n = batch_size_of(batch, self._tensor)
        if n:
            self._data_seen = True
            self.pending_batches += 1
            self.pending_batch_samples += n

    def scaler_step_begin(self) -> int:
        return self.optimizer_steps

    def scaler_step_end(self, optimizer: Any, token: int | None) -> None:
        """After ``GradScaler.step(optimizer)``: no optimizer step since the begin means the
        scaler skipped it; that still ends a training step (one that did no update)."""
        if self.broken or self.manual or token is None or self.optimizer_steps != token:
            return
        self._in_step = False
        if not self._is_clock_optimizer(unwrap_optimizer(optimizer)):
            return
        self.skipped_steps += 1
        self._last_from_hook = True
        self._mark(0, 0)

    def begin(self, batch: Any = None) -> None:
        """A training step starts (``tracker.begin_step()``: a trainer whose step runs several
        optimizers). Steps are then marked by hand only, and the profiled step's profile
        starts here, so it covers the whole step whichever module runs first."""
        if self.broken:
            return
        self.manual = True
        profiler = self.profiler
        if self.steps != self.profile_step or profiler is None or profiler.active \
                or profiler.done:
            return
        try:
            profiler.begin_step(batch_tensor_of(batch, self._tensor))
        except Exception as exc:
            self._profile_failed(exc)

    def mark(self, samples: int | None = None, tokens: int | None = None) -> None:
        """A manual step boundary (``tracker.step()``); from now on the only step clock.

        Called right after an optimizer step the hook already counted (nothing ran since),
        it ends that step instead of adding an empty one.
        """
        if self.broken:
            return
        if (not self.manual and self._last_from_hook and self.pending_forwards == 0
                and self.steps > 0):
            self.manual = True
            if samples or tokens:
                self._amend_last(samples or 0, tokens or 0)
            return
        self.manual = True
        self._last_from_hook = False
        self._mark(samples or 0, tokens or 0)

    def _amend_last(self, samples: int, tokens: int) -> None:
        """Give the step just recorded the samples/tokens ``tracker.step()`` was told."""
        try:
            rec = self.records.pop()
        except IndexError:  # the sampler thread already read it
            return
        self.records.append((rec[0], samples or rec[1], tokens or rec[2], *rec[3:]))
        if samples:
            self.last_step_samples = samples
            if self.profile_samples is not None and self.profile_step == -1 \
                    and self.steps == self._profiled_index + 1:
                self.profile_samples = samples

    def check_model_ran(self) -> None:
        """One warning when steps ran but the tracked model's forward never did."""
        if (self._has_model and self.steps > 0 and self.total_calls == 0
                and self._warn is not None):
            self._warn("no-forward",
                       "the tracked model's forward never ran in %d steps (the loop calls "
                       "another module, e.g. a LightningModule's self.net(x) or one module "
                       "of a ModuleDict): no micro-batch and no FLOPs from it; pass "
                       "track(model=<the module the loop calls>), or micro_batch= and "
                       "samples_per_step=", self.steps)

    def _mark(self, samples: int, tokens: int) -> None:
        try:
            forwards = self.pending_forwards
            s = self.pending_samples
            batches = self.pending_batches
            if batches and forwards == batches:
                self._forwards_match_data = True
            if batches and (forwards == 0 or (forwards > batches
                                              and not self._forwards_match_data)):
                # the model ran more often than the data had batches, in every step so far
                # (a loader that fetches ahead gives a step fewer batches at an epoch's end),
                # or never: the data says what the step consumed, and its batches are the
                # micro-batches unless the forwards split them exactly (accumulation chunks)
                if s != self.pending_batch_samples:
                    forwards = batches
                s = self.pending_batch_samples
            elif not batches and not forwards and self._data_seen:
                s = self.last_step_samples  # it consumed a batch a loader fetched ahead
            s = samples or self._samples_per_step or s
            k = tokens if tokens else self.pending_tokens  # no bool() of a device tensor
            padded = self.pending_padded_tokens if self._masked else 0
            self.pending_padded_tokens = 0
            self._masked = False
            profiling = self.steps == self.profile_step and self.profiler.active
            if profiling:  # its finish (FLOP totals, traffic) belongs to the profiled step
                self._finish_profile(s, k, padded, tokens, forwards)
            t = self._perf()  # the boundary: after the tracker's own work at the step's end
            ev = None
            if self._event_cls is not None:
                ev = self._event_cls(enable_timing=True)
                ev.record()
            comm = self._comm_step() if self._comm_step is not None else None
            # a plain tuple, read as a StepRecord off the training thread: the garbage
            # collector untracks exact tuples of plain values, while it would traverse every
            # queued NamedTuple (up to maxlen of them) on each collection
            if len(self.records) == self.records.maxlen:
                self.dropped += 1  # the deque drops the oldest record: counted, warned about
            self.records.append((t, s, k, forwards, ev, comm))
            self.last_step_samples = s
            self.last_step_forwards = forwards
            self.pending_samples = self.pending_tokens = self.pending_forwards = 0
            self._last_mark_s = self._perf()
            self.pending_batches = self.pending_batch_samples = 0
            if profiling:
                self._profiled_index = self.steps
            self.steps += 1
            if self._compiled is not None:
                self._end_compiled_count(forwards)
            if self.steps == self.profile_step - 1 and self.profiler is not None:
                self._count_compiled()
        except Exception as exc:
            self._fail("step hook", exc)
            return
        if self.steps == 2 and self.total_calls == 0:
            self.check_model_ran()  # said while training, not only at the end

    def _finish_profile(self, samples: int, tokens: Any, padded: int, given_tokens: int,
                        forwards: int) -> None:
        """End the profiled step's profile, before its boundary is stamped: the FLOP totals
        and the traffic count take milliseconds to seconds, which stamped after would be read
        as the next step's, the first steady one."""
        self.profile_step = -1
        self.profile_samples = samples
        if padded and not given_tokens:
            try:  # the profiled step's one synchronisation for its real tokens
                self.profiler.padding_fraction = max(0.0, 1.0 - float(tokens) / padded)
            except Exception as exc:
                logger.debug("gpuopt: padding not measured: %s", exc)
        self.profile_forwards = forwards
        try:
            self.profiler.end_step()
        except Exception as exc:
            self._profile_failed(exc)
