"""Where the catalog lives: the shipped snapshot (the repository's ``pricing/`` folder,
installed as ``mlflow_gpuopt/pricing_data/``) and the user's cache of refreshed prices,
which takes precedence provider by provider.

The cache directory is ``$GPUOPT_CACHE_DIR`` or ``~/.cache/mlflow-gpuopt``; refreshed files go
to ``<cache>/catalog-v<CATALOG_SCHEMA_VERSION>/<provider>.csv`` so a schema change never reads
an old file. A cached file older than ``max_age_days`` (argument, else
``$GPUOPT_PRICING_MAX_AGE_DAYS``, else 30) is still used, with a warning naming its date; a
cache path that is not a regular file (a directory, a FIFO, a symlink loop) is skipped with a
warning naming it. Each warning is logged once per process, however often the catalog loads.
"""

from __future__ import annotations

import datetime as _dt
import functools
import logging
import os
import threading
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from mlflow_gpuopt.atomic_write import not_regular_file
from mlflow_gpuopt.bounded_read import read_capped
from mlflow_gpuopt.catalog.catalog import Catalog
from mlflow_gpuopt.catalog.errors import CatalogError
from mlflow_gpuopt.catalog.rows import parse_gpus_csv, parse_offers_csv
from mlflow_gpuopt.catalog.schema import CATALOG_SCHEMA_VERSION, PROVIDERS, GpuSpec

if TYPE_CHECKING:  # importlib.resources.abc is Python 3.11+
    from importlib.resources.abc import Traversable

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "GPUOPT_CACHE_DIR"
MAX_AGE_ENV = "GPUOPT_PRICING_MAX_AGE_DAYS"
DEFAULT_MAX_AGE_DAYS = 30.0
SHIPPED = "shipped snapshot"
#: Where a wheel holds the snapshot, inside the package (pyproject.toml maps it to pricing/).
PACKAGED_SNAPSHOT = "pricing_data"

_lock = threading.Lock()
_loaded: dict[tuple, Catalog] = {}
_warned: set[str] = set()
_warned_lock = threading.Lock()  # apart from _lock, which load_catalog holds while warning


def _warn_once(message: str) -> None:
    """Log ``message`` as a warning unless this process has already logged it."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    logger.warning("%s", message)


def cache_root() -> Path:
    """The user's cache directory (not created here)."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mlflow-gpuopt"


def catalog_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The schema-versioned folder that holds refreshed ``<provider>.csv`` files."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    return root / f"catalog-v{CATALOG_SCHEMA_VERSION}"


def max_age_days_setting(max_age_days: float | None = None) -> float:
    """The staleness limit in days: the argument, else the environment, else 30."""
    if max_age_days is not None:
        value, where = max_age_days, "max_age_days"
    elif os.environ.get(MAX_AGE_ENV):
        value, where = os.environ[MAX_AGE_ENV], MAX_AGE_ENV
    else:
        return DEFAULT_MAX_AGE_DAYS
    try:
        out = float(value)
    except ValueError:
        out = float("nan")
    if not out > 0:
        raise CatalogError(f"{where} must be a positive number of days, got {value!r}")
    return out


def snapshot_dir() -> Traversable:
    """The folder of the shipped snapshot that belongs to this copy of the package.

    An installed wheel holds it as package data (``mlflow_gpuopt/pricing_data/``); a source
    checkout (``PYTHONPATH``, an editable install) reads the repository's ``pricing/`` folder
    next to the package, so each checkout reads its own data.
    """
    packaged = resources.files("mlflow_gpuopt").joinpath(PACKAGED_SNAPSHOT)
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "pricing"


def shipped_text(name: str) -> str:
    """Text of one file of the shipped snapshot (``pricing/<name>`` in the repository)."""
    return snapshot_dir().joinpath(name).read_text(encoding="utf-8")


def load_gpus() -> dict[str, GpuSpec]:
    """The shipped GPU specs (canonical name -> spec); parsed once per process, a fresh dict
    each call."""
    return dict(_shipped_gpus())


@functools.lru_cache(maxsize=1)
def _shipped_gpus() -> dict[str, GpuSpec]:
    return parse_gpus_csv(shipped_text("gpus.csv"), "pricing/gpus.csv")


#: Largest cached price file read (bytes). A provider's refreshed offers are a few thousand
#: rows (about 120 bytes each); a file far larger is not a price list this package wrote, and
#: parsing a million rows would take over a minute and gigabytes.
MAX_CACHE_FILE_BYTES = 16 * 1024**2


def _user_files(cache_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """The cached ``<provider>.csv`` files, and one warning per cache path that is skipped
    because it is not a regular file or is over :data:`MAX_CACHE_FILE_BYTES`."""
    files, skipped = {}, []
    for provider in PROVIDERS:
        path = cache_dir / f"{provider}.csv"
        kind = not_regular_file(path)
        if kind is not None:
            skipped.append(f"ignoring {path}: not a regular file ({kind}); using the shipped "
                           f"{provider} prices")
        elif path.is_file():
            size = path.stat().st_size
            if size > MAX_CACHE_FILE_BYTES:
                skipped.append(f"ignoring {path}: {size / 1024**2:.0f} MiB, over the "
                               f"{MAX_CACHE_FILE_BYTES // 1024**2} MiB a price cache may be; "
                               f"using the shipped {provider} prices")
                continue
            files[provider] = path
    return files, skipped


def load_catalog(
    cache_dir: str | os.PathLike | None = None,
    max_age_days: float | None = None,
    *,
    use_user_cache: bool = True,
    reload: bool = False,
    today: _dt.date | None = None,
) -> Catalog:
    """Load and validate the catalog: user cache (per provider) over the shipped snapshot.

    The result is kept per process (keyed by the cache folder and the cached files' mtimes, so
    a refresh is picked up); ``reload=True`` reads everything again.

    Raises:
        CatalogError: a file is malformed; the message names file, row and column.
    """
    folder = catalog_cache_dir(cache_dir)
    limit = max_age_days_setting(max_age_days)
    files, skipped = _user_files(folder) if use_user_cache else ({}, [])
    stamp = tuple(sorted((p, f.stat().st_mtime_ns, f.stat().st_size) for p, f in files.items()))
    key = (str(folder), limit, use_user_cache, stamp, today)
    with _lock:
        if not reload and key in _loaded:
            return _loaded[key]
        catalog = _read(folder, files, limit, today or _dt.date.today(), skipped)
        _loaded.clear()
        _loaded[key] = catalog
        return catalog


def _read(
    folder: Path, files: dict[str, Path], limit: float, today: _dt.date, skipped: list[str]
) -> Catalog:
    gpus = load_gpus()
    offers = []
    sources = {}
    warnings = list(skipped)
    for provider in PROVIDERS:
        path = files.get(provider)
        if path is None:
            offers += parse_offers_csv(
                shipped_text(f"{provider}.csv"), gpus, f"pricing/{provider}.csv", provider
            )
            sources[provider] = SHIPPED
            continue
        try:
            data = read_capped(path, MAX_CACHE_FILE_BYTES)  # it may have grown meanwhile
            if len(data) > MAX_CACHE_FILE_BYTES:
                raise CatalogError(f"over the {MAX_CACHE_FILE_BYTES // 1024**2} MiB a price "
                                   "cache may be", file=str(path))
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogError(f"cannot read: {exc}", file=str(path)) from None
        rows = parse_offers_csv(text, gpus, str(path), provider)
        if not rows:
            raise CatalogError("holds no offers", file=str(path))
        offers += rows
        sources[provider] = str(path)
        newest = max(_dt.date.fromisoformat(o.as_of) for o in rows)
        age = (today - newest).days
        if age > limit:
            msg = (
                f"refreshed {provider} prices in {path} are from {newest.isoformat()}, "
                f"{age} days old (limit {limit:g}); run `mlflow gpuopt pricing refresh "
                f"--provider {provider}`"
            )
            warnings.append(msg)
    for msg in warnings:
        _warn_once(msg)
    return Catalog(tuple(offers), gpus, sources, tuple(warnings))


def clear_catalog_cache() -> None:
    """Forget the catalog kept for this process (the next load reads the files again)."""
    with _lock:
        _loaded.clear()
