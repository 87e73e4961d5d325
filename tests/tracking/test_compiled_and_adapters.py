"""torch.compile on a CPU (Inductor's C++ kernels) and LoRA adapters: what the profile says
the compiled step launches, the workload's name behind wrappers, trainable parameters and
the adapters. Expected figures are counted here, independently of the tracker."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from support.tracking import logged

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.tracking.compiled import generated_kernel_calls
from mlflow_gpuopt.tracking.dispatch_count import is_kernel_op

OPTS = {"interval_s": 0.1, "print_summary": False, "warmup_steps": 1}
D_IN, H, D_OUT, B = 16, 32, 4, 8


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, H), nn.GELU(), nn.Linear(H, H), nn.GELU(),
                         nn.Linear(H, D_OUT))


def micro_step(model):
    x, y = torch.randn(B, D_IN), torch.randint(0, D_OUT, (B,))
    F.cross_entropy(model(x), y).backward()


def tracked_run(model, steps=4):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with gpuopt.track(model, opt, **OPTS) as t:
        for _ in range(steps):
            micro_step(model)
            opt.step()
            opt.zero_grad()
    return t, opt


def test_generated_kernel_calls_reads_the_wrapper_call():
    source = '''
cpp_fused_gelu_0 = async_compile.cpp_pybinding(['float*'], r"""...""")
triton_poi_fused_1 = async_compile.triton('triton_poi_fused_1', """...""")

class Runner:
    def call(self, args):
        buf0 = empty_strided_cpu((8, 32), (32, 1), torch.float32)
        extern_kernels.addmm(a, b, c, out=buf0)
        cpp_fused_gelu_0(buf0, buf1)
        triton_poi_fused_1.run(buf1, stream=stream0)
        cpp_fused_gelu_0(buf1, buf2)
        return (buf2, )

runner = Runner(partitions=[])
cpp_fused_gelu_0(x)
'''
    # two calls of the C++ kernel and one Triton launch inside call(); the extern kernel
    # dispatches (the mode counts it) and the call after call() is not in it
    assert generated_kernel_calls(source) == 3
    assert generated_kernel_calls("def call(self, args):\n    return ()\n") == 0


class _Seen(torch.utils._python_dispatch.TorchDispatchMode):
    """The test's own count of dispatched kernel operators, letting compiled graphs run."""

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_kernel_op(func):
            self.ops += 1
        return func(*args, **(kwargs or {}))


def launched_by_compiled_micro_step(model) -> int:
    """One compiled forward + backward, counted from outside: operators that go through the
    dispatcher, plus every call of an Inductor-generated kernel, seen by wrapping each kernel
    function of the loaded wrapper modules (their ``call()`` looks them up at each call)."""
    from torch._inductor.codecache import PyCodeCache

    calls = 0
    patched = []

    def counting(fn):
        def kernel(*args, **kwargs):
            nonlocal calls
            calls += 1
            return fn(*args, **kwargs)
        return kernel

    for mod in PyCodeCache.modules:
        for name in dir(mod):
            if name.startswith("cpp_fused") and callable(getattr(mod, name)):
                patched.append((mod, name, getattr(mod, name)))
                setattr(mod, name, counting(getattr(mod, name)))
    assert patched, "no generated kernels loaded"
    x, y = torch.randn(B, D_IN), torch.randint(0, D_OUT, (B,))
    seen = _Seen()
    try:
        with seen:
            F.cross_entropy(model(x), y).backward()
    finally:
        for mod, name, fn in patched:
            setattr(mod, name, fn)
    model.zero_grad()
    assert calls, "the model ran eagerly: no generated kernel was called"
    return seen.ops + calls


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")),
                    reason="Inductor's CPU kernels need a C++ compiler")
def test_compiled_model_is_measured_as_compiled(tracking_uri):
    eager, _ = tracked_run(mlp())
    eager_params, _ = logged(eager.run_id)
    assert "gpuopt.compiled" not in eager_params
    eager_kernels = float(eager_params["gpuopt.kernels_per_micro_step"])

    model = mlp()
    compiled = torch.compile(model)
    t, opt = tracked_run(compiled)
    params, _ = logged(t.run_id)
    assert params["gpuopt.compiled"] == "true"
    assert params["gpuopt.model_wrapper"] == "compiled"
    assert t.profile.name == "Sequential"  # the user's class, not OptimizedModule
    # the profiled step ran eagerly (under the profiler's modes): the eager count; and the
    # model runs compiled after it (launched_by_compiled_micro_step checks)
    assert float(params["gpuopt.eager_kernels_per_micro_step"]) == pytest.approx(eager_kernels)
    kernels = float(params["gpuopt.kernels_per_micro_step"])
    assert kernels == pytest.approx(launched_by_compiled_micro_step(compiled))
    assert kernels < eager_kernels  # Inductor fused the element-wise operators
    # the FLOPs are the model's, compiled or not
    assert params["gpuopt.flops_per_sample"] == eager_params["gpuopt.flops_per_sample"]


# -- LoRA: a frozen base layer with PEFT's lora_A / lora_B structure ------------------------

RANK = 4


class LoraLinear(nn.Module):
    """PEFT's ``lora.Linear`` shape (PEFT is not installed here): the base layer frozen,
    ``lora_B(lora_A(x))`` scaled and added."""

    def __init__(self, n_in, n_out, rank=RANK, alpha=8):
        super().__init__()
        self.base_layer = nn.Linear(n_in, n_out)
        self.base_layer.requires_grad_(False)
        self.lora_A = nn.Linear(n_in, rank, bias=False)
        self.lora_B = nn.Linear(rank, n_out, bias=False)
        self.scaling = alpha / rank

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


def lora_flops_per_sample() -> int:
    """By hand, 2 per multiply-add. Layer 1 gets data without gradients: its base layer only
    runs forward (frozen weight, no input gradient); lora_A computes its weight's gradient,
    lora_B its weight's and its input's. Layer 2's input records gradients (layer 1's adapter
    output does): its base layer computes the input's gradient only."""
    def mm(i, o):
        return 2 * i * o

    layer1 = mm(D_IN, H) + 2 * mm(D_IN, RANK) + 3 * mm(RANK, H)
    layer2 = 2 * mm(H, D_OUT) + 3 * mm(H, RANK) + 3 * mm(RANK, D_OUT)
    return layer1 + layer2


def test_lora_profile_counts_trainable_params_and_names_the_adapter(tracking_uri):
    torch.manual_seed(0)
    model = nn.Sequential(LoraLinear(D_IN, H), nn.ReLU(), LoraLinear(H, D_OUT))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with gpuopt.track(model, opt, **OPTS) as t:
        for _ in range(4):
            micro_step(model)
            opt.step()
            opt.zero_grad()
    params, _ = logged(t.run_id)
    base = (D_IN * H + H) + (H * D_OUT + D_OUT)
    adapters = (D_IN * RANK + RANK * H) + (H * RANK + RANK * D_OUT)
    assert int(params["gpuopt.params"]) == base + adapters
    assert int(params["gpuopt.trainable_params"]) == adapters
    assert params["gpuopt.adapter"] == "lora"
    assert float(params["gpuopt.flops_per_sample"]) == pytest.approx(lora_flops_per_sample())
    # AdamW: two fp32 moments per trainable parameter (and a step counter per tensor)
    assert t.profile.optimizer_state_bytes_per_param == pytest.approx(8.0, rel=0.01)


def test_plain_model_has_no_adapter(tracking_uri):
    t, _ = tracked_run(mlp())
    params, _ = logged(t.run_id)
    assert "gpuopt.adapter" not in params
    assert params["gpuopt.params"] == params["gpuopt.trainable_params"]
