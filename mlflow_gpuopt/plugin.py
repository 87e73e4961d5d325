"""MLflow entry points: the run-context provider (hardware tags) and the ``mlflow gpuopt`` hook.

MLflow imports this module on every ``import mlflow``; it must stay cheap and must never
raise. The provider tags each new run with the hardware fingerprint (``devices.fingerprint``);
the hook attaches the ``gpuopt`` command group (``_mlflow_cli_hook``).
"""

from __future__ import annotations

try:  # attach `mlflow gpuopt` when (and if) mlflow.cli is imported; never break mlflow
    from mlflow_gpuopt import _mlflow_cli_hook

    _mlflow_cli_hook.install()
except Exception:  # a plugin must not make `import mlflow` fail
    pass


try:  # MLflow's base class; already imported when MLflow loads this entry point
    from mlflow.tracking.context.abstract_context import RunContextProvider as _ProviderBase
except Exception:  # fall back to a duck-typed provider
    _ProviderBase = object  # type: ignore[assignment,misc]


class HardwareRunContextProvider(_ProviderBase):  # type: ignore[misc,valid-type]
    """Tags every new MLflow run with the hardware it runs on (``gpuopt.hw.*``).

    The probe (NVML if present, ``/proc/cpuinfo``, ``/sys/class/dmi/id``, Colab's environment)
    runs once per process, on the first run, never at import; ``tags()`` never raises.
    """

    def in_context(self) -> bool:
        return True

    def tags(self) -> dict:
        try:
            from mlflow_gpuopt.devices.fingerprint import hardware_fingerprint

            return hardware_fingerprint().tags()
        except Exception:  # tagging must never break mlflow.start_run
            return {}
