"""Which offers and precisions a search may use (pure): the search space's filter over the
catalog, and the precisions a plan may switch a script to without changing what it computes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mlflow_gpuopt.catalog.catalog import Catalog
from mlflow_gpuopt.catalog.schema import GpuSpec, Offer
from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt.recommend.types import SearchSpace

#: Data-parallel strategies from the least memory-hungry-to-communicate up.
DATA_PARALLEL_LADDER = ("ddp", "zero1", "zero2", "fsdp")


class NoOffersError(InputError):
    """No catalog offer matches the providers / region / spot choice asked for."""


def allowed_precisions(workload_precision: str, spec: GpuSpec, *,
                       linear_layers: bool = False) -> tuple[str, ...]:
    """Precisions a plan on ``spec`` may use without changing what the script computes.

    fp32 scripts may also run with TF32 matmuls (where the GPU has TF32); fp16 autocast
    may become bf16 (no loss scaling needed); bf16 needs bf16 hardware; fp8 needs fp8.
    16-bit scripts whose FLOPs are in linear layers (``linear_layers``: transformers) may also
    run those in FP8 where the GPU has FP8 tensor cores: Transformer Engine and torchao float8
    swap ``nn.Linear`` modules and leave the rest of the step in bf16 (convolutions included,
    so CNNs are not offered FP8).
    """
    p = (workload_precision or "fp32").lower()
    fp8 = ("fp8",) if spec.fp8_tflops and linear_layers else ()
    if p == "fp32":
        return ("fp32", "tf32") if spec.tf32_tflops else ("fp32",)
    if p == "tf32":
        return ("tf32",) if spec.tf32_tflops else ("fp32",)
    if p == "fp16":
        return ("fp16", "bf16", *fp8) if spec.bf16_tflops else ("fp16",)
    if p == "bf16":
        return ("bf16", *fp8) if spec.bf16_tflops else ()
    if p == "fp8":
        return ("fp8",) if spec.fp8_tflops else ()
    return (p,)


def filter_offers(offers: Iterable[Offer], space: SearchSpace,
                  gpus: Mapping[str, GpuSpec] | None = None) -> list[Offer]:
    """Offers allowed by providers / region / spot / GPUs per instance (see
    :meth:`Catalog.query`), cheapest $/GPU-h first; raises :class:`NoOffersError` if none, or
    if no offer is in the region asked (region-independent offers alone do not make a region
    real)."""
    catalog = Catalog(tuple(offers), gpus or {})
    region = space.region.lower() if space.region else None
    if region and not any(o.region.lower() == region for o in catalog.offers):
        raise NoOffersError(f"no catalog offers in region {space.region}")
    try:
        out = catalog.query(provider=space.providers or None, region=space.region,
                            spot=space.spot, max_gpu_count=space.max_gpus)
    except ValueError as exc:  # an unknown provider
        raise NoOffersError(str(exc)) from None
    if not out:
        asked = []
        if space.providers:
            asked.append("provider " + "/".join(space.providers))
        if space.region:
            asked.append(f"region {space.region}")
        if space.spot:
            asked.append("spot")
        if space.max_gpus is not None:
            asked.append(f"at most {space.max_gpus} GPUs")
        raise NoOffersError(f"no catalog offers for {', '.join(asked) or 'this search'}")
    return out
