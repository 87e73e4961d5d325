"""The download progress bar, for real: the CLI in a subprocess whose stderr is a
pseudo-terminal, against a local server sending >1 MiB offer files with Content-Length.
A bar appears on the TTY; nothing of it appears when stderr is a pipe; the bar never shows a
URL, its query string or an API key."""

from __future__ import annotations

import copy
import json
import os
import threading

import pytest

from support.aws_offer_server import OfferServer, aws_region_file, cli, region_of
from support.pricing import FAKE_GCP_KEY, FIXTURES

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.name != "posix", reason="needs a pty")]
PAD = 5000  # unrelated products per offer file: ~1.7 MB, over the 1 MiB bar threshold


def _big_aws(index: int, path: str) -> bytes:
    return json.dumps(aws_region_file(region_of(path), pad_products=PAD)).encode()


def _run_on_pty(args, cache_dir, env_extra=None) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pty; returns (exit code, stdout, what the terminal got)."""
    master, slave = os.openpty()
    env_extra = env_extra or {}
    old = {k: os.environ.get(k) for k in env_extra}
    os.environ.update(env_extra)
    try:
        proc = cli(args, cache_dir, stderr=slave)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    os.close(slave)
    got: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the child closed its end
                return
            if not chunk:
                return
            got.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=120)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(got).decode(errors="replace")


def test_aws_download_shows_a_bar_on_a_tty_and_nothing_on_a_pipe(tmp_path):
    with OfferServer(_big_aws) as server:
        args = ["pricing", "refresh", "--provider", "aws", "--base-url", server.url]
        code, out, tty = _run_on_pty(args, tmp_path / "tty")
        assert code == 0, tty
        assert "refreshed" in out
        for region in ("ap-northeast-1", "us-east-1", "us-west-2"):
            assert f"AWS {region} offer file" in tty
        assert "[" in tty and "#" in tty and "100%" in tty
        assert "http" not in tty and "index.json" not in tty
        piped = cli(args, tmp_path / "pipe")
        out2, err2 = piped.communicate(timeout=120)
    assert piped.returncode == 0, err2.decode()
    assert "refreshed" in out2.decode()
    err = err2.decode()
    assert "kept its previous price" in err  # stderr is read (the log warnings are there)...
    for mark in ("offer file", "#", "%", "\r"):  # ...but no label, bar or redraws
        assert mark not in err, mark


def _gcp_body(index: int, path: str) -> bytes:
    if "pageToken=page-2-token" in path:
        return (FIXTURES / "gcp_skus_page2.json").read_bytes()
    page = copy.deepcopy(json.loads((FIXTURES / "gcp_skus_page1.json").read_text()))
    for i in range(PAD):  # storage SKUs the parser skips
        page["skus"].append({
            "name": f"services/6F81-5844-456A/skus/PAD-{i:06d}", "skuId": f"PAD-{i:06d}",
            "description": "Storage PD Capacity in somewhere far away, padding padding",
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Storage",
                         "resourceGroup": "PDStandard", "usageType": "OnDemand"},
            "serviceRegions": ["us-central1"]})
    return json.dumps(page).encode()


def test_gcp_bar_never_shows_the_key_or_the_query_string(tmp_path):
    with OfferServer(_gcp_body) as server:
        code, out, tty = _run_on_pty(
            ["pricing", "refresh", "--provider", "gcp", "--base-url", server.url],
            tmp_path / "tty", {"GPUOPT_GCP_API_KEY": FAKE_GCP_KEY})
        paths = [p for p, _, _ in server.log]
    assert code == 0, tty
    assert any("pageSize=5000" in p for p in paths)  # the query string exists...
    assert "GCP billing catalog" in tty and "100%" in tty  # ...a bar was drawn...
    for secret in (FAKE_GCP_KEY, "pageSize", "pageToken", "page-2-token", "skus?", "http"):
        assert secret not in tty, secret  # ...showing none of it
    assert FAKE_GCP_KEY not in out
