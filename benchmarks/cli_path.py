"""What the accuracy benchmarks share: their predictions go through ``mlflow gpuopt predict``,
the command a user runs, invoked in-process (click's ``CliRunner``) with a workload file and
an observations CSV in a temporary folder, and its ``--json`` read back.

The price catalog is read once per process (every call would otherwise parse the shipped
snapshot again); nothing else is shared with the model's Python API.
"""

from __future__ import annotations

import csv
import functools
import json
from collections.abc import Iterable
from pathlib import Path

from click.testing import CliRunner

import mlflow_gpuopt.catalog as catalog_module
from mlflow_gpuopt.cli.predict import predict as predict_command
from mlflow_gpuopt.workload_files import OBSERVATION_COLUMNS

__all__ = ["OBSERVATION_COLUMNS", "PredictError", "observations_args", "run_predict"]

_load_catalog = catalog_module.load_catalog


@functools.lru_cache(maxsize=1)
def _cached_catalog(*args, **kwargs):
    return _load_catalog(*args, **kwargs)


def observations_args(path: Path, lines: Iterable[list]) -> list[str]:
    """Write ``lines`` (rows of :data:`OBSERVATION_COLUMNS`) as the observations CSV a user
    writes at ``path``; the ``--observations`` arguments that pass it."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(OBSERVATION_COLUMNS)
        writer.writerows(lines)
    return ["--observations", str(path)]


class PredictError(RuntimeError):
    """The command refused the input (its one-line message) or failed."""


def run_predict(args: list[str]) -> dict:
    """``mlflow gpuopt predict ARGS --json`` as a dict; :class:`PredictError` with the
    command's message when it exits non-zero."""
    catalog_module.load_catalog = _cached_catalog
    try:
        result = CliRunner().invoke(predict_command, [*args, "--json"], catch_exceptions=True)
    finally:
        catalog_module.load_catalog = _load_catalog
    if result.exit_code != 0:
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise PredictError(f"{type(result.exception).__name__}: {result.exception}")
        raise PredictError((result.output or "").strip().splitlines()[-1:] or "failed")
    return json.loads(result.output)
