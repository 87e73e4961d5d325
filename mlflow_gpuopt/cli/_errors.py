"""One way to turn bad input into one clear line and exit code 2."""

from __future__ import annotations

import click


class UsageError(click.ClickException):
    """Bad input from the user: printed as one line, exit code 2, no traceback."""

    exit_code = 2

    def show(self, file=None) -> None:  # click API
        click.echo(f"Error: {self.format_message()}", err=True, file=file)


class LoggingFailed(click.ClickException):
    """The result was computed and printed, but writing it to MLflow failed: one line on
    stderr and exit code 1 (the command's own work is done; its record is missing)."""

    exit_code = 1

    def show(self, file=None) -> None:  # click API
        click.echo(f"Error: {self.format_message()}", err=True, file=file)


def one_line_reason(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``exc``'s message (or its type), secrets masked, at most ``limit``
    characters: what a one-line error may quote of an exception from MLflow or the OS."""
    from mlflow_gpuopt.redact import redact

    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    text = redact(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."
