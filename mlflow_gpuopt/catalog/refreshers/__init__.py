"""Refresh one provider's prices from its API into the user's cache.

Each provider module has pure ``parse_*`` functions (payload -> offers) kept apart from the
HTTP ``fetch*``. :func:`refresh` prices the offers already in the catalog (their hardware facts
come from it), validates every row with the loader's own validator, and only then replaces
``<cache>/catalog-v<N>/<provider>.csv`` atomically. On any failure it raises
:class:`RefreshError` and leaves the previous file byte-for-byte as it was.

Read, fetch, validate and replace run under an inter-process lock per provider
(``<cache>/.refresh-<provider>.lock``, beside the catalog folder so that holds only catalogs),
so two refreshes at once run one after the other instead of both pricing the same old
catalog; the wait is bounded.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from mlflow_gpuopt.atomic_write import not_regular_file, write_atomically
from mlflow_gpuopt.catalog.errors import CatalogError, LockTimeoutError, RefreshError
from mlflow_gpuopt.catalog.refreshers import aws, azure, gcp, lambda_cloud
from mlflow_gpuopt.catalog.refreshers._http import HttpClient
from mlflow_gpuopt.catalog.rows import offers_to_csv, parse_offers_csv
from mlflow_gpuopt.catalog.schema import Offer
from mlflow_gpuopt.catalog.store import (
    catalog_cache_dir,
    clear_catalog_cache,
    load_catalog,
    load_gpus,
)
from mlflow_gpuopt.file_lock import LockHeldError, exclusive_lock

logger = logging.getLogger(__name__)

#: Providers that have a refresher (Colab has no price API).
REFRESHABLE = ("aws", "gcp", "lambda", "azure")
LOCK_TIMEOUT_ENV = "GPUOPT_REFRESH_LOCK_TIMEOUT_S"
#: Default longest wait (s) for another refresh of the same provider to finish.
DEFAULT_LOCK_TIMEOUT_S = 300.0


def lock_timeout_setting(lock_timeout_s: float | None = None) -> float:
    """The lock wait in seconds: the argument, else the environment, else 300."""
    if lock_timeout_s is None:
        raw = os.environ.get(LOCK_TIMEOUT_ENV)
        if not raw:
            return DEFAULT_LOCK_TIMEOUT_S
        try:
            lock_timeout_s = float(raw)
        except ValueError:
            raise RefreshError(
                f"{LOCK_TIMEOUT_ENV} must be a number of seconds, got {raw!r}"
            ) from None
    if not lock_timeout_s >= 0:
        raise RefreshError(f"lock timeout must be >= 0 seconds, got {lock_timeout_s!r}")
    return float(lock_timeout_s)


@dataclass(frozen=True)
class RefreshResult:
    """What a refresh wrote: the file, how many offers were repriced and kept unchanged."""

    provider: str
    path: Path
    refreshed: int
    kept: int


def _templates(provider: str, cache_dir: str | os.PathLike | None) -> list[Offer]:
    try:
        cat = load_catalog(cache_dir, max_age_days=1e9, reload=True)
    except CatalogError as exc:
        logger.warning("current catalog unreadable (%s); pricing the shipped snapshot", exc)
        cat = load_catalog(cache_dir, use_user_cache=False, reload=True)
    return [o for o in cat.offers if o.provider == provider]


def refresh(
    provider: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    client: HttpClient | None = None,
    today: _dt.date | None = None,
    lock_timeout_s: float | None = None,
) -> RefreshResult:
    """Fetch, parse, validate and atomically write one provider's prices.

    Args:
        provider: ``aws``, ``gcp``, ``lambda`` or ``azure``.
        cache_dir: cache root (default ``$GPUOPT_CACHE_DIR`` or ``~/.cache/mlflow-gpuopt``).
        base_url: API base URL (default: the provider's, or its ``GPUOPT_*_URL`` variable).
        api_key: key for GCP/Lambda (default: from the environment / key file).
        client: HTTP client (timeouts, retries); a default one is made otherwise.
        today: the date recorded as ``as_of`` (default: today).
        lock_timeout_s: longest wait (s) for another refresh of this provider to finish
            (default ``$GPUOPT_REFRESH_LOCK_TIMEOUT_S`` or 300).

    Raises:
        RefreshError: nothing was written; the message is one line, keys redacted
            (:class:`~mlflow_gpuopt.catalog.errors.LockTimeoutError` if the lock wait ran out).
    """
    provider = provider.lower()
    if provider not in REFRESHABLE:
        raise RefreshError(
            f"cannot refresh {provider!r}; refreshable providers: {', '.join(REFRESHABLE)}"
        )
    wait_s = lock_timeout_setting(lock_timeout_s)
    target = catalog_cache_dir(cache_dir) / f"{provider}.csv"
    kind = not_regular_file(target)
    if kind is not None:  # checked before anything is read or fetched; again when writing
        raise RefreshError(f"cannot write the price cache: {target} is not a regular file "
                           f"({kind}); left as it is")
    lock_path = catalog_cache_dir(cache_dir).parent / f".refresh-{provider}.lock"
    try:
        with exclusive_lock(lock_path, timeout_s=wait_s, what=f"{provider} price refresh"):
            return _refresh_locked(provider, cache_dir, base_url, api_key, client, today)
    except LockHeldError as exc:
        raise LockTimeoutError(str(exc)) from None
    except OSError as exc:  # the cache folder or its lock file cannot be written
        raise RefreshError(f"cannot write the price cache: {exc}") from None


def _refresh_locked(
    provider: str,
    cache_dir: str | os.PathLike | None,
    base_url: str | None,
    api_key: str | None,
    client: HttpClient | None,
    today: _dt.date | None,
) -> RefreshResult:
    as_of = (today or _dt.date.today()).isoformat()
    templates = _templates(provider, cache_dir)
    key = api_key
    if provider == "gcp" and not key:
        key = gcp.api_key_from_env()
    elif provider == "lambda" and not key:
        key = lambda_cloud.api_key_from_env()
    client = client or HttpClient(secrets=[key] if key else [])
    if key and key not in client.secrets:
        client.secrets = (*client.secrets, key)
    try:
        if provider == "aws":
            fresh, kept = aws.fetch_and_parse(client, templates, as_of, base_url)
        elif provider == "gcp":
            fresh, kept = gcp.parse_skus(gcp.fetch_pages(client, key, base_url), templates, as_of)
        elif provider == "lambda":
            payload = lambda_cloud.fetch(client, key, base_url)
            fresh, kept = lambda_cloud.parse_instance_types(payload, templates, as_of)
        else:
            fresh, kept = azure.parse_items(azure.fetch_pages(client, templates, base_url),
                                            templates, as_of)
        order = {(t.instance_type, t.region): i for i, t in enumerate(templates)}
        offers = sorted(fresh + kept, key=lambda o: order[(o.instance_type, o.region)])
        path = catalog_cache_dir(cache_dir) / f"{provider}.csv"
        text = offers_to_csv(offers)
        parse_offers_csv(text, load_gpus(), str(path), provider)  # the loader's own checks
    except RefreshError as exc:
        raise RefreshError(client._fail(str(exc)).problem) from None
    except CatalogError as exc:
        raise RefreshError(f"refreshed {provider} prices failed validation: {exc}") from None
    write_atomically(path, text)
    clear_catalog_cache()
    for t in kept:
        logger.warning("%s %s in %s not found in the price API; kept its previous price",
                       provider, t.instance_type, t.region)
    return RefreshResult(provider, path, len(fresh), len(kept))
