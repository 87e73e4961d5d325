"""Measured (not guessed) communication time and bytes of DDP and FSDP collectives and of
all-to-alls (mixture-of-experts dispatch and combine).

DDP: a communication hook that wraps the default all-reduce and timestamps each bucket's
launch and completion. FSDP2 (``fully_shard``): timing wrappers installed through its public
``set_custom_all_gather`` / ``set_custom_reduce_scatter``. All-to-all: torch has no hook for
it, so while a job is tracked the ``ProcessGroup`` methods that ``dist.all_to_all_single`` and
``dist.all_to_all`` call (``all_to_all_single``, ``alltoall``) are wrapped
(:func:`meter_all_to_all`; however the user's code imported those functions, and on any
group: a ``DeviceMesh``'s ``ep`` group included); their bytes are the input's (what this rank
sends, its own slice included). The functional collectives
(``torch.distributed._functional_collectives``, torchtitan's expert-parallel dispatch) run
in C++ without passing through them and are not counted. All feed a :class:`CommMeter`,
whose cumulative totals the step clock stamps on each optimizer step's record.

Exposed communication is estimated as the tail after the last collective was launched: DDP
launches a bucket's all-reduce as soon as its gradients are ready, so the last launch marks
the end of backward compute, and whatever finishes after it is time the step waited on the
network. Timestamps are host ``perf_counter`` seconds taken when the collective's future
completes; on CUDA that is when the watchdog/stream callback observed completion, which can
lag the kernel by a little.
"""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger(__name__)


class CommMeter:
    """Thread-safe accumulator; collectives complete on communication threads.

    Totals are cumulative since construction. The training thread closes each step with
    :meth:`end_step` (one lock, one tuple: the step hook stays cheap), which adds that step's
    exposed tail to the cumulative exposed time and returns the cumulative totals; per-step
    figures are differences of successive totals, computed off the training thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._time_s = 0.0
        self._bytes = 0
        self._exposed_s = 0.0
        self._last_launch = 0.0  # this step's latest launch (0 = none yet)
        self._last_end = 0.0  # this step's latest completion

    def launched(self) -> float:
        """Note a launch; returns its timestamp for :meth:`completed`."""
        now = time.perf_counter()
        with self._lock:
            if now > self._last_launch:
                self._last_launch = now
        return now

    def completed(self, launched_at: float, nbytes: int) -> None:
        now = time.perf_counter()
        with self._lock:
            self._count += 1
            self._time_s += now - launched_at
            self._bytes += int(nbytes)
            if now > self._last_end:
                self._last_end = now

    def end_step(self) -> tuple[int, float, int, float]:
        """Close a step: the cumulative totals, in :class:`~..steps.CommTotals`' field order (a
        plain tuple on the step hook; the aggregator reads it as ``CommTotals``)."""
        with self._lock:
            if self._last_launch and self._last_end > self._last_launch:
                self._exposed_s += self._last_end - self._last_launch
            self._last_launch = self._last_end = 0.0
            return (self._count, self._time_s, self._bytes, self._exposed_s)


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _ddp_hook(meter: CommMeter):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def timed_allreduce(process_group, bucket):
        nbytes = _nbytes(bucket.buffer())
        start = meter.launched()
        fut = allreduce_hook(process_group, bucket)

        def done(f):
            meter.completed(start, nbytes)
            return f.value()

        return fut.then(done)

    return timed_allreduce


def _fsdp_comms(meter: CommMeter):
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        DefaultAllGather,
        DefaultReduceScatter,
    )

    def _timed(work, start: float, nbytes: int):
        if work is None:  # synchronous: already complete
            meter.completed(start, nbytes)
            return work
        work.get_future().then(lambda _f: meter.completed(start, nbytes))
        return work

    class TimedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            start = meter.launched()
            work = super().__call__(output_tensor, input_tensor, group, async_op=async_op)
            return _timed(work, start, _nbytes(output_tensor))

    class TimedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            start = meter.launched()
            work = super().__call__(output_tensor, input_tensor, group, op, async_op=async_op)
            return _timed(work, start, _nbytes(input_tensor))

    return TimedAllGather(), TimedReduceScatter()


def instrument(model, meter: CommMeter) -> str:
    """Attach timing to ``model``'s collectives; returns the strategy seen.

    Returns ``"ddp"`` for ``DistributedDataParallel``, ``"fsdp"`` for a ``fully_shard`` model
    and ``"single"`` for anything else (nothing attached). Never raises: a PyTorch that
    refuses the hook leaves the model untouched and the strategy still detected.
    """
    if model is None:
        return "single"
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception:  # torch without distributed support
        return "single"
    if isinstance(model, DistributedDataParallel):
        try:
            model.register_comm_hook(None, _ddp_hook(meter))
        except Exception as exc:  # e.g. a hook the user registered already
            logger.warning("gpuopt: cannot time DDP all-reduce (%s); communication not measured",
                           exc)
        return "ddp"
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:
        return "single"
    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not fsdp_modules:
        return "single"
    all_gather, reduce_scatter = _fsdp_comms(meter)
    for module in fsdp_modules:
        try:
            module.set_custom_all_gather(all_gather)
            module.set_custom_reduce_scatter(reduce_scatter)
        except Exception as exc:
            logger.warning("gpuopt: cannot time FSDP collectives (%s)", exc)
            break
    return "fsdp"


#: ``ProcessGroup`` methods behind ``dist.all_to_all_single`` / ``dist.all_to_all`` -> which
#: positional argument holds the input (a tensor, or a list of them).
_ALL_TO_ALL = {"all_to_all_single": 1, "alltoall": 1}
_a2a_lock = threading.Lock()
_a2a_meters: list[CommMeter] = []  # the newest is metered into
#: name -> the class's own attribute (pybind's ``instancemethod``, which binds ``self``; a
#: plain ``getattr`` on the class returns the unbound builtin), None where it was inherited
_a2a_originals: dict[str, object] = {}


def _input_bytes(value) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(t) for t in value)
    return _nbytes(value)


def _timed_all_to_all(name: str, original):
    position = _ALL_TO_ALL[name]

    def timed(self, *args, **kwargs):
        meter = _a2a_meters[-1] if _a2a_meters else None
        if meter is None or len(args) <= position:
            return original(self, *args, **kwargs)
        nbytes = _input_bytes(args[position])
        start = meter.launched()
        work = original(self, *args, **kwargs)
        try:
            work.get_future().then(lambda _f: meter.completed(start, nbytes))
        except Exception:  # a backend without futures: count it, launch time only
            meter.completed(start, nbytes)
        return work

    timed.__wrapped__ = original  # type: ignore[attr-defined]
    return timed


def meter_all_to_all(meter: CommMeter) -> bool:
    """Count every all-to-all of this process into ``meter`` until
    :func:`release_all_to_all` (the newest meter wins while several are held). Returns False
    when torch has no process groups to wrap. Never raises."""
    try:
        from torch.distributed import ProcessGroup
    except Exception:  # torch without distributed support
        return False
    with _a2a_lock:
        if not _a2a_originals:
            try:
                for name in _ALL_TO_ALL:
                    _a2a_originals[name] = ProcessGroup.__dict__.get(name)
                for name in _ALL_TO_ALL:
                    setattr(ProcessGroup, name,
                            _timed_all_to_all(name, getattr(ProcessGroup, name)))
            except Exception as exc:  # a torch whose ProcessGroup cannot be wrapped
                _restore(ProcessGroup)
                logger.warning("gpuopt: cannot time all-to-all (%s); not measured", exc)
                return False
        _a2a_meters.append(meter)
    return True


def _restore(process_group: type) -> None:
    for name, original in _a2a_originals.items():
        if original is not None:
            setattr(process_group, name, original)
        elif name in process_group.__dict__:
            delattr(process_group, name)  # inherited: the base class's again
    _a2a_originals.clear()


def release_all_to_all(meter: CommMeter) -> None:
    """Stop counting all-to-alls into ``meter``; the last release restores torch's
    methods. Never raises."""
    with _a2a_lock:
        if meter in _a2a_meters:
            _a2a_meters.remove(meter)
        if _a2a_meters or not _a2a_originals:
            return
        try:
            from torch.distributed import ProcessGroup

            _restore(ProcessGroup)
        except Exception as exc:
            logger.debug("gpuopt: all-to-all timing not removed: %s", exc)
            _a2a_originals.clear()
