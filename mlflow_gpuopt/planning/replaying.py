"""``replay PATH``: deliver a tracking journal left behind by an outage, in order and once.

The journal is removed only once everything in it was delivered
(docs/reliability.md#replay):

* the journal's own lock (``PATH.lock``) keeps a second replay of it out;
* every line is validated first (:func:`~mlflow_gpuopt.mlflow_io.journal.read_state`): a
  corrupt journal sends nothing;
* the run must exist at the tracking URI. A run the trainer could not create (server down at
  start) is created first, found again by its ``gpuopt.local_run_id`` tag if an earlier
  replay created it, and the mapping is journaled;
* before each send an "uncertain" mark is synced to the journal, after it an ack: a replay
  killed mid-send resumes by reading back what that batch may have written;
* the run's end status, when journaled, is set last.

Bad input (path, corrupt journal, missing run, a replay already running) raises
:class:`~mlflow_gpuopt.errors.InputError`; an unreachable MLflow, refused records or a
journal that cannot be written to raise :class:`ReplayFailed`. Either way the journal stays.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlflow_gpuopt.errors import InputError

#: Refused records named one warning each; the rest are counted in the error.
MAX_REFUSAL_WARNINGS = 3


@dataclass(frozen=True)
class ReplayRequest:
    """What ``replay`` was asked: the journal, the URI (None: the journal's, else
    ``$MLFLOW_TRACKING_URI``) and the seconds to wait for each request to MLflow."""

    path: str
    tracking_uri: str | None = None
    timeout_s: float = 10.0


@dataclass(frozen=True)
class ReplayResult:
    """A delivered (and removed) journal. ``run_id`` None: nothing was left to deliver."""

    path: str
    records: int = 0
    metric_values: int = 0
    run_id: str | None = None
    created_for_local_run: str | None = None  # the trainer's local id, if replay made the run
    shown_uri: str = ""


class ReplayFailed(Exception):  # noqa: N818 - names the outcome
    """MLflow could not take the journal (unreachable, refused records, or the journal
    could not be written to); the message is one line, redacted, and the journal is kept."""


def replay(request: ReplayRequest, warn: Callable[[str], None] = lambda _: None
           ) -> ReplayResult:
    """Deliver ``request.path`` and remove it; ``warn`` gets one line per refused record
    (the first :data:`MAX_REFUSAL_WARNINGS`)."""
    from mlflow_gpuopt.mlflow_io.journal import JournalBusyError, lock_path, replay_lock

    path = request.path
    if not Path(path).is_file():
        raise InputError(f"{path}: no such journal file")
    try:
        with replay_lock(path):
            return _replay_locked(request, lock_path(path), warn)
    except JournalBusyError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:  # e.g. a full disk: progress can't be recorded, so nothing is sent
        raise ReplayFailed(f"cannot write next to {path} ({exc.strerror or exc}); the journal "
                           "is kept, free some space and run the same command again") from None


def _replay_locked(request: ReplayRequest, lock: Path, warn: Callable[[str], None]
                   ) -> ReplayResult:
    from mlflow_gpuopt.mlflow_io import delivery
    from mlflow_gpuopt.mlflow_io.journal import (
        JournalError,
        JournalWriter,
        iter_pending,
        read_state,
    )
    from mlflow_gpuopt.redact import public_uri, redact, redact_uri, uri_secrets

    path = request.path
    try:
        state = read_state(path)  # read under the lock: another replay may have delivered
    except JournalError as exc:
        raise InputError(str(exc)) from None
    uri = (request.tracking_uri or public_uri(state.header.get("tracking_uri"))
           or os.environ.get("MLFLOW_TRACKING_URI"))
    if not uri:
        raise InputError(f"{path}: no tracking URI recorded; pass --tracking-uri")
    secrets = uri_secrets(uri)
    shown = redact_uri(uri)

    def reason(exc: Exception) -> str:
        return redact(str(exc), secrets)[:200]

    def unreachable(exc: Exception) -> ReplayFailed:
        return ReplayFailed(f"could not deliver {path} to MLflow at {shown} ({reason(exc)}); "
                            "the journal is kept, run the same command again later")

    if state.pending_records == 0 and state.end is None and state.create_run is None:
        _remove(path, lock)
        return ReplayResult(path=path, shown_uri=shown)
    try:
        transport = delivery.make_transport(uri, request.timeout_s)
    except Exception as exc:  # any store MLflow can't open is a bad URI here
        raise InputError(f"cannot use tracking URI {shown}: {redact(str(exc), secrets)}"
                         ) from None

    journal = JournalWriter.reopen(path)
    try:
        try:
            run_id, created = _target_run(transport, state, journal)
        except delivery.DeliveryError as exc:
            if exc.permanent:
                raise InputError(f"{path}: {reason(exc)} at {shown}; the journal is kept"
                                 ) from None
            raise unreachable(exc) from None
        if run_id is None:
            raise InputError(f"{path}: run {state.run_id} does not exist at {shown} (a wrong "
                             "--tracking-uri, or the run was deleted); the journal is kept")
        delivered, refused = 0, 0
        for batch in delivery.batches(iter_pending(state)):
            verify = batch.records[0].seq <= state.uncertain_seq
            journal.mark_uncertain(batch.last_seq)  # a replay killed during the send verifies
            try:
                delivered += delivery.send(transport, run_id, batch, verify=verify)
            except delivery.DeliveryError as exc:
                if not exc.permanent:
                    raise unreachable(exc) from None
                if exc.not_found:  # the run vanished mid-replay
                    raise InputError(f"run {run_id} no longer exists: {reason(exc)}; the "
                                     "journal is kept") from None
                refused += len(batch.records)
                if refused <= MAX_REFUSAL_WARNINGS:
                    warn(f"Warning: MLflow refused record {batch.last_seq}: {reason(exc)}")
            journal.ack(batch.last_seq)
        if state.end is not None:
            try:
                transport.update_run(run_id, state.end["status"], state.end["end_time_ms"])
            except delivery.DeliveryError as exc:
                raise unreachable(exc) from None
    finally:
        journal.close()
    local = str(state.header["run_id"]) if created else None
    if refused:
        note = f" (created for the local run {local})" if local else ""
        raise ReplayFailed(f"MLflow refused {refused} record(s) of {path}; the rest "
                           f"({state.pending_records - refused} records, {delivered} metric "
                           f"values) went to run {run_id}{note} at {shown}; the journal is "
                           "kept for inspection")
    _remove(path, lock)
    return ReplayResult(path=path, records=state.pending_records, metric_values=delivered,
                        run_id=run_id, created_for_local_run=local, shown_uri=shown)


def _target_run(transport, state, journal) -> tuple[str | None, bool]:
    """The run to deliver to (None: it does not exist), and whether this replay created it."""
    from mlflow_gpuopt import contract

    spec = state.create_run
    if spec is None:
        return (state.run_id if transport.run_exists(state.run_id) else None), False
    local_id = str(state.header["run_id"])
    exp_id = spec.get("experiment_id") or transport.experiment_id(spec["experiment_name"])
    run_id = transport.find_run(exp_id, contract.TAG_LOCAL_RUN_ID, local_id)
    created = run_id is None
    if created:
        tags = {**spec.get("tags", {}), contract.TAG_LOCAL_RUN_ID: local_id}
        run_id = transport.create_run(exp_id, spec.get("run_name"), spec["start_time_ms"], tags)
    journal.mark_created(run_id)
    return run_id, created


def _remove(path: str, lock: Path) -> None:
    os.remove(path)
    lock.unlink(missing_ok=True)  # under the lock: a waiting replay then finds no journal
