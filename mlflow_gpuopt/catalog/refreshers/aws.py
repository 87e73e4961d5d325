"""AWS: on-demand prices from the public Price List bulk offer file for EC2, one per region.

``GET {base}/offers/v1.0/aws/AmazonEC2/current/{region}/index.json`` (no auth). Products and
terms are separate sections; we keep Linux, shared tenancy, no pre-installed software, used
capacity, "Compute Instance" products (not Capacity Blocks), hourly on-demand rates of the
instance types already in the catalog; a product with no OnDemand term is skipped. Spot needs AWS
credentials (``DescribeSpotPriceHistory``), so spot prices are kept from the previous catalog.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from mlflow_gpuopt.catalog.errors import RefreshError
from mlflow_gpuopt.catalog.refreshers._common import get, guard_parse, number, repriced
from mlflow_gpuopt.catalog.refreshers._http import HttpClient
from mlflow_gpuopt.catalog.schema import Offer

logger = logging.getLogger(__name__)

PROVIDER = "aws"
BASE_URL_ENV = "GPUOPT_AWS_PRICING_URL"
DEFAULT_BASE_URL = "https://pricing.us-east-1.amazonaws.com"


def offer_file_url(base_url: str, region: str) -> str:
    """URL of one region's EC2 offer file."""
    return f"{base_url.rstrip('/')}/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"


def _memory_gib(text: str, where: str) -> float:
    value = text.replace(",", "").split()[0] if text.strip() else ""
    return number(value, f"{where} memory")


@guard_parse(PROVIDER)
def parse_offer_file(
    payload: Any, region: str, templates: Sequence[Offer], as_of: str
) -> tuple[list[Offer], list[Offer]]:
    """Price ``templates`` (this region's offers) from one region offer file.

    Returns:
        (repriced offers, templates not found in the file, kept unchanged).
    Raises:
        RefreshError: wrong shape or absurd price.
    """
    where = f"AWS offer file {region}"
    products = get(payload, "products", dict, where)
    on_demand = get(get(payload, "terms", dict, where), "OnDemand", dict, where + " terms")
    version = str(payload.get("version", "?"))[:40]
    wanted = {t.instance_type: t for t in templates if t.region == region}
    prices: dict[str, float] = {}
    specs: dict[str, tuple[int, float]] = {}
    for sku, product in products.items():
        attrs = get(product, "attributes", dict, f"{where} product {sku}")
        itype = attrs.get("instanceType")
        if itype not in wanted:
            continue
        if (attrs.get("operatingSystem") != "Linux" or attrs.get("tenancy") != "Shared"
                or attrs.get("preInstalledSw", "NA") != "NA"
                or attrs.get("capacitystatus", "Used") != "Used"
                or attrs.get("regionCode", region) != region
                or attrs.get("marketoption", "OnDemand") != "OnDemand"  # e.g. CapacityBlock
                or product.get("productFamily", "Compute Instance") != "Compute Instance"):
            continue
        if sku not in on_demand:  # sold only reserved/savings-plan: no on-demand price
            continue
        gpus = attrs.get("gpu")
        if (gpus is not None
                and int(number(gpus, f"{where} {itype} gpu")) != wanted[itype].gpu_count):
            raise RefreshError(
                f"{where}: {itype} has {gpus} GPUs, the catalog says {wanted[itype].gpu_count}"
            )
        hourly = []
        for term in get(on_demand, sku, dict, f"{where} OnDemand terms").values():
            dims = get(term, "priceDimensions", dict, f"{where} {itype} term")
            for dim in dims.values():
                if get(dim, "unit", str, f"{where} {itype}") != "Hrs":
                    continue
                usd = get(get(dim, "pricePerUnit", dict, f"{where} {itype}"), "USD", str,
                          f"{where} {itype} pricePerUnit")
                hourly.append(number(usd, f"{where} {itype} price"))
        hourly = [h for h in hourly if h != 0.0]
        if not hourly:
            continue
        if len(set(hourly)) > 1 or itype in prices and prices[itype] != hourly[0]:
            raise RefreshError(f"{where}: several different on-demand prices for {itype}")
        prices[itype] = hourly[0]
        specs[itype] = (
            int(number(get(attrs, "vcpu", str, f"{where} {itype}"), f"{where} {itype} vcpu")),
            _memory_gib(get(attrs, "memory", str, f"{where} {itype}"), f"{where} {itype}"),
        )
    source = (f"AWS Price List bulk API, AmazonEC2 {region} offer file version {version} "
              "(on-demand Linux, shared tenancy); spot kept from the previous catalog")
    fresh, kept = [], []
    for itype, template in wanted.items():
        if itype not in prices:
            kept.append(template)
            continue
        vcpus, mem = specs[itype]
        fresh.append(repriced(template, price=prices[itype], as_of=as_of, source=source,
                              vcpus=vcpus, memory_gb=mem))
    return fresh, kept


def fetch_and_parse(
    client: HttpClient, templates: Sequence[Offer], as_of: str, base_url: str | None = None
) -> tuple[list[Offer], list[Offer]]:
    """Download each region's offer file that the catalog has offers in, and price them."""
    base = base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    fresh: list[Offer] = []
    kept: list[Offer] = []
    for region in sorted({t.region for t in templates}):
        payload = client.get_json(offer_file_url(base, region), what=f"AWS {region} offer file")
        f, k = parse_offer_file(payload, region, templates, as_of)
        fresh += f
        kept += k
    if templates and not fresh:
        raise RefreshError(f"AWS offer files: none of our {len(templates)} offers is priced")
    return fresh, kept
