"""``mlflow gpuopt replay PATH``: deliver a tracking journal left behind by an outage.

Delivers the journal's undelivered records to its run, in order and exactly once (records a
previous attempt may have sent are checked against the run first), appending acks to the
journal as it goes so an interrupted replay resumes where it stopped. On success the journal
is removed. Exit 2: no such file / not a journal (one line). Exit 1: MLflow still unreachable
(one line); the journal stays on disk, complete.
"""

from __future__ import annotations

import os

import click

from mlflow_gpuopt.cli._errors import UsageError


class _Unreachable(click.ClickException):
    exit_code = 1

    def show(self, file=None) -> None:  # click API
        click.echo(f"Error: {self.format_message()}", err=True, file=file)


@click.command("replay")
@click.argument("path", type=click.Path(dir_okay=False, path_type=str))
@click.option("--tracking-uri", default=None,
              help="MLflow tracking URI (default: the URI recorded in the journal, without its "
                   "password - MLflow then takes credentials from MLFLOW_TRACKING_USERNAME/"
                   "PASSWORD or _TOKEN; else $MLFLOW_TRACKING_URI).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, help="Seconds to wait for each request to MLflow.")
def replay(path: str, tracking_uri: str | None, timeout_s: float) -> None:
    """Deliver a tracking journal (PATH) to MLflow, then remove it."""
    from mlflow_gpuopt.mlflow_io import delivery
    from mlflow_gpuopt.mlflow_io.journal import (
        JournalError,
        JournalWriter,
        iter_pending,
        read_state,
    )
    from mlflow_gpuopt.redact import redact, redact_uri, uri_secrets

    try:
        state = read_state(path)
    except JournalError as exc:
        raise UsageError(str(exc)) from None
    uri = (tracking_uri or _without_userinfo(state.header.get("tracking_uri"))
           or os.environ.get("MLFLOW_TRACKING_URI"))
    if not uri:
        raise UsageError(f"{path}: no tracking URI recorded; pass --tracking-uri")
    secrets = uri_secrets(uri)
    if state.pending_records == 0:
        os.remove(path)
        click.echo(f"Nothing to deliver: {path} was already delivered; removed it.")
        return
    try:
        transport = delivery.make_transport(uri, timeout_s)
    except Exception as exc:
        raise UsageError(f"cannot use tracking URI {redact_uri(uri)}: "
                         f"{redact(str(exc), secrets)}") from None
    journal = JournalWriter.reopen(path)
    delivered = 0
    try:
        for batch in delivery.batches(iter_pending(state)):
            verify = batch.records[0]["seq"] <= state.uncertain_seq
            try:
                delivered += delivery.send(transport, state.run_id, batch, verify=verify)
            except delivery.DeliveryError as exc:
                if not exc.permanent:
                    if exc.ambiguous:
                        journal.mark_uncertain(batch.last_seq)
                    raise _Unreachable(
                        f"could not deliver {path} to MLflow at {redact_uri(uri)} "
                        f"({redact(str(exc), secrets)[:200]}); the journal is kept, "
                        "run the same command again later") from None
                click.echo(f"Warning: MLflow refused record {batch.last_seq}: "
                           f"{redact(str(exc), secrets)[:200]}", err=True)
            journal.ack(batch.last_seq)
    finally:
        journal.close()
    os.remove(path)
    click.echo(f"Delivered {state.pending_records} records ({delivered} metric values) to run "
               f"{state.run_id} at {redact_uri(uri)}; removed {path}.")


def _without_userinfo(uri: str | None) -> str | None:
    """The journal's URI without the masked password (the journal never holds the real one)."""
    if not uri or "***@" not in uri:
        return uri
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://{rest.split('@', 1)[1]}"
