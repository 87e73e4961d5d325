"""One way to turn bad input into one clear line and exit code 2."""

from __future__ import annotations

import click


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


def one_line_reason(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``exc``'s message (or its type), secrets masked, at most ``limit``
    characters: what a one-line error may quote of an exception from MLflow or the OS."""
    from mlflow_gpuopt.redact import redact

    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    text = redact(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."
