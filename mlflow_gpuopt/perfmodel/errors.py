"""The one error the scaling models raise for inputs they cannot use."""

from __future__ import annotations

from mlflow_gpuopt.errors import InputError


class PerfModelError(InputError):
    """A workload, observation or configuration the models cannot work with.

    The message is one line a command line can print as it is.
    """
