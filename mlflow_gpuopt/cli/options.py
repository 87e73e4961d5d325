"""What the ``predict``, ``recommend`` and ``compare`` commands share: the training-target
flags, where the runs come from, loading the catalog and naming a GPU in it, each turned into
one line and exit code 2 when the input is bad.

The flags are checked here, before anything is read, with messages that name the flags; the
arithmetic is :func:`mlflow_gpuopt.perfmodel.samples_for_target`, whose own errors (a value
that is not positive, a missing global batch) are passed on as they are. A flag given an empty
value is refused (:func:`reject_empty_values`), and a target beyond what any real training
run has (:data:`mlflow_gpuopt.validation.BOUNDS`) too: it would otherwise overflow to
infinity, which JSON cannot hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import click

from mlflow_gpuopt.cli._errors import UsageError

_TARGET_FORMS = "--samples N, --epochs E --dataset-size N, --tokens T or --steps S"


def reject_empty_values(ctx: click.Context) -> None:
    """Refuse a flag given an empty value (``--deadline ""``, usually an unset shell
    variable): read as absent, it would silently drop what the user meant to ask for."""
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        values = value if isinstance(value, (tuple, list)) else (value,)
        if any(isinstance(v, str) and not v.strip() for v in values):
            flag = max(param.opts, key=len)
            raise UsageError(f"{flag} is empty: give it a value or leave it out")


def check_target_samples(samples: float, flags: str, unit: str = "samples") -> float:
    """``samples`` when a real training run could have that many; else one line naming
    ``flags`` (the bound and why it is there: :data:`mlflow_gpuopt.validation.BOUNDS`).
    ``unit`` names what the flags counted (a sample holds at least one token, and a step at
    least one sample, so tokens and steps are held to the same bound before the workload is
    read)."""
    from mlflow_gpuopt.validation import BOUNDS

    bound = BOUNDS["target_samples"]
    if not bound.contains(samples):
        raise UsageError(f"{flags} asks for {samples:.3g} {unit}; a real training target "
                         f"is at most {bound.high:g} samples ({bound.why})")
    return samples


def target_options(func: Callable) -> Callable:
    """The ``--samples | --epochs --dataset-size | --tokens | --steps`` options."""
    for option in reversed((
        click.option("--samples", metavar="N", help="Target: samples to train on (2e9, 2B, 1.5M)."),
        click.option("--epochs", metavar="E", help="Target: epochs (with --dataset-size)."),
        click.option("--dataset-size", metavar="N", help="Samples per epoch (with --epochs)."),
        click.option("--tokens", metavar="T",
                     help="Target: tokens (e.g. 2B; needs the workload's tokens_per_sample)."),
        click.option("--steps", metavar="S",
                     help="Target: optimizer steps at the global batch (the measured run's, "
                          "or --global-batch)."),
    )):
        func = option(func)
    return func


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
        (samples per optimizer step) that ``--tokens`` and ``--steps`` are counted in."""
        from mlflow_gpuopt.perfmodel import PerfModelError, samples_for_target

        if self.tokens is not None and not tokens_per_sample:
            raise UsageError("--tokens needs a workload with tokens_per_sample (sequence "
                             "length); use --samples or --steps instead")
        try:
            total = samples_for_target(
                samples=self.samples, epochs=self.epochs, dataset_size=self.dataset_size,
                tokens=self.tokens, tokens_per_sample=tokens_per_sample, steps=self.steps,
                samples_per_step=samples_per_step)
        except PerfModelError as exc:
            raise UsageError(str(exc)) from None
        return check_target_samples(total, self.flags)

    @property
    def flags(self) -> str:
        """The flags this target came from, for messages."""
        if self.samples is not None:
            return "--samples"
        if self.epochs is not None:
            return "--epochs x --dataset-size"
        return "--tokens" if self.tokens is not None else "--steps"


def parse_target(*, samples: str | None, epochs: str | None, dataset_size: str | None,
                 tokens: str | None, steps: str | None,
                 required: bool) -> TrainingTarget | None:
    """The target the flags state, checked without reading anything; None when no flag was
    given and ``required`` is false. Raises :class:`UsageError` naming the flags."""
    from mlflow_gpuopt.quantities import QuantityError, parse_count

    forms = [name for name, v in (("--samples", samples), ("--epochs", epochs),
                                  ("--tokens", tokens), ("--steps", steps)) if v is not None]
    if dataset_size is not None and epochs is None:
        raise UsageError("--dataset-size goes with --epochs (e.g. --epochs 90 "
                         "--dataset-size 1281167)")
    if not forms and not required:
        return None
    if len(forms) != 1:
        raise UsageError(f"give exactly one target: {_TARGET_FORMS} "
                         f"(got {', '.join(forms) or 'none'})")
    if epochs is not None and dataset_size is None:
        raise UsageError("--epochs needs --dataset-size N (samples per epoch)")
    try:
        target = TrainingTarget(
            samples=parse_count(samples, what="--samples") if samples is not None else None,
            epochs=parse_count(epochs, what="--epochs") if epochs is not None else None,
            dataset_size=(parse_count(dataset_size, what="--dataset-size")
                          if dataset_size is not None else None),
            tokens=parse_count(tokens, what="--tokens") if tokens is not None else None,
            steps=parse_count(steps, what="--steps") if steps is not None else None)
    except QuantityError as exc:
        raise UsageError(str(exc)) from None
    # What can be counted without the workload is checked now, before anything is read.
    if target.samples is not None:
        check_target_samples(target.samples, target.flags)
    elif target.epochs is not None:
        check_target_samples(target.epochs * target.dataset_size, target.flags)
    elif target.tokens is not None:
        check_target_samples(target.tokens, target.flags, "tokens")
    else:
        check_target_samples(target.steps, target.flags, "steps")
    return target


def check_run_source(run_ids, experiment) -> None:
    """Runs come from ``--run-id`` (repeatable) or ``--experiment``: exactly one of them."""
    if bool(run_ids) == bool(experiment):
        raise UsageError("give --run-id ID (one or more) or --experiment NAME, not both"
                         if run_ids else "give --run-id ID or --experiment NAME")


def load_catalog_or_fail():
    """The price catalog (user cache over the shipped snapshot), or one line and exit 2."""
    from mlflow_gpuopt.catalog import CatalogError, load_catalog

    try:
        return load_catalog()
    except CatalogError as exc:
        raise UsageError(f"cannot load the price catalog: {exc}") from None


def resolve_gpu_or_fail(catalog, name: str) -> str:
    """The catalog's name for ``name``; an unknown GPU is one line naming the closest ones."""
    from mlflow_gpuopt.catalog import UnknownGpuError

    try:
        return catalog.resolve_gpu(name)
    except UnknownGpuError as exc:
        raise UsageError(str(exc)) from None
