"""``mlflow gpuopt replay PATH``: deliver a tracking journal left behind by an outage.

Delivers the journal's undelivered records to its run, in order and exactly once, and
removes the journal only once everything in it was delivered:

* the journal's own lock (``PATH.lock``, :func:`~mlflow_gpuopt.mlflow_io.journal.replay_lock`)
  so two replays of one journal never run at once: the second says so in one line, exit 2;
* every line is validated first (:func:`~mlflow_gpuopt.mlflow_io.journal.read_state`): a
  corrupt journal is one line, exit 2, nothing sent;
* the run must exist at the tracking URI (a typo in ``--tracking-uri``, a deleted run: one
  line, exit 2, journal kept). A run the trainer could not create (server down at start) is
  created first, found again by its ``gpuopt.local_run_id`` tag if an earlier replay created
  it, and the mapping is journaled;
* before each send an "uncertain" mark is synced to the journal, after it an ack: a replay
  killed mid-send resumes by reading back what that batch may have written;
* the run's end status, when journaled, is set last.

Exit 2: bad path, corrupt journal, run missing, another replay running (one line each).
Exit 1: MLflow unreachable, or records refused by MLflow (one line); the journal stays.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from mlflow_gpuopt.cli._errors import UsageError

_MAX_REFUSAL_LINES = 3


class _Unreachable(click.ClickException):
    exit_code = 1

    def show(self, file=None) -> None:  # click API
        click.echo(f"Error: {self.format_message()}", err=True, file=file)


@click.command("replay")
@click.argument("path", type=click.Path(dir_okay=False, path_type=str))
@click.option("--tracking-uri", default=None,
              help="MLflow tracking URI (default: the URI recorded in the journal, which never "
                   "holds credentials - MLflow then takes them from MLFLOW_TRACKING_USERNAME/"
                   "PASSWORD or _TOKEN; else $MLFLOW_TRACKING_URI).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=3600), default=10.0,
              show_default=True, help="Seconds to wait for each request to MLflow.")
def replay(path: str, tracking_uri: str | None, timeout_s: float) -> None:
    """Deliver a tracking journal (PATH) to MLflow, then remove it."""
    import logging

    from mlflow_gpuopt.mlflow_io.journal import JournalBusyError, lock_path, replay_lock

    # MLflow's INFO chatter (e.g. creating a sqlite store's tables) would break "one line"
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    lock = lock_path(path)
    if not Path(path).is_file():
        raise UsageError(f"{path}: no such journal file")
    try:
        with replay_lock(path):
            _replay_locked(path, tracking_uri, timeout_s, lock)
    except JournalBusyError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # e.g. a full disk: progress can't be recorded, so nothing is sent
        raise _Unreachable(f"cannot write next to {path} ({exc.strerror or exc}); the journal "
                           "is kept, free some space and run the same command again") from None


def _replay_locked(path: str, tracking_uri: str | None, timeout_s: float, lock: Path) -> None:
    from mlflow_gpuopt.mlflow_io import delivery
    from mlflow_gpuopt.mlflow_io.journal import JournalError, JournalWriter, read_state
    from mlflow_gpuopt.redact import public_uri, redact, redact_uri, uri_secrets

    try:
        state = read_state(path)  # read under the lock: another replay may have delivered
    except JournalError as exc:
        raise UsageError(str(exc)) from None
    uri = (tracking_uri or public_uri(state.header.get("tracking_uri"))
           or os.environ.get("MLFLOW_TRACKING_URI"))
    if not uri:
        raise UsageError(f"{path}: no tracking URI recorded; pass --tracking-uri")
    secrets = uri_secrets(uri)
    shown = redact_uri(uri)

    def unreachable(exc: Exception) -> _Unreachable:
        return _Unreachable(f"could not deliver {path} to MLflow at {shown} "
                            f"({redact(str(exc), secrets)[:200]}); the journal is kept, "
                            "run the same command again later")

    if state.pending_records == 0 and state.end is None and state.create_run is None:
        _remove(path, lock)
        click.echo(f"Nothing to deliver: {path} was already delivered; removed it.")
        return
    try:
        transport = delivery.make_transport(uri, timeout_s)
    except Exception as exc:
        raise UsageError(f"cannot use tracking URI {shown}: {redact(str(exc), secrets)}") from None

    journal = JournalWriter.reopen(path)
    try:
        try:
            run_id, created = _target_run(transport, state, journal)
        except delivery.DeliveryError as exc:
            if exc.permanent:
                raise UsageError(f"{path}: {redact(str(exc), secrets)[:200]} at {shown}; "
                                 "the journal is kept") from None
            raise unreachable(exc) from None
        if run_id is None:
            raise UsageError(f"{path}: run {state.run_id} does not exist at {shown} (a wrong "
                             "--tracking-uri, or the run was deleted); the journal is kept")
        delivered, refused = _deliver(transport, state, run_id, journal, secrets, unreachable)
        if state.end is not None:
            try:
                transport.update_run(run_id, state.end["status"], state.end["end_time_ms"])
            except delivery.DeliveryError as exc:
                raise unreachable(exc) from None
    finally:
        journal.close()
    note = f" (created for the local run {state.header['run_id']})" if created else ""
    if refused:
        raise _Unreachable(f"MLflow refused {refused} record(s) of {path}; the rest "
                           f"({state.pending_records - refused} records, {delivered} metric "
                           f"values) went to run {run_id}{note} at {shown}; the journal is kept "
                           "for inspection")
    _remove(path, lock)
    click.echo(f"Delivered {state.pending_records} records ({delivered} metric values) to run "
               f"{run_id}{note} at {shown}; removed {path}.")


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


def _deliver(transport, state, run_id, journal, secrets, unreachable) -> tuple[int, int]:
    """Send the pending records; (metric values delivered, records refused)."""
    from mlflow_gpuopt.mlflow_io import delivery
    from mlflow_gpuopt.mlflow_io.journal import iter_pending
    from mlflow_gpuopt.redact import redact

    delivered = refused = 0
    for batch in delivery.batches(iter_pending(state)):
        verify = batch.records[0].seq <= state.uncertain_seq
        journal.mark_uncertain(batch.last_seq)  # a replay killed during the send verifies it
        try:
            delivered += delivery.send(transport, run_id, batch, verify=verify)
        except delivery.DeliveryError as exc:
            if not exc.permanent:
                raise unreachable(exc) from None
            if exc.not_found:  # the run vanished mid-replay
                raise UsageError(f"run {run_id} no longer exists: "
                                 f"{redact(str(exc), secrets)[:200]}; the journal is kept"
                                 ) from None
            refused += len(batch.records)
            if refused <= _MAX_REFUSAL_LINES:
                click.echo(f"Warning: MLflow refused record {batch.last_seq}: "
                           f"{redact(str(exc), secrets)[:200]}", err=True)
        journal.ack(batch.last_seq)
    return delivered, refused


def _remove(path: str, lock: Path) -> None:
    os.remove(path)
    lock.unlink(missing_ok=True)  # under the lock: a waiting replay then finds no journal
