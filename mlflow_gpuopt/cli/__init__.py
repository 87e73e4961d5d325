"""The ``gpuopt`` click group, shared by ``mlflow gpuopt``, ``mlflow-gpuopt`` and ``python -m``.

Subcommands live in their own modules and are imported only when invoked, so ``--help`` and
``mlflow``'s own start-up stay fast.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
from collections.abc import Iterator

import click
from click.exceptions import NoArgsIsHelpError

from mlflow_gpuopt.cli._errors import UsageError
from mlflow_gpuopt.errors import InputError

#: subcommand name -> "module:attribute" of a click command.
_SUBCOMMANDS = {
    "recommend": "mlflow_gpuopt.cli.recommend:recommend",
    "advise": "mlflow_gpuopt.cli.advise:advise",
    "accuracy": "mlflow_gpuopt.cli.accuracy:accuracy",
    "predict": "mlflow_gpuopt.cli.predict:predict",
    "pricing": "mlflow_gpuopt.cli.pricing:pricing",
    "compare": "mlflow_gpuopt.cli.compare:compare",
    "replay": "mlflow_gpuopt.cli.replay:replay",
}

_HELP = {
    "recommend": "Rank instance x GPUs x strategy by cost for a target time-to-train.",
    "advise": "What to change in the training script, with evidence and what it saves.",
    "accuracy": "Hold every launched plan's predictions against what its job measured.",
    "predict": "Predict throughput, memory and step time for one configuration.",
    "pricing": "Show or refresh the cloud GPU price catalog.",
    "compare": "Compare measured runs side by side, with what their hardware costs.",
    "replay": "Deliver a tracking journal left behind when the server was unreachable.",
}


@contextlib.contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    """Re-raise click's usage errors and every :class:`~mlflow_gpuopt.errors.InputError`
    (a bad flag value, file, run or catalog, wherever it was found) as :class:`UsageError`:
    the promise is one line on stderr and exit code 2, also under ``mlflow gpuopt``, whose
    own main would otherwise print click's usage and hint lines too. Any other exception is
    a bug, and surfaces as one."""
    try:
        yield
    except NoArgsIsHelpError:
        raise  # a group called bare: its help is the answer
    except click.UsageError as exc:
        raise UsageError(exc.format_message()) from None
    except InputError as exc:
        raise UsageError(str(exc)) from None


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return None
        return getattr(module, attr)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # A bad option of the group itself (``mlflow-gpuopt --bogus``) fails here, before
        # invoke; click would print usage + hint + error.
        with _one_line_usage_errors():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        # click reports an unknown subcommand or a bad option value of a subcommand
        # (``--provider nope``, ``--max-gpus 0``) as usage + hint + error on four lines.
        with _one_line_usage_errors():
            return super().invoke(ctx)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Describe subcommands without importing them (keeps `--help` instant).
        rows = [(name, _HELP[name]) for name in sorted(_SUBCOMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


#: MLflow's HTTP settings for the commands' own MLflow calls (docs/reliability.md#replay).
_MLFLOW_HTTP_FOR_COMMANDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
                             "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@click.group(name="gpuopt", cls=_LazyGroup)
@click.version_option(package_name="mlflow-gpuopt")
def gpuopt() -> None:
    """Measure training, price cloud GPUs, predict scaling and recommend the cheapest setup."""
    # The commands read small artifacts (gpuopt/profile.json); MLflow's download progress
    # bars would interleave with the table and the one-line errors on stderr.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's own retries (7, 120 s timeout) held a command against an unreachable server
    # ~2.5 min: 1 retry and 10 s per request for the command, unless the user set them.
    ctx = click.get_current_context()
    for name, value in _MLFLOW_HTTP_FOR_COMMANDS.items():
        if name not in os.environ:
            os.environ[name] = value
            ctx.call_on_close(lambda name=name: os.environ.pop(name, None))
    # Everything imported so far (MLflow, click, SQLAlchemy: a few hundred thousand objects)
    # lives until the process exits; frozen, the collector stops re-walking it in every full
    # collection the command's allocations trigger (each ~0.1-0.2 s of CPU here). Thawed
    # when the command ends, so a caller that stays (a test's CliRunner) collects as before.
    gc.freeze()
    ctx.call_on_close(gc.unfreeze)


def main() -> None:
    """Console-script entry point (``mlflow-gpuopt``)."""
    gpuopt(prog_name="mlflow-gpuopt")
