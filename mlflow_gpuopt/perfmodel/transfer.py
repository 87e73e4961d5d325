"""Carry a proxy model's measured efficiency to a bigger model of the same family.

An observation belongs to one workload, so :func:`transfer` takes the predictor fitted to the
proxy's runs (a 1B measured for a 70B, on the big run's GPUs and software) and returns one
for the target workload: the fit's scales of the stack (compute, batch-independent,
optimizer, communication and overlap) and its spread are **carried**; the roofline, memory,
parallel traffic, bubble and recomputation are **recomputed** from the target's own shape;
the kernels per micro-step and the latency-bound work are **rescaled** (per layer, per
FLOP). Nothing of the proxy's memory carries, and a proxy measured only on CPUs carries its
dispatch count but no GPU efficiency. The interval widens with the size ratio
(:func:`size_sigma`, from ``uncertainty.TRANSFORMER_MFU_SPREAD`` over ``MFU_SPREAD_DECADES``).
Why each part is carried or not: docs/models.md#transfer-from-a-proxy-run.

Pure: no I/O, no MLflow, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mlflow_gpuopt.perfmodel import uncertainty as unc
from mlflow_gpuopt.perfmodel.compute import architecture
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.fitting import FitResult
from mlflow_gpuopt.perfmodel.predictor import ObservedFit, Predictor, validate_workload
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.types import Workload

#: Decades of model size the within-group MFU spreads of ``TRANSFORMER_MFU_SPREAD`` were
#: measured over (its derivation set, ``benchmarks/bench_llm.py``): Hopper bf16 Megatron-LM
#: 2024 GPT 1.7B-462B (2.43), Hopper FP8 NeMo 24.07 5B-340B (1.83), Ampere bf16 torchtitan
#: Llama 2 13B-70B (0.73). Blackwell takes Hopper's, as the spreads do.
MFU_SPREAD_DECADES = {("ampere", "bf16"): math.log10(70 / 13),
                      ("hopper", "bf16"): math.log10(462 / 1.7),
                      ("hopper", "fp8"): math.log10(340 / 5),
                      ("blackwell", "bf16"): math.log10(462 / 1.7),
                      ("blackwell", "fp8"): math.log10(340 / 5)}
#: A group without a measured spread (another GPU generation, a model not described as a
#: transformer): the generic cross-GPU width ``uncertainty.SIGMA_OTHER_GPU`` per model over
#: two decades.
DEFAULT_SPREAD = unc.SIGMA_OTHER_GPU
DEFAULT_DECADES = 2.0


@dataclass(frozen=True)
class ProxyTransfer:
    """What a transfer carried, for the prediction's assumptions."""

    proxy_name: str
    proxy_params: int
    target_name: str
    target_params: int
    source: str  # how the proxy was given: "run(s) ID, ..." or a file name
    cpu_only: bool  # the proxy ran on CPUs only: nothing of its speed carries
    sigma_by_key: tuple[tuple[tuple[str, str], float], ...]  # widening per (GPU, precision)

    @property
    def size_ratio(self) -> float:
        """Target parameters ÷ proxy parameters."""
        return self.target_params / self.proxy_params


def size_sigma(proxy_params: float, target_params: float, gpu: str, precision: str,
               transformer: bool = True) -> float:
    """Width (sd of log throughput) a transfer from ``proxy_params`` to ``target_params`` adds
    on ``gpu`` at ``precision``: ``√2 · s · √min(1, d / D)`` with ``d`` the decades between
    the two sizes, ``s`` the group's spread of one model's MFU and ``D`` the decades it was
    measured over (``TRANSFORMER_MFU_SPREAD``, ``MFU_SPREAD_DECADES``); 0 for the same size."""
    if proxy_params <= 0 or target_params <= 0:
        raise PerfModelError("a transfer needs positive parameter counts")
    decades = abs(math.log10(target_params / proxy_params))
    p = "bf16" if precision == "fp16" else precision
    group = (architecture(gpu), p)
    spread = unc.TRANSFORMER_MFU_SPREAD.get(group) if transformer else None
    span = MFU_SPREAD_DECADES.get(group) if spread is not None else None
    if spread is None or span is None:
        spread, span = DEFAULT_SPREAD, DEFAULT_DECADES
    return math.sqrt(2.0) * spread * math.sqrt(min(1.0, decades / span))


def _layers(workload: Workload) -> tuple[int, bool]:
    """(layers, estimated) of a workload: its own count, else the shape estimate."""
    if workload.num_layers:
        return int(workload.num_layers), False
    return model_shape(workload).num_layers, True


def _is_transformer(workload: Workload) -> bool:
    return bool(workload.num_layers and workload.hidden_size and workload.tokens_per_sample
                and workload.num_heads and workload.vocab_size)


def transfer(proxy: Predictor, target: Workload, *, source: str = "") -> Predictor:
    """A predictor for ``target`` carrying what ``proxy`` (fitted to a smaller model's runs)
    measured; see the module docstring for what carries, what is recomputed and the width.

    ``source`` names the proxy (run ids or a file) in the assumptions."""
    validate_workload(target)
    src = proxy.workload
    res = proxy.result
    proxy_layers, proxy_est = _layers(src)
    target_layers, target_est = _layers(target)

    kernels = target.kernels_per_micro_step
    kernel_note = None
    if not kernels and src.kernels_per_micro_step:
        per_layer = src.kernels_per_micro_step / proxy_layers
        kernels = per_layer * target_layers
        # the casts autocast adds (compute.kernel_count) scale with the same layers
        amp = (src.amp_kernels_per_micro_step / proxy_layers * target_layers
               if src.amp_kernels_per_micro_step and not target.amp_kernels_per_micro_step
               else target.amp_kernels_per_micro_step)
        target = replace(target, kernels_per_micro_step=kernels, amp_kernels_per_micro_step=amp)
        kernel_note = (f"kernels per micro-step {kernels:,.0f}: the proxy's "
                       f"{src.kernels_per_micro_step:,.0f} over {proxy_layers} layer(s)"
                       + (" (estimated)" if proxy_est else "") + f" × {target_layers} layer(s)"
                       + (" (estimated)" if target_est else ""))
    kernel_ratio = ((kernels / src.kernels_per_micro_step)
                    if kernels and src.kernels_per_micro_step else target_layers / proxy_layers)
    flops_ratio = target.flops_per_sample / src.flops_per_sample

    transformer = _is_transformer(target)
    sigmas = {key: size_sigma(src.params, target.params, key[0], key[1], transformer)
              for key in res.log_compute_scale}
    sd = {key: unc.combine(v, sigmas[key]) for key, v in res.log_compute_sd.items()}
    latency = {key: (fixed * kernel_ratio, per_sample * flops_ratio)
               for key, (fixed, per_sample) in res.latency_flops.items()}
    carried = replace(res, log_compute_sd=sd, latency_flops=latency,
                      carried_variance={key: s * s for key, s in sigmas.items()})

    info = ProxyTransfer(
        proxy_name=src.name, proxy_params=int(src.params), target_name=target.name,
        target_params=int(target.params), source=source or src.name, cpu_only=res.cpu_only,
        sigma_by_key=tuple(sorted(sigmas.items())))
    notes = [_headline(info, res)]
    if kernel_note:
        notes.append(kernel_note)
    return Predictor(target, carried, ObservedFit(notes=tuple(notes)))


def _count(n: float) -> str:
    """``1.3B``, ``421k``: a parameter count in words."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def _headline(info: ProxyTransfer, res: FitResult) -> str:
    """The assumption line that says a prediction was transferred, and from which proxy."""
    ratio = info.size_ratio
    what = (f"transferred from proxy {info.proxy_name} ({_count(info.proxy_params)} params, "
            f"{info.source}) to {info.target_name} ({_count(info.target_params)}, "
            + (f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.3g}x") + ")")
    if info.cpu_only or not res.log_compute_scale:
        return (what + ": the proxy ran on CPU only, so only its kernels per layer carry; GPU "
                "speed from the prior")
    widths = ", ".join(f"{gpu} {prec} ×/÷{math.exp(unc.Z90 * s):.2f}"
                       for (gpu, prec), s in info.sigma_by_key)
    return (what + ": its measured efficiency (share of the roofline, communication scale) "
            f"carried; memory, communication, bubble and kernels from the target's shape; "
            f"interval widened for the size ratio ({widths})")


def fit_proxy(proxy: Workload, observations, hardware, target: Workload, *,
              source: str = "") -> Predictor:
    """Fit the scaling model to ``observations`` of the ``proxy`` workload and carry it to
    ``target`` (:func:`transfer`); ``hardware`` as :func:`.predictor.fit` takes it."""
    from mlflow_gpuopt.perfmodel.predictor import fit

    return transfer(fit(proxy, observations, hardware), target, source=source)
