"""HTTP for the refreshers: timeouts, retries with backoff on 429/5xx, TLS verification on,
secrets redacted from every message, a progress bar for long downloads on a terminal.

Redirects are followed here, not by ``requests``: a request that carries an API key (any
header, or a secret in its URL) never follows one, since ``requests`` would resend a custom
header such as ``X-Goog-Api-Key`` to whatever host the redirect names; an unkeyed download
follows at most :data:`MAX_REDIRECTS`, each keeping the scheme (never https -> http).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import click
import requests
import urllib3

from mlflow_gpuopt.catalog.errors import RefreshError
from mlflow_gpuopt.redact import mask_values, public_url

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Downloads larger than this (bytes) are refused: no EC2 region offer file comes close.
MAX_DOWNLOAD_BYTES = 4 * 1024**3
_PROGRESS_MIN_BYTES = 1024**2
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: Most redirects an unkeyed download follows.
MAX_REDIRECTS = 5
#: Longest per-request deadline accepted (s): a day; sockets cannot wait for ever.
MAX_TIMEOUT_S = 86400.0
#: The encodings :class:`_Inflater` decodes; asked for explicitly so none other arrives.
_ENCODINGS = {"Accept-Encoding": "gzip, deflate"}


def host_of(url: str) -> str:
    """``host[:port]`` of ``url``, without any userinfo, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    return f"{host}:{parts.port}" if parts.port else host


def _sendable(value: str) -> bool:
    """Whether ``value`` can be an HTTP header value: Latin-1, no line break or NUL, no
    leading whitespace (what ``http.client`` and ``requests`` accept)."""
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return not any(c in value for c in "\r\n\0") and value[:1] not in (" ", "\t")


def redirect_allowed(origin: str, target: str) -> bool:
    """Whether an unkeyed download from ``origin`` may follow a redirect to ``target``: only
    to the same scheme (http or https), so a redirect never drops TLS."""
    scheme = urlsplit(origin).scheme.lower()
    return scheme in ("http", "https") and urlsplit(target).scheme.lower() == scheme


def _left(deadline: float) -> float:
    """Seconds left until ``deadline`` (monotonic); ``requests.Timeout`` once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise requests.Timeout()
    return left


def _bound_next_read(resp: requests.Response, left_s: float) -> None:
    """Make the next socket read of ``resp`` wait at most ``left_s``: the per-read timeout
    ``requests`` set would otherwise let each dripped byte restart the clock."""
    sock = getattr(getattr(resp.raw, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(left_s)


class _TooLargeError(Exception):
    """The decompressed body passed the download limit."""


class _Inflater:
    """Decompresses a ``Content-Encoding`` of gzip or deflate (or passes identity through),
    never producing more than ``cap`` bytes in all: each step inflates at most what is left
    under the cap, so a bomb costs at most ``cap`` bytes of memory before it is refused."""

    def __init__(self, encoding: str, cap: int) -> None:
        self.encoding = encoding.strip().lower()
        self.cap = cap
        self.produced = 0
        self.unsupported = ""
        self._zlib = None
        if self.encoding in ("gzip", "x-gzip", "deflate"):
            self._zlib = zlib.decompressobj(32 + zlib.MAX_WBITS)  # gzip or zlib header
        elif self.encoding not in ("", "identity"):
            self.unsupported = self.encoding

    @property
    def complete(self) -> bool:
        """Whether the compressed stream reached its end (always true for identity)."""
        return self._zlib is None or self._zlib.eof

    def feed(self, data: bytes) -> list[bytes]:
        """The decompressed bytes of ``data`` (raises :class:`_TooLargeError`, ``zlib.error``)."""
        if self._zlib is None:
            return [data]
        out: list[bytes] = []
        while data:
            piece = self._zlib.decompress(data, self.cap - self.produced + 1)
            self.produced += len(piece)
            if self.produced > self.cap:
                raise _TooLargeError
            out.append(piece)
            if self._zlib.eof:  # a second gzip member may follow
                data = self._zlib.unused_data
                if data:
                    self._zlib = zlib.decompressobj(32 + zlib.MAX_WBITS)
            else:
                data = self._zlib.unconsumed_tail
        return out


class HttpClient:
    """GET with a timeout, bounded retries (exponential backoff, ``Retry-After`` honoured up to
    ``max_backoff_s``) on 429/5xx and connection errors, TLS verification always on.

    Args:
        timeout_s: deadline for each request as a whole, seconds: connecting, the headers and
            the whole body (each redirect followed and each retry gets a new one), so a server
            that drips its body cannot hold a refresh for longer. Finite and positive.
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
        if not (isinstance(timeout_s, int | float) and 0 < timeout_s < MAX_TIMEOUT_S):
            raise ValueError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}) seconds, "
                             f"got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
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
        if not all(_sendable(value) for value in (headers or {}).values()):
            raise self._fail(
                f"{what}: the API key contains characters that cannot be sent in an HTTP header"
            )
        keyed = bool(headers) or any(
            secret in f"{url} {params or ''}" for secret in self.secrets
        )
        last = ""
        last_retry_after: str | None = None  # the previous attempt's Retry-After header
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._wait(attempt, last_retry_after))
            last_retry_after = None
            deadline = time.monotonic() + self.timeout_s
            try:
                resp = self._get_following(url, params, headers, keyed, what, deadline)
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
                    return self._read(resp, what, shown, deadline)
                except requests.Timeout:
                    last = f"{what}: timed out after {self.timeout_s:g} s reading {shown}"
                    continue
                except requests.RequestException as exc:
                    last = f"{what}: download from {shown} broke off ({type(exc).__name__})"
                    continue
        raise self._fail(f"{last} after {self.retries + 1} attempts")

    def _get_following(
        self,
        url: str,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        keyed: bool,
        what: str,
        deadline: float,
    ) -> requests.Response:
        """GET ``url``, following redirects only as the module docstring says."""
        for _ in range(MAX_REDIRECTS + 1):
            resp = self.session.get(
                url, params=params, headers={**_ENCODINGS, **(headers or {})},
                timeout=_left(deadline),
                stream=True, verify=True, allow_redirects=False,
            )
            if resp.status_code not in REDIRECT_STATUSES:
                return resp
            with resp:
                target = urljoin(resp.url, resp.headers.get("Location", ""))
            if keyed:
                raise self._fail(
                    f"{what}: HTTP {resp.status_code} redirect from {host_of(resp.url)} to "
                    f"{host_of(target)} refused (a request carrying an API key never follows "
                    "a redirect)"
                )
            if not redirect_allowed(resp.url, target):
                raise self._fail(
                    f"{what}: HTTP {resp.status_code} redirect from {public_url(resp.url)} to "
                    f"{public_url(target)} refused (a redirect must keep the scheme)"
                )
            url, params = target, None
        raise self._fail(f"{what}: more than {MAX_REDIRECTS} redirects from {public_url(url)}")

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        wait = self.backoff_s * 2 ** (attempt - 1)
        if retry_after:
            with contextlib.suppress(ValueError):
                wait = max(wait, float(retry_after))
        return min(wait, self.max_backoff_s)

    def _read(self, resp: requests.Response, what: str, shown: str, deadline: float) -> bytes:
        """The body, decompressed here (gzip/deflate) so that both limits hold: the wire bytes
        are what ``Content-Length`` and :data:`MAX_DOWNLOAD_BYTES` count, and inflating stops
        as soon as the decompressed body passes the same cap (a gzip bomb is never inflated
        whole)."""
        cap = MAX_DOWNLOAD_BYTES
        length_header = resp.headers.get("Content-Length")
        expected = int(length_header) if length_header and length_header.isdigit() else None
        if expected is not None and expected > cap:
            raise self._fail(f"{what}: {shown} is {expected} bytes, over the download limit")
        inflater = _Inflater(resp.headers.get("Content-Encoding", ""), cap)
        if inflater.unsupported:
            raise self._fail(
                f"{what}: {shown} sent an unsupported Content-Encoding "
                f"{inflater.unsupported[:40]!r}"
            )
        chunks: list[bytes] = []
        wire = 0
        show = self.progress and expected is not None and expected >= _PROGRESS_MIN_BYTES
        # The label is the caller's short description, never the URL (whose query string may
        # carry a key); redacted all the same in case a caller put a secret into it.
        label = mask_values(what, self.secrets)
        bar = click.progressbar(length=expected, label=label, file=sys.stderr) if show else None
        # read1 (urllib3 >= 2) returns what has arrived instead of waiting for a full chunk.
        read = getattr(resp.raw, "read1", None) or resp.raw.read
        try:
            while True:
                _bound_next_read(resp, _left(deadline))
                chunk = read(1 << 16, decode_content=False)
                if not chunk:
                    break
                wire += len(chunk)
                if wire > cap:
                    raise self._fail(f"{what}: {shown} exceeds the download limit")
                try:
                    chunks += inflater.feed(chunk)
                except _TooLargeError:
                    raise self._fail(
                        f"{what}: {shown} decompresses to more than the download limit"
                    ) from None
                except zlib.error:
                    raise self._fail(f"{what}: malformed compressed body from {shown}") from None
                if bar is not None:
                    bar.update(len(chunk))
        except urllib3.exceptions.ReadTimeoutError:
            raise requests.Timeout() from None
        except urllib3.exceptions.HTTPError as exc:
            raise requests.ConnectionError(type(exc).__name__) from None
        finally:
            if bar is not None:
                bar.render_finish()
        if expected is not None and wire != expected:
            raise self._fail(
                f"{what}: truncated payload from {shown} ({wire} of {expected} bytes)"
            )
        if not inflater.complete:
            raise self._fail(f"{what}: truncated compressed payload from {shown}")
        return b"".join(chunks)

    def get_json(self, url: str, **kwargs: Any) -> Any:
        """GET and decode JSON; malformed or truncated JSON is a :class:`RefreshError`."""
        what = kwargs.get("what", "download")
        body = self.get_bytes(url, **kwargs)
        try:
            return json.loads(body)
        except RecursionError:
            raise self._fail(
                f"{what}: malformed JSON from {public_url(url)} (nested too deeply)"
            ) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._fail(
                f"{what}: malformed JSON from {public_url(url)} ({type(exc).__name__} at "
                f"{getattr(exc, 'pos', '?')} of {len(body)} bytes)"
            ) from None
