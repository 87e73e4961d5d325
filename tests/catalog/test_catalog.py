"""Loading, validating and querying the catalog; the shipped snapshot's content."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from mlflow_gpuopt.catalog import (
    Catalog,
    CatalogError,
    UnknownGpuError,
    catalog_cache_dir,
    load_catalog,
)
from mlflow_gpuopt.catalog.rows import offers_to_csv, parse_offers_csv
from mlflow_gpuopt.catalog.store import load_gpus, shipped_text

pytestmark = pytest.mark.usefixtures("pricing_env")  # tests/conftest.py


@pytest.fixture()
def cat() -> Catalog:
    return load_catalog(reload=True)


def _find(cat, provider, instance_type, region=None):
    hits = [o for o in cat.offers if o.provider == provider and o.instance_type == instance_type
            and (region is None or o.region == region)]
    assert hits, f"{provider} {instance_type} {region} missing"
    return hits[0]


REQUIRED = {
    "aws": ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p3.2xlarge", "p3.8xlarge",
            "p3.16xlarge", "p3dn.24xlarge", "g5.xlarge", "g5.12xlarge", "g5.48xlarge",
            "g6.xlarge", "g6.12xlarge", "g6.48xlarge"],
    "gcp": ["a2-highgpu-1g", "a2-highgpu-2g", "a2-highgpu-4g", "a2-highgpu-8g", "a2-megagpu-16g",
            "a2-ultragpu-1g", "a2-ultragpu-8g", "a3-highgpu-8g", "g2-standard-4", "g2-standard-48"],
    "lambda": ["gpu_1x_a100", "gpu_2x_a100", "gpu_4x_a100", "gpu_8x_a100",
               "gpu_8x_a100_80gb_sxm4", "gpu_1x_h100_sxm5", "gpu_8x_h100_sxm5", "gpu_1x_h100_pcie",
               "gpu_1x_a10", "gpu_1x_a6000", "gpu_2x_a6000", "gpu_4x_a6000", "gpu_8x_v100"],
    "azure": ["Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4", "Standard_ND96isr_H100_v5"],
}


@pytest.mark.parametrize("provider", sorted(REQUIRED))
def test_snapshot_holds_every_required_offer(cat, provider):
    for it in REQUIRED[provider]:
        offer = _find(cat, provider, it)
        assert offer.price_per_hour_usd > 0 and offer.source and offer.as_of


def test_aws_in_us_east_1_and_a_second_region(cat):
    for it in REQUIRED["aws"]:
        regions = {o.region for o in cat.offers if o.instance_type == it}
        assert "us-east-1" in regions and len(regions) >= 2, (it, regions)


def test_required_gpu_specs_present(cat):
    for name in ["V100-SXM2-16GB", "V100-SXM2-32GB", "T4", "A10", "A10G", "L4", "A100-40GB-SXM4",
                 "A100-80GB-SXM4", "A100-40GB-PCIe", "A100-80GB-PCIe", "RTX-A6000", "A40", "L40S",
                 "RTX-3090", "RTX-4090", "H100-SXM5-80GB", "H100-PCIe-80GB", "H200-SXM-141GB"]:
        spec = cat.gpus[name]
        assert spec.memory_gb > 0 and spec.fp16_tflops > 0 and spec.source


def test_corrections_from_the_data_readme_are_respected(cat):
    mega = _find(cat, "gcp", "a2-megagpu-16g")
    assert mega.gpu_count == 16 and mega.total_gpu_memory_gb == 640 and mega.memory_gb == 1360
    p4d = _find(cat, "aws", "p4d.24xlarge", "us-east-1")
    assert p4d.total_gpu_memory_gb == 320
    for offer in (mega, p4d):
        assert offer.intra_node_link == "nvswitch" and offer.intra_node_gb_per_s == 600
    assert p4d.inter_node_gbps == 400 and p4d.inter_node_rdma
    assert mega.inter_node_gbps == 100 and not mega.inter_node_rdma
    assert _find(cat, "lambda", "gpu_4x_a100").price_per_hour_usd == pytest.approx(7.96)
    assert cat.gpu("H100-SXM5-80GB").memory_bandwidth_gb_per_s == 3350
    assert cat.gpu("V100").memory_bandwidth_gb_per_s == 900


def test_suspect_gcp_rows_are_marked_estimated(cat):
    for it in ("a2-ultragpu-1g", "a2-ultragpu-8g"):
        offer = _find(cat, "gcp", it)
        assert offer.is_estimate and "SUSPECT" in offer.source
        assert offer.price_per_gpu_hour_usd > 3.5  # list price, not the anomalous ~1.85
    central = _find(cat, "gcp", "a3-highgpu-8g", "us-central1")
    assert central.is_estimate and central.price_per_hour_usd == pytest.approx(87.83249)


def test_colab_offers_are_compute_units_with_limits(cat):
    colab = cat.query(provider="colab")
    assert {o.gpu for o in colab} == {"T4", "L4", "V100-SXM2-16GB", "A100-40GB-SXM4"}
    plans = {o.instance_type.split("-")[1] for o in colab}
    assert plans == {"payg", "pro", "proplus"}
    for o in colab:
        assert o.pricing == "compute_units" and o.max_nodes == 1 and o.gpu_count == 1
        assert not o.gpu_guaranteed and o.max_session_hours
        assert o.price_per_hour_usd == pytest.approx(
            o.compute_units_per_hour * o.usd_per_compute_unit, rel=1e-4)
    a100 = _find(cat, "colab", "colab-proplus-A100")
    assert a100.subscription_usd_per_month == 49.99 and a100.compute_units_per_month == 500
    assert a100.compute_units_per_hour == 13.08


def test_every_offer_has_a_dated_source_and_consistent_hardware(cat):
    for o in cat.offers:
        dt.date.fromisoformat(o.as_of)
        assert o.source
        assert o.gpu in cat.gpus
        if o.spot_price_per_hour_usd is not None:
            assert o.spot_price_per_hour_usd <= o.price_per_hour_usd


def test_query_filters(cat):
    a100_aws = cat.query(provider="AWS", gpu="NVIDIA A100-SXM4-40GB")
    assert a100_aws and {o.instance_type for o in a100_aws} == {"p4d.24xlarge"}
    several = cat.query(provider=["aws", "lambda"], gpu="A100-80GB")
    assert {o.provider for o in several} == {"aws", "lambda"}
    east = cat.query(region="us-east-1")
    assert {o.region for o in east} == {"us-east-1", "global"}
    big = cat.query(min_gpu_memory_gb=80)
    assert big and all(o.gpu_memory_gb >= 80 for o in big)
    assert len(big) < len(cat.offers)
    spot = cat.query(spot=True)
    assert spot and all(o.spot_price_per_hour_usd for o in spot)
    assert len(cat.query(spot=False)) == len(cat.offers)
    small = cat.query(max_gpu_count=1)
    assert small and all(o.gpu_count == 1 for o in small)
    assert len(small) == sum(o.gpu_count <= 1 for o in cat.offers) < len(cat.offers)
    prices = [o.price_per_gpu_hour_usd for o in cat.query(gpu="H100")]
    assert prices == sorted(prices)
    with pytest.raises(ValueError, match="unknown provider"):
        cat.query(provider="oracle")
    with pytest.raises(UnknownGpuError):
        cat.query(gpu="Voodoo 5")


def test_gpu_lookup_accepts_any_spelling(cat):
    assert cat.gpu("Tesla T4").name == "T4"
    assert cat.gpu("NVIDIA H100 80GB HBM3").fp8_tflops == pytest.approx(1978.9)
    assert cat.gpu("T4").bf16_tflops is None


def test_snapshot_round_trips_through_the_writer(cat):
    gpus = load_gpus()
    aws = [o for o in cat.offers if o.provider == "aws"]
    assert parse_offers_csv(offers_to_csv(aws), gpus, "x.csv", "aws") == aws


# ------------------------------------------------------------------ validation


def _mutate(provider: str, column: str, value: str, row: int = 0) -> str:
    import csv
    import io

    rows = list(csv.reader(io.StringIO(shipped_text(f"{provider}.csv"))))
    rows[row + 1][rows[0].index(column)] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("price_per_hour_usd", "-3", "positive"),
        ("price_per_hour_usd", "0", "positive"),
        ("price_per_hour_usd", "abc", "a number"),
        ("price_per_hour_usd", "90000", "sanity"),
        ("gpu_count", "8.5", "integer"),
        ("gpu", "Voodoo 5", "unknown GPU"),
        ("total_gpu_memory_gb", "1200", "gpu_count x gpu_memory_gb"),
        ("gpu_memory_gb", "80", "has 40"),
        ("spot_price_per_hour_usd", "99", "above on-demand"),
        ("intra_node_link", "carrier-pigeon", "expected one of"),
        ("as_of", "last tuesday", "ISO date"),
        ("source", "", "empty"),
        ("provider", "gcp", "expected 'aws'"),
        ("inter_node_rdma", "maybe", "true or false"),
        ("max_nodes", "0", ">= 1"),
    ],
)
def test_bad_row_names_file_row_and_column(tmp_path, column, value, problem):
    folder = catalog_cache_dir()
    folder.mkdir(parents=True)
    (folder / "aws.csv").write_text(_mutate("aws", column, value, row=0))
    with pytest.raises(CatalogError) as info:
        load_catalog(reload=True)
    err = info.value
    assert err.file.endswith("aws.csv") and err.row == 2 and err.column == column
    assert problem in str(err) and "row 2" in str(err) and column in str(err)


def test_bad_header_and_ragged_rows_are_located(tmp_path):
    folder = catalog_cache_dir()
    folder.mkdir(parents=True)
    text = shipped_text("lambda.csv")
    (folder / "lambda.csv").write_text(text.replace("price_per_hour_usd", "price", 1))
    with pytest.raises(CatalogError, match="row 1.*price_per_hour_usd"):
        load_catalog(reload=True)
    lines = text.splitlines()
    lines[3] = lines[3] + ",extra"
    (folder / "lambda.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(CatalogError, match="row 4.*cells"):
        load_catalog(reload=True)


def test_duplicate_offer_rejected():
    gpus = load_gpus()
    text = shipped_text("azure.csv")
    lines = text.splitlines()
    with pytest.raises(CatalogError, match="row 3.*already on row 2"):
        parse_offers_csv("\n".join([lines[0], lines[1], lines[1]]), gpus, "azure.csv", "azure")


# ------------------------------------------------------------------ user cache


def _cache_with_price(provider: str, price: str, as_of: str) -> None:
    folder = catalog_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    text = _mutate(provider, "price_per_hour_usd", price)
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    col = rows[0].index("as_of")
    for r in rows[1:]:
        r[col] = as_of
    if provider == "azure":
        spot = rows[0].index("spot_price_per_hour_usd")
        rows[1][spot] = ""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (folder / f"{provider}.csv").write_text(buf.getvalue())


def test_user_cache_takes_precedence_per_provider(caplog):
    today = dt.date.today().isoformat()
    _cache_with_price("azure", "1.23", today)
    with caplog.at_level(logging.WARNING):
        cat = load_catalog(reload=True)
    azure = [o for o in cat.offers if o.provider == "azure"]
    assert azure[0].price_per_hour_usd == 1.23
    assert cat.sources["azure"].endswith("azure.csv")
    assert cat.sources["aws"] == "shipped snapshot"
    assert not cat.warnings and not caplog.records
    shipped_only = load_catalog(use_user_cache=False, reload=True)
    assert [o for o in shipped_only.offers if o.provider == "azure"][0].price_per_hour_usd == 27.197


def test_stale_user_cache_is_used_with_a_warning_naming_its_date(caplog, monkeypatch):
    _cache_with_price("azure", "1.23", "2020-01-02")
    with caplog.at_level(logging.WARNING):
        cat = load_catalog(reload=True)
    assert [o for o in cat.offers if o.provider == "azure"][0].price_per_hour_usd == 1.23
    assert len(cat.warnings) == 1 and "2020-01-02" in cat.warnings[0]
    assert any("2020-01-02" in r.getMessage() for r in caplog.records)
    fresh = load_catalog(max_age_days=1e6, reload=True)
    assert not fresh.warnings
    monkeypatch.setenv("GPUOPT_PRICING_MAX_AGE_DAYS", "1000000")
    assert not load_catalog(reload=True).warnings
    monkeypatch.setenv("GPUOPT_PRICING_MAX_AGE_DAYS", "soon")
    with pytest.raises(CatalogError, match="GPUOPT_PRICING_MAX_AGE_DAYS"):
        load_catalog(reload=True)


def test_catalog_is_kept_per_process_but_sees_refreshed_files():
    first = load_catalog()
    assert load_catalog() is first
    assert load_catalog(reload=True) is not first
    _cache_with_price("azure", "2.5", dt.date.today().isoformat())
    assert [o for o in load_catalog().offers if o.provider == "azure"][0].price_per_hour_usd == 2.5


def test_cache_dir_is_versioned_by_schema(tmp_path):
    from mlflow_gpuopt.catalog import CATALOG_SCHEMA_VERSION

    assert catalog_cache_dir().name == f"catalog-v{CATALOG_SCHEMA_VERSION}"
    assert catalog_cache_dir(tmp_path) == tmp_path / f"catalog-v{CATALOG_SCHEMA_VERSION}"
