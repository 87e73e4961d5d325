"""What the advice rules read (:class:`RunFacts`) and what they say (:class:`Finding`,
:class:`NotEvaluated`). Plain frozen records; no torch, no MLflow."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunFacts:
    """The measurements of one tracked run that the rules read (``None``: not measured)."""

    run_id: str | None
    device: str  # NVML name of the measured GPU, or "cpu"
    device_count: int  # GPUs of the run (0 on a CPU)
    precision: str  # fp32 | tf32 | fp16 | bf16 | fp8, as the profiler saw it
    params: int | None = None
    micro_batch: int | None = None
    grad_accum: int = 1
    step_time_mean_s: float | None = None  # steady state
    #: mean host time per step from the end of one step to the next forward, and its share
    #: of the mean step time (0..1)
    input_wait_mean_s: float | None = None
    input_wait_fraction: float | None = None
    gpu_utilization_mean_percent: float | None = None  # None: no GPU readings
    cpu_utilization_mean_percent: float | None = None  # host-wide
    #: distinct (M, K, N) of the matmuls of the profiled step, with their FLOPs share
    gemm_shapes: tuple[tuple[int, int, int], ...] | None = None
    model_wrapper: str | None = None  # contract.PARAM_MODEL_WRAPPER's value
    compiled: bool = False  # compiled graphs ran the step (contract.PARAM_COMPILED)
    kernels_per_micro_step: float | None = None
    exposed_comm_fraction: float | None = None  # distributed jobs only
    world_size: int = 1
    strategy: str | None = None
    recompute: str | None = None  # "none" | "selective" | "full" | None (unknown)


@dataclass(frozen=True)
class Evidence:
    """One measured figure a finding rests on: the metric/param name and its value."""

    name: str
    value: float | str
    text: str  # the figure in words, with its unit

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "text": self.text}


@dataclass(frozen=True)
class Finding:
    """One thing to change in the training script.

    ``change`` says what the pricing predicts differently (``precision``, ``micro_batch``,
    ``input_wait``, ``gemm_alignment``, ``ddp``, ``recompute``, ``dispatch``, ``sharding``,
    ``exposed_comm`` or ``none``: not priced);
    ``share`` is the rule's own estimate of the step-time share at stake (0..1), used to rank
    findings when nothing is priced (the end-of-run line).
    """

    rule: str
    title: str
    evidence: tuple[Evidence, ...]
    fix: str  # the exact line of PyTorch to write
    change: str
    share: float
    detail: str = ""
    #: what the change is worth on the recommended plan for the target (filled by pricing)
    hours_saved: float | None = None
    usd_saved: float | None = None
    worth_note: str = ""
    params: dict = field(default_factory=dict, hash=False, compare=False)

    def line(self) -> str:
        """The finding in one line (the end-of-run summary)."""
        ev = "; ".join(e.text for e in self.evidence[:2])
        return f"{self.title} ({ev}); fix: {self.fix}"

    def to_dict(self) -> dict:
        return {"rule": self.rule, "title": self.title,
                "evidence": [e.to_dict() for e in self.evidence], "fix": self.fix,
                "detail": self.detail, "change": self.change, "share": self.share,
                "hours_saved": self.hours_saved, "usd_saved": self.usd_saved,
                "worth_note": self.worth_note}


@dataclass(frozen=True)
class NotEvaluated:
    """A rule that the run's hardware or measurements cannot decide, and why."""

    rule: str
    reason: str

    def to_dict(self) -> dict:
        return {"rule": self.rule, "reason": self.reason}
