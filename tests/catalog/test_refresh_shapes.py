"""The pure parsers read the fields exactly as ``shared/reference/pricing_apis.md`` documents
them (AWS bulk offer file, GCP billing SKUs, Lambda instance types, Azure retail items), and
skip the look-alike entries a real payload holds next to the ones we price."""

from __future__ import annotations

import copy
import json

import pytest
from support.pricing import FIXTURES

from mlflow_gpuopt.catalog import load_catalog
from mlflow_gpuopt.catalog.refreshers import aws, azure, gcp, lambda_cloud

AS_OF = "2025-09-01"


def fixture(name):
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def templates():
    cat = load_catalog(use_user_cache=False, reload=True)
    return lambda provider: [o for o in cat.offers if o.provider == provider]


def _price(offers, it, region=None):
    return next(o for o in offers if o.instance_type == it and region in (None, o.region))


def _p4d_copy(data, sku, **attrs):
    product = copy.deepcopy(data["products"]["AAAAP4DLINUX0001"])
    product["sku"] = sku
    product["attributes"].update(attrs)
    data["products"][sku] = product
    return product


def test_aws_reads_documented_fields(templates):
    fresh, _ = aws.parse_offer_file(fixture("aws_ec2_us-east-1.json"), "us-east-1",
                                    templates("aws"), AS_OF)
    p4d = _price(fresh, "p4d.24xlarge")
    assert p4d.vcpus == 96 and p4d.memory_gb == 1152 and p4d.as_of == AS_OF
    assert "20250801000000" in p4d.source


def test_aws_skips_products_without_on_demand_terms(templates):
    data = fixture("aws_ec2_us-east-1.json")
    _p4d_copy(data, "RESERVEDONLY0001")  # a Linux/shared p4d sold only on reserved terms
    fresh, _ = aws.parse_offer_file(data, "us-east-1", templates("aws"), AS_OF)
    base, _ = aws.parse_offer_file(fixture("aws_ec2_us-east-1.json"), "us-east-1",
                                   templates("aws"), AS_OF)
    assert _price(fresh, "p4d.24xlarge").price_per_hour_usd == _price(
        base, "p4d.24xlarge").price_per_hour_usd


def test_aws_skips_capacity_blocks_and_other_product_families(templates):
    data = fixture("aws_ec2_us-east-1.json")
    base_price = _price(aws.parse_offer_file(copy.deepcopy(data), "us-east-1", templates("aws"),
                                             AS_OF)[0], "p4d.24xlarge").price_per_hour_usd
    terms = data["terms"]["OnDemand"]
    for sku, fam, market in (("CAPBLOCK00000001", "Compute Instance", "CapacityBlock"),
                             ("BAREMETAL0000001", "Compute Instance (bare metal)", "OnDemand")):
        product = _p4d_copy(data, sku, marketoption=market)
        product["productFamily"] = fam
        term = copy.deepcopy(terms["AAAAP4DLINUX0001"])
        for t in term.values():
            for dim in t["priceDimensions"].values():
                dim["pricePerUnit"]["USD"] = "31.4640000000"
        terms[sku] = term
    fresh, _ = aws.parse_offer_file(data, "us-east-1", templates("aws"), AS_OF)
    assert _price(fresh, "p4d.24xlarge").price_per_hour_usd == base_price


def _gcp_pages():
    return [fixture("gcp_skus_page1.json"), fixture("gcp_skus_page2.json")]


def test_gcp_units_plus_nanos_and_usage_types(templates):
    fresh, _ = gcp.parse_skus(_gcp_pages(), templates("gcp"), AS_OF)
    assert fresh and all(o.as_of == AS_OF for o in fresh)
    a2 = _price(fresh, "a2-highgpu-1g", "us-central1")
    skus = {s["description"]: s for p in _gcp_pages() for s in p["skus"]}

    def unit(desc):
        up = skus[desc]["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]
        return float(up["units"]) + up["nanos"] / 1e9

    expected = (unit("A2 Instance Core running in Americas") * a2.vcpus
                + unit("A2 Instance Ram running in Americas") * a2.memory_gb
                + unit("Nvidia Tesla A100 GPU running in Americas"))
    assert a2.price_per_hour_usd == pytest.approx(expected, rel=1e-6)
    spot = (unit("Spot Preemptible A2 Instance Core running in Americas") * a2.vcpus
            + unit("Spot Preemptible A2 Instance Ram running in Americas") * a2.memory_gb
            + unit(next(d for d in skus if d.startswith("Nvidia Tesla A100 GPU attached"))))
    assert a2.spot_price_per_hour_usd == pytest.approx(spot, rel=1e-6)


@pytest.mark.parametrize("change", ["EUR", "monthly"])
def test_gcp_skips_non_usd_and_non_hourly_rates(templates, change):
    pages = _gcp_pages()
    base = _price(gcp.parse_skus(copy.deepcopy(pages), templates("gcp"), AS_OF)[0],
                  "a2-highgpu-1g", "us-central1").price_per_hour_usd
    odd = copy.deepcopy(pages[0]["skus"][0])  # "A2 Instance Core", one region: most specific
    odd["skuId"] = "ODD-SKU"
    odd["serviceRegions"] = ["us-central1"]
    expr = odd["pricingInfo"][0]["pricingExpression"]
    expr["tieredRates"][0]["unitPrice"] = {"currencyCode": "USD", "units": "9", "nanos": 0}
    if change == "EUR":
        expr["tieredRates"][0]["unitPrice"]["currencyCode"] = "EUR"
    else:
        expr["usageUnit"] = "mo"
    pages[0]["skus"].insert(0, odd)
    fresh, _ = gcp.parse_skus(pages, templates("gcp"), AS_OF)
    assert _price(fresh, "a2-highgpu-1g", "us-central1").price_per_hour_usd == base


def test_lambda_reads_cents_specs_and_capacity_regions(templates):
    payload = fixture("lambda_instance_types.json")
    fresh, _ = lambda_cloud.parse_instance_types(payload, templates("lambda"), AS_OF)
    for o in fresh:
        entry = payload["data"][o.instance_type]
        assert o.price_per_hour_usd == entry["instance_type"]["price_cents_per_hour"] / 100
        assert o.vcpus == entry["instance_type"]["specs"]["vcpus"]
        assert o.regions_with_capacity == tuple(
            r["name"] for r in entry["regions_with_capacity_available"])


def test_azure_consumption_spot_low_priority_windows_devtest(templates):
    t = next(o for o in templates("azure") if o.instance_type == "Standard_ND96asr_v4")
    item = {"currencyCode": "USD", "retailPrice": 27.197, "unitPrice": 27.197,
            "armRegionName": t.region, "meterName": "ND96asr A100 v4",
            "productName": "NDasrA100_v4 Series", "skuName": "ND96asr A100 v4",
            "serviceName": "Virtual Machines", "unitOfMeasure": "1 Hour", "type": "Consumption",
            "armSkuName": "Standard_ND96asr_v4"}
    spot = {**item, "retailPrice": 8.1, "meterName": "ND96asr A100 v4 Spot",
            "skuName": "ND96asr A100 v4 Spot"}
    low = {**item, "retailPrice": 5.0, "meterName": "ND96asr A100 v4 Low Priority",
           "skuName": "ND96asr A100 v4 Low Priority"}
    windows = {**item, "retailPrice": 31.0, "productName": "NDasrA100_v4 Series Windows"}
    devtest = {**item, "retailPrice": 20.0, "type": "DevTestConsumption"}
    pages = [{"BillingCurrency": "USD", "Items": [low, windows, item], "NextPageLink": "x",
              "Count": 3},
             {"BillingCurrency": "USD", "Items": [devtest, spot], "NextPageLink": None,
              "Count": 2}]
    fresh, _ = azure.parse_items(pages, [t], AS_OF)
    assert fresh[0].price_per_hour_usd == 27.197
    assert fresh[0].spot_price_per_hour_usd == 8.1
