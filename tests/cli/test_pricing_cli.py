"""``mlflow gpuopt pricing show|refresh`` through the real click group."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.pricing import FAKE_LAMBDA_KEY, FIXTURES

from mlflow_gpuopt.catalog import catalog_cache_dir
from mlflow_gpuopt.cli import gpuopt

pytestmark = pytest.mark.usefixtures("pricing_env")  # tests/conftest.py
CONTRACT_KEYS = {"provider", "instance_type", "region", "gpu", "gpu_count", "gpu_memory_gb",
                 "vcpus", "memory_gb", "price_per_hour_usd", "spot_price_per_hour_usd",
                 "intra_node_link", "inter_node_gbps", "as_of", "source"}


def run(*args):
    return CliRunner().invoke(gpuopt, ["pricing", *args], catch_exceptions=False)


def test_show_json_lists_every_offer_with_contract_keys():
    result = run("show", "--json")
    assert result.exit_code == 0, result.output
    offers = json.loads(result.stdout)
    assert {o["provider"] for o in offers} == {"aws", "gcp", "lambda", "azure", "colab"}
    for o in offers:
        assert set(o) >= CONTRACT_KEYS
        assert o["price_per_hour_usd"] > 0 and o["as_of"] and o["source"]
    mega = next(o for o in offers if o["instance_type"] == "a2-megagpu-16g")
    assert mega["gpu_memory_gb"] == 40 and mega["gpu_count"] == 16
    assert mega["total_gpu_memory_gb"] == 640


def test_show_filters_by_provider_and_any_gpu_spelling():
    result = run("show", "--json", "--provider", "lambda", "--gpu", "NVIDIA H100 80GB HBM3")
    offers = json.loads(result.stdout)
    assert offers and {o["provider"] for o in offers} == {"lambda"}
    assert {o["gpu"] for o in offers} == {"H100-SXM5-80GB"}


def test_show_region_filter_keeps_that_region_and_region_independent_offers():
    every = json.loads(run("show", "--json").stdout)
    result = run("show", "--json", "--region", "US-WEST-2")
    assert result.exit_code == 0, result.output
    offers = json.loads(result.stdout)
    assert {o["region"] for o in offers} == {"us-west-2", "global"}
    assert {o["provider"] for o in offers if o["region"] == "us-west-2"} == {"aws"}
    expected = [o for o in every if o["region"] in ("us-west-2", "global")]
    assert len(offers) == len(expected) < len(every)


def test_show_spot_filter_keeps_only_offers_with_a_spot_price():
    every = json.loads(run("show", "--json").stdout)
    offers = json.loads(run("show", "--json", "--spot", "--provider", "aws").stdout)
    with_spot = [o for o in every if o["provider"] == "aws" and o["spot_price_per_hour_usd"]]
    assert offers and len(offers) == len(with_spot)
    assert all(o["spot_price_per_hour_usd"] is not None for o in offers)
    assert any(o["spot_price_per_hour_usd"] is None for o in every)  # the filter did something
    table = run("show", "--spot", "--region", "us-east-1", "--provider", "aws")
    assert table.exit_code == 0 and "p4d.24xlarge" in table.stdout


def test_show_json_carries_billing_network_and_estimate_fields():
    offers = json.loads(run("show", "--json").stdout)
    for o in offers:
        assert isinstance(o["billing_increment_s"], int) and o["billing_increment_s"] >= 1
        assert isinstance(o["billing_minimum_s"], int) and o["billing_minimum_s"] >= 0
        assert isinstance(o["inter_node_rdma"], bool) and isinstance(o["is_estimate"], bool)
        assert isinstance(o["max_nodes"], int) and o["max_nodes"] >= 1
        assert o["pricing"] in ("on_demand", "compute_units")
        assert o["is_estimate"] == o["source"].lower().startswith("estimated")
    p4d = next(o for o in offers if o["instance_type"] == "p4d.24xlarge")
    assert p4d["inter_node_rdma"] is True and p4d["max_nodes"] > 1
    colab = [o for o in offers if o["provider"] == "colab"]
    assert colab and all(o["pricing"] == "compute_units" and o["max_nodes"] == 1 for o in colab)


def test_show_table_is_readable():
    result = run("show", "--provider", "gcp", "--gpu", "nvidia-tesla-a100")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["provider", "instance", "region", "GPUs"]
    mega = next(line for line in lines if "a2-megagpu-16g" in line)
    assert "16x40GB" in mega and "nvswitch 600GB/s" in mega and "55.74" in mega


@pytest.mark.parametrize(
    ("args", "message"),
    [(["show", "--provider", "oracle"], "unknown provider 'oracle'"),
     (["show", "--gpu", "Voodoo 5"], "unknown GPU 'Voodoo 5'"),
     (["show", "--region", "mars-north-1"], "unknown region 'mars-north-1'; known: ")],
)
def test_bad_input_is_one_line_exit_2(args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_broken_user_cache_is_one_line_naming_the_file():
    folder = catalog_cache_dir()
    folder.mkdir(parents=True)
    (folder / "azure.csv").write_text("provider,instance_type\nazure,x\n")
    result = run("show")
    assert result.exit_code == 2 and "azure.csv" in result.stderr


def test_refresh_writes_cache_and_show_uses_it(httpserver):
    httpserver.expect_request("/api/v1/instance-types").respond_with_json(
        json.loads((FIXTURES / "lambda_instance_types.json").read_text()))
    result = run("refresh", "--provider", "lambda", "--base-url", httpserver.url_for("/"))
    assert result.exit_code == 0, result.output
    assert "refreshed 3 lambda offers" in result.stdout and FAKE_LAMBDA_KEY not in result.output
    offers = json.loads(run("show", "--json", "--provider", "lambda").stdout)
    a10 = next(o for o in offers if o["instance_type"] == "gpu_1x_a10")
    assert a10["price_per_hour_usd"] == 0.75 and "Lambda Cloud API" in a10["source"]


def test_refresh_failure_is_one_line_exit_2_and_changes_nothing(httpserver):
    httpserver.expect_request("/api/v1/instance-types").respond_with_data("{trunc", status=200)
    result = run("refresh", "--provider", "lambda", "--base-url", httpserver.url_for("/"),
                 "--retries", "0")
    assert result.exit_code == 2
    assert "nothing changed" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert FAKE_LAMBDA_KEY not in result.output
    assert not (catalog_cache_dir() / "lambda.csv").exists()


def test_refresh_rejects_unknown_provider():
    result = run("refresh", "--provider", "colab")
    assert result.exit_code == 2
