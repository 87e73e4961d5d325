"""What a ``torch.compile``d training step launches.

Under the profiler's dispatch modes Dynamo runs the model eagerly (a dispatch mode must see
every operator), so the profiled step's operator count is the eager one. The compiled step is
counted on the step before the profiled one, from its first forward to its end, by a mode
that declares ``ignore_compile_internals``: Dynamo then runs the compiled graphs, and the
mode sees the operators dispatched outside them (the loss outside the model, gradient
accumulation, graph breaks) and the extern kernels and ATen fallbacks the graphs call
(``extern_kernels.mm``...). The kernels Inductor generated (a C++ function on a CPU, a
Triton kernel on a GPU) dispatch nothing: each call of a graph (``CompiledFxGraph``, a
forward or a backward) adds the generated-kernel calls of its wrapper's ``call()``, read
from its source. Operators inside an optimizer's ``step()`` are the optimizer's and left
out (closures included: a compiled Lightning step under automatic optimization is counted
without its last micro-batch). See docs/metrics.md (``gpuopt.kernels_per_micro_step``).
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from typing import Any

logger = logging.getLogger(__name__)

_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.\w+\(", re.MULTILINE)
_CALL = re.compile(r"^\s*(\w+)(?:\.run)?\(")


def generated_kernel_calls(source: str) -> int:
    """Calls of Inductor-generated kernels in one call of a wrapper module (its source):
    the statements of ``call()`` that run a kernel the module defines with
    ``async_compile`` (extern kernels and ATen fallbacks dispatch, and are counted by the
    mode)."""
    kernels = set(_KERNEL_DEF.findall(source))
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("def call(")),
                 None)
    if start is None or not kernels:
        return 0
    indent = len(lines[start]) - len(lines[start].lstrip())
    calls = 0
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break  # the end of call()'s body
        m = _CALL.match(line)
        if m is not None and m.group(1) in kernels:
            calls += 1
    return calls


@functools.cache
def _mode_class() -> type:
    """A kernel-counting dispatch mode that lets compiled graphs run compiled."""
    from mlflow_gpuopt.tracking.dispatch_count import kernel_count_mode_class

    class CompiledStepMode(kernel_count_mode_class()):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

    return CompiledStepMode


class CompiledLaunchCounter:
    """Counts what a step launches through compiled graphs: :meth:`start` at the step's
    start, :meth:`begin` at its first forward, :meth:`stop` at its end; ``launches``
    (outside optimizer steps) and ``graphs`` (compiled graph calls seen; 0: nothing
    compiled ran, the count means nothing)."""

    def __init__(self) -> None:
        self.generated = 0  # generated-kernel calls of the graphs
        self.graphs = 0
        self.in_optimizer = False  # set by the step clock's optimizer hooks
        self._cls: Any = None
        self._orig: Any = None
        self._mode: Any = None
        self._optimizer_start: int | None = None
        self._optimizer_ops = 0

    @property
    def launches(self) -> int:
        counted = self._mode.count if self._mode is not None else 0
        return counted - self._optimizer_ops + self.generated

    def start(self) -> bool:
        """Patch Inductor's graph call (``False``: nothing was compiled in this process, so
        Inductor is not even imported — importing it takes seconds — or torch has none)."""
        if "torch._dynamo" not in sys.modules:
            return False
        try:
            from torch._inductor.output_code import CompiledFxGraph
        except Exception as exc:  # an old or stripped torch: nothing compiled to count
            logger.debug("gpuopt: no Inductor graphs to count: %s", exc)
            return False
        orig = CompiledFxGraph.__dict__["__call__"]
        counter = self

        @functools.wraps(orig)
        def __call__(graph: Any, inputs: Any) -> Any:  # noqa: N807
            if counter._mode is not None and not counter.in_optimizer:
                try:
                    counter.graphs += 1
                    counter.generated += _generated_calls_of(graph)
                except Exception as exc:  # never break training
                    logger.debug("gpuopt: compiled graph not counted: %s", exc)
            return orig(graph, inputs)

        self._cls, self._orig = CompiledFxGraph, orig
        CompiledFxGraph.__call__ = __call__
        return True

    def begin(self) -> None:
        """The step's first forward: count operators from here."""
        if self._mode is None and self._cls is not None:
            self._mode = _mode_class()()
            self._mode.__enter__()

    def optimizer_step(self, starts: bool) -> None:
        """An optimizer's ``step()`` starts (``True``) or ends: its operators are not the
        micro-steps'."""
        self.in_optimizer = starts
        if self._mode is None:
            return
        if starts:
            self._optimizer_start = self._mode.count
        elif self._optimizer_start is not None:
            self._optimizer_ops += self._mode.count - self._optimizer_start
            self._optimizer_start = None

    def stop(self) -> None:
        """Leave the mode and undo the patch (idempotent)."""
        mode = self._mode
        if mode is not None and not getattr(mode, "left", False):
            mode.left = True
            mode.__exit__(None, None, None)
        cls, orig, self._cls, self._orig = self._cls, self._orig, None, None
        if cls is not None:
            cls.__call__ = orig


def _generated_calls_of(graph: Any) -> int:
    cached = getattr(graph, "_gpuopt_generated_calls", None)
    if cached is None:
        cached = generated_kernel_calls(getattr(graph, "source_code", "") or "")
        try:
            graph._gpuopt_generated_calls = cached
        except Exception:  # a slotted graph object: parsed again next time
            logger.debug("gpuopt: generated-kernel count of a graph not cached")
    return cached
