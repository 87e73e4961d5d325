"""Refreshers against a real local HTTP server (pytest-httpserver) serving the documented
response shapes: success, pagination, retries, timeouts, malformed/truncated/absurd payloads;
a failed refresh must leave the previous catalog byte-for-byte intact."""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

import pytest
from support.pricing import FAKE_GCP_KEY, FAKE_LAMBDA_KEY, FIXTURES
from werkzeug import Response

from mlflow_gpuopt.catalog import RefreshError, catalog_cache_dir, load_catalog
from mlflow_gpuopt.catalog.refreshers import refresh
from mlflow_gpuopt.catalog.refreshers._http import HttpClient

pytestmark = pytest.mark.usefixtures("pricing_env")  # tests/conftest.py
AWS_PATH = "/offers/v1.0/aws/AmazonEC2/current/{}/index.json"
GCP_PATH = "/v1/services/6F81-5844-456A/skus"


def _snapshot_rows(provider: str) -> int:
    """Offers of ``provider`` in the shipped snapshot (every one is refreshed or kept)."""
    import csv

    from mlflow_gpuopt.catalog.store import snapshot_dir

    text = (snapshot_dir() / f"{provider}.csv").read_text(encoding="utf-8")
    return sum(1 for _ in csv.DictReader(text.splitlines()))


def fixture(name: str):
    return json.loads((FIXTURES / name).read_text())


def client(**kw) -> HttpClient:
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("retries", 2)
    kw.setdefault("backoff_s", 0.01)
    return HttpClient(**kw)


def aws_region_file(region: str, p4d_price: str = "20.0000000000") -> dict:
    data = copy.deepcopy(fixture("aws_ec2_us-east-1.json"))
    for product in data["products"].values():
        product["attributes"]["regionCode"] = region
    for term in data["terms"]["OnDemand"]["AAAAP4DLINUX0001"].values():
        for dim in term["priceDimensions"].values():
            dim["pricePerUnit"]["USD"] = p4d_price
    return data


def serve_aws(httpserver, p4d_price: str = "20.0000000000") -> None:
    for region in ("us-east-1", "us-west-2", "ap-northeast-1"):
        httpserver.expect_request(AWS_PATH.format(region)).respond_with_json(
            aws_region_file(region, p4d_price))


def serve_lambda(httpserver, payload=None) -> None:
    httpserver.expect_request(
        "/api/v1/instance-types", headers={"Authorization": f"Bearer {FAKE_LAMBDA_KEY}"}
    ).respond_with_json(payload or fixture("lambda_instance_types.json"))


def cache_file(provider: str) -> Path:
    return catalog_cache_dir() / f"{provider}.csv"


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert FAKE_GCP_KEY not in text and FAKE_LAMBDA_KEY not in text


def test_unwritable_cache_is_one_refresh_error(httpserver, tmp_path):
    serve_aws(httpserver)
    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("x")
    with pytest.raises(RefreshError, match="cannot write the price cache"):
        refresh("aws", cache_dir=blocked, base_url=httpserver.url_for("/"), client=client())
    assert blocked.read_text() == "x"


def offer(cat, provider, it, region=None):
    return next(o for o in cat.offers if o.provider == provider and o.instance_type == it
                and (region is None or o.region == region))


# ------------------------------------------------------------------ success paths


def test_aws_refresh_prices_our_types_and_keeps_spot(httpserver):
    serve_aws(httpserver)
    result = refresh("aws", base_url=httpserver.url_for("/"), client=client())
    assert result.path == cache_file("aws") and result.path.exists()
    assert result.refreshed == 2 * 3  # p4d, p5.48xlarge, g5.xlarge in us-east-1 and us-west-2
    cat = load_catalog()
    p4d = offer(cat, "aws", "p4d.24xlarge", "us-east-1")
    assert p4d.price_per_hour_usd == 20.0  # the Linux/shared row, not Windows or dedicated
    assert p4d.spot_price_per_hour_usd == pytest.approx(2.4655)  # kept from the snapshot
    assert "Price List bulk API" in p4d.source and "20250801000000" in p4d.source
    assert offer(cat, "aws", "g5.xlarge", "us-east-1").price_per_hour_usd == 1.006
    kept = offer(cat, "aws", "p3.2xlarge", "us-east-1")
    assert kept.price_per_hour_usd == 3.06 and "skypilot" in kept.source
    assert cat.sources["aws"] == str(result.path)


def test_gcp_refresh_follows_pages_and_adds_vm_and_gpu_parts(httpserver):
    httpserver.expect_ordered_request(
        GCP_PATH, query_string={"pageSize": "5000"}, headers={"X-Goog-Api-Key": FAKE_GCP_KEY}
    ).respond_with_json(fixture("gcp_skus_page1.json"))
    httpserver.expect_ordered_request(
        GCP_PATH, query_string={"pageSize": "5000", "pageToken": "page-2-token"},
        headers={"X-Goog-Api-Key": FAKE_GCP_KEY},
    ).respond_with_json(fixture("gcp_skus_page2.json"))
    result = refresh("gcp", base_url=httpserver.url_for("/"), client=client())
    httpserver.check_assertions()
    cat = load_catalog()
    one = offer(cat, "gcp", "a2-highgpu-1g")
    assert one.price_per_hour_usd == pytest.approx(12 * 0.031611 + 85 * 0.004237 + 2.933908)
    assert one.spot_price_per_hour_usd == pytest.approx(12 * 0.009483 + 85 * 0.001271 + 1.5)
    mega = offer(cat, "gcp", "a2-megagpu-16g")
    assert mega.price_per_hour_usd == pytest.approx(96 * 0.031611 + 1360 * 0.004237 + 16 * 2.933908)
    ultra = offer(cat, "gcp", "a2-ultragpu-1g")
    assert ultra.price_per_hour_usd == pytest.approx(12 * 0.031611 + 170 * 0.004237 + 3.92808)
    assert not ultra.is_estimate
    g2 = offer(cat, "gcp", "g2-standard-4")
    assert g2.price_per_hour_usd == pytest.approx(4 * 0.024423 + 16 * 0.002862 + 0.56004)
    a3 = offer(cat, "gcp", "a3-highgpu-8g", "us-east4")
    assert a3.price_per_hour_usd == pytest.approx(87.83249)  # no A3 SKUs served: kept
    # kept: the rows the fixture serves no SKUs for (a3-highgpu x2, a3-mega, a3-ultra, a4)
    assert result.refreshed == 9  # the rows the two fixture pages price
    assert result.refreshed + result.kept == _snapshot_rows("gcp")
    assert_no_secret(result.path.read_text())
    for req, _ in httpserver.log:
        assert FAKE_GCP_KEY not in req.url  # key in a header, never in a URL


def test_lambda_refresh_records_capacity(httpserver):
    serve_lambda(httpserver)
    result = refresh("lambda", base_url=httpserver.url_for("/"), client=client())
    cat = load_catalog()
    h100 = offer(cat, "lambda", "gpu_8x_h100_sxm5")
    assert h100.price_per_hour_usd == 23.92
    assert h100.regions_with_capacity == ("us-east-1", "us-west-1")
    a10 = offer(cat, "lambda", "gpu_1x_a10")
    assert a10.price_per_hour_usd == 0.75 and a10.regions_with_capacity == ()
    assert offer(cat, "lambda", "gpu_1x_a6000").regions_with_capacity is None  # kept
    assert result.refreshed == 3
    assert_no_secret(result.path.read_text())


def test_lambda_key_from_key_file(httpserver, tmp_path, monkeypatch):
    monkeypatch.delenv("LAMBDA_API_KEY")
    key_file = tmp_path / "lambda_keys"
    key_file.write_text(f"api_key = {FAKE_LAMBDA_KEY}\n")
    monkeypatch.setenv("GPUOPT_LAMBDA_API_KEY_FILE", str(key_file))
    serve_lambda(httpserver)
    assert refresh("lambda", base_url=httpserver.url_for("/"), client=client()).refreshed == 3


def test_azure_refresh_follows_next_page_link(httpserver):
    page1 = fixture("azure_prices_page1.json")
    page1["NextPageLink"] = httpserver.url_for("/api/retail/prices") + "?$skip=100"
    httpserver.expect_ordered_request("/api/retail/prices").respond_with_json(page1)
    httpserver.expect_ordered_request(
        "/api/retail/prices", query_string={"$skip": "100"}
    ).respond_with_json(fixture("azure_prices_page2.json"))
    result = refresh("azure", base_url=httpserver.url_for("/api/retail/prices"), client=client())
    httpserver.check_assertions()
    first_query = httpserver.log[0][0].args["$filter"]
    assert "armRegionName eq 'eastus'" in first_query and "Standard_ND96asr_v4" in first_query
    cat = load_catalog()
    nd = offer(cat, "azure", "Standard_ND96asr_v4")
    assert nd.price_per_hour_usd == 27.197 and nd.spot_price_per_hour_usd == 3.1
    assert offer(cat, "azure", "Standard_ND96isr_H100_v5").price_per_hour_usd == 98.32
    # kept: ND A100 v4 (80 GB), NC A100 v4 and ND H200 v5, which the fixture does not price
    # The fixture prices two offers; every other snapshot row is kept at its price.
    assert result.refreshed == 2
    assert result.refreshed + result.kept == _snapshot_rows("azure")


def test_retries_500s_then_succeeds(httpserver):
    for _ in range(2):
        httpserver.expect_ordered_request("/api/v1/instance-types").respond_with_data(
            "oops", status=500)
    httpserver.expect_ordered_request("/api/v1/instance-types").respond_with_json(
        fixture("lambda_instance_types.json"))
    result = refresh("lambda", base_url=httpserver.url_for("/"), client=client(retries=2))
    assert result.refreshed == 3 and len(httpserver.log) == 3


def test_429_honours_retry_after_up_to_the_cap(httpserver):
    httpserver.expect_ordered_request("/api/v1/instance-types").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "0.2"})
    httpserver.expect_ordered_request("/api/v1/instance-types").respond_with_json(
        fixture("lambda_instance_types.json"))
    start = time.monotonic()
    refresh("lambda", base_url=httpserver.url_for("/"), client=client(max_backoff_s=0.3))
    assert time.monotonic() - start >= 0.2


# ------------------------------------------------------------------ failures


@pytest.fixture()
def previous(httpserver):
    """A refreshed Lambda file already in the cache; returns its bytes."""
    serve_lambda(httpserver)
    refresh("lambda", base_url=httpserver.url_for("/"), client=client())
    httpserver.clear()
    return cache_file("lambda").read_bytes()


def _assert_untouched(before: bytes) -> None:
    assert cache_file("lambda").read_bytes() == before
    assert [p.name for p in cache_file("lambda").parent.iterdir()] == ["lambda.csv"]


def _slow(_request):
    time.sleep(1.0)
    return Response("{}", content_type="application/json")


def _mutated(fn):
    payload = copy.deepcopy(fixture("lambda_instance_types.json"))
    fn(payload)
    return json.dumps(payload)


FAILURES = {
    "persistent 500": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_data(
        "down", status=503), "HTTP 503"),
    "401": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_data(
        "no", status=401), "check the API key"),
    "timeout": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_handler(
        _slow), "timed out"),
    "malformed json": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_data(
        "{data: nope", content_type="application/json"), "malformed JSON"),
    "truncated json": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_data(
        (FIXTURES / "lambda_instance_types.json").read_text()[:700],
        content_type="application/json"), "malformed JSON"),
    "missing field": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_data(
        _mutated(lambda p: p["data"]["gpu_4x_a100"]["instance_type"].pop("price_cents_per_hour")),
        content_type="application/json"), "price_cents_per_hour"),
    "absurd price": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_data(
        _mutated(lambda p: p["data"]["gpu_1x_a10"]["instance_type"].update(
            price_cents_per_hour=500_000)), content_type="application/json"), "sanity limit"),
    "zero price": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_data(
        _mutated(lambda p: p["data"]["gpu_1x_a10"]["instance_type"].update(
            price_cents_per_hour=0)), content_type="application/json"), "not positive"),
    "wrong gpu count": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_data(
        _mutated(lambda p: p["data"]["gpu_4x_a100"]["instance_type"]["specs"].update(gpus=2)),
        content_type="application/json"), "the catalog says 4"),
    "empty data": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_json(
        {"data": {}}), "none of our instance types"),
    "wrong shape": (lambda s: s.expect_request("/api/v1/instance-types").respond_with_json(
        [1, 2, 3]), "expected an object"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failed_refresh_leaves_previous_catalog_intact(httpserver, previous, case, caplog):
    setup, message = FAILURES[case]
    setup(httpserver)
    with caplog.at_level(logging.DEBUG), pytest.raises(RefreshError) as info:
        refresh("lambda", base_url=httpserver.url_for("/"),
                client=client(timeout_s=0.3, retries=1))
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert_no_secret(str(info.value), caplog.text)
    _assert_untouched(previous)


def test_connection_refused_is_a_refresh_error(previous):
    with pytest.raises(RefreshError, match="cannot reach"):
        refresh("lambda", base_url="http://127.0.0.1:9", client=client(retries=1))
    _assert_untouched(previous)


def test_aws_absurd_price_leaves_file_intact(httpserver):
    serve_aws(httpserver)
    refresh("aws", base_url=httpserver.url_for("/"), client=client())
    before = cache_file("aws").read_bytes()
    httpserver.clear()
    serve_aws(httpserver, p4d_price="99999.0")
    with pytest.raises(RefreshError, match="sanity limit"):
        refresh("aws", base_url=httpserver.url_for("/"), client=client())
    assert cache_file("aws").read_bytes() == before


def test_gcp_without_key_says_which_variable(monkeypatch):
    monkeypatch.delenv("GPUOPT_GCP_API_KEY")
    with pytest.raises(RefreshError, match="GPUOPT_GCP_API_KEY"):
        refresh("gcp", base_url="http://127.0.0.1:9", client=client())
    assert not cache_file("gcp").exists()


def test_gcp_repeated_page_token_is_an_error(httpserver):
    page = fixture("gcp_skus_page1.json")
    httpserver.expect_request(GCP_PATH).respond_with_json(page)
    with pytest.raises(RefreshError, match="repeated nextPageToken"):
        refresh("gcp", base_url=httpserver.url_for("/"), client=client())
    assert not cache_file("gcp").exists()


def test_azure_next_page_on_another_host_is_refused(httpserver):
    page1 = fixture("azure_prices_page1.json")
    page1["NextPageLink"] = "https://evil.example.com/api/retail/prices?$skip=100"
    httpserver.expect_request("/api/retail/prices").respond_with_json(page1)
    with pytest.raises(RefreshError, match="another host"):
        refresh("azure", base_url=httpserver.url_for("/api/retail/prices"), client=client())
    assert not cache_file("azure").exists()


def test_colab_and_unknown_providers_cannot_be_refreshed():
    for name in ("colab", "oracle"):
        with pytest.raises(RefreshError, match="cannot refresh"):
            refresh(name)


def test_base_url_from_environment(httpserver, monkeypatch):
    monkeypatch.setenv("GPUOPT_LAMBDA_API_URL", httpserver.url_for("/"))
    serve_lambda(httpserver)
    assert refresh("lambda", client=client()).refreshed == 3
