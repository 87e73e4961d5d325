"""One way to turn bad input into one clear line and exit code 2."""

from __future__ import annotations

import click

from mlflow_gpuopt.redact import one_line_reason

__all__ = ["LoggingFailed", "OneLineError", "UsageError", "one_line_reason"]


class OneLineError(click.ClickException):
    """An error printed as one line on stderr, no traceback, redacted as it is printed: a
    message may quote MLflow's own error text, which holds the tracking URI with its
    credentials (``http://user:token@host``)."""

    def show(self, file=None) -> None:  # click API
        from mlflow_gpuopt.redact import redact

        click.echo(f"Error: {redact(self.format_message())}", err=True, file=file)


class UsageError(OneLineError):
    """Bad input from the user (or a store that cannot be read): exit code 2."""

    exit_code = 2


class LoggingFailed(OneLineError):  # noqa: N818 - names the outcome, as click's Abort does
    """The result was computed and printed, but writing it to MLflow failed: exit code 1
    (the command's own work is done; its record is missing)."""

    exit_code = 1
