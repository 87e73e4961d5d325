"""The run contract: every MLflow param, metric, tag and artifact name gpuopt writes or reads.

Declared once here; writers (tracking, the recommendation logger, the run-context plugin) and
readers (``mlflow_io``, the CLI, the report) import these names instead of spelling them. The
meaning and units of each name are documented in ``docs/metrics.md``; a name's unit is also
its suffix (``_s``, ``_bytes``, ``_percent``, ``_watts``, ``_joules``, ``_per_s``).

Pure constants and string builders: no imports, no I/O.
"""

from __future__ import annotations

PREFIX = "gpuopt"

# -- params (``gpuopt.*``) ---------------------------------------------------------------------
PARAM_PREFIX = "gpuopt."
PARAM_DEVICE = "gpuopt.device"  # NVML name of GPU 0 of this process, or "cpu"
PARAM_GPU_BACKEND = "gpuopt.gpu_backend"
PARAM_DEVICE_COUNT = "gpuopt.device_count"
PARAM_NODES = "gpuopt.nodes"
PARAM_WORLD_SIZE = "gpuopt.world_size"
PARAM_STRATEGY = "gpuopt.strategy"
PARAM_GPUS_PER_NODE = "gpuopt.gpus_per_node"
PARAM_BACKEND = "gpuopt.backend"  # torch.distributed backend of a job
PARAM_INTERCONNECT = "gpuopt.interconnect"
PARAM_PRECISION = "gpuopt.precision"
PARAM_MICRO_BATCH = "gpuopt.micro_batch"
PARAM_GRAD_ACCUM = "gpuopt.grad_accum"
PARAM_PARAMS = "gpuopt.params"
PARAM_TRAINABLE_PARAMS = "gpuopt.trainable_params"
#: Model FLOPs (forward + backward, recomputation left out) and, apart, the FLOPs of the
#: forward operators activation checkpointing replayed: hardware FLOPs are the two summed.
PARAM_FLOPS_PER_SAMPLE = "gpuopt.flops_per_sample"
PARAM_RECOMPUTE_FLOPS_PER_SAMPLE = "gpuopt.recompute_flops_per_sample"
PARAM_OPTIMIZER = "gpuopt.optimizer"
PARAM_TOKENS_PER_SAMPLE = "gpuopt.tokens_per_sample"
#: Context parallelism: what the profiled rank's slice of each sample held, as measured
#: (``gpuopt.tokens_per_sample`` and ``gpuopt.flops_per_sample`` are the whole sample's);
#: logged only when the sequence is split (``gpuopt.cp`` > 1).
PARAM_RANK_TOKENS_PER_SAMPLE = "gpuopt.rank_tokens_per_sample"
PARAM_RANK_FLOPS_PER_SAMPLE = "gpuopt.rank_flops_per_sample"
PARAM_KERNELS_PER_MICRO_STEP = "gpuopt.kernels_per_micro_step"
#: Degrees of parallelism of a job (from its DeviceMesh or TrackConfig).
PARAM_TP = "gpuopt.tp"
PARAM_PP = "gpuopt.pp"
PARAM_DP = "gpuopt.dp"
PARAM_CP = "gpuopt.cp"
#: Expert-parallel degree (a mesh ``ep`` dimension or ``TrackConfig.ep``): each MoE layer's
#: experts split over this many of the data-parallel ranks.
PARAM_EP = "gpuopt.ep"
#: What the profiled step ran: attention kernel, activation recomputation, FP8 recipe.
PARAM_ATTENTION = "gpuopt.attention"  # sdpa | eager
PARAM_RECOMPUTE = "gpuopt.recompute"  # none | selective | selective-op | full
PARAM_FP8_RECIPE = "gpuopt.fp8_recipe"  # te | tensorwise | rowwise
#: Memory format of the tracked model's 2-D convolutions (not logged: no Conv2d layers).
PARAM_MEMORY_FORMAT = "gpuopt.memory_format"  # contiguous | channels_last
#: The tracked model's wrapper class: "DataParallel", "DistributedDataParallel",
#: "FullyShardedDataParallel", "compiled" (a torch.compile'd module) or "none".
PARAM_MODEL_WRAPPER = "gpuopt.model_wrapper"
#: "true" when compiled (Inductor) graphs ran the training step; then
#: ``gpuopt.kernels_per_micro_step`` is their launches and this the eager operator count
PARAM_COMPILED = "gpuopt.compiled"
#: Share of the profiled step's token positions that were padding (attention-mask zeros);
#: throughput in tokens counts the real tokens only
PARAM_PADDING_FRACTION = "gpuopt.padding_fraction"
#: Parameter-efficient adapters the model holds: "lora" or "qlora" (not logged: none)
PARAM_ADAPTER = "gpuopt.adapter"
PARAM_EAGER_KERNELS_PER_MICRO_STEP = "gpuopt.eager_kernels_per_micro_step"

#: The tracked model's architecture, as its ``config`` declares it (Hugging Face, nanoGPT,
#: litgpt; :mod:`mlflow_gpuopt.tracking.architecture`): not logged when not declared.
PARAM_NUM_LAYERS = "gpuopt.num_layers"
PARAM_HIDDEN_SIZE = "gpuopt.hidden_size"
PARAM_NUM_HEADS = "gpuopt.num_heads"
PARAM_NUM_KV_HEADS = "gpuopt.num_kv_heads"
PARAM_FFN_HIDDEN_SIZE = "gpuopt.ffn_hidden_size"
PARAM_MLP = "gpuopt.mlp"  # gelu | swiglu | geglu
PARAM_VOCAB_SIZE = "gpuopt.vocab_size"
#: Mixture of experts, read from the tracked model's MoE blocks
#: (:mod:`mlflow_gpuopt.tracking.moe_layers`), by the workload file's key names; not logged
#: for a dense model. ``gpuopt.params`` counts every expert, ``gpuopt.active_params`` the
#: parameters one token uses.
PARAM_NUM_EXPERTS = "gpuopt.num_experts"
PARAM_EXPERTS_PER_TOKEN = "gpuopt.experts_per_token"
PARAM_NUM_SHARED_EXPERTS = "gpuopt.num_shared_experts"
PARAM_EXPERT_FFN_HIDDEN_SIZE = "gpuopt.expert_ffn_hidden_size"
PARAM_MOE_LAYER_FREQ = "gpuopt.moe_layer_freq"
PARAM_ACTIVE_PARAMS = "gpuopt.active_params"
#: Profile key -> param of the MoE fields (num_experts first: experts_per_token needs it).
MOE_PARAMS = {
    "num_experts": PARAM_NUM_EXPERTS, "experts_per_token": PARAM_EXPERTS_PER_TOKEN,
    "num_shared_experts": PARAM_NUM_SHARED_EXPERTS,
    "expert_ffn_hidden_size": PARAM_EXPERT_FFN_HIDDEN_SIZE,
    "moe_layer_freq": PARAM_MOE_LAYER_FREQ,
}
#: Profile key -> param of the architecture fields (the config's, then the MoE blocks').
ARCHITECTURE_PARAMS = {
    "num_layers": PARAM_NUM_LAYERS, "hidden_size": PARAM_HIDDEN_SIZE,
    "num_heads": PARAM_NUM_HEADS, "num_kv_heads": PARAM_NUM_KV_HEADS,
    "ffn_hidden_size": PARAM_FFN_HIDDEN_SIZE, "mlp": PARAM_MLP, "vocab_size": PARAM_VOCAB_SIZE,
    **MOE_PARAMS,
}

#: Workload fields (the profile's keys) and the param that carries each when the profile
#: artifact is missing.
WORKLOAD_PARAMS = {
    "params": PARAM_PARAMS, "flops_per_sample": PARAM_FLOPS_PER_SAMPLE,
    "precision": PARAM_PRECISION, "micro_batch": PARAM_MICRO_BATCH,
    "grad_accum": PARAM_GRAD_ACCUM, "optimizer": PARAM_OPTIMIZER,
    "tokens_per_sample": PARAM_TOKENS_PER_SAMPLE, "trainable_params": PARAM_TRAINABLE_PARAMS,
    "kernels_per_micro_step": PARAM_KERNELS_PER_MICRO_STEP,
    "attention": PARAM_ATTENTION, "recompute": PARAM_RECOMPUTE, "fp8_recipe": PARAM_FP8_RECIPE,
    "recompute_flops_per_sample": PARAM_RECOMPUTE_FLOPS_PER_SAMPLE,
    "memory_format": PARAM_MEMORY_FORMAT,
    **ARCHITECTURE_PARAMS,
}


def param_field(param: str) -> str:
    """The field a ``gpuopt.*`` param names (``gpuopt.world_size`` -> ``world_size``)."""
    return param.split(".", 1)[1] if param.startswith(PARAM_PREFIX) else param


# -- tags --------------------------------------------------------------------------------------
TAG_TRACKED = "gpuopt.tracked"  # "true" on runs track() wrote into
TAG_LOCAL_RUN_ID = "gpuopt.local_run_id"  # id minted by track() for a run it creates over REST
TAG_KIND = "gpuopt.kind"  # KIND_RECOMMENDATION | KIND_CANDIDATE
TAG_SOURCE_RUN_IDS = "gpuopt.source_run_ids"  # comma-separated
TAG_WHY = "gpuopt.why"  # a candidate's one-line reason
KIND_RECOMMENDATION = "recommendation"
KIND_CANDIDATE = "candidate"
#: A job launched as a plan (``GPUOPT_PLAN`` / ``track(plan=...)``): the plan id
#: (``<recommendation_run_id>:<rank>``), its parts, and the plan's child run where one exists.
TAG_PLAN = "gpuopt.plan"
TAG_RECOMMENDATION_RUN_ID = "gpuopt.recommendation_run_id"
TAG_PLAN_RANK = "gpuopt.plan_rank"
TAG_PLAN_RUN_ID = "gpuopt.plan_run_id"
#: On a plan's run (its child run, else the recommendation run): the job runs launched as
#: it, comma-separated, appended by each job.
TAG_JOB_RUN_IDS = "gpuopt.job_run_ids"
#: Also on the plan's run, one per job: ``gpuopt.job_run.<job run id>`` = "1" (a tag of its
#: own is never overwritten by another job's append).
TAG_JOB_RUN_PREFIX = "gpuopt.job_run."
#: Hardware fingerprint tags set on every new run by the run-context plugin.
TAG_HW_GPU = "gpuopt.hw.gpu"
TAG_HW_GPU_COUNT = "gpuopt.hw.gpu_count"
TAG_HW_CPU = "gpuopt.hw.cpu"
TAG_HW_CPU_COUNT = "gpuopt.hw.cpu_count"
TAG_HW_MEMORY_GB = "gpuopt.hw.memory_gb"
TAG_HW_CLOUD = "gpuopt.hw.cloud"
TAG_HW_INSTANCE_TYPE = "gpuopt.hw.instance_type"

# -- metrics: time series (``gpuopt/*``) ------------------------------------------------------
METRIC_STEP_TIME_S = "gpuopt/step_time_s"
METRIC_THROUGHPUT_SAMPLES = "gpuopt/throughput_samples_per_s"
METRIC_THROUGHPUT_TOKENS = "gpuopt/throughput_tokens_per_s"
METRIC_CPU_UTILIZATION = "gpuopt/cpu_utilization_percent"
METRIC_HOST_MEMORY_USED = "gpuopt/host_memory_used_bytes"
METRIC_PROCESS_RSS = "gpuopt/process_rss_bytes"
METRIC_COMM_TIME_S = "gpuopt/comm_time_s"  # per step, mean over ranks (jobs)
METRIC_COMM_BYTES = "gpuopt/comm_bytes"  # per step, mean over ranks (jobs)
METRIC_EXPOSED_COMM_FRACTION = "gpuopt/exposed_comm_fraction"
#: Mean host time per step from the end of a step to the next step's first forward.
METRIC_INPUT_WAIT_S = "gpuopt/input_wait_s"

#: Per-GPU readings (``gpu_<i>_<reading>``).
GPU_UTILIZATION_PERCENT = "utilization_percent"
GPU_MEMORY_USED_BYTES = "memory_used_bytes"
GPU_POWER_WATTS = "power_watts"
GPU_SM_CLOCK_MHZ = "sm_clock_mhz"
GPU_TORCH_ALLOCATED_BYTES = "torch_allocated_bytes"
GPU_TORCH_RESERVED_BYTES = "torch_reserved_bytes"
#: Per-rank readings (``rank_<r>/<reading>``) and per-node host readings (``node_<k>/...``).
RANK_STEP_TIME_S = "step_time_s"
RANK_THROUGHPUT_SAMPLES = "throughput_samples_per_s"
RANK_PROCESS_CPU_PERCENT = "process_cpu_percent"
RANK_PROCESS_RSS_BYTES = "process_rss_bytes"
NODE_CPU_UTILIZATION_PERCENT = "cpu_utilization_percent"
NODE_HOST_MEMORY_USED_BYTES = "host_memory_used_bytes"


def gpu_metric(gpu: int, reading: str) -> str:
    """``gpuopt/gpu_<gpu>_<reading>``: one GPU of this process (``gpu``: its index among the
    GPUs the process samples)."""
    return f"{PREFIX}/gpu_{gpu}_{reading}"


def rank_metric(rank: int, reading: str) -> str:
    """``gpuopt/rank_<rank>/<reading>``: one rank of a distributed job."""
    return f"{PREFIX}/rank_{rank}/{reading}"


def node_metric(node: int, reading: str) -> str:
    """``gpuopt/node_<node>/<reading>``: one node's host-wide reading."""
    return f"{PREFIX}/node_{node}/{reading}"


def node_gpu_metric(node: int, gpu: int, reading: str) -> str:
    """``gpuopt/node_<node>/gpu_<gpu>_<reading>`` (``gpu``: the GPU's index on its node)."""
    return f"{PREFIX}/node_{node}/gpu_{gpu}_{reading}"


# -- metrics: the end-of-run summary (``gpuopt/summary/*``) -----------------------------------
SUMMARY_PREFIX = "gpuopt/summary/"


def summary_metric(name: str) -> str:
    """``gpuopt/summary/<name>``."""
    return SUMMARY_PREFIX + name


SUMMARY_THROUGHPUT_SAMPLES = summary_metric("throughput_samples_per_s")
SUMMARY_THROUGHPUT_TOKENS = summary_metric("throughput_tokens_per_s")
SUMMARY_THROUGHPUT_STEPS = summary_metric("throughput_steps_per_s")
SUMMARY_STEP_TIME_P50_S = summary_metric("step_time_p50_s")
SUMMARY_STEP_TIME_P90_S = summary_metric("step_time_p90_s")
SUMMARY_STEP_TIME_MEAN_S = summary_metric("step_time_mean_s")
SUMMARY_STEPS = summary_metric("steps")
SUMMARY_STEADY_STEPS = summary_metric("steady_steps")
SUMMARY_WARMUP_STEPS = summary_metric("warmup_steps")
SUMMARY_PEAK_MEMORY_BYTES = summary_metric("peak_memory_bytes")
SUMMARY_MFU = summary_metric("mfu")
SUMMARY_ENERGY_JOULES = summary_metric("energy_joules")
SUMMARY_GPU_UTILIZATION = summary_metric("gpu_utilization_percent")
SUMMARY_COMM_TIME_PER_STEP_S = summary_metric("comm_time_per_step_s")  # jobs only
SUMMARY_COMM_BYTES_PER_STEP = summary_metric("comm_bytes_per_step")
SUMMARY_COLLECTIVES_PER_STEP = summary_metric("collectives_per_step")
SUMMARY_EXPOSED_COMM_FRACTION = summary_metric("exposed_comm_fraction")
SUMMARY_INPUT_WAIT_FRACTION = summary_metric("input_wait_fraction")  # of the step time, 0..1
SUMMARY_INPUT_WAIT_MEAN_S = summary_metric("input_wait_mean_s")
SUMMARY_CPU_UTILIZATION = summary_metric("cpu_utilization_percent")  # host, mean of samples
SUMMARY_SKIPPED_STEPS = summary_metric("skipped_steps")  # GradScaler skipped the update
#: mean padded tokens per sample over the steps, where their padded lengths varied (the
#: profile's ``sequence_bins``)
SUMMARY_MEAN_PADDED_TOKENS = summary_metric("mean_padded_tokens_per_sample")

SUMMARY_PREDICTION_RATIO_THROUGHPUT = summary_metric("prediction_ratio_throughput")
SUMMARY_PREDICTION_RATIO_STEP_TIME = summary_metric("prediction_ratio_step_time")
SUMMARY_PREDICTION_RATIO_MEMORY = summary_metric("prediction_ratio_memory")

# -- metrics: a plan's predictions, logged next to what a job launched as it measures ----------
PREDICTED_PREFIX = "gpuopt/predicted/"
PREDICTED_THROUGHPUT_SAMPLES = PREDICTED_PREFIX + "throughput_samples_per_s"
PREDICTED_THROUGHPUT_LOW = PREDICTED_PREFIX + "throughput_low_samples_per_s"
PREDICTED_THROUGHPUT_HIGH = PREDICTED_PREFIX + "throughput_high_samples_per_s"
PREDICTED_STEP_TIME_S = PREDICTED_PREFIX + "step_time_s"
PREDICTED_MEMORY_PER_GPU_BYTES = PREDICTED_PREFIX + "memory_per_gpu_bytes"
PREDICTED_HOURS = PREDICTED_PREFIX + "hours"
PREDICTED_HOURS_LOW = PREDICTED_PREFIX + "hours_low"
PREDICTED_HOURS_HIGH = PREDICTED_PREFIX + "hours_high"
PREDICTED_COST_USD = PREDICTED_PREFIX + "cost_usd"

# -- artifacts ---------------------------------------------------------------------------------
ARTIFACT_DIR = "gpuopt"
PROFILE_ARTIFACT = "gpuopt/profile.json"  # the workload profile, schema PROFILE_SCHEMA
RECOMMENDATION_JSON = "gpuopt/recommendation.json"
CANDIDATES_TABLE = "gpuopt/candidates_table.json"
REPORT_HTML = "gpuopt/report.html"
PARETO_PNG = "gpuopt/pareto.png"
SCALING_PNG = "gpuopt/scaling.png"
ADVICE_JSON = "gpuopt/advice.json"  # `mlflow gpuopt advise`: the ranked findings, ADVICE_SCHEMA

# -- schema versions ---------------------------------------------------------------------------
PROFILE_SCHEMA = "gpuopt.workload/1"  # the "schema" key of gpuopt/profile.json
JOURNAL_SCHEMA = "gpuopt.journal/1"  # the first line of a delivery journal
ADVICE_SCHEMA = "gpuopt.advice/1"  # the "schema" key of gpuopt/advice.json
