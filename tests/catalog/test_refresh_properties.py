"""Property tests: random payloads thrown at the pure parsers end in valid offers or a clear
CatalogError/RefreshError, never another exception."""

from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.pricing import FIXTURES

from mlflow_gpuopt.catalog import CatalogError, load_catalog
from mlflow_gpuopt.catalog.refreshers import aws, azure, gcp, lambda_cloud
from mlflow_gpuopt.catalog.rows import offers_to_csv, parse_offers_csv
from mlflow_gpuopt.catalog.store import load_gpus

CAT = load_catalog(use_user_cache=False, reload=True)
GPUS = load_gpus()
TEMPLATES = {p: [o for o in CAT.offers if o.provider == p]
             for p in ("aws", "gcp", "lambda", "azure")}

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["1.5", "-3", "Hrs", "Linux", "Shared", "NA", "1 Hour", "USD", "gpu_1x_a10",
                     "p4d.24xlarge", "us-east-1", "eastus", "1e308", "nan"]),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20,
)


def _fixture(name):
    return json.loads((FIXTURES / name).read_text())


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _mutate(base, data):
    """Replace one random node of a real-shaped payload with a random JSON value."""
    payload = copy.deepcopy(base)
    paths = [p for p in _paths(payload) if p]
    path = data.draw(st.sampled_from(paths))
    node = payload
    for key in path[:-1]:
        node = node[key]
    if data.draw(st.booleans()) and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = data.draw(json_value)
    return payload


def _outcome(parse, provider):
    try:
        fresh, kept = parse()
    except CatalogError as exc:  # RefreshError is a CatalogError
        assert str(exc)
        return
    parse_offers_csv(offers_to_csv(fresh + kept), GPUS, "x.csv", provider)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(payload=json_value)
def test_random_payloads(payload):
    _outcome(lambda: aws.parse_offer_file(payload, "us-east-1", TEMPLATES["aws"], "2026-01-01"),
             "aws")
    _outcome(lambda: gcp.parse_skus([payload], TEMPLATES["gcp"], "2026-01-01"), "gcp")
    _outcome(lambda: lambda_cloud.parse_instance_types(payload, TEMPLATES["lambda"], "2026-01-01"),
             "lambda")
    _outcome(lambda: azure.parse_items([payload], TEMPLATES["azure"], "2026-01-01"), "azure")


@SETTINGS
@given(data=st.data())
def test_mutated_aws(data):
    base = _fixture("aws_ec2_us-east-1.json")
    payload = _mutate(base, data)
    _outcome(lambda: aws.parse_offer_file(payload, "us-east-1", TEMPLATES["aws"], "2026-01-01"),
             "aws")


@SETTINGS
@given(data=st.data())
def test_mutated_gcp(data):
    pages = [_fixture("gcp_skus_page1.json"), _fixture("gcp_skus_page2.json")]
    payload = _mutate(pages, data)
    _outcome(lambda: gcp.parse_skus(payload, TEMPLATES["gcp"], "2026-01-01"), "gcp")


@SETTINGS
@given(data=st.data())
def test_mutated_lambda(data):
    payload = _mutate(_fixture("lambda_instance_types.json"), data)
    _outcome(lambda: lambda_cloud.parse_instance_types(payload, TEMPLATES["lambda"], "2026-01-01"),
             "lambda")


@SETTINGS
@given(data=st.data())
def test_mutated_azure(data):
    pages = [_fixture("azure_prices_page1.json"), _fixture("azure_prices_page2.json")]
    payload = _mutate(pages, data)
    _outcome(lambda: azure.parse_items(payload, TEMPLATES["azure"], "2026-01-01"), "azure")


def test_unmutated_fixtures_parse():
    fresh, _ = lambda_cloud.parse_instance_types(_fixture("lambda_instance_types.json"),
                                                 TEMPLATES["lambda"], "2026-01-01")
    assert len(fresh) == 3
