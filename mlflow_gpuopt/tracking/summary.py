"""The end-of-run summary: one frozen record (with its MFU and advice line), its MLflow metrics
and printout."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking.aggregate import SteadyState
from mlflow_gpuopt.tracking.workload_profile import WorkloadProfile

if TYPE_CHECKING:
    from mlflow_gpuopt.tracking.hw_reader import HardwareReader
    from mlflow_gpuopt.tracking.reporting import Reporter
    from mlflow_gpuopt.tracking.step_timing import StepTiming


@dataclass(frozen=True)
class TrackSummary:
    """What ``track()`` measured, steady state (warm-up excluded)."""

    run_id: str | None
    device: str  # NVML name or "cpu"
    device_count: int
    total_steps: int
    steady: SteadyState
    peak_memory_bytes: float | None  # GPU: torch reserved peak or NVML used; CPU: process RSS
    mfu: float | None  # model FLOPs utilisation, 0..1, where the GPU's peak is known
    flops_per_sample: float | None
    params: int | None
    energy_joules: float | None  # all sampled GPUs, first to last sample
    gpu_utilization_mean_percent: float | None
    #: host time per step waiting for the next batch (mean, s) and its share of the step
    input_wait_mean_s: float | None = None
    input_wait_fraction: float | None = None
    cpu_utilization_mean_percent: float | None = None  # host, mean over the samples
    #: optimizer steps a GradScaler skipped (inf/NaN gradients: no update); counted in
    #: ``total_steps``, since they took a step's time
    skipped_steps: int = 0
    advice: str | None = None  # the top finding of the cheap advice rules, one line

    def metrics(self) -> dict[str, float]:
        """The summary metrics (``contract.SUMMARY_*``); figures that are unknown are left out."""
        s = self.steady
        values = {
            contract.SUMMARY_THROUGHPUT_SAMPLES: s.throughput_samples_per_s,
            contract.SUMMARY_THROUGHPUT_TOKENS: s.throughput_tokens_per_s,
            contract.SUMMARY_THROUGHPUT_STEPS: s.throughput_steps_per_s,
            contract.SUMMARY_STEP_TIME_P50_S: s.step_time_p50_s,
            contract.SUMMARY_STEP_TIME_P90_S: s.step_time_p90_s,
            contract.SUMMARY_STEP_TIME_MEAN_S: s.step_time_mean_s,
            contract.SUMMARY_STEPS: float(self.total_steps),
            contract.SUMMARY_STEADY_STEPS: float(s.steps),
            contract.SUMMARY_WARMUP_STEPS: float(s.warmup_steps),
            contract.SUMMARY_PEAK_MEMORY_BYTES: self.peak_memory_bytes,
            contract.SUMMARY_MFU: self.mfu,
            contract.SUMMARY_ENERGY_JOULES: self.energy_joules,
            contract.SUMMARY_GPU_UTILIZATION: self.gpu_utilization_mean_percent,
            contract.SUMMARY_INPUT_WAIT_MEAN_S: self.input_wait_mean_s,
            contract.SUMMARY_INPUT_WAIT_FRACTION: self.input_wait_fraction,
            contract.SUMMARY_CPU_UTILIZATION: self.cpu_utilization_mean_percent,
            contract.SUMMARY_SKIPPED_STEPS: float(self.skipped_steps),
        }
        return {k: float(v) for k, v in values.items() if v is not None}

    def text(self) -> str:
        """A short human summary, e.g. for the end of a training script."""
        s = self.steady
        parts = [f"gpuopt: run {self.run_id or '(not logged)'} on "
                 f"{self.device_count} x {self.device}" if self.device_count else
                 f"gpuopt: run {self.run_id or '(not logged)'} on cpu",
                 f"{self.total_steps} steps" + (f" ({self.skipped_steps} skipped by the "
                                                f"GradScaler: inf/NaN gradients)"
                                                if self.skipped_steps else "")]
        if s.throughput_samples_per_s is not None:
            parts.append(f"{s.throughput_samples_per_s:.1f} samples/s")
        elif s.throughput_steps_per_s is not None:
            parts.append(f"{s.throughput_steps_per_s:.2f} steps/s")
        if s.step_time_p50_s is not None:
            parts.append(f"step p50 {s.step_time_p50_s * 1e3:.2f} ms, "
                         f"p90 {s.step_time_p90_s * 1e3:.2f} ms")
        if self.peak_memory_bytes is not None:
            parts.append(f"peak memory {self.peak_memory_bytes / 2**30:.2f} GiB")
        if self.mfu is not None:
            parts.append(f"MFU {self.mfu * 100:.1f}%")
        if self.input_wait_fraction is not None:
            parts.append(f"input wait {self.input_wait_fraction * 100:.0f}%")
        line = " | ".join(parts)
        return f"{line}\n{self.advice}" if self.advice else line


def model_flops_utilization(flops_per_sample: float | None,
                            throughput_samples_per_s: float | None, device: str, precision: str,
                            device_count: int) -> float | None:
    """Model FLOPs utilisation, 0..1: achieved model FLOP/s over the dense peak of
    ``device_count`` ``device`` GPUs at ``precision`` (``pricing/gpus.csv``); ``None`` when a
    figure is missing or the GPU's peak is unknown (CPU runs)."""
    if not (flops_per_sample and throughput_samples_per_s and device_count):
        return None
    from mlflow_gpuopt.catalog import peak_flops_per_s

    peak = peak_flops_per_s(device, precision)
    if not peak:
        return None
    return flops_per_sample * throughput_samples_per_s / (peak * device_count)


def build_summary(run_id: str | None, device: str, device_count: int, total_steps: int,
                  steady: SteadyState, peak_memory_bytes: float | None,
                  energy_joules: float | None, gpu_utilization_mean_percent: float | None,
                  profile: WorkloadProfile | None) -> TrackSummary:
    """The summary of a process or a job, its MFU computed from the profile's FLOPs."""
    p = profile
    mfu = (model_flops_utilization(p.flops_per_sample, steady.throughput_samples_per_s,
                                   device, p.precision, device_count) if p else None)
    return TrackSummary(
        run_id=run_id, device=device, device_count=device_count, total_steps=total_steps,
        steady=steady, peak_memory_bytes=peak_memory_bytes, mfu=mfu,
        flops_per_sample=p.flops_per_sample if p else None, params=p.params if p else None,
        energy_joules=energy_joules, gpu_utilization_mean_percent=gpu_utilization_mean_percent)



def summarize(run_id: str | None, device: str, device_count: int, timing: StepTiming,
              hw: HardwareReader, reporter: Reporter,
              profile: WorkloadProfile | None) -> TrackSummary:
    """This process's summary at the end; on rank 0 of a job whose ranks reported, the job's
    figures (``reporter.figures``) with this process's input wait and host CPU."""
    own = timing.figures(hw, device_count)
    f = reporter.figures(own)
    summary = build_summary(run_id, device, f.device_count, timing.agg.steps, f.steady,
                            f.peak_memory_bytes, f.energy_joules,
                            f.gpu_utilization_mean_percent, profile)
    wait_mean, wait_share = timing.input_wait(own.steady.step_time_p50_s)
    return replace(summary, input_wait_mean_s=wait_mean, input_wait_fraction=wait_share,
                   cpu_utilization_mean_percent=hw.cpu_utilization_mean_percent,
                   skipped_steps=timing.clock.skipped_steps)

def advice_line(summary: TrackSummary, profile: WorkloadProfile | None, model: Any,
                device_count: int, precision: str, world_size: int) -> str | None:
    """The top finding of the cheap advice rules for the run that just ended, one line (or
    ``None``); ``device_count``: this process's, ``precision``: the profile's or the model's."""
    from mlflow_gpuopt.advice import RunFacts
    from mlflow_gpuopt.tracking.advice_facts import model_wrapper, top_finding_line

    s, p = summary, profile
    return top_finding_line(RunFacts(
        run_id=s.run_id, device=s.device, device_count=device_count, precision=precision,
        params=p.params if p else None, micro_batch=p.micro_batch if p else None,
        grad_accum=p.grad_accum if p else 1,
        step_time_mean_s=s.steady.step_time_mean_s,
        input_wait_mean_s=s.input_wait_mean_s,
        input_wait_fraction=s.input_wait_fraction,
        gpu_utilization_mean_percent=s.gpu_utilization_mean_percent,
        cpu_utilization_mean_percent=s.cpu_utilization_mean_percent,
        gemm_shapes=p.gemm_shapes if p else None,
        model_wrapper=model_wrapper(model),
        kernels_per_micro_step=p.kernels_per_micro_step if p else None,
        world_size=world_size))
