"""The catalog's errors: bad data (file, row, column), unknown GPU names, failed refreshes."""

from __future__ import annotations

from mlflow_gpuopt.errors import InputError


class CatalogError(InputError):
    """A price or GPU file is malformed; the message names the file, row and column.

    ``row`` is the line number in the file (the header is line 1); ``None`` where the problem
    is the file as a whole.
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | None = None,
        row: int | None = None,
        column: str | None = None,
    ) -> None:
        self.problem = problem
        self.file = file
        self.row = row
        self.column = column
        where = []
        if file:
            where.append(str(file))
        if row is not None:
            where.append(f"row {row}")
        if column:
            where.append(f"column {column!r}")
        super().__init__(f"{', '.join(where)}: {problem}" if where else problem)


class UnknownGpuError(InputError):
    """A GPU name the resolver cannot map; the message lists the closest known names."""

    def __init__(self, name: str, closest: list[str]) -> None:
        self.name = name
        self.closest = closest
        super().__init__(
            f"unknown GPU {name!r}; closest known: {', '.join(closest)}"
            if closest
            else f"unknown GPU {name!r}"
        )


class RefreshError(CatalogError):
    """A refresh failed (network, HTTP, malformed or absurd payload); nothing was replaced."""


class LockTimeoutError(RefreshError):
    """Another refresh of the provider held its lock for longer than the allowed wait."""
