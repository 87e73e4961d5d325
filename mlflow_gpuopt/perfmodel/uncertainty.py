"""Prediction intervals: the fit's own spread plus a term for every way a prediction
extrapolates beyond what was measured.

Widths are standard deviations of log(throughput), added in quadrature. The constants are
set once from the spread of published scaling and cross-GPU ratios (NVIDIA's
DeepLearningExamples tables; see ``benchmarks/bench_accuracy.py``), not per workload.
"""

from __future__ import annotations

import math

#: z for a central 90% interval of a normal.
Z90 = 1.6448536269514722
#: Run-to-run noise of a measured throughput: the narrowest an interval gets.
SIGMA_FLOOR = 0.03
#: No GPU measurement at all (a CPU run or none): FLOPs / peak at a prior efficiency (plus the
#: counted dispatch where the profile has a kernel count). The width is the spread of what
#: whole training steps achieve against that prior, which depends on the kind of workload, not
#: on the GPU. Per workload class, the mean log(measured / prior) that
#: ``bench_accuracy.py --lomo`` prints: BERT-large seq128 and ResNet-50 +0.05, SSD300 −0.13,
#: SQuAD −0.27, GNMT −0.29, BERT seq512 +0.56 (runs 1.75x above it), NCF −0.60, Transformer-XL
#: −0.80 / −1.02, Tacotron2 −1.13 (its counted dispatch is a third of the measured step) and
#: WaveGlow −1.23. Over the benchmark's 62 single-GPU rows the root-mean-square is 0.71 (0.70
#: weighting its 11 classes equally); the width is that spread, rounded up to 0.75 (90%
#: interval ×/÷3.4). Picked leave-one-model-out (the RMS of the other ten classes, 0.62-0.73)
#: it covers 85.5% of the rows. Those figures are with the profiled kernel counts and
#: activations (what a CPU-tracked run gives). With workload files of model-card keys only the
#: same check gives 0.79 over the rows (0.85 per class): Tacotron2 −2.40 (its 77,633
#: dispatched operators are on no card), the other classes +0.59 to −0.78, leave-one-model-out
#: coverage 93.5%. The point stays at the prior: the error is not centred, and a
#: shifted point would move every prior-basis plan the recommender prices.
SIGMA_PRIOR_ONLY = 0.75
#: No GPU measurement, and a workload that is not a described transformer but whose memory
#: traffic per sample and kernel count were measured (``track()``'s profile of a CPU run:
#: ``memory_traffic_bytes_per_sample`` with its matmul share, ``kernels_per_micro_step``, the
#: weight traffic per micro-step, the reductions of its batch-row GEMMs for their wave tails).
#: What is left is how far the roofline at a prior efficiency plus the counted dispatch
#: strays on whole steps. ``bench_accuracy.py --tracked`` prints, for the eight
#: DeepLearningExamples models it tracks that are not described transformers, the mean
#: log(published / predicted) of their 1-GPU rows through ``predict --run-id`` (AMP rows from
#: the profile's bytes and kernels under autocast; the run facts each model's files state:
#: apex O1 for Tacotron 2 and WaveGlow, the optimizer loops): NCF +0.06, Transformer-XL base
#: +0.14, SSD300 −0.04, Transformer-XL large +0.10, ResNet-50 −0.07, GNMT +0.15, Tacotron 2
#: −0.23, WaveGlow −0.33; per-class root-mean-square 0.197 (0.178 over the 50 rows), 0.20
#: (90 % interval ×/÷1.39, width 1.9× against ``SIGMA_PRIOR_ONLY``'s 11.8×). Picked
#: leave-one-model-out (the other seven classes' RMS, 0.17-0.21) it covers 88.0 % of the rows
#: (the misses two of Tacotron 2's four, three of WaveGlow's, one of Transformer-XL large's).
#: What moved the classes in: the GEMMs' wave tails (``compute.wave_tail_time_s``: GNMT,
#: Tacotron 2), the convolutions' NCHW transposes and the for-loop optimizers' host time
#: (WaveGlow), apex O1's wrappers (Tacotron 2's AMP rows). What is left: WaveGlow's
#: 160-230 ms a step that nothing counted explains, Tacotron 2's AMP rows (−0.41), GNMT's
#: tails, more than its steps leave (docs/accuracy.md#the-tracked-path). Eight classes is a
#: thin sample: the figure is what they show, not a bound; the same rows are
#: bench_accuracy's task 3t, so its leave-one-model-out coverage is the honest one.
SIGMA_PRIOR_TRACKED = 0.20
#: No GPU measurement, but a transformer described by its architecture (layers, hidden size,
#: sequence, heads, vocabulary) on a GPU generation and precision ``compute.GENERATION_MFU``
#: has a figure for: every term is derived from the architecture (docs/models.md#defaults), and
#: what is left is how far the whole prior strays on published pre-training. The
#: root-mean-square of log(published / predicted) over the derivation set of
#: ``shared/data/llm_training_throughput.tsv`` (the rows ``GENERATION_MFU`` came from, never
#: scored by ``benchmarks/bench_llm.py``), each predicted from its workload file alone through
#: ``mlflow gpuopt predict`` (their tensor-parallel communication overlapped, as the sources
#: run it, attention at its kernel's figure): Megatron-LM 2024 H100 0.288 (9 rows), NeMo 24.07
#: FP8 0.176 (12), torchtitan A100 Llama 2 0.187 (5); 0.223 over the 26, rounded up to 0.23
#: (``bench_llm.py --derive-prior-width`` prints it). It is a whole published run's spread
#: (its layout, node count and network included), so a prediction without a GPU measurement
#: adds none of the scaling pieces below. Other workloads and generations keep
#: ``SIGMA_PRIOR_ONLY``.
SIGMA_PRIOR_TRANSFORMER = 0.23
#: The pieces a described transformer's prior adds where its GPU generation or precision has
#: no published MFU (``compute.GENERATION_MFU``), each only where assumed
#: (:func:`prior_transformer_sigma`):
#: - a generation without a figure (Volta, Turing, Ada...) takes Ampere's efficiency
#:   (``compute.tensor_efficiency``); it strays from it by about as much as the published
#:   generations differ from each other: Ampere bf16 0.538 against Hopper bf16 0.46, log
#:   0.157 (the same derivation set);
#: - a precision without a figure on that generation (TF32, fp32 on the FP32 units) takes
#:   another operator path's efficiency: ``SIGMA_OTHER_PRECISION``, the same-GPU
#:   other-precision width.
SIGMA_GENERATION_UNMEASURED = 0.157
#: The whole spread of a calibration carried to another GPU type, every piece in: the
#: root-mean-square of log(published / predicted) over DeepLearningExamples' V100 <-> A100
#: transfers, 0.14 amp <-> amp (50 rows) and 0.27 fp32 <-> tf32 (36 rows), taken as 0.25. A
#: proxy transfer of a workload not described as a transformer uses it per model
#: (``transfer.DEFAULT_SPREAD``); a cross-GPU prediction itself combines the pieces below.
SIGMA_OTHER_GPU = 0.25
#: The pieces of a cross-GPU transfer (:func:`other_gpu_sigma`), each added only where the
#: prediction had to assume it:
#: - another GPU type at the calibration's own precision (same operator path: 16-bit tensor
#:   cores on both, or the FP32 units on both): the spread of the per-operator-class roofline
#:   transfer itself, net of the pieces the same interval adds for what else it assumed (the
#:   fit, a micro-batch away, the carried FLOPs-only defaults). Over the amp ↔ amp transfers
#:   of NVIDIA's DeepLearningExamples tables (V100 ↔ A100, 50 rows of 11 workload classes)
#:   log(published / predicted) had a root-mean-square of 0.139 when this was set, and those
#:   other pieces one of 0.129: what was left, sqrt(0.139² − 0.129²) = 0.052, rounded up to
#:   0.06. Since the operator-class transfer (wave tails, optimizer traffic) the same rows
#:   give 0.091 against 0.122, 42 of them with other pieces under 0.15 (0.076): net nothing
#:   (``bench_accuracy.py --lomo`` prints it), so 0.06 is kept as a floor, not narrowed to
#:   zero, for a transfer no row can show exact. The gross spread is the whole spread with the
#:   carried defaults inside it; adding them to it counted them twice.
#: - the precision changes on the way (fp32 on V100's FP32 units to TF32 on A100's tensor
#:   cores; bf16 to FP8): another operator path whose efficiency the calibration did not
#:   see, ``SIGMA_OTHER_PRECISION`` (the same-GPU, other-precision width).
SIGMA_OTHER_GPU_SAME_PRECISION = 0.06
#: Spread (standard deviation of log MFU) of large transformer pre-training within one GPU
#: generation and precision: how far one model's efficiency strays from the generation's
#: median (``compute.GENERATION_MFU``), in the same derivation set of
#: ``shared/data/llm_training_throughput.tsv`` that ``benchmarks/bench_llm.py`` never scores:
#: Ampere bf16 0.077 (torchtitan Llama 2 13B/70B on A100, 5 rows), Hopper bf16 0.063
#: (Megatron-LM README 2024, 9 rows with their layout), Hopper fp8 0.126 (NeMo 24.07, 12 rows,
#: linear-layer efficiency). Blackwell takes Hopper's (as GENERATION_MFU does). Taken as
#: independent between two groups, ``sqrt(sd_A² + sd_B²)`` (bf16 A100 -> H100 0.10, bf16 ->
#: fp8 on Hopper 0.14, fp8 H100 -> B200 0.18) is how far a calibration of such a transformer
#: carried from (generation, precision) A to B strays when nothing of the model's own
#: deviation is kept: whole runs of other models, sizes, layouts, GPU counts and micro-batches,
#: so it bounds any transfer between the two groups (:func:`transformer_transfer_bound`). It
#: is used instead of ``SIGMA_OTHER_GPU`` / ``SIGMA_OTHER_PRECISION`` for workloads described
#: by their transformer architecture (layers, hidden size, sequence, heads and vocabulary: what
#: the generation figures were measured on). Pairs with a group not listed keep the generic
#: widths.
TRANSFORMER_MFU_SPREAD = {("ampere", "bf16"): 0.077, ("hopper", "bf16"): 0.063,
                          ("hopper", "fp8"): 0.126, ("blackwell", "bf16"): 0.063,
                          ("blackwell", "fp8"): 0.126}
#: The same transformer, the same software stack, carried to another GPU type: its deviation
#: from the generation median is mostly its own (GEMM shapes, attention kernel, layout) and
#: stays with it on the new GPU, so what the carried calibration strays by is
#: Var(d_A - d_B) = sd_A² + sd_B² - 2·rho·sd_A·sd_B, not the independent sum. Measured
#: directly as the spread of such pairs through the CLI path (``bench_llm.py
#: --derive-transfer-width`` prints every figure here): NVIDIA's DeepLearningExamples
#: BERT-large (pre-training at sequence 128 and 512, SQuAD fine-tuning: the described
#: transformers of ``shared/data/nvidia_dle_benchmarks.csv``, rows ``bench_llm.py`` never
#: scores), one V100's amp row predicted from one A100's and back (each table's own
#: micro-batch on each GPU type): log(published / predicted) ∓0.013, ∓0.071, +0.067/−0.087,
#: root-mean-square 0.061 over the 6 rows and over the 3 models. Gross: those intervals' other
#: pieces (fit 0.03, micro-batch 0.05-0.10) are as large as the errors, so netting them out
#: leaves nothing the sample can resolve; the piece keeps the fit's noise and the micro-batch
#: change inside it. It implies rho 0.63 between Ampere bf16 and Hopper bf16, 0.88 between
#: Hopper fp8 and Blackwell fp8. Three models on one generation pair is a thin sample: the
#: figure is what they show, not a bound; picked leave-one-model-out (0.051-0.074) it covers
#: all 6 rows. Each pair was one GPU, so a change of layout, replicas or nodes adds its own
#: pieces beside it, never beyond the independent bound (:func:`transformer_transfer_terms`).
#: The same flag now prints 0.032 over the same rows (SQuAD's FLOPs counted as a config.json's
#: and sequence 512's bins stated in their files moved the pairs' errors): two corrections of
#: the workload files halved it, which says how loosely six rows hold the figure, so the
#: larger stays.
#: A change of precision keeps the bound: the one set of unscored pairs of a model at two
#: precisions on one GPU type (dgxc-benchmarking's NeMo BF16/FP8 H100 tables of GPT-3 175B
#: and Nemotron-4 15B / 340B, ``benchmarks/llm_pairs.py``, printed by the same flag) spreads
#: by 0.080 over its 15 rows, but leave-one-model-out it covers 40 % of them (without
#: Nemotron-4 15B, whose FP8 rows are 9-11 % slower than predicted, the other two give 0.020):
#: three models do not pin it down, so it is not used.
SIGMA_TRANSFORMER_GENERATION_PAIR = 0.061
#: Spreads (standard deviation of log value) of the defaults the models take where a workload
#: does not give a quantity (:mod:`.defaults`), each argued from the range the quantity
#: physically takes, not fitted:
#: - DRAM traffic from the architecture's activations × 6 passes: fused kernels (a compiled
#:   norm, FlashAttention) make it ~4 passes, unfused fp32 norm intermediates and casts ~9:
#:   ×/÷1.5, log 0.4;
#: - DRAM traffic from FLOPs / 30 (no architecture): training steps range from ~10 FLOPs per
#:   byte (embedding-heavy recommenders) to over 1,000 (billion-parameter transformers):
#:   ×/÷3.3, log 1.2;
#: - kernels per micro-step from the architecture (100 per layer, eager): torch.compile fuses
#:   them to about a third, FSDP's gathers and casts add: ×/÷1.65, log 0.5;
#: - the flat host overhead (no count, no architecture) stands for ~100 operators; models
#:   dispatch from 10² (an MLP) to 10⁵ (a recurrent decoder, Tacotron 2's 77,633): log 1.5;
#: - shape estimated from the parameter count (GPT aspect ratio hidden ≈ 64-128 × layers):
#:   log 0.3.
#: A FLOPs-only fallback's spread, times how far it moves the prediction (the root-mean-square
#: of moving it up and down by that spread), is added to the interval where the GPU and
#: precision were not measured themselves. The traffic one agrees with the benchmark files'
#: own figures: 6 × the activations their notes give against FLOPs / 30, over the eight
#: FLOPs-only workloads of ``benchmarks/workloads``, log ratios +0.48 (ResNet-50) to −2.34
#: (Tacotron 2), root-mean-square 1.34. The profiler's counts of the same eight tracked on the
#: CPU (``bench_accuracy.py --tracked``) put the traffic default's spread lower, 0.74 (12
#: FLOPs per byte for NCF to 120 for GNMT), but the flat host overhead's higher: its ~100
#: operators against counts of 53 (NCF) to 77,632 (Tacotron 2), root-mean-square 3.1 about
#: the default (geometric mean ~1,000). Narrowing the one on that evidence and not widening
#: the other would be choosing the evidence that narrows; re-centring the flat default on the
#: counts helped the prior-only rows (task 3b 41 → 32 %) but not the scaling ones (task 1a
#: p90 25 → 33 %), so both stay as argued.
SIGMA_TRAFFIC_ARCHITECTURE = 0.4
SIGMA_TRAFFIC_FROM_FLOPS = 1.2
SIGMA_KERNELS_ARCHITECTURE = 0.5
SIGMA_KERNELS_FLAT = 1.5
SIGMA_SHAPE_ESTIMATE = 0.3
#: Calibrated at another precision (another operator path: the FP32 units against TF32 or
#: 16-bit tensor cores, whose efficiencies differ): the spread of carrying a run to the other
#: precision on the same GPU, net of the pieces the same intervals add for what else they
#: assumed. Derived from NVIDIA's DeepLearningExamples 1-GPU rows of one model at both
#: precisions on one GPU (fp32 or TF32 <-> AMP: 64 predictions, 10 models, V100 and A100),
#: pairs no benchmark task scores (task 2 keeps the precision family): over the 34 whose
#: other pieces are under 0.15 (the carried FLOPs-only defaults swamp the rest) log(published
#: / predicted) has an RMS of 0.155 and net of those pieces 0.142; the maximum-likelihood
#: piece over all 64, each with its own other pieces, is 0.135, and leave-one-model-out
#: 0.111-0.147, covering 92 % of the rows (``bench_accuracy.py --derive-precision-width``).
#: Taken as 0.14.
SIGMA_OTHER_PRECISION = 0.14
#: A mixture-of-experts workload predicted with no run of it on any GPU: its MoE layers' terms
#: (dispatcher rates from DeepEP's README, the grouped expert GEMMs' small-``M`` efficiency,
#: routing balance; docs/models.md#mixture-of-experts) come from kernel sources, not from
#: whole runs like ``GENERATION_MFU``'s dense figures, so the prior's spread does not cover
#: them. Set, not derived: the width once taken for another operator path (0.2).
SIGMA_MOE_LAYERS = 0.2
#: The same, with a run of the same MoE model measured on another GPU type (or precision):
#: what the MoE layers leave beyond the transfer's other pieces, where
#: ``bench_llm.py --derive-transfer-width`` (its last lines) derives one. It does not now:
#: from the cross-GPU pairs no task scores (Megatron-Bridge's 26.02.01 and 26.04 tables,
#: GPT-OSS 120B 64 H100 <-> 64 B200, Qwen3-30B-A3B 16 H100 <-> 8 B200, Qwen3-235B-A22B on
#: 256 H100 from the 26.02 B200 run; its token-dropping NeMo 25.09 rows), each target
#: predicted through ``predict`` from the other GPU type's run, the RMS log error is 0.215
#: over 13 rows of 4 models beside 0.147 of the intervals' other pieces; the maximum-
#: likelihood piece beyond them is 0.156, and picked leave-one-model-out it covers 53.8 % of
#: the rows, under the 80 % rule the dense pair spreads are held to. (0.12 was derived from
#: 11 rows of 3 models, 81.8 %, before the Qwen3-235B H100 runs, whose expert group folds
#: over the tensor-parallel pairs, could be read.) So the prior's piece stays.
SIGMA_MOE_TRANSFER = SIGMA_MOE_LAYERS
#: A mixture of experts' measured time beyond the roofline carried to another GPU type
#: (``fitting.excess_as_throughput``): how far the point, which carries it as GPU throughput
#: work, strays from what the excess does, as a share of the log distance between that
#: reading and the latency-bound one (:func:`unexplained_sigma`). From how the measured
#: excess scales: on Megatron-Bridge's dropless Qwen3-30B-A3B runs it is 2.83× and 2.93×
#: longer on H100 than on B200, release by release (docs/accuracy.md#mixture-of-experts),
#: where throughput work moves by 2.27-2.30× (FP8 peak, memory bandwidth) and latency-bound
#: work by 1.12× (SMs × clock). Written as latency^(1-a) · throughput^a, the measured
#: ratios are a = ln(2.83 / 1.12) / ln(2.27 / 1.12) = 1.31 and ln(2.93 / 1.12) / ln(2.27 /
#: 1.12) = 1.36 (1.29 and 1.34 against the bandwidth's 2.30): at or beyond throughput work,
#: in log 1.3-1.4× as far from the latency reading as throughput work is (halfway, a = 0.5,
#: is ruled out). The root-mean-square of a - 1 over the two is 0.338 (0.313 against the
#: bandwidth), taken as 0.34 of the distance (log throughput taken linear in a): the
#: excess's nature is pinned to throughput work or faster, and what stays unknown is how much
#: faster. Two releases of one model and layout pair are a thin sample: the figure is what
#: they show, not a bound.
UNEXPLAINED_SCALING_SHARE = 0.34
#: More data-parallel replicas than any observation had: per doubling beyond the largest.
SIGMA_PER_DOUBLING_BEYOND = 0.035
#: A strategy, a node count > 1 or a micro-batch never observed.
SIGMA_UNOBSERVED_STRATEGY = 0.10
SIGMA_UNOBSERVED_MULTINODE = 0.08
SIGMA_PER_BATCH_DOUBLING = 0.05
#: Least spread of a fitted communication scale when carried to more replicas than measured:
#: a fit to 2 GPUs cannot tell bandwidth from per-hop latency or how NCCL's bus bandwidth
#: changes with ring size (nccl-tests busbw moves by about ±40% between 2 and 8 ranks).
SIGMA_COMM_FIT_FLOOR = 0.4


#: Names of the widths a prediction combines (``Prediction.width_terms``, ``predict --json``'s
#: ``width_terms``): what the prediction had to assume, each with its own spread.
TERM_FIT = "fit"
TERM_COMM_FIT = "communication scale carried"
TERM_PRIOR = "no GPU measurement"
TERM_PRIOR_TRANSFORMER = "no GPU measurement, transformer by its architecture"
TERM_PRIOR_TRACKED = "no GPU measurement, traffic and kernels measured by a tracked run"
TERM_GENERATION = "generation without a published MFU"
TERM_PRECISION_PRIOR = "precision without a published MFU"
TERM_OTHER_GPU = "another GPU type"
TERM_OTHER_PRECISION = "another precision"
TERM_TRANSFORMER_TRANSFER = "transformer MFU, another generation or precision"
TERM_BEYOND = "more replicas than measured"
TERM_BATCH = "micro-batch away from the measured ones"
TERM_STRATEGY = "strategy never observed"
TERM_MULTINODE = "multi-node never observed"
TERM_DEFAULT_PREFIX = "carried default: "
TERM_MOE = "mixture-of-experts layers, unmeasured on this GPU type and precision"
TERM_UNEXPLAINED = "unexplained time, nature unknown"


def _transformer_group(key: tuple[str, str]) -> tuple[str, str]:
    arch, precision = key
    return arch, "bf16" if precision == "fp16" else precision


def transformer_transfer_bound(source: tuple[str, str], target: tuple[str, str]
                               ) -> float | None:
    """Width of carrying a described transformer's calibration from ``source`` to
    ``target`` (each an (architecture, precision) pair) when none of the model's own
    deviation is kept: both groups' spreads in quadrature (``TRANSFORMER_MFU_SPREAD``); None
    where either group has no measured spread."""
    a = TRANSFORMER_MFU_SPREAD.get(_transformer_group(source))
    b = TRANSFORMER_MFU_SPREAD.get(_transformer_group(target))
    if a is None or b is None:
        return None
    return combine(a, b)


def transformer_transfer_sigma(source: tuple[str, str], target: tuple[str, str]
                               ) -> float | None:
    """The transfer piece of a described transformer's calibration carried from ``source``
    to ``target`` (each an (architecture, precision) pair): at the same precision (another
    GPU type) the same model's pair spread, ``SIGMA_TRANSFORMER_GENERATION_PAIR``, never above
    :func:`transformer_transfer_bound`; with a change of precision the bound itself. None
    where either group has no measured spread."""
    bound = transformer_transfer_bound(source, target)
    if bound is None:
        return None
    if _transformer_group(source)[1] != _transformer_group(target)[1]:
        return bound
    return min(SIGMA_TRANSFORMER_GENERATION_PAIR, bound)


def transformer_transfer_terms(piece: float, bound: float,
                               scaling: tuple[tuple[str, float], ...]
                               ) -> tuple[tuple[str, float], ...]:
    """Named widths of a described transformer's transfer: its piece (``piece``, from
    :func:`transformer_transfer_sigma`) beside the scaling pieces of what else changed
    (``scaling``: more replicas, another strategy, nodes), or the independent ``bound`` alone
    where those together would exceed it (the bound is the spread of whole runs of other
    layouts and scales, so it holds every change a layout brings)."""
    if combine(piece, *(v for _, v in scaling)) <= bound:
        return ((TERM_TRANSFORMER_TRANSFER, piece), *scaling)
    return ((TERM_TRANSFORMER_TRANSFER, bound), *((name, 0.0) for name, _ in scaling))


def prior_transformer_terms(generation_measured: bool, precision_measured: bool
                            ) -> tuple[tuple[str, float], ...]:
    """Named widths of a described transformer's prediction without a GPU measurement:
    ``SIGMA_PRIOR_TRANSFORMER`` (the whole prior's spread where ``compute.GENERATION_MFU`` has
    the generation and precision), with ``SIGMA_GENERATION_UNMEASURED`` and
    ``SIGMA_OTHER_PRECISION`` for what it lacks, each only where lacking."""
    return ((TERM_PRIOR_TRANSFORMER, SIGMA_PRIOR_TRANSFORMER),
            *(() if generation_measured else ((TERM_GENERATION, SIGMA_GENERATION_UNMEASURED),)),
            *(() if precision_measured else ((TERM_PRECISION_PRIOR, SIGMA_OTHER_PRECISION),)))


def prior_tracked(traffic_measured: bool, kernels_measured: bool) -> float | None:
    """``SIGMA_PRIOR_TRACKED`` where both the memory traffic and the kernel count were
    measured (a tracked profile), else None (the caller's own prior width)."""
    return SIGMA_PRIOR_TRACKED if traffic_measured and kernels_measured else None


def prior_transformer_sigma(generation_measured: bool, precision_measured: bool) -> float:
    """The combined width of :func:`prior_transformer_terms`."""
    return combine(*(v for _, v in prior_transformer_terms(generation_measured,
                                                           precision_measured)))


def other_gpu_terms(other_gpu: bool, other_precision: bool) -> tuple[tuple[str, float], ...]:
    """Named widths of carrying a calibration to another GPU type and/or precision, from the
    pieces the transfer had to assume (``SIGMA_OTHER_GPU_SAME_PRECISION``,
    ``SIGMA_OTHER_PRECISION``); empty when it had to assume neither."""
    return (*(((TERM_OTHER_GPU, SIGMA_OTHER_GPU_SAME_PRECISION),) if other_gpu else ()),
            *(((TERM_OTHER_PRECISION, SIGMA_OTHER_PRECISION),) if other_precision else ()))


def other_gpu_sigma(other_gpu: bool, other_precision: bool) -> float:
    """The combined width of :func:`other_gpu_terms`; 0 when it had to assume neither."""
    return combine(*(v for _, v in other_gpu_terms(other_gpu, other_precision)))


def unexplained_sigma(throughput_reading: float, latency_reading: float) -> float:
    """Width ``TERM_UNEXPLAINED`` of a measured time beyond the roofline carried to another
    GPU type: ``UNEXPLAINED_SCALING_SHARE`` of |log| of the two readings' throughputs (the
    excess as GPU throughput work, the point, and as latency-bound work), any units."""
    if throughput_reading <= 0 or latency_reading <= 0:
        return 0.0
    return UNEXPLAINED_SCALING_SHARE * abs(math.log(throughput_reading / latency_reading))


def combine(*sigmas: float) -> float:
    """Independent log-normal widths added in quadrature."""
    return math.sqrt(sum(s * s for s in sigmas))


def scale_beyond(replicas: int, max_observed_replicas: int) -> float:
    """Width for predicting more replicas than measured (0 when within the measured range)."""
    if replicas <= max_observed_replicas:
        return 0.0
    return SIGMA_PER_DOUBLING_BEYOND * math.log2(replicas / max(1, max_observed_replicas))


def comm_fit_spread(log_comm_sd: float, exposed_share: float, replicas: int,
                    max_observed_replicas: int) -> float:
    """Width from the fitted communication scale: its log spread (never below
    ``SIGMA_COMM_FIT_FLOOR`` once the prediction has more replicas than measured) times the
    sensitivity of log step time to it, about the share of the step that is exposed
    communication. Zero when the scale was not fitted (the prior widths cover it)."""
    if log_comm_sd <= 0 or exposed_share <= 0:
        return 0.0
    sd = max(log_comm_sd, SIGMA_COMM_FIT_FLOOR) if replicas > max_observed_replicas \
        else log_comm_sd
    return sd * min(1.0, exposed_share)


def narrowed_prior_cov(cov: tuple[tuple[float, ...], ...],
                       priors: list[tuple[int, float, float]]) -> list[list[float]]:
    """The fit's covariance of its log scales as it would be with each scale's prior at its
    own published spread instead of the fit's weak regulariser. ``priors`` holds (index in
    ``cov``, the fit's prior width, the scale's own spread): for κ ``fitting.SIGMA_PRIOR_COMM``
    (×/÷4.5) and the communication model's ``SIGMA_COMM_FIT_FLOOR``; for a compute scale
    ``fitting.SIGMA_PRIOR_COMPUTE`` and the prior's width without a GPU run. Each is a
    rank-one update of the precision along that scale (Sherman-Morrison): what the runs
    pinned (the step they measured) stays pinned, and only what they left to the prior
    narrows to what the prior is known to. A spread not narrower than the fit's prior
    changes nothing."""
    out = [list(row) for row in cov]
    n = len(out)
    for i, fit_prior, own in priors:
        a = 1.0 / own ** 2 - 1.0 / fit_prior ** 2 if own > 0 else 0.0
        if a <= 0:
            continue
        col = [out[r][i] for r in range(n)]
        denom = 1.0 + a * out[i][i]
        out = [[out[r][c] - a * col[r] * col[c] / denom for c in range(n)]
               for r in range(n)]
    return out


def batch_away(micro_batch: float, observed: frozenset[float], split_identified: bool) -> float:
    """Width for a micro-batch away from the measured ones when ``a``/``b`` was not fitted:
    ``SIGMA_PER_BATCH_DOUBLING`` per doubling (log2) to the nearest of ``observed``.

    ``observed`` is the batches (samples per GPU) the prediction's calibration was measured
    at: the target GPU's own, or, for a transferred prediction (GPU or precision never
    measured), those of the calibrations it borrows, since the batch dependence of
    per-sample time belongs to the workload more than to the GPU
    (``Predictor._reference_batches``). ``split_identified`` is true only where ``a``/``b``
    was fitted for the target itself; a transfer does not carry the fitted ``r`` (its
    roofline split is the prior), so it pays the term.
    Empty ``observed`` (no measurement at all) adds nothing: the prior width covers it.
    """
    if split_identified or not observed or micro_batch in observed:
        return 0.0
    nearest = min(abs(math.log2(micro_batch / m)) for m in observed if m > 0)
    return SIGMA_PER_BATCH_DOUBLING * nearest


def interval(value: float, log_sigma: float, z: float = Z90) -> tuple[float, float]:
    """(low, high) of a log-normal around ``value`` at ``z`` standard deviations."""
    return value * math.exp(-z * log_sigma), value * math.exp(z * log_sigma)

