"""``mlflow gpuopt pricing show|refresh``: look at the price catalog, refresh it from the APIs."""

from __future__ import annotations

import dataclasses
import json

import click

from mlflow_gpuopt.cli._errors import UsageError
from mlflow_gpuopt.cli.options import load_catalog_or_fail

#: Keys of ``pricing show --json`` (the documented contract keys first, then the rest of the offer).
JSON_KEYS = (
    "provider", "instance_type", "region", "gpu", "gpu_count", "gpu_memory_gb", "vcpus",
    "memory_gb", "price_per_hour_usd", "spot_price_per_hour_usd", "intra_node_link",
    "inter_node_gbps", "as_of", "source",
)


def offer_to_json(offer) -> dict:
    """One offer as the ``--json`` object (contract keys first, plus every other field)."""
    data = dataclasses.asdict(offer)
    out = {k: data[k] for k in JSON_KEYS}
    out["price_per_gpu_hour_usd"] = round(offer.price_per_gpu_hour_usd, 6)
    out["total_gpu_memory_gb"] = offer.total_gpu_memory_gb
    out["is_estimate"] = offer.is_estimate
    out["estimated"] = offer.is_estimate  # older spelling, kept for existing readers
    for k in ("billing_increment_s", "billing_minimum_s", "inter_node_rdma", "max_nodes",
              "pricing"):
        out[k] = data[k]
    for k, v in data.items():
        if k not in out:
            out[k] = list(v) if isinstance(v, tuple) else v
    return out


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _link(offer) -> str:
    if offer.intra_node_link == "none":
        return "-"
    return f"{offer.intra_node_link} {offer.intra_node_gb_per_s:g}GB/s"


def render_table(offers) -> str:
    """The readable table of ``pricing show``."""
    head = ("provider", "instance", "region", "GPUs", "GPU mem", "link", "net Gbps", "$/h",
            "$/GPU-h", "spot $/h", "as of", "")
    rows = [head]
    for o in offers:
        rows.append((
            o.provider, o.instance_type, o.region, f"{o.gpu_count}x {o.gpu}",
            f"{o.gpu_count}x{o.gpu_memory_gb:g}GB", _link(o),
            (f"{o.inter_node_gbps:g}{' RDMA' if o.inter_node_rdma else ''}"
             if o.max_nodes > 1 else "-"),
            _money(o.price_per_hour_usd), _money(o.price_per_gpu_hour_usd),
            _money(o.spot_price_per_hour_usd), o.as_of,
            "est." if o.is_estimate else ("CU" if o.pricing == "compute_units" else ""),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    numeric = {3, 6, 7, 8, 9}
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in numeric and r is not head else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


@click.group(name="pricing")
def pricing() -> None:
    """Show or refresh the cloud GPU price catalog."""


@pricing.command(name="show")
@click.option("--provider", "providers", multiple=True,
              help="aws, gcp, lambda, azure or colab (repeatable).")
@click.option("--gpu", default=None, help="Any GPU name (NVML, provider or catalog spelling).")
@click.option("--region", default=None, help="Keep one region (plus region-independent offers).")
@click.option("--spot", is_flag=True, help="Keep only offers that sell spot/preemptible capacity.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of offers.")
def show(providers: tuple[str, ...], gpu: str | None, region: str | None, spot: bool,
         as_json: bool) -> None:
    """List offers: instance, GPUs, GPU memory, link, $/h, $/GPU-h, spot and as-of date.

    ``--region`` keeps one region (case-insensitive) plus region-independent offers (Lambda,
    Colab); an unknown region is an error listing the known ones. ``--spot`` keeps offers with
    a spot price.
    """
    cat = load_catalog_or_fail()
    offers = cat.query(provider=list(providers) or None, gpu=gpu, region=region,
                       spot=True if spot else None)
    known_regions = sorted({o.region for o in cat.offers})
    if region is not None and region.lower() not in {r.lower() for r in known_regions}:
        raise UsageError(f"unknown region {region!r}; known: {', '.join(known_regions)}")
    # cat.warnings (a stale or unusable cache file) were logged, once per process, on loading.
    offers.sort(key=lambda o: (o.provider, o.gpu, o.gpu_count, o.instance_type, o.region))
    if as_json:
        click.echo(json.dumps([offer_to_json(o) for o in offers], indent=2))
        return
    if not offers:
        click.echo("no offers match", err=True)
        return
    click.echo(render_table(offers))
    if any(o.is_estimate for o in offers):
        click.echo("est. = estimated, not read from a price source (see the offer's source)",
                   err=True)


@pricing.command(name="refresh")
@click.option("--provider", required=True,
              type=click.Choice(["aws", "gcp", "lambda", "azure"], case_sensitive=False),
              help="Which provider's price API to read.")
@click.option("--base-url", default=None, help="Override the API base URL (mirrors, tests).")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True, type=float,
              help="Seconds per HTTP request, the whole download included (AWS's offer "
                   "files run to hundreds of MB; raise it on a slow link).")
@click.option("--retries", default=3, show_default=True, type=click.IntRange(0, 10),
              help="Retries on 429/5xx and connection errors.")
@click.option("--lock-timeout", "lock_timeout_s", default=None, type=float,
              help="Seconds to wait for another refresh of the same provider to finish "
                   "[default: $GPUOPT_REFRESH_LOCK_TIMEOUT_S or 300].")
def refresh(provider: str, base_url: str | None, timeout_s: float, retries: int,
            lock_timeout_s: float | None) -> None:
    """Re-read one provider's prices into the user cache (atomically; on failure nothing changes).

    Keys: GCP from GPUOPT_GCP_API_KEY; Lambda from LAMBDA_API_KEY or a key file
    (GPUOPT_LAMBDA_API_KEY_FILE, ~/.lambda_cloud/lambda_keys). AWS and Azure need none.
    Two refreshes of one provider at once run one after the other (a lock file in the cache).
    Exit status 2 on any failure (missing key, network, HTTP error, bad payload, lock wait
    ran out).
    """
    from mlflow_gpuopt.catalog.errors import RefreshError
    from mlflow_gpuopt.catalog.refreshers import refresh as do_refresh
    from mlflow_gpuopt.catalog.refreshers._http import MAX_TIMEOUT_S, HttpClient

    if not 0 < timeout_s < MAX_TIMEOUT_S:  # also refuses nan and inf
        raise UsageError(f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}), "
                         f"got {timeout_s!r}")
    if lock_timeout_s is not None and not lock_timeout_s >= 0:
        raise UsageError("--lock-timeout must be >= 0")
    try:
        result = do_refresh(provider.lower(), base_url=base_url,
                            client=HttpClient(timeout_s=timeout_s, retries=retries),
                            lock_timeout_s=lock_timeout_s)
    except RefreshError as exc:
        raise UsageError(f"refresh of {provider.lower()} failed, nothing changed: {exc}") from None
    click.echo(f"refreshed {result.refreshed} {result.provider} offers"
               f"{f', kept {result.kept} unchanged' if result.kept else ''} -> {result.path}")
