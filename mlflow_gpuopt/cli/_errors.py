"""One way to turn bad input into one clear line and exit code 2."""

from __future__ import annotations

import click


class UsageError(click.ClickException):
    """Bad input from the user: printed as one line, exit code 2, no traceback."""

    exit_code = 2

    def show(self, file=None) -> None:  # click API
        click.echo(f"Error: {self.format_message()}", err=True, file=file)
