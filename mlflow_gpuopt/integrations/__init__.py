"""Callbacks for the trainers people use; each module imports its library on first use.

* :mod:`mlflow_gpuopt.integrations.transformers` — ``GpuOptCallback`` for ``transformers.Trainer``.
* :mod:`mlflow_gpuopt.integrations.lightning` — ``GpuOptCallback`` for Lightning's ``Trainer``.
* accelerate needs none: pass what ``accelerator.prepare`` returned to ``gpuopt.track()``.
"""
