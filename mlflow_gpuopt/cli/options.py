"""What the ``predict``, ``recommend`` and ``compare`` commands share: the training-target
flags, where the runs come from, loading the catalog and naming a GPU in it, each turned into
one line and exit code 2 when the input is bad.

The flags are checked here, before anything is read, with messages that name the flags; the
arithmetic is :class:`mlflow_gpuopt.planning.target.TrainingTarget`'s, whose own errors (a
value that is not positive, a missing global batch) are passed on as they are. A flag given an empty
value is refused (:func:`reject_empty_values`), and a target beyond what any real training
run has (:data:`mlflow_gpuopt.validation.BOUNDS`) too: it would otherwise overflow to
infinity, which JSON cannot hold.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import click

from mlflow_gpuopt.cli._errors import UsageError
from mlflow_gpuopt.planning.target import TrainingTarget, check_target_samples

__all__ = ["TrainingTarget", "check_file_inputs", "check_run_source", "confidence_option",
           "load_catalog_or_fail",
           "parse_deadline", "parse_target", "reject_empty_values", "resolve_gpu_or_fail",
           "run_options", "target_options", "workload_file_options"]

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


def workload_file_options(func: Callable) -> Callable:
    """``--workload``, ``--seq-len``, ``--observations`` and ``--proxy-workload``: planning
    from files (``predict`` and ``recommend`` alike; :func:`check_file_inputs` checks their
    combinations)."""
    for option in reversed((
        click.option("--workload", "workload_path", type=click.Path(dir_okay=False),
                     help="workload.json (params, flops_per_sample, precision, ...) or a "
                          "Hugging Face config.json (with --seq-len); with runs, the model "
                          "to plan from those (proxy) runs."),
        click.option("--seq-len", "seq_len", type=click.IntRange(min=1), metavar="N",
                     default=None, help="With a Hugging Face config.json: the training "
                                        "sequence length (tokens)."),
        click.option("--observations", "observations_path", type=click.Path(dir_okay=False),
                     help="With --workload: measured throughputs, CSV (gpu, gpu_count, nodes, "
                          "micro_batch, throughput_samples_per_s, strategy, precision)."),
        click.option("--proxy-workload", "proxy_path", type=click.Path(dir_okay=False),
                     help="workload.json of the smaller model --observations measured (a "
                          "proxy); --workload is the model to plan."),
    )):
        func = option(func)
    return func


def check_file_inputs(runs: bool, workload_path, observations_path, proxy_path, seq_len,
                      runs_hint: str = "--run-id ID") -> None:
    """The input flags' combinations, before anything is read: measured runs (``runs``:
    ``--run-id`` or ``--experiment``, which ``runs_hint`` names), or ``--workload`` (with
    ``--observations``), or a proxy (runs, or ``--proxy-workload`` with its
    ``--observations``) planning ``--workload``."""
    if observations_path and not workload_path:
        raise UsageError("--observations needs --workload W.json")
    if runs and (observations_path or proxy_path):
        raise UsageError("give measured runs or --observations/--proxy-workload, not both "
                         "(with runs, --workload is the model to plan from those proxy runs)")
    if proxy_path and not observations_path:
        raise UsageError("--proxy-workload needs --observations O.csv (the proxy's "
                         "measurements)")
    if not runs and not workload_path:
        raise UsageError(f"give {runs_hint}, or --workload W.json [--observations O.csv] "
                         "before any run exists")
    if runs and seq_len is not None and not workload_path:
        raise UsageError("--seq-len goes with --workload CONFIG.json (a Hugging Face "
                         "config), not measured runs")


#: the flags of :func:`run_options`: (flag, RunOptions field, metavar, help)
_RUN_OPTIONS = (
    ("--pp-microbatches", "pp_microbatches", "N",
     "Pipeline: micro-batches one run of the schedule takes, where each "
     "gradient-accumulation step runs it again (torchtitan, NeMo AutoModel: local batch / "
     "pipeline micro-batch); default: the whole step's."),
    ("--moe-dispatcher", "moe_dispatcher", "NAME",
     "Mixture of experts: how expert parallelism moves the tokens: alltoall (default), "
     "allgather or flex (deepep, hybridep); overrides the workload's moe_dispatcher."),
    ("--moe-routing", "moe_routing", "NAME",
     "Mixture of experts: random (default) or round_robin (forced-balance benchmark gates); "
     "overrides the workload's moe_routing."),
    ("--moe-a2a-overlap", "moe_a2a_overlap", "NAME",
     "Mixture of experts: 1f1b (Megatron-core's overlap_moe_expert_parallel_comm: one "
     "micro-batch's all-to-alls under another's compute; with a pipeline, the interleaved "
     "schedule), none (default) or auto (on where the layout can run it and it pays); "
     "overrides the workload's moe_a2a_overlap."),
    ("--expert-tensor-parallel", "expert_tensor_parallel", "N",
     "Mixture of experts: the routed experts' tensor-parallel degree (Megatron's "
     "expert_tensor_parallel_size), dividing tp; default: tp."),
    ("--attention-kernel", "attention_kernel", "NAME",
     "The fused attention kernel the job runs: fa2 (PyTorch SDPA's flash backend, the "
     "default) or fa3 (te, cudnn: Transformer Engine); overrides the workload's "
     "attention_kernel."),
    ("--optimizer-impl", "optimizer_impl", "NAME",
     "How the job's optimizer step runs on the GPU: for-loop (a loop over the parameter "
     "tensors: torch.optim before PyTorch 2.0, foreach=False), foreach or fused; overrides "
     "the workload's optimizer_impl."),
    ("--mixed-precision", "mixed_precision", "NAME",
     "How a 16-bit job runs its mixed precision: autocast (torch.amp, the default), "
     "master_weights (the model in 16 bits: apex O2) or apex_o1 (apex AMP O1's wrappers); "
     "overrides the workload's mixed_precision."),
)


def run_options(func: Callable) -> Callable:
    """The flags saying how the job runs, over the workload's own (``predict`` and
    ``recommend`` alike), handed to the command as one ``run_flags``
    (:class:`~mlflow_gpuopt.planning.inputs.RunOptions`) keyword."""
    from mlflow_gpuopt.validation import BOUNDS

    types = {"pp_microbatches": click.IntRange(min=1,
                                               max=int(BOUNDS["pp_microbatches"].high)),
             "expert_tensor_parallel": click.IntRange(min=1, max=64)}  # the rest: words
    fields = [field for _, field, _, _ in _RUN_OPTIONS]

    @functools.wraps(func)
    def command(**kwargs):
        from mlflow_gpuopt.planning.inputs import RunOptions

        chosen = RunOptions(**{f: kwargs.pop(f) for f in fields})
        return func(run_flags=chosen, **kwargs)

    for flag, field, metavar, text in reversed(_RUN_OPTIONS):
        command = click.option(flag, field, type=types.get(field), default=None,
                               metavar=metavar, help=text)(command)
    return command


def parse_target(*, samples: str | None, epochs: str | None, dataset_size: str | None,
                 tokens: str | None, steps: str | None,
                 required: bool) -> TrainingTarget | None:
    """The target the flags state, checked without reading anything; None when no flag was
    given and ``required`` is false. Raises :class:`UsageError` or an
    :class:`~mlflow_gpuopt.errors.InputError` naming the flags."""
    from mlflow_gpuopt.quantities import parse_count

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
    target = TrainingTarget(
        samples=parse_count(samples, what="--samples") if samples is not None else None,
        epochs=parse_count(epochs, what="--epochs") if epochs is not None else None,
        dataset_size=(parse_count(dataset_size, what="--dataset-size")
                      if dataset_size is not None else None),
        tokens=parse_count(tokens, what="--tokens") if tokens is not None else None,
        steps=parse_count(steps, what="--steps") if steps is not None else None)
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


def confidence_option(func: Callable) -> Callable:
    """The ``--confidence`` option (``recommend``, ``advise``)."""
    return click.option(
        "--confidence", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
        default=0.9, show_default=True, callback=_check_probability,
        help="A plan meets the deadline when P(time <= deadline) is at least this.")(func)


def _check_probability(ctx: click.Context, param: click.Parameter, value: float) -> float:
    # click's range lets NaN through (NaN compares false)
    if not 0.0 < value < 1.0:
        raise UsageError(f"--confidence must be a probability between 0 and 1 (exclusive), "
                         f"got {value}")
    return value


def parse_deadline(text: str | None) -> float | None:
    """``--deadline`` in hours (``24h``, ``90m``, ``2d``, ``1d12h``), held to the bound a
    real deadline has; None when not given."""
    from mlflow_gpuopt.quantities import parse_duration_hours
    from mlflow_gpuopt.validation import BOUNDS

    if not text:
        return None
    hours = parse_duration_hours(text, what="--deadline")
    bound = BOUNDS["deadline_hours"]
    if not bound.contains(hours):
        raise UsageError(f"--deadline {text} is {hours:.3g} hours; a deadline is "
                         f"{bound.text()} hours ({bound.why})")
    return hours


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
