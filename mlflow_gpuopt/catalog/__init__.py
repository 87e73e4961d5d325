"""The price catalog: GPU specs, cloud offers, GPU-name resolution, loading and refreshing.

```python
from mlflow_gpuopt.catalog import load_catalog, resolve_gpu
cat = load_catalog()                       # user cache (per provider) > shipped snapshot
cat.query(provider="aws", gpu="NVIDIA A100-SXM4-40GB", spot=True)
resolve_gpu("Tesla V100-SXM2-16GB")        # -> "V100-SXM2-16GB"
```
"""

from __future__ import annotations

import logging
from functools import lru_cache

from mlflow_gpuopt.catalog.catalog import GLOBAL_REGION, Catalog
from mlflow_gpuopt.catalog.errors import CatalogError, RefreshError, UnknownGpuError
from mlflow_gpuopt.catalog.gpu_names import build_alias_table, resolve_gpu_in
from mlflow_gpuopt.catalog.schema import CATALOG_SCHEMA_VERSION, PROVIDERS, GpuSpec, Offer
from mlflow_gpuopt.catalog.store import (
    catalog_cache_dir,
    clear_catalog_cache,
    load_catalog,
    load_gpus,
)

logger = logging.getLogger(__name__)

__all__ = [
    "CATALOG_SCHEMA_VERSION", "GLOBAL_REGION", "PROVIDERS", "Catalog", "CatalogError", "GpuSpec",
    "Offer", "RefreshError", "UnknownGpuError", "catalog_cache_dir", "clear_catalog_cache",
    "clear_gpu_name_caches", "load_catalog", "load_gpus", "peak_flops_per_s", "resolve_gpu",
]


@lru_cache(maxsize=1)
def _gpu_memory() -> dict[str, float]:
    return {name: spec.memory_gb for name, spec in load_gpus().items()}


def clear_gpu_name_caches() -> None:
    """Forget the GPU-memory and GPU-name tables :func:`resolve_gpu` built from the loaded
    specs; the next call builds them again (``mlflow_gpuopt.testing.clear_caches``)."""
    _gpu_memory.cache_clear()
    build_alias_table.cache_clear()


def resolve_gpu(name: str) -> str:
    """The catalog's canonical name for any spelling of a GPU, case-insensitive.

    Accepts NVML/torch names (``NVIDIA A100-SXM4-40GB``, ``Tesla T4``), provider names
    (``gpu_8x_a100_80gb_sxm4``, ``nvidia-tesla-a100``, ``A100-80GB``) and canonical names.
    Short names pick documented defaults (``A100`` -> ``A100-40GB-SXM4``, ``V100`` ->
    ``V100-SXM2-16GB``, ``H100`` -> ``H100-SXM5-80GB``); see ``catalog.gpu_names``.

    Raises:
        UnknownGpuError: (a ValueError) listing the closest known names.
    """
    memory = _gpu_memory()
    return resolve_gpu_in(name, memory, memory)


def peak_flops_per_s(gpu_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of one ``gpu_name`` GPU at ``precision`` from ``pricing/gpus.csv``
    (datasheet figures, no sparsity); ``None`` for ``cpu`` or a GPU the catalog lacks.

    ``gpu_name`` is any spelling :func:`resolve_gpu` accepts (an NVML name, typically).
    """
    if not gpu_name or gpu_name == "cpu":
        return None
    try:
        value = load_gpus()[resolve_gpu(gpu_name)].peak_tflops(precision)
    except (CatalogError, ValueError) as exc:  # unknown GPU / precision, unreadable specs
        logger.debug("gpuopt: no peak for %s/%s: %s", gpu_name, precision, exc)
        return None
    return float(value) * 1e12 if value else None
