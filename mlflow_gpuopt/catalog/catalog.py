"""The loaded catalog: GPU specs plus offers, with a query API. Pure (no I/O)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

from mlflow_gpuopt.catalog.gpu_names import resolve_gpu_in
from mlflow_gpuopt.catalog.schema import PROVIDERS, GpuSpec, Offer
from mlflow_gpuopt.errors import InputError

#: Offers whose price does not depend on the region (Lambda, Colab) carry this region; a
#: region filter keeps them.
GLOBAL_REGION = "global"


class Catalog:
    """GPU specs and rentable offers, validated; build it with ``load_catalog()``.

    Attributes:
        offers: every offer, in provider order then file order.
        gpus: canonical GPU name -> :class:`GpuSpec` (read-only mapping).
        sources: provider -> where its offers were read (a path, or ``"shipped snapshot"``).
        warnings: what loading had to say (e.g. a stale user cache), one line each.
    """

    def __init__(
        self,
        offers: tuple[Offer, ...],
        gpus: Mapping[str, GpuSpec],
        sources: Mapping[str, str] | None = None,
        warnings: tuple[str, ...] = (),
    ) -> None:
        self.offers: tuple[Offer, ...] = tuple(offers)
        self.gpus: Mapping[str, GpuSpec] = MappingProxyType(dict(gpus))
        self.sources: Mapping[str, str] = MappingProxyType(dict(sources or {}))
        self.warnings: tuple[str, ...] = tuple(warnings)

    def __repr__(self) -> str:
        return f"Catalog({len(self.offers)} offers, {len(self.gpus)} GPUs)"

    @property
    def providers(self) -> tuple[str, ...]:
        """Providers that have offers, in display order."""
        present = {o.provider for o in self.offers}
        return tuple(p for p in PROVIDERS if p in present)

    def resolve_gpu(self, name: str) -> str:
        """Canonical name of ``name`` among this catalog's GPUs (raises UnknownGpuError)."""
        return resolve_gpu_in(name, self.gpus, {k: v.memory_gb for k, v in self.gpus.items()})

    def gpu(self, name: str) -> GpuSpec:
        """The spec of ``name`` (any spelling :func:`resolve_gpu` accepts)."""
        return self.gpus[self.resolve_gpu(name)]

    def query(
        self,
        provider: str | Collection[str] | None = None,
        gpu: str | None = None,
        region: str | None = None,
        min_gpu_memory_gb: float | None = None,
        spot: bool | None = None,
        max_gpu_count: int | None = None,
    ) -> list[Offer]:
        """Offers matching every filter given, cheapest $/GPU-h first.

        Args:
            provider: one provider or several (``aws``, ``gcp``, ``lambda``, ``azure``,
                ``colab``; case-insensitive). Unknown names raise an ``InputError`` (a
                ``ValueError``).
            gpu: any GPU spelling the resolver accepts (raises ``UnknownGpuError``).
            region: exact region (case-insensitive); region-independent offers
                (region ``"global"``: Lambda, Colab) always match.
            min_gpu_memory_gb: keep offers whose per-GPU memory is at least this (GB).
            spot: ``True`` keeps only offers that sell spot/preemptible capacity; ``False`` or
                ``None`` filter nothing (every offer has an on-demand price).
            max_gpu_count: keep offers whose instance holds at most this many GPUs.
        """
        out = list(self.offers)
        if provider is not None:
            if isinstance(provider, str):
                wanted = {provider.lower()}
            else:
                wanted = {p.lower() for p in provider}
            unknown = sorted(wanted - set(PROVIDERS))
            if unknown:
                raise InputError(
                    f"unknown provider {unknown[0]!r}; expected one of {', '.join(PROVIDERS)}"
                )
            out = [o for o in out if o.provider in wanted]
        if gpu is not None:
            canonical = self.resolve_gpu(gpu)
            out = [o for o in out if o.gpu == canonical]
        if region is not None:
            reg = region.lower()
            out = [o for o in out if o.region.lower() in (reg, GLOBAL_REGION)]
        if min_gpu_memory_gb is not None:
            out = [o for o in out if o.gpu_memory_gb >= min_gpu_memory_gb]
        if spot:
            out = [o for o in out if o.spot_price_per_hour_usd is not None]
        if max_gpu_count is not None:
            out = [o for o in out if o.gpu_count <= max_gpu_count]
        return sorted(out, key=lambda o: (o.price_per_gpu_hour_usd, o.provider, o.instance_type))
