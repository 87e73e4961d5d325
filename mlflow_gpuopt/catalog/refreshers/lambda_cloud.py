"""Lambda Cloud: ``GET {base}/api/v1/instance-types`` with a bearer key.

The key comes from ``$LAMBDA_API_KEY``, else a key file (``$GPUOPT_LAMBDA_API_KEY_FILE`` or
``~/.lambda_cloud/lambda_keys``; either the bare key or an ``api_key = ...`` line). Prices are
``price_cents_per_hour / 100`` and the same in every region; the regions that had capacity at
fetch time are recorded in ``regions_with_capacity``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlflow_gpuopt.catalog.errors import RefreshError
from mlflow_gpuopt.catalog.refreshers._common import get, guard_parse, number, repriced
from mlflow_gpuopt.catalog.refreshers._http import HttpClient
from mlflow_gpuopt.catalog.schema import Offer

PROVIDER = "lambda"
API_KEY_ENV = "LAMBDA_API_KEY"
KEY_FILE_ENV = "GPUOPT_LAMBDA_API_KEY_FILE"
DEFAULT_KEY_FILE = Path("~/.lambda_cloud/lambda_keys")
BASE_URL_ENV = "GPUOPT_LAMBDA_API_URL"
DEFAULT_BASE_URL = "https://cloud.lambda.ai"


def instance_types_url(base_url: str) -> str:
    """URL of the instance-type list."""
    return f"{base_url.rstrip('/')}/api/v1/instance-types"


@guard_parse(PROVIDER)
def parse_instance_types(
    payload: Any, templates: Sequence[Offer], as_of: str
) -> tuple[list[Offer], list[Offer]]:
    """Price the catalog's Lambda instance types; returns (repriced, kept unchanged)."""
    data = get(payload, "data", dict, "Lambda instance-types")
    wanted = {t.instance_type: t for t in templates}
    fresh = []
    source = f"Lambda Cloud API GET /api/v1/instance-types, read {as_of}"
    for name, entry in data.items():
        if name not in wanted:
            continue
        where = f"Lambda {name}"
        it = get(entry, "instance_type", dict, where)
        cents = number(get(it, "price_cents_per_hour", (int, float), where), where + " price")
        specs = get(it, "specs", dict, where)
        gpus = int(number(get(specs, "gpus", (int, float), where), where + " gpus"))
        template = wanted[name]
        if gpus != template.gpu_count:
            raise RefreshError(f"{where}: {gpus} GPUs, the catalog says {template.gpu_count}")
        vcpus = int(number(get(specs, "vcpus", (int, float), where), where + " vcpus"))
        mem = number(get(specs, "memory_gib", (int, float), where), where + " memory_gib")
        if vcpus < 1 or mem <= 0:
            raise RefreshError(f"{where}: implausible specs ({vcpus} vCPUs, {mem:g} GiB)")
        regions = tuple(
            get(r, "name", str, where + " region")
            for r in get(entry, "regions_with_capacity_available", list, where)
        )
        fresh.append(repriced(template, price=cents / 100.0, as_of=as_of, source=source,
                              vcpus=vcpus, memory_gb=mem, regions_with_capacity=regions))
    if templates and not fresh:
        raise RefreshError("Lambda instance-types: none of our instance types is listed")
    found = {o.instance_type for o in fresh}
    return fresh, [t for t in templates if t.instance_type not in found]


def api_key_from_env(key_file: str | os.PathLike | None = None) -> str:
    """The API key from the environment or the key file; a RefreshError if neither has one."""
    key = os.environ.get(API_KEY_ENV, "").strip()
    if key:
        return key
    path = Path(key_file or os.environ.get(KEY_FILE_ENV) or DEFAULT_KEY_FILE).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        text = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("api_key"):
            _, _, line = line.partition("=")
            line = line.strip()
        if line and not line.startswith("#"):
            return line
    raise RefreshError(f"set {API_KEY_ENV} or put the key in {path} to refresh Lambda prices")


def fetch(client: HttpClient, api_key: str, base_url: str | None = None) -> Any:
    """The decoded instance-type list."""
    url = instance_types_url(base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL)
    return client.get_json(url, headers={"Authorization": f"Bearer {api_key}"},
                           what="Lambda instance-types")
