"""Keep provider API keys and MLflow credentials out of everything the package writes or says.

Secrets reach this package in two ways: as environment variables (cloud provider keys such as
``LAMBDA_API_KEY``, ``GPUOPT_GCP_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ``AZURE_*``; MLflow's
``MLFLOW_TRACKING_TOKEN`` / ``MLFLOW_TRACKING_PASSWORD``) and inside a tracking URI
(``https://user:password@host``). Anything tracking turns into text that leaves the process —
params, tags, JSON artifacts, the journal, warning messages (an exception message may quote
the URI) — goes through :func:`redact` or :func:`redact_obj` first; the price refreshers mask
the keys they were given with :func:`mask_values` and show URLs through :func:`public_url`.

Pure string functions; they read ``os.environ`` only when no environment is passed.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: What replaces a secret.
MASK = "***"

#: Environment variables that are secrets whatever their name looks like.
_KNOWN_SECRET_VARS = frozenset({
    "LAMBDA_API_KEY", "GPUOPT_GCP_API_KEY", "GPUOPT_LAMBDA_API_KEY", "GPUOPT_AZURE_API_KEY",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID",
    "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "DATABRICKS_TOKEN",
    "DATABRICKS_CLIENT_SECRET", "GOOGLE_API_KEY", "HF_TOKEN", "WANDB_API_KEY",
})
#: Variable names that hold secrets by convention.
#: (a whole word of the name: ``tokens_per_sample`` is not a secret, ``hf_token`` is).
_SECRET_NAME = re.compile(
    r"(?:^|[_.\-/])(API_?KEY|APIKEY|SECRET|SECRETS|TOKEN|PASSWORD|PASSWD|PWD|CREDENTIALS?|"
    r"PRIVATE_?KEY|ACCESS_?KEY|SECRET_?KEY|AUTH|AUTHORIZATION)(?:$|[_.\-/])", re.I)
#: Names the shell sets to working directories (``PWD`` is a word of ``DB_PWD``, a password):
#: never secrets, or the working directory would be masked wherever a path shows it.
_NOT_SECRET_VARS = frozenset({"PWD", "OLDPWD"})
#: ``..._per_token`` names a count per token (``experts_per_token``), never a credential.
_PER_TOKEN = re.compile(r"(?:^|[_.\-/])PER_TOKEN$", re.I)
#: Prefixes whose every variable is treated as a secret (Azure puts keys under many names).
_SECRET_PREFIXES = ("AZURE_",)
#: Values shorter than this are not treated as secrets (masking "1" or "true" everywhere
#: would destroy unrelated text, and such values are not credentials).
_MIN_SECRET_LEN = 6

# scheme://user:password@host  -> scheme://user:***@host
_URI_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^/@\s:]*):(?P<pw>[^/@\s]+)@")
# scheme://TOKEN@host (a token as the whole user-info) -> scheme://***@host
_URI_TOKEN = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<pw>[^/@\s:*]+)@")
_QUERY_SECRET = re.compile(r"(token|key|password|secret|sig|signature|credential)", re.I)


def is_secret_name(name: str) -> bool:
    """True when a variable, param or tag name says its value is a credential."""
    upper = name.upper()
    if upper in _NOT_SECRET_VARS or _PER_TOKEN.search(name):
        return False
    return upper in _KNOWN_SECRET_VARS or bool(_SECRET_NAME.search(name))


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secret values present in ``environ`` (default ``os.environ``), longest first.

    Includes the password of any URI-valued variable (e.g. ``MLFLOW_TRACKING_URI``).
    """
    env = os.environ if environ is None else environ
    found: set[str] = set()
    for name, value in env.items():
        if not value:
            continue
        secret_var = is_secret_name(name) or name.upper().startswith(_SECRET_PREFIXES)
        if secret_var and len(value) >= _MIN_SECRET_LEN:
            found.add(value)
        for match in [*_URI_USERINFO.finditer(value), *_URI_TOKEN.finditer(value)]:
            if len(match.group("pw")) >= _MIN_SECRET_LEN:
                found.add(match.group("pw"))
    return sorted(found, key=len, reverse=True)


def _mask_userinfo(text: str) -> str:
    text = _URI_USERINFO.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{MASK}@", text)
    return _URI_TOKEN.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def redact_uri(uri: str | None) -> str | None:
    """``uri`` with the password (or token-only user-info) of its user-info and secret-looking
    query values masked."""
    if not uri:
        return uri
    text = _mask_userinfo(uri)
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.query:
        return text
    query = [(k, MASK if _QUERY_SECRET.search(k) else v) for k, v in parse_qsl(parts.query, True)]
    return urlunsplit(parts._replace(query=urlencode(query, safe="*")))


def redact(text: str, extra_secrets: tuple[str, ...] | list[str] = (),
           environ: Mapping[str, str] | None = None) -> str:
    """``text`` with URI passwords and every known secret value replaced by ``***``.

    ``extra_secrets`` adds values known to the caller (e.g. the password of the tracking URI
    the writer was given, which need not be in the environment).
    """
    if not text:
        return text
    out = _mask_userinfo(text)
    secrets = [s for s in extra_secrets if s and len(s) >= _MIN_SECRET_LEN]
    for secret in sorted(set(secrets) | set(secret_values(environ)), key=len, reverse=True):
        if secret in out:
            out = out.replace(secret, MASK)
    return out


def mask_values(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (values the caller holds, of any length) replaced by
    ``***``, longest first."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def public_url(url: str) -> str:
    """``url`` without user-info or query string (either may carry a key), for messages."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def uri_secrets(uri: str | None) -> list[str]:
    """The password or token (if any) inside ``uri``, for :func:`redact`'s ``extra_secrets``."""
    if not uri:
        return []
    return ([m.group("pw") for m in _URI_USERINFO.finditer(uri)]
            + [m.group("pw") for m in _URI_TOKEN.finditer(uri)])


def public_uri(uri: str | None) -> str | None:
    """``uri`` without its user-info (and with secret-looking query values masked): what may
    be stored, e.g. in a journal header. Credentials come back from MLflow's environment
    (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``/``_TOKEN``) when the URI is used again."""
    if not uri:
        return uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return redact_uri(uri)
    if "@" in parts.netloc:
        uri = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return redact_uri(uri)


def redact_obj(obj: Any, extra_secrets: tuple[str, ...] | list[str] = (),
               environ: Mapping[str, str] | None = None) -> Any:
    """A copy of a JSON-like object with secrets masked in every string.

    Values under secret-looking keys (``api_key``, ``password``, ...) are masked entirely.
    """
    secrets = list(extra_secrets) + secret_values(environ)
    return _redact_obj(obj, secrets)


def _redact_obj(obj: Any, secrets: list[str]) -> Any:
    if isinstance(obj, str):
        return redact(obj, secrets, environ={})
    if isinstance(obj, Mapping):
        return {k: (MASK if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v
                    else _redact_obj(v, secrets)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_redact_obj(v, secrets) for v in obj]
    return obj


def redact_mapping(values: Mapping[str, Any], extra_secrets: tuple[str, ...] | list[str] = (),
                   environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Params or tags as strings, with secrets masked (whole value for secret-named keys)."""
    secrets = list(extra_secrets) + secret_values(environ)
    out: dict[str, str] = {}
    for key, value in values.items():
        text = str(value)
        out[str(key)] = MASK if (is_secret_name(str(key)) and text) else redact(text, secrets, {})
    return out


@contextlib.contextmanager
def no_url_echo(uri: str | None) -> Iterator[None]:
    """While active, MLflow does not print run URLs if ``uri`` carries a password.

    ``mlflow.end_run()`` (and ``MlflowClient.set_terminated``) print "View run at: URL" built
    from the tracking URI, password included. ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` turns
    that off; it is set only for the duration of the block and only when there is a secret.
    """
    if not uri_secrets(uri):
        yield
        return
    name = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
    old = os.environ.get(name)
    os.environ[name] = "true"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def one_line_reason(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``exc``'s message (or its type), secrets masked, at most ``limit``
    characters: what a one-line error may quote of an exception from MLflow or the OS."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    text = redact(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."
