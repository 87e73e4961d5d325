"""``mlflow gpuopt replay PATH``: deliver a tracking journal left behind by an outage.

The delivery itself (lock, validation, exactly once, the run created if the trainer could
not) is :mod:`mlflow_gpuopt.planning.replaying`; docs/reliability.md#replay.

Exit 2: bad path, corrupt journal, run missing, another replay running (one line each).
Exit 1: MLflow unreachable, or records refused by MLflow (one line); the journal stays.
"""

from __future__ import annotations

import click


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

    from mlflow_gpuopt.planning.replaying import ReplayFailed, ReplayRequest
    from mlflow_gpuopt.planning.replaying import replay as deliver

    # MLflow's INFO chatter (e.g. creating a sqlite store's tables) would break "one line"
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    try:
        result = deliver(ReplayRequest(path, tracking_uri, timeout_s),
                         warn=lambda line: click.echo(line, err=True))
    except ReplayFailed as exc:
        raise _Unreachable(str(exc)) from None
    if result.run_id is None:
        click.echo(f"Nothing to deliver: {path} was already delivered; removed it.")
        return
    note = (f" (created for the local run {result.created_for_local_run})"
            if result.created_for_local_run else "")
    click.echo(f"Delivered {result.records} records ({result.metric_values} metric values) to "
               f"run {result.run_id}{note} at {result.shown_uri}; removed {path}.")
