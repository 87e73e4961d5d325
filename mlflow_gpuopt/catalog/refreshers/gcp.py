"""GCP: Cloud Billing Catalog API, Compute Engine SKUs (``services/6F81-5844-456A/skus``).

Paginated (``pageSize`` up to 5000, ``nextPageToken``); the API key comes from
``$GPUOPT_GCP_API_KEY`` and is sent in the ``X-Goog-Api-Key`` header (never in a URL). A
machine's price is its vCPU SKU × vCPUs + RAM SKU × GiB (SKUs of its series, e.g. "A2
Instance Core/Ram") + GPU SKU × GPUs, in its region; spot from the Preemptible SKUs.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any

from mlflow_gpuopt.catalog.errors import RefreshError
from mlflow_gpuopt.catalog.refreshers._common import KEEP, get, guard_parse, number, repriced
from mlflow_gpuopt.catalog.refreshers._http import HttpClient
from mlflow_gpuopt.catalog.schema import Offer

logger = logging.getLogger(__name__)

PROVIDER = "gcp"
API_KEY_ENV = "GPUOPT_GCP_API_KEY"
BASE_URL_ENV = "GPUOPT_GCP_BILLING_URL"
DEFAULT_BASE_URL = "https://cloudbilling.googleapis.com"
SERVICE = "6F81-5844-456A"
MAX_PAGES = 200

_SKIP = ("commitment", "reserved", "sole tenancy", "custom", "premium", "dws", "calendar")
_VM_PART = re.compile(r"\b([A-Z]\d+) Instance (Core|Ram)\b")
_GPU_PATTERNS = (
    (re.compile(r"\bA100 80GB\b"), "A100-80GB-SXM4"),
    (re.compile(r"\bA100\b"), "A100-40GB-SXM4"),
    (re.compile(r"\bH100 80GB\b(?!.*Mega)"), "H100-SXM5-80GB"),
    (re.compile(r"\bL4\b"), "L4"),
)


def skus_url(base_url: str) -> str:
    """URL of the Compute Engine SKU list."""
    return f"{base_url.rstrip('/')}/v1/services/{SERVICE}/skus"


#: Usage units we price by: per hour (cores, GPUs) and per GiB-hour (RAM).
_HOURLY_UNITS = ("h", "GiBy.h")


def _unit_price(sku: dict, where: str) -> float | None:
    """$ per usage unit from ``pricingInfo[0].pricingExpression.tieredRates[0].unitPrice``
    (``units`` + ``nanos``/1e9); ``None`` where it is not an hourly USD rate."""
    info = get(sku, "pricingInfo", list, where)
    if not info:
        raise RefreshError(f"{where}: empty pricingInfo")
    expr = get(info[0], "pricingExpression", dict, where)
    if expr.get("usageUnit", "h") not in _HOURLY_UNITS:
        return None
    rates = get(expr, "tieredRates", list, where)
    if not rates:
        raise RefreshError(f"{where}: no tieredRates")
    price = get(rates[0], "unitPrice", dict, where)
    if price.get("currencyCode", "USD") != "USD":
        return None
    units = number(price.get("units", "0"), where + " units")
    nanos = number(price.get("nanos", 0), where + " nanos")
    return units + nanos / 1e9


def _part(description: str, group: str) -> str | None:
    if group == "GPU":
        for pattern, gpu in _GPU_PATTERNS:
            if pattern.search(description):
                return f"gpu:{gpu}"
        return None
    m = _VM_PART.search(description)
    return f"{m.group(1).lower()}:{m.group(2).lower()}" if m else None


@guard_parse(PROVIDER)
def parse_skus(
    pages: Sequence[Any], templates: Sequence[Offer], as_of: str
) -> tuple[list[Offer], list[Offer]]:
    """Price the catalog's GCP machines from SKU pages (each ``{"skus": [...], ...}``).

    Returns (repriced offers, templates that could not be priced, kept unchanged).
    """
    # (part, usage, region) -> (n_regions of the SKU, price): the most specific SKU wins.
    table: dict[tuple[str, str, str], tuple[int, float]] = {}
    n_skus = 0
    for i, page in enumerate(pages):
        for sku in get(page, "skus", list, f"GCP SKU page {i + 1}"):
            n_skus += 1
            where = f"GCP SKU {str(sku.get('skuId', '?'))[:40] if isinstance(sku, dict) else '?'}"
            desc = get(sku, "description", str, where)
            cat = get(sku, "category", dict, where)
            if cat.get("resourceFamily") != "Compute" or any(s in desc.lower() for s in _SKIP):
                continue
            usage = cat.get("usageType")
            if usage not in ("OnDemand", "Preemptible"):
                continue
            part = _part(desc, str(cat.get("resourceGroup", "")))
            if part is None:
                continue
            price = _unit_price(sku, where)
            if price is None:
                continue
            if price < 0:
                raise RefreshError(f"{where}: negative unit price {price:g}")
            regions = get(sku, "serviceRegions", list, where)
            for region in regions:
                key = (part, usage, str(region))
                if key not in table or len(regions) < table[key][0]:
                    table[key] = (len(regions), price)
    if n_skus == 0:
        raise RefreshError("GCP billing catalog returned no SKUs")
    source = (f"GCP Cloud Billing Catalog API services/{SERVICE}/skus, read {as_of}: "
              "vCPU + RAM SKUs of the series + GPU SKUs")
    fresh, kept = [], []
    for t in templates:
        od = _machine_price(table, t, "OnDemand")
        if od is None:
            kept.append(t)
            continue
        spot = _machine_price(table, t, "Preemptible")
        fresh.append(repriced(t, price=od, as_of=as_of, source=source,
                              spot=KEEP if spot is None else spot))
    if templates and not fresh:
        raise RefreshError("GCP billing catalog: none of our machine types could be priced "
                           "(vCPU, RAM or GPU SKU missing)")
    return fresh, kept


def _machine_price(table: dict, t: Offer, usage: str) -> float | None:
    series = t.instance_type.split("-")[0].lower()
    parts = [(f"{series}:core", t.vcpus), (f"{series}:ram", t.memory_gb),
             (f"gpu:{t.gpu}", t.gpu_count)]
    total = 0.0
    for part, qty in parts:
        hit = table.get((part, usage, t.region))
        if hit is None:
            return None
        total += hit[1] * qty
    return total


def fetch_pages(client: HttpClient, api_key: str, base_url: str | None = None) -> list[Any]:
    """Every page of the SKU list, following ``nextPageToken``."""
    url = skus_url(base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL)
    pages, token, seen = [], "", set()
    for _ in range(MAX_PAGES):
        params = {"pageSize": 5000, **({"pageToken": token} if token else {})}
        page = client.get_json(url, params=params, headers={"X-Goog-Api-Key": api_key},
                               what="GCP billing catalog")
        pages.append(page)
        token = page.get("nextPageToken", "") if isinstance(page, dict) else ""
        if not token:
            return pages
        if not isinstance(token, str) or token in seen:
            raise RefreshError("GCP billing catalog: bad or repeated nextPageToken")
        seen.add(token)
    raise RefreshError(f"GCP billing catalog: more than {MAX_PAGES} pages")


def api_key_from_env() -> str:
    """The API key, or a RefreshError saying which variable to set."""
    key = os.environ.get(API_KEY_ENV, "").strip()
    if not key:
        raise RefreshError(f"set {API_KEY_ENV} to a Cloud Billing API key to refresh GCP prices")
    return key
