"""MLflow entry points: the run-context provider (hardware tags) and the ``mlflow gpuopt`` hook.

MLflow imports this module on every ``import mlflow``; it must stay cheap and must never
raise. The provider class is defined by the tracking work; the CLI hook by the recommend work.
"""

from __future__ import annotations

try:  # attach `mlflow gpuopt` when (and if) mlflow.cli is imported; never break mlflow
    from mlflow_gpuopt import _mlflow_cli_hook

    _mlflow_cli_hook.install()
except Exception:  # noqa: BLE001 - a plugin must not make `import mlflow` fail
    pass
