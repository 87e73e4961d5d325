"""``fit()`` and the :class:`Predictor` it returns: throughput, interval, step-time breakdown
and memory for any configuration on any GPU, from the fitted calibration."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from mlflow_gpuopt.perfmodel import context, moe, sequence_bins, vendor
from mlflow_gpuopt.perfmodel import uncertainty as unc
from mlflow_gpuopt.perfmodel.compute import (
    APEX_O1_EXTRA_OPERATORS_PER_CALL,
    APEX_O1_WRAPPED_CALLS_PER_KERNEL,
    GENERATION_MFU,
    KERNEL_DISPATCH_S,
    OPERATOR_CLASSES,
    architecture,
    attention_term,
    kernel_count,
    matmul_efficiency,
    mixed_precision_mode,
    operator_class_times_s,
    optimizer_step_extras,
    traffic_source,
    transformer_mfu_group,
)
from mlflow_gpuopt.perfmodel.defaults import SPEED_KINDS, Default, perturbed, workload_defaults
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.fitting import (
    SIGMA_PRIOR_COMM,
    SIGMA_PRIOR_COMPUTE,
    FitResult,
    Key,
    excess_is_throughput,
    fit_calibration,
    is_cpu,
)
from mlflow_gpuopt.perfmodel.layout import Layout, resolve_layout, validate_config
from mlflow_gpuopt.perfmodel.memory import (
    activation_notes,
    activation_scale_to_fit,
    largest_fitting,
    max_micro_batch_fitting,
    memory_at,
    normalize_frozen_precision,
    optimizer_state_bytes_per_param,
    p_fits,
    recompute_factor,
    transformer_dims,
    usable_memory_bytes,
)
from mlflow_gpuopt.perfmodel.activations import normalize_cross_entropy
from mlflow_gpuopt.perfmodel.precision import normalize_precision
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms
from mlflow_gpuopt.perfmodel.types import (
    Hardware,
    Observation,
    ParallelConfig,
    Prediction,
    Workload,
)

_DP_FAMILY = {"single": "ddp", "ddp": "ddp"}
#: Named widths (what was assumed, sd of log throughput): ``Prediction.width_terms``.
WidthTerms = tuple[tuple[str, float], ...]


def validate_workload(workload: Workload) -> None:
    """Raise :class:`PerfModelError` for a workload the models cannot use."""
    if not workload.params or workload.params <= 0:
        raise PerfModelError("workload needs a positive 'params' (parameter count)")
    if not workload.flops_per_sample or workload.flops_per_sample <= 0:
        raise PerfModelError("workload needs a positive 'flops_per_sample'")
    normalize_precision(workload.precision)
    if workload.micro_batch is not None and workload.micro_batch < 1:
        raise PerfModelError("workload 'micro_batch' must be at least 1")
    try:
        normalize_cross_entropy(workload.cross_entropy)
        if workload.frozen_precision:
            normalize_frozen_precision(workload.frozen_precision)
    except ValueError as exc:
        raise PerfModelError(f"workload: {exc}") from None


class Predictor:
    """A fitted scaling model for one workload. Build it with :func:`fit`.

    ``predict`` is plain arithmetic over quantities fixed at fit time, cheap enough for the
    recommender's thousands of calls.
    """

    def __init__(self, workload: Workload, result: FitResult,
                 fit_to_observed: ObservedFit | None = None,
                 hardware: Mapping[str, Hardware] | None = None) -> None:
        self.workload = workload
        self.result = result
        self._hardware = dict(hardware or {})  # the measured GPUs, for carried defaults
        self._shape = model_shape(workload)
        self._observed = fit_to_observed or ObservedFit()
        self._opt_bytes, opt_assumed = optimizer_state_bytes_per_param(workload)
        notes = []
        if opt_assumed:
            notes.append("optimizer unknown: Adam's 8 bytes/param of state assumed")
        extras = optimizer_step_extras(workload)
        if extras:
            notes.append("optimizer step bytes per parameter beyond Adam's: "
                         + ", ".join(extras))
        if mixed_precision_mode(workload) == "apex_o1":
            notes.append(
                "apex AMP O1 at 16 bits: its Python wrappers' host time, "
                f"{APEX_O1_WRAPPED_CALLS_PER_KERNEL:g} wrapped calls per counted kernel x "
                f"{APEX_O1_EXTRA_OPERATORS_PER_CALL * KERNEL_DISPATCH_S * 1e6:.0f} us "
                "(a Tacotron 2 step's share and cost, measured; docs/models.md)")
        prior = "FLOPs / peak at a prior efficiency" + (
            " plus the counted kernels' dispatch" if workload.kernels_per_micro_step else "")
        self._defaults = workload_defaults(workload, self._shape, opt_assumed)
        # Speed defaults in words (memory and shape ones have their own notes below).
        notes += [d.describe() for d in self._defaults if d.kind in ("traffic", "kernels")]
        # Each speed default's quantity moved by its own spread, for its effect on a
        # prediction (built once: the workloads key the models' caches).
        self._perturbed = {d.kind: perturbed(workload, d, math.exp(d.log_spread))
                           for d in self._defaults if d.kind in SPEED_KINDS}
        if result.cpu_only and result.n_observations:
            notes.append(f"only CPU measurements: GPU speed from {prior} (wide interval)")
        elif not result.log_compute_scale:
            notes.append(f"no measurements: GPU speed from {prior}")
        self._notes = tuple(notes) + self._observed.notes
        self._observed_gpus = {key[0] for key in result.log_compute_scale}
        self._observed_families = {_DP_FAMILY.get(s, s) for s in result.observed_strategies}
        self._calib_cache: dict[Key, tuple[Calibration, float, WidthTerms, bool]] = {}
        # Per carried key whose measured excess is carried as throughput work: the
        # calibrations of the two readings (latency-bound, throughput), for the width.
        self._hypotheses: dict[Key, tuple[Calibration, Calibration]] = {}
        # Per target key carried as a described transformer: the independent bound of its
        # transfer piece (uncertainty.transformer_transfer_bound).
        self._transformer_bound: dict[Key, float] = {}
        # Described by its transformer architecture: its transfers take the same model's pair
        # spreads, bounded by GENERATION_MFU's (uncertainty.transformer_transfer_sigma).
        self._transformer = bool(transformer_dims(workload) is not None and workload.num_heads
                                 and workload.vocab_size)
        self._batches_cache: dict[Key, frozenset[float]] = {}
        self._carried_cache: dict[tuple, list[tuple[Default, float]]] = {}
        self._efficiency_notes: dict[Key, str] = {}

    def with_kernels_per_micro_step(self, kernels: float) -> Predictor:
        """The same fitted model for the workload launching ``kernels`` per micro-step (a
        compiled one, its casts fused into its kernels): only the dispatch term of the step
        changes."""
        from dataclasses import replace

        return Predictor(replace(self.workload, kernels_per_micro_step=kernels,
                                 amp_kernels_per_micro_step=None), self.result,
                         self._observed)

    @property
    def assumptions(self) -> tuple[str, ...]:
        """What the model had to guess for this workload, in words."""
        return self._notes

    def _calibration(self, key: Key) -> tuple[Calibration, float, WidthTerms, bool]:
        """(calibration, sd of log compute from the fit, the named widths of carrying it to
        this GPU or precision, extrapolated) for a GPU and precision (cached:
        the recommender asks for the same few keys thousands of times)."""
        cached = self._calib_cache.get(key)
        if cached is None:
            cached = self._calib_cache[key] = self._build_calibration(key)
        return cached

    def _build_calibration(self, key: Key) -> tuple[Calibration, float, WidthTerms, bool]:
        res = self.result
        pool = self._pool(key)
        logk, sd_k, extra, logr, extrapolated = self._compute_scale(key, pool)
        x_fixed = sum(res.latency_flops.get(k, (0.0, 0.0))[0] for k in pool) / len(pool)
        x_sample = sum(res.latency_flops.get(k, (0.0, 0.0))[1] for k in pool) / len(pool)
        opt = [res.log_optimizer_scale[k] for k in pool if k in res.log_optimizer_scale]
        overhead = None
        if key not in res.log_compute_scale and res.log_compute_scale:
            # Host-side dispatch is CPU time: keep the seconds fitted where it was measured
            # (compute × fixed scale there), whatever this GPU's own factors are.
            overhead = math.exp(sum(res.log_compute_scale[k] + res.log_fixed_scale.get(k, 0.0)
                                    for k in pool) / len(pool))
        calib = Calibration(compute_scale=math.exp(logk), fixed_scale=math.exp(logr),
                            comm_scale=res.comm_scale, gamma=res.gamma,
                            latency_fixed_flops=x_fixed, latency_per_sample_flops=x_sample,
                            optimizer_scale=math.exp(sum(opt) / len(opt)) if opt else None,
                            overhead_scale=overhead)
        if (overhead is not None and any(k in res.throughput_scales for k in pool)
                and excess_is_throughput(self.workload)):
            # carried as GPU throughput work; the latency-bound reading sets the width
            latency_bound = calib
            calib = self._as_throughput(pool, latency_bound)
            self._hypotheses[key] = (latency_bound, calib)
        return calib, sd_k, extra, extrapolated

    def _as_throughput(self, pool: list[Key], latency: Calibration) -> Calibration:
        """The measured keys' time beyond the roofline carried to another GPU type as GPU
        throughput work: per pool key the split's scales with its latency-bound work moved
        onto the GPU's roofline terms (``fitting.excess_as_throughput``), averaged over the
        pool as the latency-bound one is (log scales); the host's seconds stay the measured
        ones (``latency``'s ``overhead_scale``)."""
        res = self.result
        logs_k, logs_r = [], []
        for k in pool:
            split = (math.exp(res.log_compute_scale[k]),
                     math.exp(res.log_fixed_scale.get(k, 0.0)))
            kk, rr = res.throughput_scales.get(k, split)
            logs_k.append(math.log(kk))
            logs_r.append(math.log(rr))
        n = len(pool)
        return replace(latency, compute_scale=math.exp(sum(logs_k) / n),
                       fixed_scale=math.exp(sum(logs_r) / n),
                       latency_fixed_flops=0.0, latency_per_sample_flops=0.0)

    def _pool(self, key: Key) -> list[Key]:
        """The calibrated keys a prediction for ``key`` borrows from (none: priors only)."""
        res = self.result
        if key in res.log_compute_scale or not res.log_compute_scale:
            return [key]
        same_gpu = [k for k in res.log_compute_scale if k[0] == key[0]]
        if same_gpu:
            return same_gpu
        # Prefer calibrations made at the same precision.
        return [k for k in res.log_compute_scale if k[1] == key[1]] or list(res.log_compute_scale)

    def _reference_batches(self, key: Key) -> frozenset[float]:
        """Micro-batches (samples per GPU) a prediction for ``key`` is extrapolated from in
        batch: those measured at ``key`` itself, else those of every calibration it borrows
        (``_pool(key)``: the same GPU's other precisions, else other GPUs).

        Why the pool's batches and not none: how per-sample time depends on the micro-batch
        (fixed vs per-sample work) is a property of the workload more than of the GPU, and a
        transferred prediction inherits its compute scale from the pool's fit, which is exact
        only near the batches the pool measured. Looking only at the target key (empty for a
        GPU never measured) made the batch term vanish exactly where it applies: V100 at 48
        carried to A100 at 128 got the width of V100 at 48 carried to A100 at 48. Batches of
        keys outside the pool are not used: they did not calibrate this prediction. No
        measurement at all: empty (``SIGMA_PRIOR_ONLY`` covers the batch too).
        """
        cached = self._batches_cache.get(key)
        if cached is None:
            seen = self.result.observed_batches
            cached = seen.get(key) or frozenset().union(
                *(seen.get(k, frozenset()) for k in self._pool(key)))
            self._batches_cache[key] = cached
        return cached

    def _compute_scale(self, key: Key, pool: list[Key]
                       ) -> tuple[float, float, WidthTerms, float, bool]:
        """(log k, sd of the fit, the named widths of the transfer, log r, extrapolated) for
        a GPU and precision, from ``_pool(key)``. Without any GPU measurement the prior's
        widths are the transfer's (:meth:`_prior_terms`) and the fit has none."""
        res = self.result
        if key in res.log_compute_scale:
            return (res.log_compute_scale[key], res.log_compute_sd[key], (),
                    res.log_fixed_scale.get(key, 0.0), False)
        is_moe = moe.is_moe(self.workload)
        if not res.log_compute_scale:
            prior_moe = ((unc.TERM_MOE, unc.SIGMA_MOE_LAYERS),) if is_moe else ()
            return 0.0, 0.0, self._prior_terms(key) + prior_moe, 0.0, True
        moe_terms = ((unc.TERM_MOE, unc.SIGMA_MOE_TRANSFER),) if is_moe else ()
        same_gpu = key[0] in self._observed_gpus  # then the pool is that GPU's other precisions
        extra = unc.other_gpu_terms(not same_gpu, any(k[1] != key[1] for k in pool))
        if self._transformer:
            pairs = [((architecture(k[0]), k[1]), (architecture(key[0]), key[1])) for k in pool]
            spreads = [unc.transformer_transfer_sigma(*p) for p in pairs]
            if spreads and all(v is not None for v in spreads):
                extra = ((unc.TERM_TRANSFORMER_TRANSFER, max(spreads)),)
                self._transformer_bound[key] = max(
                    unc.transformer_transfer_bound(*p) for p in pairs)
        logk = sum(res.log_compute_scale[k] for k in pool) / len(pool)
        sd = max(res.log_compute_sd[k] for k in pool)
        return logk, sd, tuple(extra) + moe_terms, 0.0, not same_gpu

    def _efficiency_note(self, key: Key, hardware: Hardware) -> str:
        """The efficiency default of a prediction without a GPU measurement, in words."""
        note = self._efficiency_notes.get(key)
        if note is None:
            d = self._efficiency_default(key, hardware)
            note = self._efficiency_notes[key] = (
                f"default {d.quantity}: {d.value:.3g} of the dense {key[1]} peak of "
                f"{hardware.gpu}, from {d.source}")
        return note

    def _efficiency_default(self, key: Key, hardware: Hardware) -> Default:
        """The GPU's efficiency as a :class:`.defaults.Default` (no GPU measurement)."""
        group = (architecture(hardware.gpu), "bf16" if key[1] == "fp16" else key[1])
        spread = (unc.TRANSFORMER_MFU_SPREAD.get(group) if self._transformer else None) \
            or unc.SIGMA_PRIOR_ONLY
        eff, source = matmul_efficiency(hardware, key[1])
        return Default("efficiency", "matmul efficiency", eff, "of dense peak",
                       f"{source}, no GPU measurement", spread)

    def _prior_terms(self, key: Key) -> WidthTerms:
        """Named widths of a prediction with no GPU measurement. A transformer described by
        its architecture: ``SIGMA_PRIOR_TRANSFORMER``, plus the pieces for a generation or a
        precision ``GENERATION_MFU`` has no figure for (NVIDIA GPUs;
        :func:`.uncertainty.prior_transformer_terms`). Anything else: ``SIGMA_PRIOR_ONLY``,
        the spread measured over such workloads, or ``SIGMA_PRIOR_TRACKED`` where its memory
        traffic and kernel count were measured (:func:`.uncertainty.prior_tracked`)."""
        arch, precision = transformer_mfu_group(
            (architecture(key[0]), "bf16" if key[1] == "fp16" else key[1]))
        if not self._transformer or vendor.is_amd(key[0]) or arch == "unknown":
            tracked = None if self._transformer else unc.prior_tracked(
                traffic_source(self.workload) == "measured",
                kernel_count(self.workload)[1] == "measured")
            if tracked:
                return ((unc.TERM_PRIOR_TRACKED, tracked),)
            return ((unc.TERM_PRIOR, unc.SIGMA_PRIOR_ONLY),)
        if (arch, precision) in GENERATION_MFU:
            return unc.prior_transformer_terms(True, True)
        generation = any(a == arch for a, _ in GENERATION_MFU)
        known = precision in ("bf16", "fp8")
        return unc.prior_transformer_terms(generation, known)

    def _resolve(self, config: ParallelConfig, hardware: Hardware
                 ) -> tuple[Layout, str, int]:
        validate_config(config, hardware)
        layout = resolve_layout(config)
        moe.check_experts(self.workload, layout)
        context.check_context(self.workload, layout)
        precision = normalize_precision(config.precision or self.workload.precision)
        m = config.micro_batch or self.workload.micro_batch
        if not m:
            raise PerfModelError("no micro-batch: give one in the configuration or the workload")
        return layout, precision, int(m)

    def predict(self, config: ParallelConfig, hardware: Hardware) -> Prediction:
        """Throughput, interval, time breakdown and memory for ``config`` on ``hardware``."""
        layout, precision, m = self._resolve(config, hardware)
        res = self.result
        key = (hardware.gpu, precision)
        calib, sd_k, transfer, extrapolated = self._calibration(key)
        recompute = config.recompute_mode(self.workload.recompute)
        rfactor = recompute_factor(self.workload, recompute)
        terms = step_terms(self.workload, hardware, precision, layout, m, config.grad_accum,
                           self._shape, self._opt_bytes, calib, rfactor, recompute == "full")
        throughput = terms.samples_per_step / terms.step_s
        exposed_share = terms.exposed_comm_s / terms.step_s

        strategy = layout.strategy_name()
        joint = self._joint_fit_sigma(key, hardware, layout, precision, m, config.grad_accum,
                                      calib, rfactor, recompute == "full", throughput)
        if joint is None:
            fit_terms = ((unc.TERM_FIT, sd_k),
                         (unc.TERM_COMM_FIT,
                          unc.comm_fit_spread(res.log_comm_sd, exposed_share, layout.dp,
                                              res.max_observed_dp)))
        else:
            # The observations pin down the step they measured, not compute and
            # communication each; the spread along this prediction's own sensitivity, plus
            # the floor for more replicas than measured.
            beyond = layout.dp > res.max_observed_dp
            fit_terms = ((unc.TERM_FIT, max(unc.SIGMA_FLOOR, res.residual_rms, joint)),
                         (unc.TERM_COMM_FIT,
                          unc.SIGMA_COMM_FIT_FLOOR * min(1.0, exposed_share) if beyond
                          else 0.0))
        # The scaling pieces apply to a calibration carried beyond what it measured. Not to
        # a prediction without any GPU measurement (nothing carried: its prior's width is
        # the spread of whole published runs, their layouts and node counts included). A
        # transformer's calibration carried to another GPU type or precision adds them beside
        # its transfer piece, up to that transfer's independent bound, which holds every
        # change of layout and scale (uncertainty.transformer_transfer_terms).
        scaling = bool(res.log_compute_scale)
        carried = any(name == unc.TERM_TRANSFORMER_TRANSFER for name, _ in transfer)
        scaling_terms = (
            (unc.TERM_BEYOND, unc.scale_beyond(layout.dp, res.max_observed_dp)
             if scaling and res.max_observed_dp else 0.0),
            (unc.TERM_BATCH, unc.batch_away(m, self._reference_batches(key),
                                            key in res.log_fixed_scale) if scaling else 0.0),
            (unc.TERM_STRATEGY, unc.SIGMA_UNOBSERVED_STRATEGY
             if scaling and res.max_observed_dp
             and _DP_FAMILY.get(strategy, strategy) not in self._observed_families
             and layout.gpus_total() > 1 else 0.0),
            (unc.TERM_MULTINODE, unc.SIGMA_UNOBSERVED_MULTINODE
             if scaling and config.nodes > 1 and not res.observed_multinode else 0.0),
        )
        if carried:
            # The generation pairs changed micro-batch (and the bound holds every change), so
            # the micro-batch piece is inside the transfer's.
            piece = dict(transfer)[unc.TERM_TRANSFORMER_TRANSFER]
            rest = tuple(t for t in transfer if t[0] != unc.TERM_TRANSFORMER_TRANSFER)
            transfer = rest + unc.transformer_transfer_terms(
                piece, self._transformer_bound[key],
                tuple(t for t in scaling_terms if t[0] != unc.TERM_BATCH))
            scaling_terms = ()
        widths = [*fit_terms, *transfer, *scaling_terms]
        hypotheses = self._hypotheses.get(key)
        if hypotheses is not None:
            # The measured time beyond the roofline carried as throughput work: the width is
            # the share of the log distance to the latency-bound reading that the measured
            # excess's scaling leaves open (uncertainty.UNEXPLAINED_SCALING_SHARE).
            ends = [step_terms(self.workload, hardware, precision, layout, m, config.grad_accum,
                               self._shape, self._opt_bytes, c, rfactor, recompute == "full")
                    for c in hypotheses]
            widths.append((unc.TERM_UNEXPLAINED, unc.unexplained_sigma(
                ends[1].samples_per_step / ends[1].step_s,
                ends[0].samples_per_step / ends[0].step_s)))
        if key not in res.log_compute_scale and res.log_compute_scale:
            # FLOPs-only fallbacks (architecture unknown) widen a prediction carried from
            # another GPU or precision: each default's spread times how far it moves this
            # prediction. (A prior-only one has SIGMA_PRIOR_ONLY, the spread measured over
            # such workloads, fallbacks included.)
            widths += [(f"{unc.TERM_DEFAULT_PREFIX}{d.quantity}", v) for d, v in
                      self._carried_fallback_spread(key, hardware, m)]
        width_terms = tuple((name, v) for name, v in widths if v > 0)
        sigma = unc.combine(*(v for _, v in width_terms))
        low, high = unc.interval(throughput, sigma)

        # The median peak is linear in the micro-batch: two evaluations give the max m.
        scale = self._observed.activation_scale
        usable = usable_memory_bytes(hardware.gpu, hardware.memory_bytes)
        mem0 = memory_at(self.workload, config, layout, hardware.memory_bytes, 0, self._shape,
                       scale)
        mem1 = memory_at(self.workload, config, layout, hardware.memory_bytes, 1, self._shape,
                       scale)
        memory = memory_at(self.workload, config, layout, hardware.memory_bytes, m, self._shape,
                         scale)
        max_m = largest_fitting(mem0.total_bytes, mem1.total_bytes, usable)
        chance = p_fits(memory, usable)
        fits = chance >= 0.5
        observed_m = self._observed.micro_batches.get(
            _observed_key(hardware.gpu, config, layout, precision, recompute), 0)
        notes = self._notes + activation_notes(self.workload, recompute)
        if not res.log_compute_scale:
            notes += (self._efficiency_note(key, hardware),)
        if observed_m >= m and not fits:
            # A run proved this configuration fits; the estimate is what is wrong.
            fits, max_m, chance = True, max(max_m, observed_m), 1.0
            notes += ("this configuration was observed to run: called fitting although the "
                      "memory estimate exceeds the GPU",)
        if extrapolated or (key not in res.log_compute_scale and res.log_compute_scale):
            notes += self._class_notes(key, hardware, m) + self._operator_notes(key, hardware)
        # tokens that run, padding included: the mean padded length where batches are binned
        tokens = (sequence_bins.mean_padded_tokens(self.workload)
                  or self.workload.tokens_per_sample)
        notes += sequence_bins.notes(self.workload)
        notes += self._shape_notes(layout, recompute == "full")
        notes += moe.notes(self.workload, layout, terms.alltoall_s, terms.alltoall_total_s,
                           terms.a2a_overlapped)
        notes += moe.expert_sync_notes(self.workload, layout, hardware.gpus_per_node)
        notes += context.notes(self.workload, layout, terms.cp_exchange_total_s,
                               terms.cp_exchange_s)
        return Prediction(
            gpu=hardware.gpu, config=config, throughput_samples_per_s=throughput,
            low=low, high=high, log_sigma=sigma, step_time_s=terms.step_s,
            compute_s=terms.compute_s, exposed_comm_s=terms.exposed_comm_s,
            bubble_s=terms.bubble_s, memory=memory, memory_capacity_bytes=hardware.memory_bytes,
            fits=fits, max_micro_batch=max_m,
            samples_per_step=int(round(terms.samples_per_step)), extrapolated=extrapolated,
            tokens_per_s=throughput * tokens if tokens else None, assumptions=notes,
            basis=("prior" if not self.result.log_compute_scale
                   else "transferred" if extrapolated else "measured"),
            p_fits=chance, memory_usable_bytes=usable, alltoall_s=terms.alltoall_s,
            cp_exchange_s=terms.cp_exchange_s, width_terms=width_terms,
            a2a_overlap=terms.a2a_overlapped)

    def transfer_classes(self, config: ParallelConfig, hardware: Hardware) -> list[dict]:
        """For a prediction carried from a measured GPU type or precision: per operator class
        (``compute.OPERATOR_CLASSES``), its seconds in one micro-step at ``config``'s
        micro-batch on the measured source (the first of ``_pool``) and on ``hardware``, each
        at its own calibration, and the change as a share of the source's micro-step, largest
        change first; empty where nothing was carried (measured here, or no measurement)."""
        _, precision, m = self._resolve(config, hardware)
        return self._transfer_classes((hardware.gpu, precision), hardware, m)

    def _transfer_classes(self, key: Key, hardware: Hardware, m: int) -> list[dict]:
        res = self.result
        if key in res.log_compute_scale or not res.log_compute_scale:
            return []
        sources = [k for k in self._pool(key) if k[0] in self._hardware]
        if not sources:
            return []
        src = sources[0]

        def times(k: Key, hw: Hardware) -> dict[str, float]:
            c = self._calibration(k)[0]
            return operator_class_times_s(
                self.workload, hw, k[1], m, c.compute_scale, c.fixed_scale, c.overhead_scale,
                (c.latency_fixed_flops, c.latency_per_sample_flops))

        before, after = times(src, self._hardware[src[0]]), times(key, hardware)
        total = sum(before.values()) or 1.0
        rows = [{"class": name, "source": f"{src[0]} {src[1]}", "source_s": before[name],
                 "target_s": after[name], "step_change": (after[name] - before[name]) / total}
                for name in OPERATOR_CLASSES if before[name] > 0 or after[name] > 0]
        return sorted(rows, key=lambda r: -abs(r["step_change"]))

    def _class_notes(self, key: Key, hardware: Hardware, m: int) -> tuple[str, ...]:
        """The operator classes that move a carried prediction, in words (largest first)."""
        rows = self._transfer_classes(key, hardware, m)
        if not rows:
            return ()
        total = sum(r["source_s"] for r in rows) or 1.0
        parts = []
        for r in rows:
            if abs(r["step_change"]) < 0.01 and r["class"] != "dispatch":
                continue
            ratio = (f"x{r['target_s'] / r['source_s']:.2f}" if r["source_s"] > 0
                     else "new")
            parts.append(f"{r['class']} {r['source_s'] / total:.0%} of the micro-step, {ratio} "
                         f"({100 * r['step_change']:+.0f}% of it)")
        return (f"moved from {rows[0]['source']} to {hardware.gpu} {key[1]} by operator class "
                "(compute.OPERATOR_CLASSES): " + "; ".join(parts),)

    def _operator_notes(self, key: Key, hardware: Hardware) -> tuple[str, ...]:
        """The operator classes that move a calibration carried to ``key`` from the measured
        GPUs beyond the linear layers' transfer (``compute.attention_term``: attention's fused
        kernel reaches another share of peak on each generation), in words."""
        sources = [k for k in self._pool(key) if k[0] in self._hardware]
        target = attention_term(self.workload, hardware, key[1])
        src = [attention_term(self.workload, self._hardware[k[0]], k[1]) for k in sources]
        if target is None and not any(src):
            return ()
        moved = (target[0] if target else 0.0) - (
            sum(t[0] for t in src if t) / len(src) if src else 0.0)
        if abs(moved) < 0.01:
            return ()
        words = target[1] if target else next(t[1] for t in src if t)
        where = ("carried from " + ", ".join(f"{k[0]} {k[1]}" for k in sources)) if sources \
            else "against the linear layers' efficiency alone"
        return (f"{words}: {math.expm1(moved):+.0%} on the matmul speed {where}",)

    def _carried_fallback_spread(self, key: Key, hardware: Hardware, m: int
                                 ) -> list[tuple[Default, float]]:
        """Per FLOPs-only fallback default, how far its own spread moves a calibration carried
        from the measured GPUs (``_pool(key)``) to ``key``: the change of log throughput of one
        GPU's micro-step at ``m`` on the target minus that on the source (the fit absorbs
        what both share), at the priors; (default, that width) per fallback.

        The default is moved by its spread both ways and the width is the root-mean-square
        of the two moves: the roofline is a maximum, so one side (more traffic, a target
        turned memory-bound) moves the step far more than the other, and the interval is
        centred on the point."""
        fallbacks = [d for d in self._defaults if d.fallback and d.kind in SPEED_KINDS]
        sources = [k for k in self._pool(key) if k[0] in self._hardware]
        if not fallbacks or not sources:
            return []
        cache = self._carried_cache
        cached = cache.get((key, m))
        if cached is not None:
            return cached
        single = resolve_layout(ParallelConfig(gpus_per_node=1, strategy="single",
                                               micro_batch=m))
        prior = Calibration()

        def effect(d: Default, hw: Hardware, precision: str, sign: int) -> float:
            factor = math.exp(sign * d.log_spread)
            opt = self._opt_bytes / factor if d.kind == "optimizer" else self._opt_bytes
            moved_workload = self._perturbed[d.kind] if sign > 0 else \
                perturbed(self.workload, d, factor)
            base = step_terms(self.workload, hw, precision, single, m, 1, self._shape,
                              self._opt_bytes, prior).step_s
            moved = step_terms(moved_workload, hw, precision, single, m, 1,
                               self._shape, opt, prior).step_s
            return math.log(base / moved)

        out = []
        for d in fallbacks:
            moves = []
            for sign in (1, -1):
                here = effect(d, hardware, key[1], sign)
                there = sum(effect(d, self._hardware[k[0]], k[1], sign)
                            for k in sources) / len(sources)
                moves.append(here - there)
            out.append((d, math.sqrt(sum(v * v for v in moves) / 2)))
        cache[(key, m)] = out
        return out

    @property
    def defaults(self) -> tuple[Default, ...]:
        """The defaults this workload's predictions take (:mod:`.defaults`)."""
        return self._defaults

    def _speed_effects(self, hardware: Hardware, precision: str, layout: Layout, m: int,
                       grad_accum: int, calib: Calibration, rfactor: float,
                       full_recompute: bool, throughput: float
                       ) -> list[tuple[Default, float]]:
        """(default, change of log throughput when its quantity moves by its own spread) for
        each speed default (:data:`.defaults.SPEED_KINDS`)."""
        out = []
        base = math.log(throughput)
        for d in self._defaults:
            if d.kind not in SPEED_KINDS:
                continue
            w = self._perturbed[d.kind]
            opt = self._opt_bytes / math.exp(d.log_spread) if d.kind == "optimizer" \
                else self._opt_bytes
            t = step_terms(w, hardware, precision, layout, m, grad_accum, self._shape, opt,
                           calib, rfactor, full_recompute)
            out.append((d, math.log(t.samples_per_step / t.step_s) - base))
        return out

    def default_effects(self, config: ParallelConfig, hardware: Hardware
                        ) -> list[tuple[Default, float]]:
        """(default, relative change of ``config``'s predicted throughput when the default
        moves by its own spread), largest effect first: which default decides the answer.
        Without a measurement on this GPU and precision the GPU's efficiency is one of them
        (its spread: ``uncertainty.TRANSFORMER_MFU_SPREAD``, else ``SIGMA_PRIOR_ONLY``)."""
        layout, precision, m = self._resolve(config, hardware)
        key = (hardware.gpu, precision)
        calib, _, _, _ = self._calibration(key)
        recompute = config.recompute_mode(self.workload.recompute)
        rfactor = recompute_factor(self.workload, recompute)
        full = recompute == "full"
        terms = step_terms(self.workload, hardware, precision, layout, m, config.grad_accum,
                           self._shape, self._opt_bytes, calib, rfactor, full)
        throughput = terms.samples_per_step / terms.step_s
        effects = self._speed_effects(hardware, precision, layout, m, config.grad_accum,
                                      calib, rfactor, full, throughput)
        if not self.result.log_compute_scale:
            eff = self._efficiency_default(key, hardware)
            slower = replace(calib, compute_scale=calib.compute_scale * math.exp(eff.log_spread))
            t = step_terms(self.workload, hardware, precision, layout, m, config.grad_accum,
                           self._shape, self._opt_bytes, slower, rfactor, full)
            effects.append((eff, math.log(t.samples_per_step / t.step_s / throughput)))
        effects = [(d, math.expm1(v)) for d, v in effects]
        return sorted(effects, key=lambda e: -abs(e[1]))

    def _joint_fit_sigma(self, key: Key, hardware: Hardware, layout: Layout, precision: str,
                         m: int,
                         grad_accum: int, calib: Calibration, rfactor: float,
                         full_recompute: bool, throughput: float) -> float | None:
        """Spread of log throughput from the fitted compute and communication scales taken
        together (delta method: ``gᵀ Σ g`` with ``g`` this prediction's sensitivity to each
        log scale, by finite differences), or None where κ was not fitted.

        ``Σ`` is the fit's covariance with the priors of κ and of the compute scales narrowed
        from the fit's weak regularisers (``fitting.SIGMA_PRIOR_COMM``,
        ``SIGMA_PRIOR_COMPUTE``: ×/÷4.5) to their own spreads (the communication model's
        ``uncertainty.SIGMA_COMM_FIT_FLOOR``, the prior's width without a GPU run:
        :func:`.uncertainty.narrowed_prior_cov`): where the runs do not separate compute
        from communication (one multi-GPU run), what they leave is as uncertain as the
        models it falls back on, not as the regulariser."""
        res = self.result
        if not res.param_cov:
            return None
        pool = [k for k in self._pool(key) if ("k", k) in res.param_index]
        if not pool:
            return None
        eps = 1e-3
        f = math.exp(eps)

        def log_rate(c: Calibration) -> float:
            t = step_terms(self.workload, hardware, precision, layout, m,
                           grad_accum, self._shape, self._opt_bytes, c, rfactor,
                           full_recompute)
            return math.log(t.samples_per_step / t.step_s)

        base = math.log(throughput)
        slower = replace(
            calib, compute_scale=calib.compute_scale * f,
            optimizer_scale=None if calib.optimizer_scale is None
            else calib.optimizer_scale * f,
            overhead_scale=None if calib.overhead_scale is None else calib.overhead_scale * f,
            latency_fixed_flops=calib.latency_fixed_flops * f,
            latency_per_sample_flops=calib.latency_per_sample_flops * f)
        g_k = (log_rate(slower) - base) / eps / len(pool)
        g_c = (log_rate(replace(calib, comm_scale=calib.comm_scale * f)) - base) / eps
        idx = [res.param_index[("k", k)] for k in pool] + [res.param_index[("kappa",)]]
        g = [g_k] * len(pool) + [g_c]
        cov = unc.narrowed_prior_cov(res.param_cov, [
            *((res.param_index[("k", k)], SIGMA_PRIOR_COMPUTE,
               unc.combine(*(v for _, v in self._prior_terms(k)))) for k in pool),
            (res.param_index[("kappa",)], SIGMA_PRIOR_COMM, unc.SIGMA_COMM_FIT_FLOOR)])
        for k in pool:  # carried on top of the fit (a proxy's size ratio): not narrowed
            i = res.param_index[("k", k)]
            cov[i][i] += res.carried_variance.get(k, 0.0)
        var = sum(g[a] * g[b] * cov[idx[a]][idx[b]]
                  for a in range(len(g)) for b in range(len(g)))
        return math.sqrt(max(var, 0.0))

    def _shape_notes(self, layout: Layout, checkpointing: bool) -> tuple[str, ...]:
        """The shape estimates this configuration's terms actually used."""
        used = []
        for note in self._shape.assumptions:
            if note.startswith("largest layer"):
                keep = layout.dp_strategy in ("zero3", "fsdp")
            elif note.startswith("num_layers"):
                keep = layout.tp > 1 or layout.pp > 1 or checkpointing
            else:
                keep = layout.tp > 1 or layout.pp > 1
            if keep:
                used.append(note)
        return tuple(used)

    def max_micro_batch(self, config: ParallelConfig, hardware: Hardware) -> int:
        """Largest micro-batch per GPU whose memory fits ``hardware`` under ``config``."""
        validate_config(config, hardware)
        layout = resolve_layout(config)
        context.check_context(self.workload, layout)
        return max_micro_batch_fitting(self.workload, config, layout,
                                       usable_memory_bytes(hardware.gpu, hardware.memory_bytes),
                                       self._shape, self._observed.activation_scale)


@dataclass(frozen=True)
class ObservedFit:
    """What observed runs say about memory: every observed configuration ran, so it fits.

    ``activation_scale`` (at most 1) shrinks the activation estimate until the observed
    configuration that was furthest over its GPU's memory fits, with the usual workspace
    margin; ``micro_batches`` maps each observed configuration to the micro-batch it ran at
    (a prediction of it is never called infeasible).
    """

    activation_scale: float = 1.0
    micro_batches: Mapping[tuple, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def _observed_key(gpu: str, config: ParallelConfig, layout: Layout, precision: str,
                  recompute: str) -> tuple:
    return (gpu, config.gpus_per_node, config.nodes, layout.tp, layout.pp, layout.vp,
            layout.dp, layout.cp, layout.dp_strategy, precision, recompute)


def observed_fit(workload: Workload, observations: Sequence[Observation],
                 hardware: Mapping[str, Hardware]) -> ObservedFit:
    """The :class:`ObservedFit` of ``observations`` (GPU runs with known hardware)."""
    shape = model_shape(workload)
    scale, worst, seen = 1.0, None, {}
    for obs in observations:
        hw = hardware.get(obs.gpu)
        m = obs.micro_batch or workload.micro_batch
        if is_cpu(obs.gpu) or hw is None or not m:
            continue
        nodes = max(1, int(obs.nodes or 1))
        precision = normalize_precision(obs.precision or workload.precision)
        config = ParallelConfig(gpus_per_node=obs.gpu_count // nodes, nodes=nodes,
                                strategy=obs.strategy or "ddp", micro_batch=int(m),
                                grad_accum=max(1, int(obs.grad_accum or 1)),
                                precision=precision, recompute=obs.recompute)
        layout = resolve_layout(config)
        recompute = config.recompute_mode(workload.recompute)
        key = _observed_key(obs.gpu, config, layout, precision, recompute)
        seen[key] = max(seen.get(key, 0), int(m))
        mem = memory_at(workload, config, layout, hw.memory_bytes, int(m), shape)
        f = activation_scale_to_fit(mem, usable_memory_bytes(hw.gpu, hw.memory_bytes))
        if f < scale:
            scale, worst = f, (obs, mem, hw)
    notes: tuple[str, ...] = ()
    if worst is not None:
        obs, mem, hw = worst
        notes = (f"activation estimate scaled by {scale:.2f}: the observed run on "
                 f"{obs.gpu_count} x {obs.gpu} ({obs.strategy}, micro-batch "
                 f"{obs.micro_batch or workload.micro_batch}) ran, but was estimated at "
                 f"{mem.total_bytes / 1e9:.1f} GB of the "
                 f"{usable_memory_bytes(hw.gpu, hw.memory_bytes) / 1e9:.1f} GB usable per GPU",)
    return ObservedFit(activation_scale=scale, micro_batches=seen, notes=notes)


def fit(workload: Workload, observations: Sequence[Observation],
        hardware: Mapping[str, Hardware]) -> Predictor:
    """Fit the scaling model to ``observations`` of ``workload``.

    ``hardware`` maps every GPU named in ``observations`` (canonical names) to its
    :class:`Hardware`; observations on ``"cpu"`` need none. With no GPU observation the
    predictor runs on priors (FLOPs / peak at a typical efficiency) with wide intervals.
    """
    validate_workload(workload)
    return Predictor(workload, fit_calibration(workload, observations, hardware),
                     observed_fit(workload, observations, hardware), hardware)
