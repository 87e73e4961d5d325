"""Attach ``gpuopt`` to MLflow's own ``mlflow`` command, so ``mlflow gpuopt …`` works.

MLflow has no entry-point group for CLI commands. It does import our run-context-provider
module (``mlflow_gpuopt.plugin``) on every ``import mlflow``, and the ``mlflow`` console
script imports ``mlflow`` before it finishes importing ``mlflow.cli``. So :func:`install`
puts a tiny finder on ``sys.meta_path`` that waits for the module ``mlflow.cli``; when that
module has finished executing, the ``gpuopt`` group is added to ``mlflow.cli.cli``. If
``mlflow.cli`` is already imported, the group is attached at once.

Defensive by design: any failure (MLflow renamed things, click is odd) is logged at debug
level and leaves ``mlflow`` working; ``mlflow-gpuopt`` and ``python -m mlflow_gpuopt`` stay
the supported spellings. Cheap: nothing here imports click or ``mlflow.cli`` at install
time; the group itself is imported only when ``mlflow.cli`` loads.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import sys
from types import ModuleType

logger = logging.getLogger(__name__)

_TARGET = "mlflow.cli"
_COMMAND_NAME = "gpuopt"


def attach(module: ModuleType) -> bool:
    """Add the ``gpuopt`` group to ``module.cli``; True if it is there afterwards."""
    try:
        cli = getattr(module, "cli", None)
        if cli is None or not hasattr(cli, "add_command"):
            logger.debug("mlflow.cli has no click group 'cli'; `mlflow gpuopt` not attached")
            return False
        commands = getattr(cli, "commands", {})
        if _COMMAND_NAME not in commands:
            from mlflow_gpuopt.cli import gpuopt

            cli.add_command(gpuopt, name=_COMMAND_NAME)
        return True
    except Exception:  # never break `mlflow`
        logger.debug("could not attach `mlflow gpuopt`", exc_info=True)
        return False


class _AttachingLoader(importlib.abc.Loader):
    """Runs the real loader, then attaches the group to the freshly executed module."""

    def __init__(self, wrapped: importlib.abc.Loader) -> None:
        self._wrapped = wrapped

    def create_module(self, spec):  # importlib API
        create = getattr(self._wrapped, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:  # importlib API
        # The module's own loader must stay visible to tools that inspect it.
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._wrapped
        module.__loader__ = self._wrapped
        self._wrapped.exec_module(module)
        attach(module)

    def __getattr__(self, name: str):  # get_source, get_filename, is_package, …
        return getattr(self._wrapped, name)


class _CliFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of ``mlflow.cli`` found by the other finders."""

    def find_spec(self, fullname, path, target=None):  # importlib API
        if fullname != _TARGET:
            return None
        try:
            _uninstall_finder()
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _AttachingLoader(spec.loader)
                    return spec
        except Exception:  # fall back to the normal import
            logger.debug("gpuopt import hook failed; importing mlflow.cli normally",
                         exc_info=True)
        return None


_finder: _CliFinder | None = None


def _uninstall_finder() -> None:
    global _finder
    if _finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_finder)
        _finder = None


def install() -> None:
    """Arrange for ``mlflow gpuopt`` to exist; idempotent, never raises."""
    global _finder
    try:
        module = sys.modules.get(_TARGET)
        if module is not None and hasattr(module, "cli"):
            attach(module)
            return
        if _finder is None and module is None:
            _finder = _CliFinder()
            sys.meta_path.insert(0, _finder)
    except Exception:  # never break `import mlflow`
        logger.debug("could not install the gpuopt CLI hook", exc_info=True)
