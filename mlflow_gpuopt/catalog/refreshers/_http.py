"""HTTP for the refreshers: timeouts, retries with backoff on 429/5xx, TLS verification on,
secrets redacted from every message, a progress bar for long downloads on a terminal."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

import click
import requests

from mlflow_gpuopt.catalog.errors import RefreshError
from mlflow_gpuopt.redact import mask_values, public_url

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Downloads larger than this (bytes) are refused: no EC2 region offer file comes close.
MAX_DOWNLOAD_BYTES = 4 * 1024**3
_PROGRESS_MIN_BYTES = 1024**2


class HttpClient:
    """GET with a timeout, bounded retries (exponential backoff, ``Retry-After`` honoured up to
    ``max_backoff_s``) on 429/5xx and connection errors, TLS verification always on.

    Args:
        timeout_s: connect and read timeout per request, seconds.
        retries: extra attempts after the first.
        backoff_s: first wait between attempts, seconds (doubles each time).
        secrets: strings (API keys) that must never appear in an error message.
        progress: show a progress bar on stderr for large downloads (default: only on a TTY).
    """

    def __init__(
        self,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        secrets: Iterable[str] = (),
        progress: bool | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.secrets = tuple(s for s in secrets if s)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.session = session or requests.Session()

    def _fail(self, message: str) -> RefreshError:
        return RefreshError(mask_values(message, self.secrets))

    def get_bytes(
        self,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        what: str = "download",
    ) -> bytes:
        """The body of a successful GET, or :class:`RefreshError` after the retries."""
        shown = public_url(url)
        last = ""
        last_retry_after: str | None = None  # the previous attempt's Retry-After header
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._wait(attempt, last_retry_after))
            last_retry_after = None
            try:
                resp = self.session.get(
                    url, params=params, headers=dict(headers or {}), timeout=self.timeout_s,
                    stream=True, verify=True,
                )
            except requests.Timeout:
                last = f"{what}: timed out after {self.timeout_s:g} s ({shown})"
                continue
            except requests.RequestException as exc:
                last = f"{what}: cannot reach {shown} ({type(exc).__name__})"
                continue
            with resp:
                if resp.status_code in RETRY_STATUSES:
                    last = f"{what}: HTTP {resp.status_code} from {shown}"
                    last_retry_after = resp.headers.get("Retry-After")
                    logger.info("%s; retrying (%d/%d)", last, attempt + 1, self.retries)
                    continue
                if resp.status_code >= 400:
                    hint = " (check the API key)" if resp.status_code in (401, 403) else ""
                    raise self._fail(f"{what}: HTTP {resp.status_code} from {shown}{hint}")
                try:
                    return self._read(resp, what, shown)
                except requests.Timeout:
                    last = f"{what}: timed out reading {shown}"
                    continue
                except requests.RequestException as exc:
                    last = f"{what}: download from {shown} broke off ({type(exc).__name__})"
                    continue
        raise self._fail(f"{last} after {self.retries + 1} attempts")

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        wait = self.backoff_s * 2 ** (attempt - 1)
        if retry_after:
            with contextlib.suppress(ValueError):
                wait = max(wait, float(retry_after))
        return min(wait, self.max_backoff_s)

    def _read(self, resp: requests.Response, what: str, shown: str) -> bytes:
        length_header = resp.headers.get("Content-Length")
        expected = int(length_header) if length_header and length_header.isdigit() else None
        if expected is not None and expected > MAX_DOWNLOAD_BYTES:
            raise self._fail(f"{what}: {shown} is {expected} bytes, over the download limit")
        chunks: list[bytes] = []
        received = 0
        show = self.progress and expected is not None and expected >= _PROGRESS_MIN_BYTES
        # The label is the caller's short description, never the URL (whose query string may
        # carry a key); redacted all the same in case a caller put a secret into it.
        label = mask_values(what, self.secrets)
        bar = click.progressbar(length=expected, label=label, file=sys.stderr) if show else None
        try:
            for chunk in resp.iter_content(chunk_size=1 << 16):
                chunks.append(chunk)
                received += len(chunk)
                if received > MAX_DOWNLOAD_BYTES:
                    raise self._fail(f"{what}: {shown} exceeds the download limit")
                if bar is not None:
                    bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.render_finish()
        if expected is not None and received != expected:
            raise self._fail(
                f"{what}: truncated payload from {shown} ({received} of {expected} bytes)"
            )
        return b"".join(chunks)

    def get_json(self, url: str, **kwargs: Any) -> Any:
        """GET and decode JSON; malformed or truncated JSON is a :class:`RefreshError`."""
        what = kwargs.get("what", "download")
        body = self.get_bytes(url, **kwargs)
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._fail(
                f"{what}: malformed JSON from {public_url(url)} ({type(exc).__name__} at "
                f"{getattr(exc, 'pos', '?')} of {len(body)} bytes)"
            ) from None
