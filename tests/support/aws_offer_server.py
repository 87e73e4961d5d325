"""A real threaded ``http.server`` that serves AWS EC2 offer files (the documented bulk JSON
shape, from ``fixtures/pricing/aws_ec2_us-east-1.json``) with Content-Length, an optional
delay per request, an optional padding of unrelated products (to make a large download), and
a log of every request: path, start and end time, and the most requests in flight at once.

Used by the refresh concurrency and progress-bar tests, which run the CLI in subprocesses.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from support.pricing import FIXTURES

P4D_SKU = "AAAAP4DLINUX0001"
AWS_PREFIX = "/offers/v1.0/aws/AmazonEC2/current/"


def aws_region_file(region: str, p4d_price: str = "20.0000000000", pad_products: int = 0) -> dict:
    """One region's offer file: the fixture re-labelled for ``region``, p4d at ``p4d_price``,
    plus ``pad_products`` unrelated (m5) products with their on-demand terms."""
    data = copy.deepcopy(json.loads((FIXTURES / "aws_ec2_us-east-1.json").read_text()))
    for product in data["products"].values():
        product["attributes"]["regionCode"] = region
    for term in data["terms"]["OnDemand"][P4D_SKU].values():
        for dim in term["priceDimensions"].values():
            dim["pricePerUnit"]["USD"] = p4d_price
    for i in range(pad_products):
        sku = f"PAD{i:013d}"
        data["products"][sku] = {
            "sku": sku, "productFamily": "Compute Instance",
            "attributes": {"instanceType": f"m5.pad{i}", "vcpu": "2", "memory": "8 GiB",
                           "operatingSystem": "Linux", "tenancy": "Shared",
                           "preInstalledSw": "NA", "capacitystatus": "Used",
                           "regionCode": region, "location": "somewhere far away"},
        }
        data["terms"]["OnDemand"][sku] = {
            f"{sku}.JRTCKXETXF": {"offerTermCode": "JRTCKXETXF", "sku": sku, "priceDimensions": {
                f"{sku}.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": "0.096"},
                                                 "description": "$0.096 per On Demand Linux"}}}}
    return data


class OfferServer:
    """``body_for(index, path) -> bytes`` builds each response (index counts requests from 0)."""

    def __init__(self, body_for: Callable[[int, str], bytes], delay_s: float = 0.0) -> None:
        self.body_for = body_for
        self.delay_s = delay_s
        self.log: list[tuple[str, float, float]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._count = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # http.server's name
                start = time.monotonic()
                with outer._lock:
                    index = outer._count
                    outer._count += 1
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    time.sleep(outer.delay_s)
                    body = outer.body_for(index, self.path)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    with outer._lock:
                        outer.in_flight -= 1
                        outer.log.append((self.path, start, time.monotonic()))

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OfferServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def requests_seen(self) -> int:
        with self._lock:
            return self._count


def region_of(path: str) -> str:
    return path[len(AWS_PREFIX):].split("/")[0]


def cli(args: list[str], cache_dir: Path, **popen_kw) -> subprocess.Popen:
    """``mlflow-gpuopt <args>`` in a fresh Python process with its own cache dir."""
    env = {**os.environ, "GPUOPT_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1"}
    for var in ("GPUOPT_AWS_PRICING_URL", "GPUOPT_REFRESH_LOCK_TIMEOUT_S"):
        env.pop(var, None)
    popen_kw.setdefault("stdout", subprocess.PIPE)
    popen_kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "-c", "from mlflow_gpuopt.cli import main; main()", *args],
        env=env, **popen_kw,
    )
