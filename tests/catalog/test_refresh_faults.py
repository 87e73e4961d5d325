"""Refreshes against a hostile price server, for real (local HTTP servers): redirects that would
carry the key elsewhere, gzip bodies and gzip bombs, a body that drips, bodies nested too deep,
keys that cannot go into a header, and cache paths that are not regular files. Each failure is
one line, names no key, and leaves the cache as it was."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import stat
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from pytest_httpserver import HTTPServer
from support.pricing import FAKE_GCP_KEY, FAKE_LAMBDA_KEY, FIXTURES
from werkzeug import Response

from mlflow_gpuopt.catalog import RefreshError, catalog_cache_dir, load_catalog
from mlflow_gpuopt.catalog.refreshers import _http, refresh
from mlflow_gpuopt.catalog.refreshers._http import HttpClient
from mlflow_gpuopt.cli import gpuopt

pytestmark = pytest.mark.usefixtures("pricing_env")  # tests/conftest.py
GCP_PATH = "/v1/services/6F81-5844-456A/skus"
LAMBDA_PATH = "/api/v1/instance-types"
AWS_PATH = "/offers/v1.0/aws/AmazonEC2/current/{}/index.json"


@pytest.fixture()
def other_server():
    """A second local server: where a hostile redirect points."""
    server = HTTPServer(host="127.0.0.1")
    server.start()
    yield server
    server.clear()
    if server.is_running():
        server.stop()


def client(**kw) -> HttpClient:
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("retries", 0)
    kw.setdefault("backoff_s", 0.01)
    return HttpClient(**kw)


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def cache_file(provider: str) -> Path:
    return catalog_cache_dir() / f"{provider}.csv"


def run_cli(*args):
    return CliRunner().invoke(gpuopt, ["pricing", *args], catch_exceptions=False)


def one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1


@pytest.fixture()
def previous_lambda(httpserver) -> bytes:
    """A refreshed Lambda file already in the cache; returns its bytes."""
    httpserver.expect_request(LAMBDA_PATH).respond_with_data(
        fixture_text("lambda_instance_types.json"), content_type="application/json")
    refresh("lambda", base_url=httpserver.url_for("/"), client=client())
    httpserver.clear()
    return cache_file("lambda").read_bytes()


# ------------------------------------------------------------------ redirects


def _serve_gcp_pages(server) -> None:
    server.expect_request(GCP_PATH, query_string={"pageSize": "5000"}).respond_with_data(
        fixture_text("gcp_skus_page1.json"), content_type="application/json")
    server.expect_request(
        GCP_PATH, query_string={"pageSize": "5000", "pageToken": "page-2-token"}
    ).respond_with_data(fixture_text("gcp_skus_page2.json"), content_type="application/json")


def test_keyed_request_never_follows_a_redirect(httpserver, other_server):
    _serve_gcp_pages(httpserver)
    refresh("gcp", base_url=httpserver.url_for("/"), client=client())
    before = cache_file("gcp").read_bytes()
    httpserver.clear()
    _serve_gcp_pages(other_server)
    httpserver.expect_request(GCP_PATH).respond_with_data(
        "", status=302, headers={"Location": other_server.url_for(GCP_PATH)})
    with pytest.raises(RefreshError) as info:
        refresh("gcp", base_url=httpserver.url_for("/"), client=client(retries=2))
    message = str(info.value)
    assert "302" in message and "redirect" in message and "\n" not in message
    assert f"127.0.0.1:{other_server.port}" in message and FAKE_GCP_KEY not in message
    assert not any("X-Goog-Api-Key" in req.headers for req, _ in other_server.log)
    assert other_server.log == []
    assert cache_file("gcp").read_bytes() == before


def test_keyed_redirect_on_the_cli_is_one_line_exit_2(httpserver, other_server,
                                                       previous_lambda):
    other_server.expect_request(LAMBDA_PATH).respond_with_data(
        fixture_text("lambda_instance_types.json"), content_type="application/json")
    httpserver.expect_request(LAMBDA_PATH).respond_with_data(
        "", status=307, headers={"Location": other_server.url_for(LAMBDA_PATH)})
    result = run_cli("refresh", "--provider", "lambda", "--base-url", httpserver.url_for("/"))
    assert result.exit_code == 2 and one_line(result.stderr)
    assert "307" in result.stderr and FAKE_LAMBDA_KEY not in result.output
    assert other_server.log == []
    assert cache_file("lambda").read_bytes() == previous_lambda


def test_unkeyed_download_follows_a_same_scheme_redirect(httpserver, other_server):
    for region in ("us-east-1", "us-west-2", "ap-northeast-1"):
        data = json.loads(fixture_text("aws_ec2_us-east-1.json"))
        for product in data["products"].values():
            product["attributes"]["regionCode"] = region
        other_server.expect_request(AWS_PATH.format(region)).respond_with_json(data)
        httpserver.expect_request(AWS_PATH.format(region)).respond_with_data(
            "", status=301, headers={"Location": other_server.url_for(AWS_PATH.format(region))})
    result = refresh("aws", base_url=httpserver.url_for("/"), client=client())
    assert result.refreshed > 0 and len(other_server.log) == 3


def test_unkeyed_redirect_loop_is_bounded(httpserver):
    httpserver.expect_request(AWS_PATH.format("ap-northeast-1")).respond_with_data(
        "", status=302, headers={"Location": AWS_PATH.format("ap-northeast-1")})
    with pytest.raises(RefreshError, match="redirects"):
        refresh("aws", base_url=httpserver.url_for("/"), client=client())
    assert not cache_file("aws").exists()


@pytest.mark.parametrize(("origin", "target", "allowed"), [
    ("https://a.example/x", "https://b.example/y", True),
    ("http://127.0.0.1:1/x", "http://127.0.0.1:2/y", True),
    ("https://a.example/x", "http://a.example/x", False),
    ("http://a.example/x", "https://a.example/x", False),
    ("https://a.example/x", "ftp://a.example/x", False),
])
def test_redirects_keep_the_scheme(origin, target, allowed):
    assert _http.redirect_allowed(origin, target) is allowed


# ------------------------------------------------------------------ gzip


def _gzip_response(body: bytes) -> Response:
    return Response(body, content_type="application/json", headers={"Content-Encoding": "gzip"})


def _gzip_bomb(inflated_bytes: int) -> bytes:
    """A gzip stream of ``inflated_bytes`` zeros, built without holding them in memory."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    parts = [packer.compress(block) for _ in range(inflated_bytes >> 20)]
    return b"".join([*parts, packer.flush()])


def test_gzip_compressed_prices_are_accepted(httpserver):
    body = gzip.compress(fixture_text("lambda_instance_types.json").encode())
    httpserver.expect_request(LAMBDA_PATH).respond_with_response(_gzip_response(body))
    result = refresh("lambda", base_url=httpserver.url_for("/"), client=client())
    assert result.refreshed == 3
    assert "gzip" in httpserver.log[0][0].headers.get("Accept-Encoding", "")


def test_gzip_bomb_is_refused_without_inflating_it(httpserver, previous_lambda, monkeypatch):
    monkeypatch.setattr(_http, "MAX_DOWNLOAD_BYTES", 1 << 20)
    bomb = _gzip_bomb(256 << 20)
    assert len(bomb) < (1 << 20)  # the wire bytes alone are under the cap
    httpserver.expect_request(LAMBDA_PATH).respond_with_response(_gzip_response(bomb))
    tracemalloc.start()
    try:
        with pytest.raises(RefreshError) as info:
            refresh("lambda", base_url=httpserver.url_for("/"), client=client())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "download limit" in str(info.value) and "\n" not in str(info.value)
    assert peak < 16 << 20  # at most about the cap was inflated, not the 256 MiB
    assert cache_file("lambda").read_bytes() == previous_lambda


def test_truncated_gzip_is_refused(httpserver, previous_lambda):
    body = gzip.compress(fixture_text("lambda_instance_types.json").encode())
    httpserver.expect_request(LAMBDA_PATH).respond_with_response(
        _gzip_response(body[: len(body) // 2]))
    with pytest.raises(RefreshError, match="truncated") as info:
        refresh("lambda", base_url=httpserver.url_for("/"), client=client())
    assert "\n" not in str(info.value)
    assert cache_file("lambda").read_bytes() == previous_lambda


# ------------------------------------------------------------------ timeouts


def _drip(_request) -> Response:
    def body():
        for byte in b'{"data": {"gpu_1x_a10": {"instance_type": {}}}}':
            time.sleep(0.2)
            yield bytes([byte])

    return Response(body(), content_type="application/json")


def test_timeout_bounds_a_dripping_body(httpserver, previous_lambda):
    httpserver.expect_request(LAMBDA_PATH).respond_with_handler(_drip)
    with pytest.raises(RefreshError, match="timed out") as info:
        refresh("lambda", base_url=httpserver.url_for("/"), client=client(timeout_s=0.6))
    assert "\n" not in str(info.value)
    assert cache_file("lambda").read_bytes() == previous_lambda


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "-inf", "1e400"])
def test_timeout_must_be_a_finite_positive_number(value):
    result = run_cli("refresh", "--provider", "lambda", "--base-url", "http://127.0.0.1:9",
                     f"--timeout={value}")
    assert result.exit_code == 2 and one_line(result.stderr)
    assert "--timeout" in result.stderr and "Traceback" not in result.output
    assert not cache_file("lambda").exists()


# ------------------------------------------------------------------ hostile bodies and keys


def test_deeply_nested_body_is_one_line_exit_2(httpserver, previous_lambda):
    depth = 100_000
    httpserver.expect_request(LAMBDA_PATH).respond_with_data(
        '{"data": ' + "[" * depth + "]" * depth + "}", content_type="application/json")
    result = run_cli("refresh", "--provider", "lambda", "--base-url", httpserver.url_for("/"),
                     "--retries", "0")
    assert result.exit_code == 2 and one_line(result.stderr), result.output
    assert "nested too deeply" in result.stderr and FAKE_LAMBDA_KEY not in result.output
    assert cache_file("lambda").read_bytes() == previous_lambda


@pytest.mark.parametrize(("provider", "env", "key"), [
    ("lambda", "LAMBDA_API_KEY", "FAKE-lambda-\u2013-dash-not-real"),
    ("gcp", "GPUOPT_GCP_API_KEY", "FAKE-gcp-\u0416-cyrillic-not-real"),
    ("lambda", "LAMBDA_API_KEY", "FAKE-lambda-new\nline-not-real"),
])
def test_key_that_cannot_be_a_header_is_one_line_exit_2(httpserver, previous_lambda,
                                                         monkeypatch, provider, env, key):
    monkeypatch.setenv(env, key)
    result = run_cli("refresh", "--provider", provider, "--base-url", httpserver.url_for("/"))
    assert result.exit_code == 2 and one_line(result.stderr), result.output
    assert "key contains characters that cannot be sent in an HTTP header" in result.stderr
    assert key not in result.output and key.split("\n")[0] not in result.output
    assert httpserver.log == []
    assert cache_file("lambda").read_bytes() == previous_lambda
    assert not cache_file("gcp").exists()


# ------------------------------------------------------------------ the cache file itself


def _serve_lambda(server) -> None:
    server.expect_request(LAMBDA_PATH).respond_with_data(
        fixture_text("lambda_instance_types.json"), content_type="application/json")


def test_refreshed_file_keeps_the_previous_mode(httpserver, previous_lambda):
    os.chmod(cache_file("lambda"), 0o640)
    _serve_lambda(httpserver)
    refresh("lambda", base_url=httpserver.url_for("/"), client=client())
    assert stat.S_IMODE(cache_file("lambda").stat().st_mode) == 0o640


def test_new_cache_file_is_readable_as_the_umask_allows(httpserver):
    _serve_lambda(httpserver)
    old = os.umask(0o022)
    try:
        refresh("lambda", base_url=httpserver.url_for("/"), client=client())
    finally:
        os.umask(old)
    assert stat.S_IMODE(cache_file("lambda").stat().st_mode) == 0o644


def _plant(kind: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:  # a symlink loop
        os.symlink(path.name, path)


def _kind_of(path: Path) -> str:
    mode = os.lstat(path).st_mode
    return ("fifo" if stat.S_ISFIFO(mode) else "directory" if stat.S_ISDIR(mode)
            else "symlink loop" if stat.S_ISLNK(mode) else "other")


@pytest.mark.skipif(os.name != "posix", reason="FIFOs and symlinks")
@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink loop"])
def test_cache_path_that_is_not_a_file_is_ignored_with_a_warning(kind, caplog):
    path = cache_file("lambda")
    _plant(kind, path)
    with caplog.at_level("WARNING"):
        cat = load_catalog(reload=True)
    assert cat.sources["lambda"] == "shipped snapshot"
    assert [w for w in cat.warnings if str(path) in w and "not a regular file" in w]
    assert sum(str(path) in r.getMessage() for r in caplog.records) == 1


def test_cache_file_over_the_cap_is_ignored_with_one_warning(caplog):
    """A price cache far larger than any provider's offers (a million rows took 79 s and 3 GB
    to parse) is skipped by its size, unread: the shipped prices are used, said once."""
    from mlflow_gpuopt.catalog.store import MAX_CACHE_FILE_BYTES

    path = cache_file("lambda")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:  # sparse: the size is what counts
        fh.truncate(MAX_CACHE_FILE_BYTES + 1)
    with caplog.at_level("WARNING"):
        cat = load_catalog(reload=True)
    assert cat.sources["lambda"] == "shipped snapshot"
    assert [w for w in cat.warnings if str(path) in w and "MiB a price cache may be" in w]
    assert sum(str(path) in r.getMessage() for r in caplog.records) == 1


@pytest.mark.skipif(os.name != "posix", reason="FIFOs and symlinks")
@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink loop"])
def test_refresh_onto_a_path_that_is_not_a_file_fails_and_touches_nothing(httpserver, kind):
    path = cache_file("lambda")
    _plant(kind, path)
    _serve_lambda(httpserver)
    result = run_cli("refresh", "--provider", "lambda", "--base-url", httpserver.url_for("/"))
    assert result.exit_code == 2 and one_line(result.stderr), result.output
    assert str(path) in result.stderr and "not a regular file" in result.stderr
    assert _kind_of(path) == kind
    assert sorted(p.name for p in path.parent.iterdir()) == ["lambda.csv"]


def test_stale_cache_warning_prints_once(tmp_path):
    from support.aws_offer_server import cli

    cache = tmp_path / "stale"
    folder = catalog_cache_dir(cache)
    folder.mkdir(parents=True)
    rows = list(csv.reader(io.StringIO(
        (Path(__file__).parents[2] / "pricing" / "lambda.csv").read_text())))
    as_of = rows[0].index("as_of")
    for row in rows[1:]:
        row[as_of] = "2020-01-02"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (folder / "lambda.csv").write_text(buf.getvalue())
    proc = cli(["pricing", "show", "--provider", "lambda"], cache)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert err.decode().count("days old") == 1, err.decode()


def test_azure_next_page_on_another_scheme_is_refused(httpserver):
    page1 = json.loads(fixture_text("azure_prices_page1.json"))
    page1["NextPageLink"] = httpserver.url_for("/api/retail/prices").replace(
        "http://", "https://") + "?$skip=100"
    httpserver.expect_request("/api/retail/prices").respond_with_json(page1)
    with pytest.raises(RefreshError, match="NextPageLink points to another host or scheme"):
        refresh("azure", base_url=httpserver.url_for("/api/retail/prices"), client=client())
    assert not cache_file("azure").exists()
