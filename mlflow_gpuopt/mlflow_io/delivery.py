"""Sending tracking records to MLflow: batching, one short request at a time, exactly once.

Shared by :class:`~mlflow_gpuopt.mlflow_io.writer.RunWriter` (its sender thread) and
``mlflow gpuopt replay``. Records are :class:`~.records.JournalRecord` values.

For ``http(s)://`` servers :class:`RestTransport` calls ``mlflow.utils.rest_utils.http_request``
with ``max_retries=0`` and one deadline per request as a whole (:func:`_within`), because
MLflow's own retries are process-wide settings that would hold a send for minutes; other URIs
go through ``MlflowClient`` (:class:`ClientTransport`). Only a 2xx JSON object is an answer:
no redirects, an HTML page is a failed, *uncertain* send. An uncertain batch is checked
against the run's metric history before it goes again (:func:`send` with ``verify``), so
each value lands once even in stores that keep duplicates. Why each of these:
docs/reliability.md#the-writer.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Protocol

from mlflow_gpuopt.mlflow_io.records import JournalRecord
from mlflow_gpuopt.redact import redact

logger = logging.getLogger(__name__)

MAX_BATCH_METRICS = 1000  # MLflow's log_batch limits
MAX_BATCH_PARAMS = 100
MAX_BATCH_TAGS = 100

_RETRYABLE_STATUS = {401, 403, 408, 409, 425, 429}
#: Request threads still hanging past their deadline (a dripping server) before new
#: requests are refused without being sent, so a drip cannot pile up threads.
MAX_HANGING_REQUESTS = 4
_hanging: list[threading.Thread] = []
_hanging_lock = threading.Lock()


class DeliveryError(Exception):
    """A send that did not go through.

    ``permanent``: the server refused the content (bad request); sending it again won't help.
    ``ambiguous``: the request may have reached the server and been applied.
    """

    def __init__(self, message: str, *, permanent: bool = False, ambiguous: bool = False,
                 not_found: bool = False, status: int | None = None,
                 cause: str | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status when the server answered
        #: what answered that is not MLflow ("html", "redirect", "not-json") or "deadline"
        self.cause = cause
        self.permanent = permanent
        self.ambiguous = ambiguous
        self.not_found = not_found  # the run (or experiment) does not exist in this store


MetricTuple = tuple[str, float, int, int]  # key, value, timestamp_ms, step


class Transport(Protocol):
    """The three calls delivery needs; each raises :class:`DeliveryError` on failure."""

    def log_batch(self, run_id: str, metrics: list[MetricTuple], params: dict[str, str],
                  tags: dict[str, str]) -> None: ...

    def metric_history(self, run_id: str, key: str) -> set[tuple[int, int, float]]: ...

    def log_json_artifact(self, run_id: str, obj: Any, artifact_file: str) -> None: ...

    def create_run(self, experiment_id: str, run_name: str | None, start_time_ms: int,
                   tags: dict[str, str]) -> str: ...

    def experiment_id(self, name: str) -> str: ...

    def find_run(self, experiment_id: str, tag_key: str, tag_value: str) -> str | None: ...

    def update_run(self, run_id: str, status: str, end_time_ms: int) -> None: ...

    def run_exists(self, run_id: str) -> bool: ...


def _json_value(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _classify_exception(exc: BaseException, what: str) -> DeliveryError:
    """Turn a failed request into a DeliveryError: was it possibly applied?"""
    chain, cur = [], exc
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    names = " ".join(type(e).__name__ for e in chain) + " " + " ".join(str(e) for e in chain)
    not_sent = any(s in names for s in ("NewConnectionError", "ConnectTimeout",
                                        "Connection refused", "Failed to establish",
                                        "NameResolutionError"))
    return DeliveryError(f"{what} failed: {exc}", ambiguous=not not_sent)


class RestTransport:
    """Direct REST calls to an MLflow tracking server: no retries, no redirects, one deadline
    per request (``timeout_s``, the whole request), and when ``deadline_s`` is given, one for
    every request this transport makes in all (counted from its creation)."""

    def __init__(self, tracking_uri: str, timeout_s: float = 5.0,
                 deadline_s: float | None = None) -> None:
        from mlflow.utils import rest_utils  # noqa: F401 - imported here, not on the first send
        from mlflow.utils.credentials import get_default_host_creds

        self._uri = tracking_uri
        self._creds = get_default_host_creds(tracking_uri)
        self._timeout_s = timeout_s
        self._deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self._artifact_uri: dict[str, str] = {}

    def _budget(self, what: str) -> float:
        if self._deadline is None:
            return self._timeout_s
        left = self._deadline - time.monotonic()
        if left <= 0.01:
            raise DeliveryError(f"{what} not sent: the time for tracking requests ran out",
                                cause="deadline")
        return min(self._timeout_s, left)

    def _call(self, endpoint: str, method: str, what: str, creds: Any = None,
              empty_ok: bool = False, **kwargs: Any) -> dict[str, Any]:
        """One request; its answer's JSON object, or :class:`DeliveryError`. ``empty_ok``: an
        empty body is an answer too (the artifact upload's)."""
        from mlflow.utils.rest_utils import http_request

        budget = self._budget(what)
        try:
            resp = _within(budget, what, lambda: http_request(
                creds or self._creds, endpoint, method, max_retries=0, backoff_factor=0,
                backoff_jitter=0, timeout=budget, raise_on_status=False, allow_redirects=False,
                **kwargs))
        except DeliveryError:
            raise
        except Exception as exc:  # connection errors, timeouts: decide if it may have landed
            raise _classify_exception(exc, what) from exc
        status = resp.status_code
        if 200 <= status < 300:
            if empty_ok and not (resp.content or b"").strip():
                return {}
            return _json_object(resp, what)
        if 300 <= status < 400:
            from urllib.parse import urlsplit

            where = urlsplit(resp.headers.get("Location", "")).path[:80] or "?"
            raise DeliveryError(f"{what} failed: the tracking server answered with a redirect "
                                f"(HTTP {status} to {where}): a login proxy?", status=status,
                                cause="redirect")
        body = resp.text[:300] if resp.text else ""
        if _looks_html(resp):
            body = "(an HTML page)"
        message = f"{what} failed: HTTP {status} {body}".strip()
        if status >= 500:
            raise DeliveryError(message, ambiguous=True, status=status)
        if status == 404 or "RESOURCE_DOES_NOT_EXIST" in body:
            raise DeliveryError(message, permanent=True, not_found=True, status=status)
        if status in _RETRYABLE_STATUS:
            raise DeliveryError(message, status=status)
        raise DeliveryError(message, permanent=True, status=status)

    def log_batch(self, run_id, metrics, params, tags) -> None:
        body = {
            "run_id": run_id,
            "metrics": [{"key": k, "value": _json_value(v), "timestamp": ts, "step": s}
                        for k, v, ts, s in metrics],
            "params": [{"key": k, "value": v} for k, v in params.items()],
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        }
        self._call("/api/2.0/mlflow/runs/log-batch", "POST", "log-batch", json=body)

    def metric_history(self, run_id, key) -> set[tuple[int, int, float]]:
        seen: set[tuple[int, int, float]] = set()
        token = None
        while True:
            params = {"run_id": run_id, "metric_key": key, "max_results": 25000}
            if token:
                params["page_token"] = token
            data = self._call("/api/2.0/mlflow/metrics/get-history", "GET", "get-history",
                              params=params)
            try:
                for m in data.get("metrics", []):
                    seen.add((int(m.get("step", 0)), int(m.get("timestamp", 0)),
                              _float(m.get("value", 0.0))))
            except (AttributeError, TypeError, ValueError) as exc:
                raise _not_mlflow("get-history", exc) from exc
            token = data.get("next_page_token")
            if not token:
                return seen

    def log_json_artifact(self, run_id, obj, artifact_file) -> None:
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
        from mlflow.store.artifact.http_artifact_repo import HttpArtifactRepository

        payload = json.dumps(obj, indent=2).encode()
        if run_id not in self._artifact_uri:
            run = self._call("/api/2.0/mlflow/runs/get", "GET", "get-run",
                             params={"run_id": run_id})
            self._artifact_uri[run_id] = str(_field(run, "get-run", "run", "info",
                                                    "artifact_uri"))
        try:
            repo = get_artifact_repository(self._artifact_uri[run_id], tracking_uri=self._uri)
        except Exception as exc:
            raise DeliveryError(f"artifact store for {artifact_file}: {exc}") from exc
        if isinstance(repo, HttpArtifactRepository):  # served by the tracking server: PUT
            self._call(posixpath.join("/", artifact_file), "PUT", f"upload {artifact_file}",
                       creds=repo._host_creds, empty_ok=True, data=payload,
                       extra_headers={"Content-Type": "application/json"})
            return
        _log_with_repo(repo, payload, artifact_file)


    def create_run(self, experiment_id, run_name, start_time_ms, tags) -> str:
        body = {"experiment_id": str(experiment_id), "start_time": int(start_time_ms),
                "tags": [{"key": k, "value": str(v)} for k, v in tags.items()]}
        if run_name:
            body["run_name"] = run_name
        data = self._call("/api/2.0/mlflow/runs/create", "POST", "create-run", json=body)
        return str(_field(data, "create-run", "run", "info", "run_id"))

    def experiment_id(self, name) -> str:
        """The id of experiment ``name``, created when missing (as ``mlflow.start_run`` does)."""
        try:
            data = self._call("/api/2.0/mlflow/experiments/get-by-name", "GET",
                              "get-experiment", params={"experiment_name": name})
            return str(_field(data, "get-experiment", "experiment", "experiment_id"))
        except DeliveryError as exc:
            if not exc.not_found:
                raise
        data = self._call("/api/2.0/mlflow/experiments/create", "POST", "create-experiment",
                          json={"name": name})
        return str(_field(data, "create-experiment", "experiment_id"))

    def find_run(self, experiment_id, tag_key, tag_value) -> str | None:
        body = {"experiment_ids": [str(experiment_id)], "max_results": 1,
                "filter": f"tags.`{tag_key}` = '{tag_value}'"}
        data = self._call("/api/2.0/mlflow/runs/search", "POST", "search-runs", json=body)
        runs = data.get("runs") or []
        return str(_field({"r": runs}, "search-runs", "r", 0, "info", "run_id")) if runs else None

    def update_run(self, run_id, status, end_time_ms) -> None:
        self._call("/api/2.0/mlflow/runs/update", "POST", "update-run",
                   json={"run_id": run_id, "status": status, "end_time": int(end_time_ms)})

    def run_exists(self, run_id) -> bool:
        try:
            data = self._call("/api/2.0/mlflow/runs/get", "GET", "get-run",
                              params={"run_id": run_id})
        except DeliveryError as exc:
            if exc.not_found or (exc.permanent and "INVALID_PARAMETER_VALUE" in str(exc)):
                return False
            raise
        info = _field(data, "get-run", "run", "info")
        stage = info.get("lifecycle_stage", "active") if isinstance(info, dict) else None
        if stage is None:
            raise _not_mlflow("get-run", TypeError("run.info is not an object"))
        return stage == "active"


def _within(budget_s: float, what: str, request: Any) -> Any:
    """``request()`` on a daemon thread, waited for at most ``budget_s`` (connect, headers and
    body together: the socket timeout alone restarts with every byte a dripping server sends).
    A request still running then is abandoned (it may have landed: *ambiguous*); while
    :data:`MAX_HANGING_REQUESTS` of those still run, new requests are refused unsent."""
    with _hanging_lock:
        _hanging[:] = [t for t in _hanging if t.is_alive()]
        if len(_hanging) >= MAX_HANGING_REQUESTS:
            raise DeliveryError(f"{what} not sent: {len(_hanging)} earlier tracking requests "
                                "are still waiting for their answers", cause="deadline")
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["resp"] = request()
        except BaseException as exc:  # handed to the caller
            out["exc"] = exc

    t = threading.Thread(target=run, name="GpuOptRequest", daemon=True)
    t.start()
    t.join(budget_s)
    if t.is_alive():
        with _hanging_lock:
            _hanging.append(t)
        raise DeliveryError(f"{what} failed: no complete answer within {budget_s:g} s "
                            "(a server dripping its answer?)", ambiguous=True, cause="deadline")
    if "exc" in out:
        raise out["exc"]
    return out["resp"]


def _looks_html(resp: Any) -> bool:
    kind = (resp.headers.get("Content-Type") or "").lower()
    return "html" in kind or (resp.content or b"")[:200].lstrip()[:1] == b"<"


def _not_mlflow(what: str, exc: BaseException | None = None) -> DeliveryError:
    return DeliveryError(f"{what} failed: the tracking server's answer is not MLflow's JSON"
                         + (f" ({type(exc).__name__}: {str(exc)[:80]})" if exc else ""),
                         ambiguous=True, cause="not-json")


def _json_object(resp: Any, what: str) -> dict[str, Any]:
    """The JSON object of a 2xx answer; anything else (an HTML login page, a proxy's text, a
    JSON list) is an uncertain failed send: something in between answered, not MLflow."""
    if _looks_html(resp):
        raise DeliveryError(f"{what} failed: the tracking server answered with an HTML page "
                            f"(HTTP {resp.status_code}): a login proxy?", ambiguous=True,
                            status=resp.status_code, cause="html")
    try:
        data = json.loads(resp.content or b"")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _not_mlflow(what, exc) from None
    if not isinstance(data, dict):
        raise _not_mlflow(what, TypeError(f"a JSON {type(data).__name__}"))
    return data


def _field(data: Any, what: str, *keys: Any) -> Any:
    """``data[k1][k2]...``; a missing or mistyped field is :func:`_not_mlflow`."""
    for key in keys:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError) as exc:
            raise _not_mlflow(what, exc) from None
    return data


def _log_with_repo(repo: Any, payload: bytes, artifact_file: str) -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / posixpath.basename(artifact_file)
        local.write_bytes(payload)
        try:
            repo.log_artifact(str(local), posixpath.dirname(artifact_file) or None)
        except Exception as exc:
            raise DeliveryError(f"upload {artifact_file} failed: {exc}", ambiguous=True) from exc


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


class ClientTransport:
    """Any other tracking URI (sqlite, a local store): through ``MlflowClient``."""

    def __init__(self, tracking_uri: str | None) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri)

    def _fail(self, exc: Exception, what: str) -> DeliveryError:
        from mlflow.exceptions import MlflowException

        if isinstance(exc, MlflowException) and exc.error_code in (
                "INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST"):
            return DeliveryError(f"{what} failed: {exc}", permanent=True,
                                 not_found=exc.error_code == "RESOURCE_DOES_NOT_EXIST")
        return DeliveryError(f"{what} failed: {exc}", ambiguous=True)

    def log_batch(self, run_id, metrics, params, tags) -> None:
        from mlflow.entities import Metric, Param, RunTag

        try:
            self._client.log_batch(
                run_id, metrics=[Metric(k, v, ts, s) for k, v, ts, s in metrics],
                params=[Param(k, v) for k, v in params.items()],
                tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)
        except Exception as exc:
            raise self._fail(exc, "log_batch") from exc

    def metric_history(self, run_id, key) -> set[tuple[int, int, float]]:
        try:
            return {(m.step, m.timestamp, m.value)
                    for m in self._client.get_metric_history(run_id, key)}
        except Exception as exc:
            raise self._fail(exc, "get_metric_history") from exc

    def log_json_artifact(self, run_id, obj, artifact_file) -> None:
        try:
            self._client.log_dict(run_id, obj, artifact_file)
        except Exception as exc:
            raise self._fail(exc, f"log_dict {artifact_file}") from exc


    def create_run(self, experiment_id, run_name, start_time_ms, tags) -> str:
        try:
            run = self._client.create_run(str(experiment_id), start_time=int(start_time_ms),
                                          tags=dict(tags), run_name=run_name)
        except Exception as exc:
            raise self._fail(exc, "create_run") from exc
        return run.info.run_id

    def experiment_id(self, name) -> str:
        try:
            exp = self._client.get_experiment_by_name(name)
            return exp.experiment_id if exp is not None else self._client.create_experiment(name)
        except Exception as exc:
            raise self._fail(exc, "get_experiment_by_name") from exc

    def find_run(self, experiment_id, tag_key, tag_value) -> str | None:
        try:
            runs = self._client.search_runs([str(experiment_id)],
                                            f"tags.`{tag_key}` = '{tag_value}'", max_results=1)
        except Exception as exc:
            raise self._fail(exc, "search_runs") from exc
        return runs[0].info.run_id if runs else None

    def update_run(self, run_id, status, end_time_ms) -> None:
        from mlflow.entities import RunStatus

        try:  # the store's call: MlflowClient.set_terminated would print the run's URL
            self._client._tracking_client.store.update_run_info(
                run_id, RunStatus.from_string(status), int(end_time_ms), None)
        except Exception as exc:
            raise self._fail(exc, "update_run") from exc

    def run_exists(self, run_id) -> bool:
        try:
            run = self._client.get_run(run_id)
        except Exception as exc:
            err = self._fail(exc, "get_run")
            if err.permanent:
                return False
            raise err from exc
        return run.info.lifecycle_stage == "active"


def make_transport(tracking_uri: str | None, timeout_s: float = 5.0,
                   deadline_s: float | None = None) -> Transport:
    """A transport for ``tracking_uri`` (``None``: MLflow's current tracking URI).

    ``timeout_s``: each request's deadline, as a whole; ``deadline_s``: all of this transport's
    requests together (REST only: other URIs involve no network)."""
    import mlflow

    uri = tracking_uri or mlflow.get_tracking_uri()
    if uri.startswith(("http://", "https://")):
        return RestTransport(uri, timeout_s, deadline_s)
    return ClientTransport(uri)


# -- batching --------------------------------------------------------------------------------
@dataclass
class Batch:
    """Consecutive records that go out in one request (or one artifact upload)."""

    records: list[JournalRecord] = field(default_factory=list)
    n_metrics: int = 0
    n_params: int = 0
    n_tags: int = 0

    @property
    def last_seq(self) -> int:
        return self.records[-1].seq

    @property
    def is_artifact(self) -> bool:
        return bool(self.records) and self.records[0].kind == "dict"

    def fits(self, record: JournalRecord) -> bool:
        if not self.records:
            return True
        if self.is_artifact or record.kind == "dict":
            return False
        n = len(record.values)
        kind = record.kind
        if kind == "params" and set(record.values) & self._keys("params"):
            return False  # the same param twice in one batch is an error in MLflow
        return (self.n_metrics + (n if kind == "metrics" else 0) <= MAX_BATCH_METRICS
                and self.n_params + (n if kind == "params" else 0) <= MAX_BATCH_PARAMS
                and self.n_tags + (n if kind == "tags" else 0) <= MAX_BATCH_TAGS)

    def _keys(self, kind: str) -> set[str]:
        return {k for r in self.records if r.kind == kind for k in r.values}

    def add(self, record: JournalRecord) -> None:
        self.records.append(record)
        n = len(record.values)
        if record.kind == "metrics":
            self.n_metrics += n
        elif record.kind == "params":
            self.n_params += n
        elif record.kind == "tags":
            self.n_tags += n


def batches(records: Iterable[JournalRecord]) -> Iterator[Batch]:
    """Group records, in order, into batches within MLflow's limits."""
    batch = Batch()
    for record in records:
        if not batch.fits(record):
            yield batch
            batch = Batch()
        batch.add(record)
    if batch.records:
        yield batch


def split_values(values: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """``values`` in chunks of at most ``limit`` keys (one record must fit one batch)."""
    items = list(values.items())
    return [dict(items[i:i + limit]) for i in range(0, len(items), limit)] or [{}]


def send(transport: Transport, run_id: str, batch: Batch, *, verify: bool = False) -> int:
    """Send one batch; return the number of metric values that reached MLflow now.

    ``verify``: the batch may already be (partly) in MLflow; send only what isn't.
    Raises :class:`DeliveryError`. A batch the server refuses as bad content is re-sent one
    record at a time so that only the bad record is refused (``permanent`` error for it).
    """
    if batch.is_artifact:
        rec = batch.records[0]
        transport.log_json_artifact(run_id, rec.obj, rec.file)
        return 0
    metrics: list[MetricTuple] = []
    params: dict[str, str] = {}
    tags: dict[str, str] = {}
    for rec in batch.records:
        if rec.kind == "metrics":
            metrics.extend((k, float(v), int(rec.ts_ms), int(rec.step))
                           for k, v in rec.values.items())
        elif rec.kind == "params":
            params.update(rec.values)
        elif rec.kind == "tags":
            tags.update(rec.values)
    if verify and metrics:
        metrics = _not_yet_logged(transport, run_id, metrics)
    if not (metrics or params or tags):
        return 0
    try:
        transport.log_batch(run_id, metrics, params, tags)
    except DeliveryError as exc:
        if not exc.permanent or len(batch.records) == 1:
            raise
        delivered = 0
        for rec in batch.records:  # find the bad record; the good ones go through
            one = Batch()
            one.add(rec)
            try:
                delivered += send(transport, run_id, one, verify=verify)
            except DeliveryError as one_exc:
                if not one_exc.permanent:
                    raise
                logger.warning("gpuopt: MLflow refused a tracking record (seq %s): %s",
                               rec.seq, redact(str(one_exc)))
        return delivered
    return len(metrics)


def _not_yet_logged(transport: Transport, run_id: str,
                    metrics: list[MetricTuple]) -> list[MetricTuple]:
    logged: dict[str, set[tuple[int, int, float]]] = {}
    for key in {m[0] for m in metrics}:
        logged[key] = transport.metric_history(run_id, key)
    return [m for m in metrics if (m[3], m[2], m[1]) not in logged[m[0]]
            and not (math.isnan(m[1]) and any(s == m[3] and t == m[2] and math.isnan(v)
                                               for s, t, v in logged[m[0]]))]
