"""Fit the calibration factors to measured runs: bounded least squares on log error.

What the data can identify is fitted, the rest stays at its prior (Pollux's guards):

- ``log k`` per (GPU type, precision) observed: the compute scale (always identified by one
  run on that GPU at that precision);
- ``log r`` per (GPU, precision) with two or more distinct micro-batches: how much of the
  micro-step is batch-independent (``a`` vs ``b``);
- ``log κ`` when any run used more than one GPU: the communication/straggler scale;
- ``γ`` (the pipeline's overlap of data-parallel traffic, in [1, 10]) when two or more
  pipeline-parallel configurations differ in replicas.

Then, per (GPU, precision), the fitted compute is split into what the roofline explains and
latency-bound work beyond it (:func:`split_latency_bound`): a measurement slower than the
roofline at library-level efficiency keeps the roofline at scale 1 and carries the rest as
FP32-rate work, which transfers to another GPU type at its SM count × clock
(``compute.latency_rate_flops_per_s``), not its tensor peak. On the measured GPU the split
reproduces the fit exactly. For a mixture of experts the excess is also read as GPU
throughput work (``FitResult.throughput_scales``, :func:`excess_as_throughput`), which is
what another GPU type takes (:func:`excess_is_throughput`).

Every parameter also has a weak prior residual, so a fit never runs away with one run's
noise. Observations on a CPU tell nothing about GPU speed: they are set aside and the
prediction falls back to FLOPs / peak with a prior efficiency and a wide interval.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from mlflow_gpuopt.perfmodel import comm, moe
from mlflow_gpuopt.perfmodel.compute import (
    KERNEL_DISPATCH_S,
    KERNELS_PER_LAYER_STEP,
    LATENCY_FIXED_SHARE,
    kernel_count,
    fixed_time_prior_s,
    latency_rate_flops_per_s,
    per_sample_time_prior_s,
    power_capped,
    weight_traffic_time_s,
)
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import Layout, resolve_layout
from mlflow_gpuopt.perfmodel.memory import optimizer_state_bytes_per_param, recompute_factor
from mlflow_gpuopt.perfmodel.precision import normalize_precision
from mlflow_gpuopt.perfmodel.shape import Shape, model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms
from mlflow_gpuopt.perfmodel.types import Hardware, Observation, ParallelConfig, Workload
from mlflow_gpuopt.perfmodel.uncertainty import SIGMA_FLOOR

logger = logging.getLogger(__name__)

#: Noise of one measured throughput (log); sets how hard the fit follows the data vs priors.
SIGMA_OBSERVATION = 0.01
#: Prior widths (log) of the fitted factors.
SIGMA_PRIOR_COMPUTE = 1.5
SIGMA_PRIOR_FIXED = 0.7
SIGMA_PRIOR_COMM = 1.5
SIGMA_PRIOR_GAMMA = 3.0

CPU_NAMES = frozenset({"cpu", "", "none"})

Key = tuple[str, str]  # (gpu, precision)


@dataclass(frozen=True)
class PreparedObservation:
    """An observation with its precision, layout and micro-batch worked out."""

    key: Key
    hardware: Hardware
    layout: Layout
    micro_batch: float
    grad_accum: int
    nodes: int
    throughput_samples_per_s: float
    recompute: str = "none"  # activation recomputation the run used
    #: The workload as this run ran it: its own MoE dispatcher and routing where the
    #: observation gives them (:func:`run_workload`).
    workload: Workload | None = field(default=None, compare=False)


@dataclass(frozen=True)
class FitResult:
    """Fitted factors and what the observations covered (for intervals)."""

    log_compute_scale: dict[Key, float] = field(hash=False)
    log_compute_sd: dict[Key, float] = field(hash=False)
    log_fixed_scale: dict[Key, float] = field(hash=False)
    comm_scale: float
    gamma: float
    residual_rms: float
    observed_batches: dict[Key, frozenset[float]] = field(hash=False)
    max_observed_dp: int
    observed_strategies: frozenset[str]
    observed_multinode: bool
    cpu_only: bool  # observations existed but none on a GPU
    n_observations: int
    #: (per micro-step, per sample) latency-bound FP32-rate FLOP-equivalents, per key.
    latency_flops: dict[Key, tuple[float, float]] = field(default_factory=dict, hash=False)
    #: log of the optimizer step's scale per key (the compute scale before the split).
    log_optimizer_scale: dict[Key, float] = field(default_factory=dict, hash=False)
    #: standard deviation of log(comm_scale) from the fit (0 when not fitted).
    log_comm_sd: float = 0.0
    #: The fit's covariance of its log compute scales and log communication scale, for the
    #: spread of a prediction along the direction the observations pin down (one multi-GPU
    #: run fixes the product of compute and communication scales, not each): index of
    #: ``("k", key)`` and ``("kappa",)`` in ``param_cov``; empty when κ was not fitted.
    param_index: dict[tuple, int] = field(default_factory=dict, hash=False, compare=False)
    param_cov: tuple[tuple[float, ...], ...] = field(default=(), hash=False, compare=False)
    #: Variance of log compute scale per key carried on top of the fit's own (a proxy's size
    #: ratio, ``transfer.size_sigma``): added to ``param_cov``'s diagonal after its priors are
    #: narrowed (``uncertainty.narrowed_prior_cov``), not narrowed with them.
    carried_variance: dict[Key, float] = field(default_factory=dict, hash=False,
                                                compare=False)
    #: (compute scale, batch-independent scale) per key with the split's latency-bound work
    #: read as GPU throughput work instead (:func:`excess_as_throughput`): the host's seconds
    #: stay at the split's, the excess goes on the GPU's per-sample work and its
    #: batch-independent traffic; only keys with latency-bound work.
    throughput_scales: dict[Key, tuple[float, float]] = field(default_factory=dict,
                                                              hash=False, compare=False)


def is_cpu(name: str) -> bool:
    """True for a CPU "device" name as tracking logs it."""
    return name.strip().lower() in CPU_NAMES or name.strip().lower().startswith("cpu")


def run_workload(workload: Workload, obs: Observation) -> Workload:
    """``workload`` with the measured run's own MoE token dispatcher, routing, experts'
    tensor-parallel degree and all-to-all overlap where ``obs`` gives them: a run measured
    with DeepEP is read with DeepEP's traffic whatever dispatcher the planned run uses
    (docs/models.md#mixture-of-experts). A run that does not say whether it overlapped its
    all-to-alls is read as the planned run, but for ``auto``, which a run cannot be: none."""
    changes: dict = {}
    if obs.expert_tensor_parallel and obs.expert_tensor_parallel != (
            workload.expert_tensor_parallel):
        changes["expert_tensor_parallel"] = int(obs.expert_tensor_parallel)
    if obs.moe_dispatcher and (moe.normalize_dispatcher(obs.moe_dispatcher)
                               != moe.normalize_dispatcher(workload.moe_dispatcher)):
        changes["moe_dispatcher"] = moe.normalize_dispatcher(obs.moe_dispatcher)
    if obs.moe_routing and (moe.normalize_routing(obs.moe_routing)
                            != moe.normalize_routing(workload.moe_routing)):
        changes["moe_routing"] = moe.normalize_routing(obs.moe_routing)
    own = (moe.normalize_a2a_overlap(obs.moe_a2a_overlap) if obs.moe_a2a_overlap
           else moe.normalize_a2a_overlap(workload.moe_a2a_overlap))
    if own == "auto":  # a measured run ran it or did not; unsaid, the default: none
        own = "none"
    if own != moe.normalize_a2a_overlap(workload.moe_a2a_overlap):
        changes["moe_a2a_overlap"] = own
    return replace(workload, **changes) if changes else workload


def prepare(workload: Workload, observations: Sequence[Observation],
            hardware: Mapping[str, Hardware]) -> tuple[list[PreparedObservation], int]:
    """GPU observations ready for the model, and the number of CPU ones set aside."""
    prepared: list[PreparedObservation] = []
    cpu = 0
    for obs in observations:
        if obs.throughput_samples_per_s is None or not obs.throughput_samples_per_s > 0:
            raise PerfModelError(
                f"observation on {obs.gpu!r} has no positive throughput_samples_per_s")
        if is_cpu(obs.gpu):
            cpu += 1
            continue
        hw = hardware.get(obs.gpu)
        if hw is None:
            raise PerfModelError(f"no hardware description given for GPU {obs.gpu!r}")
        # A run under a board power limit ran at a lower clock: its efficiency is measured
        # against the FLOP/s that clock gives (docs/models.md#power-limits).
        hw = power_capped(hw, obs.power_limit_w)
        nodes = max(1, int(obs.nodes or 1))
        if obs.gpu_count < 1 or obs.gpu_count % nodes:
            raise PerfModelError(
                f"observation on {obs.gpu}: {obs.gpu_count} GPUs do not split over {nodes} nodes")
        precision = normalize_precision(obs.precision or workload.precision)
        m = obs.micro_batch or workload.micro_batch
        if not m:
            raise PerfModelError(
                f"observation on {obs.gpu} has no micro_batch and the workload gives none")
        config = ParallelConfig(gpus_per_node=obs.gpu_count // nodes, nodes=nodes,
                                strategy=obs.strategy or "ddp", micro_batch=int(m),
                                grad_accum=max(1, int(obs.grad_accum or 1)), precision=precision,
                                tp=max(1, int(obs.tp or 1)), pp=max(1, int(obs.pp or 1)),
                                recompute=obs.recompute)
        prepared.append(PreparedObservation(
            key=(obs.gpu, precision), hardware=hw, layout=resolve_layout(config),
            micro_batch=float(m), grad_accum=config.grad_accum, nodes=nodes,
            throughput_samples_per_s=float(obs.throughput_samples_per_s),
            recompute=config.recompute_mode(workload.recompute),
            workload=run_workload(workload, obs)))
    return prepared, cpu


def _throughput(workload: Workload, obs: PreparedObservation, shape: Shape, k_opt: float,
                calib: Calibration) -> float:
    t = step_terms(obs.workload or workload, obs.hardware, obs.key[1], obs.layout,
                   obs.micro_batch, obs.grad_accum, shape, k_opt, calib,
                   recompute_factor(workload, obs.recompute), obs.recompute == "full")
    return t.samples_per_step / t.step_s


def _config_groups(prepared: Sequence[PreparedObservation]
                   ) -> tuple[list[PreparedObservation], np.ndarray]:
    """One observation per distinct configuration (what the model predicts from: all but the
    measured throughput), and each observation's group index: the model is evaluated once per
    configuration, so repeated measurements cost one prediction (a 100k-row CSV of a few
    hundred setups fits in seconds)."""
    groups: dict[tuple, int] = {}
    reps: list[PreparedObservation] = []
    index: list[int] = []
    for o in prepared:
        run = o.workload
        cfg = (o.key, id(o.hardware), repr(o.layout), o.micro_batch, o.grad_accum, o.nodes,
               o.recompute, run.moe_dispatcher if run else None,
               run.moe_routing if run else None, run.expert_tensor_parallel if run else None,
               run.moe_a2a_overlap if run else None)
        g = groups.setdefault(cfg, len(groups))
        if g == len(reps):
            reps.append(o)
        index.append(g)
    return reps, np.asarray(index, dtype=int)


def fit_calibration(workload: Workload, observations: Sequence[Observation],
                    hardware: Mapping[str, Hardware]) -> FitResult:
    """Fit what the observations identify (see the module docstring)."""
    prepared, n_cpu = prepare(workload, observations, hardware)
    reps, group_of = _config_groups(prepared)
    log_measured = np.log(np.asarray([o.throughput_samples_per_s for o in prepared],
                                     dtype=float))
    shape = model_shape(workload)
    k_opt, _ = optimizer_state_bytes_per_param(workload)
    keys = sorted({o.key for o in prepared})
    batches = {key: frozenset(o.micro_batch for o in prepared if o.key == key) for key in keys}
    split_keys = [key for key in keys if len(batches[key]) >= 2]
    multi = [o for o in prepared if o.layout.dp > 1 or o.layout.tp > 1 or o.layout.pp > 1]
    fit_kappa = bool(multi)
    # γ shapes only the pipeline's data-parallel overlap (DDP and FSDP overlap bucket by
    # bucket, comm.bucketed_exposed_s): fitted where two pipeline runs differ in replicas.
    fit_gamma = len({(o.layout.dp, o.nodes) for o in multi if o.layout.pp > 1}) >= 2

    names: list[str] = [f"k:{k}" for k in keys] + [f"r:{k}" for k in split_keys]
    if fit_kappa:
        names.append("kappa")
    if fit_gamma:
        names.append("gamma")
    n_k, n_r = len(keys), len(split_keys)
    x0 = np.zeros(len(names))
    # Start the compute scales at observed / prior so the solver starts near the answer.
    prior = [_throughput(workload, o, shape, k_opt, Calibration()) for o in reps]
    for i, key in enumerate(keys):
        ratios = [math.log(prior[g] / o.throughput_samples_per_s)
                  for o, g in zip(prepared, group_of, strict=True) if o.key == key]
        x0[i] = float(np.mean(ratios))
    if fit_gamma:
        x0[-1] = comm.GAMMA_PRIOR
    lower = np.full(len(names), -12.0)
    upper = np.full(len(names), 12.0)
    lower[n_k:n_k + n_r], upper[n_k:n_k + n_r] = -5.0, 5.0
    if fit_kappa:
        idx = n_k + n_r
        lower[idx], upper[idx] = math.log(0.01), math.log(1e4)
    if fit_gamma:
        lower[-1], upper[-1] = 1.0, 10.0
    x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)

    def calib_for(x: np.ndarray, key: Key) -> Calibration:
        k = math.exp(x[keys.index(key)])
        r = math.exp(x[n_k + split_keys.index(key)]) if key in split_keys else 1.0
        kappa = math.exp(x[n_k + n_r]) if fit_kappa else 1.0
        gamma = float(x[-1]) if fit_gamma else comm.GAMMA_PRIOR
        return Calibration(compute_scale=k, fixed_scale=r, comm_scale=kappa, gamma=gamma)

    def residuals(x: np.ndarray) -> np.ndarray:
        predicted = np.asarray([math.log(_throughput(workload, o, shape, k_opt,
                                                     calib_for(x, o.key))) for o in reps],
                               dtype=float)
        res = list((predicted[group_of] - log_measured) / SIGMA_OBSERVATION) if reps else []
        res.extend(x[:n_k] / SIGMA_PRIOR_COMPUTE)
        res.extend(x[n_k:n_k + n_r] / SIGMA_PRIOR_FIXED)
        if fit_kappa:
            res.append(x[n_k + n_r] / SIGMA_PRIOR_COMM)
        if fit_gamma:
            res.append((x[-1] - comm.GAMMA_PRIOR) / SIGMA_PRIOR_GAMMA)
        return np.asarray(res, dtype=float)

    if fit_kappa:
        # Overlap hides small communication quadratically, so the objective is flat near
        # κ = 1: start from the best of a coarse grid instead.
        idx = n_k + n_r
        grid = [math.log(v) for v in (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)]
        costs = []
        for g in grid:
            x0[idx] = g
            costs.append(float(np.sum(residuals(x0) ** 2)))
        x0[idx] = grid[int(np.argmin(costs))]

    if names:
        # scipy.optimize takes a third of a second to import: only when there is a fit.
        from scipy.optimize import least_squares

        sol = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale=1.0)
        x = sol.x
        jac = sol.jac
        try:
            cov = np.linalg.pinv(jac.T @ jac)
        except np.linalg.LinAlgError:  # pragma: no cover - pinv is robust
            cov = np.eye(len(names))
        obs_res = residuals(x)[:len(prepared)] * SIGMA_OBSERVATION
        rms = float(np.sqrt(np.mean(obs_res**2))) if len(prepared) else 0.0
    else:
        x, cov, rms = x0, np.zeros((0, 0)), 0.0
    logger.debug("perfmodel fit: %s = %s (rms log error %.3f)", names, x, rms)

    log_k = {key: float(x[i]) for i, key in enumerate(keys)}
    # A parameter's spread: its covariance, but never below the noise of the data it saw.
    sd = {key: max(SIGMA_FLOOR, rms, float(math.sqrt(max(cov[i, i], 0.0))))
          for i, key in enumerate(keys)}
    log_r = {key: float(x[n_k + j]) for j, key in enumerate(split_keys)}
    log_opt = dict(log_k)
    latency: dict[Key, tuple[float, float]] = {}
    throughput: dict[Key, tuple[float, float]] = {}
    hw_of = {o.key: o.hardware for o in prepared}
    layout_of = {o.key: o.layout for o in prepared}
    run_of = {o.key: o.workload or workload for o in prepared}  # the run's own dispatcher
    for key in keys:
        m_ref = math.exp(float(np.mean([math.log(m) for m in batches[key]])))
        moe_s = moe_split_terms(run_of[key], layout_of[key], hw_of[key], key[1], m_ref,
                                shape.seq_len)
        split = split_latency_bound(
            workload, hw_of[key], key[1], m_ref, math.exp(log_k[key]),
            math.exp(log_r.get(key, 0.0)), key in log_r, moe_s)
        new_k, new_r, flops = split
        if flops != (0.0, 0.0):
            latency[key] = flops
            if moe.is_moe(workload):
                throughput[key] = excess_as_throughput(
                    split, roofline_gpu_terms_s(run_of[key], layout_of[key], hw_of[key],
                                                key[1], m_ref, shape.seq_len),
                    latency_rate_flops_per_s(hw_of[key]), m_ref, key in log_r)
        log_k[key] = math.log(new_k)
        if key in log_r:
            log_r[key] = math.log(new_r)
    comm_sd = 0.0
    param_index: dict[tuple, int] = {}
    param_cov: tuple[tuple[float, ...], ...] = ()
    if fit_kappa:
        idx = n_k + n_r
        comm_sd = max(rms, float(math.sqrt(max(cov[idx, idx], 0.0))))
        picks = list(range(n_k)) + [idx]
        param_index = {("k", key): i for i, key in enumerate(keys)}
        param_index[("kappa",)] = n_k
        param_cov = tuple(tuple(float(cov[i, j]) for j in picks) for i in picks)
    return FitResult(
        log_compute_scale=log_k, log_compute_sd=sd, log_fixed_scale=log_r,
        latency_flops=latency, log_optimizer_scale=log_opt, log_comm_sd=comm_sd,
        throughput_scales=throughput,
        param_index=param_index, param_cov=param_cov,
        comm_scale=math.exp(x[n_k + n_r]) if fit_kappa else 1.0,
        gamma=float(x[-1]) if fit_gamma else comm.GAMMA_PRIOR,
        residual_rms=rms, observed_batches=batches,
        max_observed_dp=max((o.layout.dp for o in prepared), default=0),
        observed_strategies=frozenset(o.layout.strategy_name() for o in prepared),
        observed_multinode=any(o.nodes > 1 for o in prepared),
        cpu_only=not prepared, n_observations=len(prepared) + n_cpu)


def split_latency_bound(workload: Workload, hardware: Hardware, precision: str,
                        micro_batch: float, compute_scale: float, fixed_scale: float,
                        split_identified: bool,
                        moe_s: tuple[float, float] = (0.0, 0.0)
                        ) -> tuple[float, float, tuple[float, float]]:
    """Split a fitted ``T_grad(m) = k·(r·a + b·m)`` into the roofline ``k'·(r'·a + b·m)``
    (``k' ≤ 1``, ``r'`` as needed) and latency-bound work ``(X_fixed + X_sample·m) / P_fp32``.

    Returns ``(k', r', (X_fixed, X_sample))`` in FLOP-equivalents at ``hardware``'s FP32
    rate. A fit at or faster than the roofline (``k ≤ 1``) is kept as it is. With one
    measured micro-batch the time beyond the roofline at that batch is split
    ``LATENCY_FIXED_SHARE`` per micro-step (at most :func:`dispatch_bound_s`), the rest per
    sample; with two, ``a`` and ``b`` are each split at what the roofline allows. At every
    micro-batch (two measured) or at the measured one (one measured) the result equals the fit
    on ``hardware``. ``moe_s`` is a mixture of experts' own work at ``micro_batch`` on the
    measured layout (:func:`moe_split_terms`: host seconds with ``a``, GPU seconds with
    ``b·m``), which the fit scaled as the step does and which the roofline has too.
    """
    a = fixed_time_prior_s(workload.params, hardware, precision,
                           kernel_count(workload, precision)[0],
                           workload) + moe_s[0]
    b = (per_sample_time_prior_s(workload, hardware, precision)
         + (moe_s[1] / micro_batch if micro_batch > 0 else 0.0))
    fitted_a, fitted_b = compute_scale * fixed_scale * a, compute_scale * b
    excess = fitted_a + fitted_b * micro_batch - (a + b * micro_batch)
    if excess <= 0 or not math.isfinite(excess):
        return compute_scale, fixed_scale, (0.0, 0.0)
    rate = latency_rate_flops_per_s(hardware)
    if split_identified:
        k_new = min(fitted_b, b) / b
        r_new = min(fitted_a, a) / (a * k_new)
        return k_new, r_new, (max(0.0, fitted_a - a) * rate, max(0.0, fitted_b - b) * rate)
    fixed = min(LATENCY_FIXED_SHARE * excess, dispatch_bound_s(workload, precision))
    return 1.0, fixed_scale, (fixed * rate, (excess - fixed) * rate / micro_batch)


def roofline_gpu_terms_s(workload: Workload, layout: Layout, hardware: Hardware,
                         precision: str, micro_batch: float,
                         seq_len: float) -> tuple[float, float]:
    """(batch-independent, per-sample) GPU seconds of :func:`split_latency_bound`'s ``a`` and
    ``b`` at ``micro_batch`` on ``layout``, in its whole-model units: ``a``'s weight and
    gradient traffic (the ``pp`` stages' :func:`.moe.params_per_shard`: what this GPU's
    shard reads, as :func:`moe_split_terms` counts it) without the host's launches, and all
    of ``b`` (the roofline per sample and a mixture of experts' permutation and expert
    GEMMs)."""
    params = (moe.params_per_shard(workload, layout) * layout.pp if moe.is_moe(workload)
              else workload.params)
    gpu_fixed = weight_traffic_time_s(params, hardware, precision, workload)
    per_sample = per_sample_time_prior_s(workload, hardware, precision)
    extra = moe_split_terms(workload, layout, hardware, precision, micro_batch, seq_len)[1]
    return gpu_fixed, per_sample + (extra / micro_batch if micro_batch > 0 else 0.0)


def excess_as_throughput(split: tuple[float, float, tuple[float, float]],
                         gpu_terms_s: tuple[float, float], rate_flops_per_s: float,
                         micro_batch: float, split_identified: bool) -> tuple[float, float]:
    """``(k, r)`` that carry :func:`split_latency_bound`'s latency-bound work as throughput
    work of the GPU instead: ``split`` = ``(k', r', (X_fixed, X_sample))``, ``gpu_terms_s`` =
    (``A``, ``B``) the roofline's batch-independent GPU seconds (the weights' traffic) and
    per-sample seconds (:func:`roofline_gpu_terms_s`), ``rate_flops_per_s`` the measuring
    GPU's latency rate, ``micro_batch`` the measured one.

    With two measured micro-batches (``split_identified``) each part stays where the fit put
    it: the per-sample excess joins ``B`` (``k = k' + X_sample / (rate · B)``), the
    batch-independent one joins ``A`` (``k·r·A = k'·r'·A + X_fixed / rate``). With one, the
    whole excess at ``micro_batch`` joins ``B``, as the roofline's throughput terms grow
    with the tokens (``LATENCY_FIXED_SHARE`` is a rule for launches, not for traffic or
    arithmetic), and ``A`` keeps the split's seconds. The host's launches keep the split's
    ``k'·r'`` (CPU seconds, carried as measured), so at the measured micro-batch the step is
    the split's, and on another GPU type the excess moves with its roofline
    (docs/models.md#latency-bound-work)."""
    k_split, r_split, (x_fixed, x_sample) = split
    gpu_fixed, per_sample = gpu_terms_s
    if per_sample <= 0 or rate_flops_per_s <= 0:
        return k_split, r_split
    fixed_s = x_fixed / rate_flops_per_s
    if not split_identified and micro_batch > 0:
        k = k_split + (fixed_s / micro_batch + x_sample / rate_flops_per_s) / per_sample
        return k, k_split * r_split / k
    k = k_split + x_sample / (rate_flops_per_s * per_sample)
    if gpu_fixed > 0:
        return k, (k_split * r_split * gpu_fixed + fixed_s) / (k * gpu_fixed)
    return k, r_split


def excess_is_throughput(workload: Workload) -> bool:
    """Whether a measurement's time beyond the roofline is carried to another GPU type as GPU
    throughput work (:func:`excess_as_throughput`, with the width
    ``uncertainty.TERM_UNEXPLAINED`` a share of the log distance to the latency-bound reading,
    ``uncertainty.UNEXPLAINED_SCALING_SHARE``)
    rather than as latency-bound work: for a mixture of experts. Megatron-Bridge's dropless
    Qwen3-30B-A3B runs, the MoE runs measured slower than their roofline on two GPU types,
    show an excess that grows with the tokens (H100 at micro-batch 1 and 2: ~1 ms a layer
    batch-independent, below the model's host launches alone) and is 2.8-2.9× longer on H100
    than on B200, against B200's 2.3× the memory bandwidth and FP8 peak and 1.12× the SMs ×
    clock (docs/accuracy.md#mixture-of-experts). Dense workloads keep the latency-bound
    reading that ``benchmarks/bench_accuracy.py``'s V100 ↔ A100 transfers check
    (docs/models.md#latency-bound-work)."""
    return moe.is_moe(workload)


def moe_split_terms(workload: Workload, layout: Layout, hardware: Hardware, precision: str,
                    micro_batch: float, seq_len: float) -> tuple[float, float]:
    """(per micro-step, GPU per micro-batch) seconds that a mixture of experts' step on
    ``layout`` has beyond :func:`split_latency_bound`'s dense ``a`` and ``b·m``, in their
    whole-model units (the step divides the latency-bound work per micro-step by ``pp``, per
    sample by ``tp × pp × cp``): the MoE layers' launches and host sync
    (:func:`.moe.layer_parts_s`, per pipeline stage) × ``pp``, less the traffic of the
    weights this GPU does not read (``pp`` stages of :func:`.moe.params_per_shard`, the
    experts over ``ep``, against the whole model's in ``a``); their permutation and expert
    GEMMs and FP8 casts (on ``1/tp`` of the tokens) × ``tp × pp × cp``. (0, 0) for a dense
    model."""
    if not moe.is_moe(workload):
        return 0.0, 0.0
    p = moe.layer_parts_s(workload, layout, hardware, precision, micro_batch,
                          seq_len / layout.cp)
    weights = (weight_traffic_time_s(moe.params_per_shard(workload, layout) * layout.pp,
                                     hardware, precision, workload)
               - weight_traffic_time_s(workload.params, hardware, precision, workload))
    return ((p["dispatch"] + p["sync"]) * layout.pp + weights,
            (p["permute"] + p["expert_gemm"] + p["fp8_cast"])
            * layout.tp * layout.pp * layout.cp)


def dispatch_bound_s(workload: Workload, precision: str | None = None) -> float:
    """Cap (seconds) on the batch-independent share of a micro-step's time beyond the
    roofline: its kernels one after another at ``KERNEL_DISPATCH_S`` each — the profiled
    count at ``precision`` (``kernels_per_micro_step``, under autocast for a mixed precision
    of an fp32 profile: ``compute.kernel_count``) where the workload has one, else
    ``KERNELS_PER_LAYER_STEP`` per layer (a guess that misses recurrent loops: a 570-step
    decoder launches thousands).

    With a count, the prior's per-micro-step overhead already holds the host-side dispatch
    (count × ``KERNEL_DISPATCH_S``); this cap is for GPU-side latency on top of it (each
    kernel occupies the GPU for some µs however small it is: launch latency, a partial wave),
    bounded by the same per-kernel figure. Additive rather than max(dispatch, GPU): host
    dispatch and GPU-side latency are spent one after the other for kernels too small to
    overlap, and the additive form predicts ``benchmarks/bench_accuracy.py`` better."""
    count, _ = kernel_count(workload, precision)
    if count:
        return count * KERNEL_DISPATCH_S
    layers = model_shape(workload).num_layers
    return layers * KERNELS_PER_LAYER_STEP * KERNEL_DISPATCH_S
