"""The run's workload profile: measured once on a real step by the profiler the step clock
runs (:mod:`.profiler`), logged as workload params as soon as it is done (or at the end from
the last step), and saved as ``contract.PROFILE_ARTIFACT`` with the hardware it ran on.
Param precedence: :func:`.run_params.workload_params`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mlflow_gpuopt import contract
from mlflow_gpuopt.tracking._warn import WarnOnce
from mlflow_gpuopt.tracking.config import TrackConfig
from mlflow_gpuopt.tracking.guard import suppress
from mlflow_gpuopt.tracking.model_facts import detect_precision
from mlflow_gpuopt.tracking.padded_lengths import mean_padded_tokens, observed_bins
from mlflow_gpuopt.tracking.run_params import profile_overrides, workload_params
from mlflow_gpuopt.tracking.workload_profile import WorkloadProfile, whole_sample

if TYPE_CHECKING:
    from mlflow_gpuopt.tracking.run_log import RunLog
    from mlflow_gpuopt.tracking.steps import StepClock


class ProfileLog:
    """The profile of one tracked run and its workload params (logged once)."""

    def __init__(self, model: Any, config: TrackConfig, run: RunLog, warn: WarnOnce) -> None:
        self.model = model
        self.config = config
        self.profile: WorkloadProfile | None = None
        #: the job's context-parallel degree (the tracker sets it from the layout): above 1,
        #: each rank holds 1/cp of every sample's sequence and the profile is scaled up
        self.context_parallel = 1
        self._run = run
        self._warn = warn
        self._logged = False

    def on_tick(self, clock: StepClock) -> None:
        """Once the profiled step is done: its profile, and the workload params logged."""
        profiler = clock.profiler
        if self._logged or profiler is None or not profiler.done:
            return
        self._logged = True
        self.profile = self._result(clock, clock.profile_samples, clock.profile_forwards)
        if self.profile is not None:
            self.log_params(clock)

    def finish(self, clock: StepClock) -> None:
        """At the end, when no profile was logged: the last step's profile (the profiled one
        never finished) and the workload params, with or without a profile. Then the padded
        lengths every step ran at join the profile (:meth:`_with_bins`)."""
        if not self._logged:
            self._logged = True
            if self.model is not None and clock.profiler is not None:
                self.profile = self._result(clock, clock.last_step_samples or None,
                                            clock.last_step_forwards or None) or self.profile
            self.log_params(clock)
        if self.profile is not None:
            self.profile = self._with_bins(self.profile, clock) or self.profile

    @suppress("sequence-bins", "padded lengths not logged: %s")
    def _with_bins(self, profile: WorkloadProfile, clock: StepClock) -> WorkloadProfile:
        """``profile`` with the ``sequence_bins`` of the run's steps where their padded
        lengths varied (a context-parallel rank's slices scaled to whole samples, as
        :func:`whole_sample` does)."""
        lengths = dict(clock.samples_by_length)
        if self.context_parallel > 1 and clock.profiler is not None \
                and not clock.profiler.batch_is_dtensor:
            lengths = {t * self.context_parallel: n for t, n in lengths.items()}
        bins = observed_bins(lengths)
        return replace(profile, sequence_bins=bins) if bins else profile

    @suppress("sequence-bins", "mean padded length not logged: %s")
    def mean_padded_tokens(self, clock: StepClock) -> float | None:
        """Mean padded tokens per sample over the run's steps, where their lengths varied
        (the profile has ``sequence_bins``); else None."""
        if self.profile is None or not self.profile.sequence_bins:
            return None
        mean = mean_padded_tokens(clock.samples_by_length)
        if mean is not None and self.context_parallel > 1 \
                and not clock.profiler.batch_is_dtensor:
            mean *= self.context_parallel
        return mean

    @suppress("profile", "workload profile failed: %s")
    def _result(self, clock: StepClock, samples: int | None,
                forwards: int | None) -> WorkloadProfile | None:
        profiler = clock.profiler
        profile = profiler.result(samples, forwards, profile_overrides(self.config))
        if self.context_parallel > 1 and not profiler.batch_is_dtensor:  # a plain slice
            profile = whole_sample(profile, self.context_parallel, profiler.tokens_per_sample,
                                   tokens_given=bool(self.config.tokens_per_sample))
        return profile

    @suppress("profile", "could not leave the profiler's modes: %s")
    def abort(self, clock: StepClock) -> None:
        """Leave the profiler's modes if its step never finished (tracking stops mid-step)."""
        if clock.profiler is not None and clock.profiler.active:
            clock.profiler.abort()

    def params(self, clock: StepClock | None) -> dict[str, Any]:
        """The workload params (profile, then ``track()``'s arguments, then the clock's)."""
        last = clock.last_step_samples if clock is not None else None
        return workload_params(self.profile, self.config, last, self.fallback_precision)

    def log_params(self, clock: StepClock | None) -> None:
        self._run.log_params(self.params(clock))

    def save(self, hardware: dict[str, Any]) -> None:
        """The profile artifact (nothing without a profile), with this host's fingerprint
        and ``hardware`` (device, counts, a job's layout)."""
        if self.profile is None:
            return
        hw = {**(self._fingerprint() or {}), **hardware}
        self._run.log_dict(self.profile.to_json(hw), contract.PROFILE_ARTIFACT)

    @suppress("fingerprint", "hardware fingerprint failed: %s")
    def _fingerprint(self) -> dict[str, Any] | None:
        from mlflow_gpuopt.devices.fingerprint import hardware_fingerprint

        return hardware_fingerprint().to_dict()

    def fallback_precision(self) -> str:
        """The model's precision without a profile (``fp32`` when it cannot be told)."""
        if self.model is None:
            return "fp32"
        try:
            p = next(iter(self.model.parameters()))
            return detect_precision(self.model, p.device.type)
        except Exception:  # no parameters, or an unusual module: the default
            return "fp32"
