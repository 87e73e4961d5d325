"""Time to train: a predicted step turned into hours for a training target, and where the
hours go (compute, exposed communication, pipeline bubble).

Pure arithmetic on a :class:`Prediction`. A target is a number of samples; people state it
as samples, epochs × dataset size, tokens (÷ tokens per sample) or optimizer steps
(× global batch): :func:`samples_for_target` converts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.types import Prediction

_SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class TrainingTime:
    """Predicted wall-clock time to train, hours.

    ``hours_low``/``hours_high`` follow the throughput interval (the high throughput gives
    the low time). The breakdown covers the steps only (not ``startup_s``): ``compute_hours``
    is forward+backward+optimizer, ``exposed_comm_hours`` communication (and straggler
    waits) not hidden behind compute, ``bubble_hours`` the pipeline's idle stages.
    """

    hours: float
    hours_low: float
    hours_high: float
    compute_hours: float
    exposed_comm_hours: float
    bubble_hours: float
    steps: int  # optimizer steps (the last one may be partly filled)
    samples: float  # the target, samples


def _positive(value: float | None, what: str) -> float:
    if value is None or isinstance(value, bool) or not math.isfinite(float(value)) \
            or float(value) <= 0:
        raise PerfModelError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def samples_for_target(*, samples: float | None = None, epochs: float | None = None,
                       dataset_size: float | None = None, tokens: float | None = None,
                       tokens_per_sample: float | None = None, steps: float | None = None,
                       samples_per_step: float | None = None) -> float:
    """Samples to train on, from exactly one way of stating the target:

    - ``samples``;
    - ``epochs`` × ``dataset_size`` (samples in the dataset);
    - ``tokens`` ÷ ``tokens_per_sample`` (the workload's sequence length);
    - ``steps`` × ``samples_per_step`` (the global batch of the configuration).

    Raises :class:`PerfModelError` (one line) for none, several, or a missing companion.
    """
    given = [name for name, v in (("samples", samples), ("epochs", epochs),
                                  ("tokens", tokens), ("steps", steps)) if v is not None]
    if not given:
        raise PerfModelError("no training target: give samples, epochs with a dataset size, "
                             "tokens, or steps")
    if len(given) > 1:
        raise PerfModelError(f"give one training target, not {' and '.join(given)}")
    if samples is not None:
        return _positive(samples, "samples")
    if epochs is not None:
        if dataset_size is None:
            raise PerfModelError("epochs need the dataset size (samples per epoch)")
        return _positive(epochs, "epochs") * _positive(dataset_size, "dataset size")
    if tokens is not None:
        if not tokens_per_sample:
            raise PerfModelError("a target in tokens needs the workload's tokens_per_sample "
                                 "(sequence length)")
        return _positive(tokens, "tokens") / _positive(tokens_per_sample, "tokens per sample")
    if not samples_per_step:
        raise PerfModelError("a target in steps needs the global batch (samples per step)")
    return _positive(steps, "steps") * _positive(samples_per_step, "samples per step")


def time_to_train(prediction: Prediction, *, samples: float,
                  startup_s: float = 0.0) -> TrainingTime:
    """Hours to process ``samples`` at ``prediction``'s configuration, plus ``startup_s``
    (loading, compilation, first-step warm-up), with the interval and the breakdown.

    Steps = ⌈samples / global batch⌉; each takes ``prediction.step_time_s``.
    """
    samples = _positive(samples, "samples")
    if startup_s is None or not math.isfinite(startup_s) or startup_s < 0:
        raise PerfModelError(f"startup time must be zero or positive, got {startup_s!r}")
    per_step = prediction.samples_per_step
    if not per_step or per_step <= 0 or not prediction.step_time_s > 0:
        raise PerfModelError("the prediction has no positive step time or global batch")
    steps = math.ceil(samples / per_step - 1e-9)
    run_s = steps * prediction.step_time_s
    thr = prediction.throughput_samples_per_s
    # The interval is on throughput; time is its reciprocal.
    low_s = run_s * thr / prediction.high if prediction.high > 0 else run_s
    high_s = run_s * thr / prediction.low if prediction.low > 0 else math.inf
    h = _SECONDS_PER_HOUR
    return TrainingTime(
        hours=(run_s + startup_s) / h, hours_low=(low_s + startup_s) / h,
        hours_high=(high_s + startup_s) / h,
        compute_hours=steps * prediction.compute_s / h,
        exposed_comm_hours=steps * prediction.exposed_comm_s / h,
        bubble_hours=steps * prediction.bubble_s / h, steps=int(steps), samples=samples)
