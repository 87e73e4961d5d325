"""Measure the host time apex AMP O1's Python wrappers add per wrapped call, and count the
calls a Tacotron 2 training step makes through them.

apex O1 (``amp.initialize(..., opt_level="O1")``, which DeepLearningExamples' Tacotron 2 and
WaveGlow ``train.py`` run in the tables' PyTorch 20.06 container) replaces the functions of
its lists (``apex/amp/lists``: torch's, ``torch.Tensor``'s and ``torch.nn.functional``'s
FP16, FP32, promote and sequence lists, and the RNN cells) by Python functions
(``apex/amp/wrap.py``) that, on every call, check that amp is active, look each fp32
``Parameter`` argument up in the cast cache (``utils.cached_cast``, with its autograd-parent
checks), test every argument for a floating tensor and ask its type string
(``utils.casted_args``, ``maybe_half``/``maybe_float``, ``collect_fp_tensor_types``), then call
the original. The cast itself is a kernel of its own (counted with autocast's casts in
``amp_kernels_per_micro_step``); what is timed here is the rest, host time only.

This script re-implements those checks (the CUDA path: no early return for a CPU tensor, and
the cast that would follow is left out) and times, side by side in one run, each
representative call plain and wrapped, together with a plain eager operator (a 2 x 64 ``+`` with
autograd recording, Python binding to kernel), the unit the model charges each dispatched
operator (``compute.KERNEL_DISPATCH_S``). The ratio extra ÷ eager operator is what carries to
another host CPU. It then patches the lists into the Tacotron 2-shaped model of
``measure_tacotron2_kernels.py`` (DeepLearningExamples' ``softmax`` moved to the FP16 list) and
counts the wrapped calls of one training step against the dispatched operators.

Run: ``OMP_NUM_THREADS=1 python benchmarks/workloads/measure_apex_o1_overhead.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as nnf

# apex/amp/lists (torch_overrides, tensor_overrides, functional_overrides): the names O1 wraps.
TORCH_FP16 = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "conv_tbc", "prelu", "addmm", "addmv", "addr", "matmul", "mm",
              "mv", "addbmm", "baddbmm", "bmm"]
TORCH_FP32 = ["acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2",
              "reciprocal", "rsqrt", "sinh", "tan", "pow", "cumprod", "cumsum", "dist", "norm",
              "prod", "std", "sum", "var", "renorm"]
TORCH_PROMOTE = ["addcdiv", "addcmul", "atan2", "cross", "bilinear", "dot", "add", "div", "mul",
                 "eq", "equal", "ge", "gt", "le", "lt", "ne"]
TORCH_SEQUENCE = ["cat", "stack"]
TENSOR_FP16 = ["__matmul__"]
TENSOR_FP32 = ["__ipow__", "__pow__", "__rpow__", "cpu"]
TENSOR_PROMOTE = ["__add__", "__div__", "__eq__", "__ge__", "__gt__", "__iadd__", "__idiv__",
                  "__imul__", "__isub__", "__itruediv__", "__le__", "__lt__", "__mul__",
                  "__ne__", "__radd__", "__rdiv__", "__rmul__", "__rsub__", "__rtruediv__",
                  "__sub__", "__truediv__"]
# DeepLearningExamples' Tacotron 2 train.py moves softmax from the FP32 list to the FP16 one.
FUNCTIONAL_FP16 = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                   "conv_transpose3d", "conv_tbc", "linear", "softmax"]
FUNCTIONAL_FP32 = ["interpolate", "softplus", "softmin", "log_softmax", "layer_norm",
                   "group_norm", "local_response_norm", "normalize", "cosine_similarity",
                   "poisson_nll_loss", "cosine_embedding_loss", "cross_entropy",
                   "hinge_embedding_loss", "kl_div", "l1_loss", "mse_loss",
                   "margin_ranking_loss", "multilabel_margin_loss",
                   "multilabel_soft_margin_loss", "multi_margin_loss", "nll_loss",
                   "binary_cross_entropy_with_logits", "smooth_l1_loss", "soft_margin_loss",
                   "triplet_margin_loss"]
RNN_CELLS = ["lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"]


class Handle:
    """amp's handle: on or off, and the cast cache of one iteration."""

    def __init__(self) -> None:
        self.active = True
        self.cache: dict = {}
        self.calls: dict[str, int] = {}

    def count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def is_active(self) -> bool:
        return self.active


def _nested(x) -> bool:
    return isinstance(x, (tuple, list))


def _fp_tensor(x) -> bool:
    if _nested(x):
        return all(_fp_tensor(y) for y in x)
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _type_name(x) -> str:
    return x.type().split(".")[-1]


def _cast_to(name: str):
    """apex's maybe_half / maybe_float on the CUDA path (the tensor's device and type asked;
    the conversion, a kernel of its own, left out)."""
    def cast(x):
        if _nested(x):
            return type(x)(cast(y) for y in x)
        x.is_cuda  # noqa: B018 (apex tests it before the type)
        if _type_name(x) == name:
            return x
        return x
    return cast


def _cacheable(x) -> bool:
    if _nested(x):
        return all(_cacheable(y) for y in x)
    return isinstance(x, torch.nn.Parameter) and _type_name(x) == "FloatTensor"


def _cached(cast, x, cache: dict):
    """apex's cached_cast: a hit checks that the cached copy's autograd parent is ``x``."""
    if _nested(x):
        return type(x)(_cached(cast, y, cache) for y in x)
    if x in cache:
        hit = cache[x]
        linked = False
        if x.requires_grad and hit.requires_grad:
            linked = len(hit.grad_fn.next_functions) > 1
            if linked and hit.grad_fn.next_functions[1][0].variable is not x:
                raise RuntimeError("cache parent mismatch")
        stale = ((torch.is_grad_enabled() and x.requires_grad != hit.requires_grad)
                 or (x.requires_grad and hit.requires_grad and not linked))
        if not stale:
            return hit
        del cache[x]
    copy = torch.zeros_like(x) + x  # an fp32 stand-in whose grad_fn has x as parent [1]
    cache[x] = copy
    return copy


def _casted(cast, args, kwargs):
    out = [cast(x) if _fp_tensor(x) else x for x in args]
    for k, v in kwargs.items():
        if _fp_tensor(v):
            kwargs[k] = cast(v)
    return out


def cast_wrapper(orig, cast, handle: Handle, caching: bool):
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        handle.count(orig.__name__)
        if not handle.is_active():
            return orig(*args, **kwargs)
        if caching:
            args = list(args)
            for i, a in enumerate(args):
                if _cacheable(a):
                    args[i] = _cached(cast, a, handle.cache)
            for k, v in kwargs.items():
                if _cacheable(v):
                    kwargs[k] = _cached(cast, v, handle.cache)
        return orig(*_casted(cast, args, kwargs), **kwargs)
    return wrapper


def _types(args, kwargs) -> set:
    found: set = set()

    def collect(x):
        if _nested(x):
            for y in x:
                collect(y)
        else:
            found.add(_type_name(x))
    for x in itertools.chain(args, kwargs.values()):
        if _fp_tensor(x):
            collect(x)
    return found


def promote_wrapper(orig, handle: Handle):
    to_float = _cast_to("FloatTensor")

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        handle.count(orig.__name__)
        types = _types(args, kwargs)
        if len(types) <= 1:
            return orig(*args, **kwargs)
        return orig(*_casted(to_float, args, kwargs), **kwargs)
    return wrapper


def sequence_wrapper(orig, handle: Handle):
    to_float = _cast_to("FloatTensor")

    @functools.wraps(orig)
    def wrapper(seq, *args, **kwargs):
        handle.count(orig.__name__)
        types = {_type_name(x) for x in seq}
        if len(types) <= 1:
            return orig(seq, *args, **kwargs)
        return orig(_casted(to_float, seq, {}), *args, **kwargs)
    return wrapper


@contextlib.contextmanager
def apex_o1_patched(handle: Handle):
    """The O1 lists patched with the wrappers, restored on exit."""
    import torch.nn.modules.rnn as rnn

    half, single = _cast_to("HalfTensor"), _cast_to("FloatTensor")
    plan = []
    for mod, names, make in (
            (torch, TORCH_FP16, lambda f: cast_wrapper(f, half, handle, True)),
            (torch, TORCH_FP32, lambda f: cast_wrapper(f, single, handle, False)),
            (torch, TORCH_PROMOTE, lambda f: promote_wrapper(f, handle)),
            (torch, TORCH_SEQUENCE, lambda f: sequence_wrapper(f, handle)),
            (torch.Tensor, TENSOR_FP16 + [n for n in TORCH_FP16 if hasattr(torch.Tensor, n)],
             lambda f: cast_wrapper(f, half, handle, True)),
            (torch.Tensor, TENSOR_FP32 + [n for n in TORCH_FP32 if hasattr(torch.Tensor, n)],
             lambda f: cast_wrapper(f, single, handle, False)),
            (torch.Tensor, TENSOR_PROMOTE + [n for n in TORCH_PROMOTE
                                             if hasattr(torch.Tensor, n)],
             lambda f: promote_wrapper(f, handle)),
            (nnf, FUNCTIONAL_FP16, lambda f: cast_wrapper(f, half, handle, True)),
            (nnf, FUNCTIONAL_FP32, lambda f: cast_wrapper(f, single, handle, False)),
            (rnn._VF, RNN_CELLS, lambda f: cast_wrapper(f, half, handle, True))):
        for name in names:
            if hasattr(mod, name):
                plan.append((mod, name, getattr(mod, name), make))
    for mod, name, orig, make in plan:
        setattr(mod, name, make(orig))
    try:
        yield
    finally:
        for mod, name, orig, _ in reversed(plan):
            setattr(mod, name, orig)


def _time_us(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


def per_call_costs(reps: int, rounds: int) -> tuple[float, dict[str, tuple[float, float]]]:
    """(a plain eager operator's µs, {call: (plain µs, wrapped µs)}): the fastest of
    ``rounds`` interleaved rounds of ``reps`` calls each (the least disturbed by other work on
    the machine), the Tacotron 2 decoder's call signatures on tiny tensors (the wrappers' work
    does not depend on the sizes; tiny, the time is the host's and not the CPU kernels')."""
    torch.manual_seed(0)
    b = 2
    x = torch.randn(b, 16, requires_grad=True)
    lin = torch.nn.Linear(16, 8)
    cell = torch.nn.LSTMCell(8, 16)
    inp = torch.randn(b, 8, requires_grad=True)
    h, c = torch.randn(b, 16), torch.randn(b, 16)
    p, q = torch.randn(b, 64, requires_grad=True), torch.randn(b, 64, requires_grad=True)
    e = torch.randn(b, 16, requires_grad=True)
    w3, m3 = torch.randn(b, 1, 16, requires_grad=True), torch.randn(b, 16, 8)
    calls = {
        "F.linear (weight, bias cached)": lambda: lin(x),
        "LSTMCell (4 weights cached)": lambda: cell(inp, (h, c)),
        "torch.cat of two": lambda: torch.cat((p, q), -1),
        "Tensor.__add__": lambda: p + q,
        "F.softmax": lambda: nnf.softmax(e, dim=1),
        "torch.bmm": lambda: torch.bmm(w3, m3),
    }
    handle = Handle()
    eager_ref, plain, wrapped = [], {k: [] for k in calls}, {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():  # each call plain, wrapped, then the unit, back to back
            plain[k].append(_time_us(fn, reps))
            with apex_o1_patched(handle):
                wrapped[k].append(_time_us(fn, reps))
            eager_ref.append(_time_us(lambda: p + q, reps))
        handle.cache.clear()
    return min(eager_ref), {k: (min(plain[k]), min(wrapped[k])) for k in calls}


def tacotron2_calls(frames: int) -> tuple[dict[str, int], int]:
    """({wrapped function: calls through the O1 wrappers}, operators the profiler counts) of
    one training step of the Tacotron 2-shaped model at ``frames`` mel frames (batch 2, text
    150)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from measure_tacotron2_kernels import N_MEL, N_SYMBOLS, Tacotron2Shaped, loss_fn

    from mlflow_gpuopt.tracking.dispatch_count import kernel_count_mode

    torch.manual_seed(0)
    model = Tacotron2Shaped().train()
    text = torch.randint(0, N_SYMBOLS, (2, 150))
    mels = torch.randn(2, N_MEL, frames)
    gate = torch.zeros(2, frames)
    handle = Handle()
    with kernel_count_mode() as mode:
        with apex_o1_patched(handle):
            loss = loss_fn(model(text, mels), mels, gate)
        loss.backward()
    return handle.calls, mode.count


#: The timed call standing for each wrapped function of the step (same wrapper, same kind of
#: arguments: cached weights, a sequence, two activations, one activation); others take the
#: median of the timed calls.
STANDS_FOR = {"linear": "F.linear (weight, bias cached)",
              "conv1d": "F.linear (weight, bias cached)",
              "lstm_cell": "LSTMCell (4 weights cached)", "cat": "torch.cat of two",
              "stack": "torch.cat of two", "__add__": "Tensor.__add__", "__mul__": "Tensor.__add__",
              "__sub__": "Tensor.__add__", "__radd__": "Tensor.__add__", "add": "Tensor.__add__",
              "softmax": "F.softmax", "mse_loss": "torch.bmm",
              "binary_cross_entropy_with_logits": "torch.bmm", "bmm": "torch.bmm"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000, help="calls per timing")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median)")
    ap.add_argument("--frames", type=int, default=570, help="mel frames of the counted step")
    a = ap.parse_args()
    eager, costs = per_call_costs(a.reps, a.rounds)
    print(f"plain eager operator (2x64 +, autograd): {eager:.2f} us")
    extras = []
    for k, (plain, wrapped) in costs.items():
        extras.append((wrapped - plain) / eager)
        print(f"  {k:32s} plain {plain:7.2f} us  wrapped {wrapped:7.2f} us  "
              f"extra {wrapped - plain:6.2f} us = {(wrapped - plain) / eager:.2f} eager operators")
    median = statistics.median(extras)
    by_call = {k: (w - p) / eager for k, (p, w) in costs.items()}
    calls, ops = tacotron2_calls(a.frames)
    n = sum(calls.values())
    extra = sum(c * by_call.get(STANDS_FOR.get(name, ""), median) for name, c in calls.items())
    print(f"Tacotron 2 step ({a.frames} frames): {n} wrapped calls, {ops} operators "
          f"({n / ops:.3f} of them; {n / a.frames:.1f} calls per frame): "
          + ", ".join(f"{k} {v}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1])))
    print(f"extra host time per wrapped call: median {median:.2f}, the step's calls' mean "
          f"{extra / n:.2f} eager operators; per counted operator {extra / ops:.3f}")


if __name__ == "__main__":
    main()
