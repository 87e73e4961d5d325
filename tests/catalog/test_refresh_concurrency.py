"""Two ``pricing refresh --provider aws`` processes at once: the lock file makes them run one
after the other (never two downloads in flight, one valid catalog at the end, priced
consistently by the later one), and a short ``--lock-timeout`` ends in one line, exit 2,
with the other refresh's file intact."""

from __future__ import annotations

import json
import time

import pytest
from support.aws_offer_server import OfferServer, aws_region_file, cli, region_of
from support.wait import wait_until

from mlflow_gpuopt.catalog import catalog_cache_dir, load_catalog
from mlflow_gpuopt.catalog.errors import LockTimeoutError, RefreshError
from mlflow_gpuopt.file_lock import LockHeldError, exclusive_lock

pytestmark = pytest.mark.slow
REGIONS = ("ap-northeast-1", "us-east-1", "us-west-2")  # the catalog's AWS regions, sorted


def _priced_by_batch(index: int, path: str) -> bytes:
    # The first process's three downloads price p4d at 20 $/h, the second's at 30 $/h.
    price = "20.0000000000" if index < 3 else "30.0000000000"
    return json.dumps(aws_region_file(region_of(path), price)).encode()


def _wait_for_requests(server: OfferServer, n: int, timeout_s: float = 60.0) -> None:
    wait_until(lambda: server.requests_seen() >= n, timeout_s,
               "the first refresh never reached the server")


def _refresh_args(url: str, *extra: str) -> list[str]:
    return ["pricing", "refresh", "--provider", "aws", "--base-url", url, "--retries", "0",
            *extra]


def test_two_refreshes_at_once_run_one_after_the_other(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    with OfferServer(_priced_by_batch, delay_s=0.8) as server:
        first = cli(_refresh_args(server.url), cache)
        _wait_for_requests(server, 1)
        second = cli(_refresh_args(server.url), cache)
        second_started = time.monotonic()
        out1, err1 = first.communicate(timeout=120)
        out2, err2 = second.communicate(timeout=120)
        log = sorted(server.log, key=lambda r: r[1])
    assert first.returncode == 0, err1.decode()
    assert second.returncode == 0, err2.decode()
    # The second process was alive while the first was still downloading...
    assert second_started < log[2][2]
    # ...yet no two downloads overlapped: the second waited for the first's lock.
    assert server.max_in_flight == 1
    assert [region_of(p) for p, _, _ in log] == list(REGIONS) * 2
    # One valid catalog, priced wholly by the later refresh (no mix of the two).
    monkeypatch.setenv("GPUOPT_CACHE_DIR", str(cache))
    cat = load_catalog(reload=True)
    p4d = [o.price_per_hour_usd for o in cat.offers
           if o.provider == "aws" and o.instance_type == "p4d.24xlarge"]
    assert p4d == [30.0, 30.0]
    assert not list(catalog_cache_dir().glob("*.tmp"))


def test_lock_wait_runs_out_one_line_exit_2_other_refresh_intact(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    with OfferServer(_priced_by_batch, delay_s=1.0) as server:
        first = cli(_refresh_args(server.url), cache)
        _wait_for_requests(server, 1)
        second = cli(_refresh_args(server.url, "--lock-timeout", "0.3"), cache)
        out2, err2 = second.communicate(timeout=120)
        out1, err1 = first.communicate(timeout=120)
        seen = server.requests_seen()
    assert first.returncode == 0, err1.decode()
    assert second.returncode == 2
    lines = err2.decode().strip().splitlines()
    assert len(lines) == 1 and "another aws price refresh is running" in lines[0]
    assert "nothing changed" in lines[0] and "Traceback" not in lines[0]
    assert seen == 3  # the second never downloaded anything
    monkeypatch.setenv("GPUOPT_CACHE_DIR", str(cache))
    cat = load_catalog(reload=True)
    assert [o.price_per_hour_usd for o in cat.offers if o.instance_type == "p4d.24xlarge"] == [
        20.0, 20.0]


def test_lock_is_exclusive_in_one_process_too_and_released_after(tmp_path):
    path = tmp_path / "x.lock"
    with exclusive_lock(path, timeout_s=0, what="test"):
        assert path.read_text().strip().isdigit()
        # a second open file description on the same file conflicts under flock
        with (pytest.raises(LockHeldError,
                            match=r"another test is running \(pid \d+ holds"),
              exclusive_lock(path, timeout_s=0.1, what="test")):
            pass
    with exclusive_lock(path, timeout_s=0, what="test"):
        pass
    assert issubclass(LockTimeoutError, RefreshError)


def test_bad_lock_timeout_is_a_usage_error(tmp_path):
    proc = cli(["pricing", "refresh", "--provider", "aws", "--lock-timeout", "-1"],
               tmp_path / "cache")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--lock-timeout" in err.decode()
