"""A training target as the user stated it, and its size in samples."""

from __future__ import annotations

from dataclasses import dataclass

from mlflow_gpuopt.errors import InputError


def check_target_samples(samples: float, flags: str, unit: str = "samples") -> float:
    """``samples`` when a real training run could have that many; else one line naming
    ``flags`` (the bound and why it is there: :data:`mlflow_gpuopt.validation.BOUNDS`).
    ``unit`` names what the flags counted (a sample holds at least one token, and a step at
    least one sample, so tokens and steps are held to the same bound before the workload is
    read)."""
    from mlflow_gpuopt.validation import BOUNDS

    bound = BOUNDS["target_samples"]
    if not bound.contains(samples):
        raise InputError(f"{flags} asks for {samples:.3g} {unit}; a real training target "
                         f"is at most {bound.high:g} samples ({bound.why})")
    return samples


@dataclass(frozen=True)
class TrainingTarget:
    """One parsed training target: exactly one of the forms is set (counts, not strings)."""

    samples: float | None = None
    epochs: float | None = None
    dataset_size: float | None = None
    tokens: float | None = None
    steps: float | None = None

    @property
    def description(self) -> str:
        """How the user stated it, e.g. ``90 epochs × 1.28M samples`` or ``2B tokens``."""
        from mlflow_gpuopt.quantities import format_count

        if self.samples is not None:
            return f"{format_count(self.samples)} samples"
        if self.epochs is not None:
            return f"{self.epochs:g} epochs × {format_count(self.dataset_size)} samples"
        if self.tokens is not None:
            return f"{format_count(self.tokens)} tokens"
        return f"{format_count(self.steps)} optimizer steps"

    def total_samples(self, *, tokens_per_sample: float | None,
                      samples_per_step: float | None) -> float:
        """Samples to train on, given the workload's sequence length and the global batch
        (samples per optimizer step) that ``--tokens`` and ``--steps`` are counted in.
        Raises :class:`InputError` (the model's own message where it refuses)."""
        from mlflow_gpuopt.perfmodel import samples_for_target

        if self.tokens is not None and not tokens_per_sample:
            raise InputError("--tokens needs a workload with tokens_per_sample (sequence "
                             "length); use --samples or --steps instead")
        total = samples_for_target(
            samples=self.samples, epochs=self.epochs, dataset_size=self.dataset_size,
            tokens=self.tokens, tokens_per_sample=tokens_per_sample, steps=self.steps,
            samples_per_step=samples_per_step)
        return check_target_samples(total, self.flags)

    @property
    def flags(self) -> str:
        """The flags this target came from, for messages."""
        if self.samples is not None:
            return "--samples"
        if self.epochs is not None:
            return "--epochs x --dataset-size"
        return "--tokens" if self.tokens is not None else "--steps"
