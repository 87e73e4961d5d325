"""What the recommender takes and returns: frozen dataclasses of plain numbers.

Times are in hours, money in US dollars, throughput in samples per second. Nothing here
knows about MLflow, files or printing; the CLI and ``mlflow_io`` turn these into tables,
JSON and artifacts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from mlflow_gpuopt.catalog.schema import GpuSpec, Offer
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Prediction


#: ``SearchSpace.memory_headroom`` unless asked otherwise (``recommend --memory-headroom``).
DEFAULT_MEMORY_HEADROOM = 0.10


class Predictor(Protocol):
    """The fitted scaling model, as ``perfmodel.fit`` returns it."""

    def predict(self, config: ParallelConfig, hardware: Hardware) -> Prediction: ...

    def max_micro_batch(self, config: ParallelConfig, hardware: Hardware) -> int: ...


class HardwareFor(Protocol):
    """Builds the model's view of one offer's GPU and links (``hardware.hardware_for_gpu``)."""

    def __call__(self, spec: GpuSpec, offer: Offer) -> Hardware: ...


@dataclass(frozen=True)
class Target:
    """What the user wants trained, by when and how sure they want to be.

    ``total_samples`` is the whole job (epochs × dataset, tokens ÷ sequence length, or steps
    × measured global batch).

    The batch each plan trains with: with ``global_batch`` set (samples per optimizer step,
    a training hyper-parameter), every plan keeps it, split as micro-batch × accumulation ×
    data-parallel ranks (a plan whose ranks do not divide it is left out);
    ``global_batch_asked`` says whether the user asked for it (``recommend --global-batch``)
    or it is the measured run's, or ``global_batch_why`` where it was derived (a workload
    file's LLM pre-training). With ``global_batch`` None, each GPU keeps
    ``per_rank_batch`` (the measured micro-batch × accumulation), so the global batch grows
    with the GPU count (``recommend --keep-micro-batch``).
    """

    total_samples: float
    deadline_hours: float | None = None  # None: no deadline, rank by cost alone
    confidence: float = 0.9  # a plan "meets" the deadline when P(time <= deadline) >= this
    per_rank_batch: int = 1
    description: str = ""  # how the user said it, e.g. "90 epochs x 1.28M samples"
    checkpoint_interval_hours: float = 0.5  # spot / Colab restarts lose half of this on average
    global_batch: int | None = None  # samples per optimizer step every plan keeps
    global_batch_asked: bool = False  # True: the user set global_batch, not the measured run
    #: Where a ``global_batch`` neither asked for nor measured comes from, in words (LLM
    #: pre-training practice: :mod:`.llm_batch`); empty otherwise
    global_batch_why: str = ""

    @property
    def batch_mode(self) -> str:
        """``kept`` (the measured global batch), ``set`` (asked for), ``derived`` (chosen
        for the workload: ``global_batch_why``) or ``per-gpu``."""
        if self.global_batch is None:
            return "per-gpu"
        if self.global_batch_asked:
            return "set"
        return "derived" if self.global_batch_why else "kept"

    def rank_batch(self, data_parallel_ranks: int) -> int | None:
        """Samples per data-parallel rank per optimizer step (micro-batch × accumulation);
        ``None`` where the global batch does not split evenly over the ranks."""
        if self.global_batch is None:
            return max(1, self.per_rank_batch)
        ranks = max(1, data_parallel_ranks)
        if self.global_batch % ranks:
            return None
        return self.global_batch // ranks


@dataclass(frozen=True)
class SearchSpace:
    """Which offers and shapes may be considered (``None`` = no restriction)."""

    providers: tuple[str, ...] | None = None
    region: str | None = None
    spot: bool | None = None  # True: spot only, False: on-demand only, None: both
    max_gpus: int | None = None
    max_nodes: int = 16
    #: Share of each GPU's usable memory a plan leaves free at its predicted median peak
    #: (plans above it are dropped): a margin for what the estimate's spread does not cover.
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM
    #: Plans' tensor-parallel degree is a multiple of this: ``--expert-tensor-parallel N``,
    #: the routed experts split N ways inside the tensor-parallel group.
    tp_multiple: int = 1


@dataclass(frozen=True)
class Costing:
    """Assumptions behind time and cost that are not in the catalog; change them per call.

    ``startup_hours`` is provisioning + image pull + data staging per (re)start, by provider.
    ``spot_preemptions_per_node_hour`` is the rate at which one spot node is reclaimed; each
    preemption costs a restart plus, on average, half a checkpoint interval of lost work.
    """

    startup_hours: Mapping[str, float] = field(default_factory=lambda: {
        "aws": 0.15, "gcp": 0.12, "azure": 0.15, "lambda": 0.1, "colab": 0.05})
    default_startup_hours: float = 0.15
    spot_preemptions_per_node_hour: float = 0.05
    spot_extra_log_sigma: float = 0.15  # preemptions make wall time less certain


@dataclass(frozen=True)
class Candidate:
    """One plan (offer × nodes × parallel config) with its predicted time and cost.

    ``hours`` is the median wall time (compute + start-up + restarts), ``hours_low`` /
    ``hours_high`` the interval from the throughput interval; ``cost_usd`` the expected cost
    (billing increments and minimums included), ``cost_low_usd`` / ``cost_high_usd`` its
    interval. ``pricing`` is ``on_demand``, ``spot`` or ``subscription``: Colab
    pay-as-you-go compute units are ``on_demand`` (paid per use), Colab Pro/Pro+ are
    ``subscription`` (a monthly fee that includes compute units). ``cost_basis`` says in
    words how ``cost_usd`` was reached (rate × billed hours, CU × $/CU, months × fee).
    """

    offer: Offer
    nodes: int
    config: ParallelConfig
    prediction: Prediction
    pricing: str
    price_per_hour_usd: float  # whole job (all nodes), at this pricing
    hours: float
    hours_low: float
    hours_high: float
    cost_usd: float
    cost_low_usd: float
    cost_high_usd: float
    p_meets_deadline: float
    meets_deadline: bool
    startup_hours: float
    overhead_hours: float  # expected preemption / session-restart overhead in ``hours``
    sessions: int = 1  # Colab: sessions needed under the session cap
    notes: tuple[str, ...] = ()
    launch: str = ""
    cost_basis: str = ""

    @property
    def gpus(self) -> int:
        """Total GPUs in the job."""
        return self.config.gpus

    @property
    def throughput_samples_per_s(self) -> float:
        """Predicted global throughput."""
        return self.prediction.throughput_samples_per_s

    @property
    def usd_per_million_samples(self) -> float:
        """Price of compute alone, per million samples (no start-up, no billing rounding)."""
        return self.price_per_hour_usd / (self.throughput_samples_per_s * 3600) * 1e6


@dataclass(frozen=True)
class ScalingPoint:
    """Predicted throughput of one GPU type at one GPU count on one instance family (for the
    scaling chart): ``instance_type`` × ``nodes`` is the machine shape the point was
    predicted on, ``family`` the instance family it belongs to (``p4d``, ``a2-highgpu``)."""

    gpu: str
    gpus: int
    throughput_samples_per_s: float
    low: float
    high: float
    provider: str = ""
    family: str = ""
    instance_type: str = ""
    nodes: int = 1


@dataclass(frozen=True)
class Recommendation:
    """The answer: ranked candidates, the cost-vs-time frontier and the winner explained.

    ``candidates`` are all feasible plans, best first: those meeting the deadline at the
    asked confidence by expected cost, then the rest by probability of meeting it.
    ``winner`` is ``None`` when nothing meets the deadline; ``fastest`` and ``cheapest``
    are always filled when anything fits (``fastest``: the shortest predicted time, the
    cheaper of equal ones). ``pareto`` is the cost-vs-time frontier, thinned so each step
    toward speed is more than 5 % faster, save the last: the cheapest plan within 5 % of the
    fastest, then the fastest itself.
    """

    target: Target
    candidates: tuple[Candidate, ...]
    pareto: tuple[Candidate, ...]
    winner: Candidate | None
    fastest: Candidate | None
    cheapest: Candidate | None
    explanation: tuple[str, ...]  # lines: why the winner, where its time goes, how to launch
    whys: Mapping[int, str]  # index into ``candidates`` -> one-line reason
    dropped: Mapping[str, int]  # reason -> how many plans were dropped for it
    searched: int  # plans considered (each offer's shapes, as if searched on its own)
    notes: tuple[str, ...] = ()
    scaling: tuple[ScalingPoint, ...] = ()
    predicted: int = 0  # step-time predictions made (offers of one hardware share them)
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM  # the policy the plans were held to
    costed: int = 0  # plans costed (time, cost and P(deadline) per offer and pricing)
