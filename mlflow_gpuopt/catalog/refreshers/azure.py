"""Azure: the public Retail Prices API (``prices.azure.com/api/retail/prices``), no auth.

One OData ``$filter`` per region for our VM sizes; pages follow ``NextPageLink`` (only on
the same host). Linux consumption prices per hour; "Spot" items give the spot price; Windows
and "Low Priority" items are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from mlflow_gpuopt.catalog.errors import RefreshError
from mlflow_gpuopt.catalog.refreshers._common import KEEP, get, guard_parse, number, repriced
from mlflow_gpuopt.catalog.refreshers._http import HttpClient, redirect_allowed
from mlflow_gpuopt.catalog.schema import Offer

PROVIDER = "azure"
BASE_URL_ENV = "GPUOPT_AZURE_PRICES_URL"
DEFAULT_BASE_URL = "https://prices.azure.com/api/retail/prices"
MAX_PAGES = 100


def odata_filter(region: str, sku_names: Sequence[str]) -> str:
    """The ``$filter`` for our VM sizes in one region."""
    skus = " or ".join(f"armSkuName eq '{s}'" for s in sorted(sku_names))
    return (f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
            f"armRegionName eq '{region}' and ({skus})")


@guard_parse(PROVIDER)
def parse_items(
    pages: Sequence[Any], templates: Sequence[Offer], as_of: str
) -> tuple[list[Offer], list[Offer]]:
    """Price the catalog's Azure VM sizes from retail-price pages; returns (repriced, kept)."""
    wanted = {(t.instance_type, t.region): t for t in templates}
    od: dict[tuple[str, str], float] = {}
    spot: dict[tuple[str, str], float] = {}
    for i, page in enumerate(pages):
        for item in get(page, "Items", list, f"Azure page {i + 1}"):
            where = f"Azure page {i + 1} item"
            key = (get(item, "armSkuName", str, where), get(item, "armRegionName", str, where))
            if key not in wanted:
                continue
            where = f"Azure {key[0]} {key[1]}"
            if (item.get("serviceName", "Virtual Machines") != "Virtual Machines"
                    or item.get("type", "Consumption") != "Consumption"
                    or str(item.get("productName", "")).endswith("Windows")
                    or item.get("currencyCode", "USD") != "USD"):
                continue
            if get(item, "unitOfMeasure", str, where) != "1 Hour":
                continue
            names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
            if "Low Priority" in names:
                continue
            price = number(get(item, "retailPrice", (int, float), where), where + " retailPrice")
            target = spot if "Spot" in names else od
            if key in target and target[key] != price:
                raise RefreshError(
                    f"{where}: several different prices ({target[key]:g}, {price:g})")
            target[key] = price
    source = f"Azure Retail Prices API (Linux, consumption), read {as_of}"
    fresh, kept = [], []
    for key, t in wanted.items():
        if key not in od:
            kept.append(t)
            continue
        fresh.append(repriced(t, price=od[key], as_of=as_of, source=source,
                              spot=spot.get(key, KEEP)))
    if templates and not fresh:
        raise RefreshError("Azure retail prices: none of our VM sizes is priced")
    return fresh, kept


def fetch_pages(client: HttpClient, templates: Sequence[Offer],
                base_url: str | None = None) -> list[Any]:
    """Every page for every region the catalog has Azure offers in."""
    base = base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    host = urlsplit(base).netloc
    pages = []
    for region in sorted({t.region for t in templates}):
        skus = [t.instance_type for t in templates if t.region == region]
        url: str | None = base
        params: dict | None = {"$filter": odata_filter(region, skus)}
        for _ in range(MAX_PAGES):
            page = client.get_json(url, params=params, what="Azure retail prices")
            pages.append(page)
            url = page.get("NextPageLink") if isinstance(page, dict) else None
            params = None
            if not url:
                break
            if (not isinstance(url, str) or urlsplit(url).netloc != host
                    or not redirect_allowed(base, url)):  # same host, same scheme
                raise RefreshError(
                    "Azure retail prices: NextPageLink points to another host or scheme"
                )
        else:
            raise RefreshError(f"Azure retail prices: more than {MAX_PAGES} pages")
    return pages
