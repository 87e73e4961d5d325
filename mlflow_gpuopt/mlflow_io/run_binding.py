"""Which MLflow run tracking writes into: a given one, the active one, or a new one.

Only a run this module started is ended by it, and the ending goes through the writer
(``RunWriter.close(end_status=...)``): one bounded request, journaled when it can't be made.

A new run on an ``http(s)://`` tracking server is created through the writer's own transport
(:mod:`.delivery`: one short request, no MLflow-internal retries), never ``mlflow.start_run``,
whose retries hold the caller for minutes when the server is down. When the server does not
answer, the run gets a locally minted id (``uuid4().hex``, the shape of MLflow's own ids) and
a description of the run to create (:attr:`RunBinding.create_run`); the writer journals it and
creates the run when the server answers, or ``mlflow gpuopt replay`` does (see
:mod:`.journal`). Training is held up by at most :data:`START_TIMEOUT_S` in all: one deadline
covers every request of the start (finding the experiment, creating the run), each request
as a whole, so a server that drips its answer costs no more than a dead one. An answer that
is not MLflow's (a login proxy's HTML page or redirect) is an outage too: journaled. The run
created at start carries ``gpuopt.local_run_id`` as well, so that when its answer is lost the
writer finds it instead of creating a second one.

Tags at run start: pass them to :func:`bind_run` (``tags=``); they go into the create request
(or the journaled create record), with MLflow's context tags (source, user, git commit) and
the run name. Other URIs (sqlite, a local path) use ``mlflow.start_run``: no network.
"""

from __future__ import annotations

import os
import sys
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

#: Longest wait for the tracking server when creating a run at the start of training, seconds.
START_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RunBinding:
    """The run tracking writes into, and whether tracking started (so must end) it.

    ``create_run``: set when the run exists only locally (the server was unreachable): what
    to create (``experiment_id`` or ``experiment_name``, ``run_name``, ``start_time_ms``,
    ``tags``); ``run_id`` is then the locally minted id.
    ``tracking_uri``: the URI the run lives at.
    """

    run_id: str
    started_here: bool
    create_run: dict[str, Any] | None = field(default=None, compare=False)
    tracking_uri: str | None = None
    pushed_active: bool = False  # put on MLflow's active-run stack by bind_run


def tracking_uri_secrets() -> list[str]:
    """The password or token inside MLflow's current tracking URI, for redacting warnings
    (the URI need not come from the environment: ``mlflow.set_tracking_uri`` sets it too).

    MLflow is not imported for this: a warning can fire on the training thread or in a rank
    that never talks to MLflow, and importing it there takes seconds. Where MLflow is not
    loaded, no URI was set through it, so the environment's is the one in force."""

    from mlflow_gpuopt.redact import uri_secrets

    mlflow = sys.modules.get("mlflow")
    uri = (mlflow.get_tracking_uri() if mlflow is not None
           else os.environ.get("MLFLOW_TRACKING_URI"))
    return uri_secrets(uri)


def bind_run(run_id: str | None = None, run_name: str | None = None, *,
             tags: dict[str, str] | None = None,
             start_timeout_s: float = START_TIMEOUT_S) -> RunBinding:
    """``run_id`` if given; else the active run (e.g. ``mlflow.autolog()``'s); else a new run.

    Raises whatever MLflow raises for a refused run (the tracker turns it into one warning);
    an unreachable server is not an error (see the module docstring).
    """
    import mlflow

    uri = mlflow.get_tracking_uri()
    if run_id:
        return RunBinding(run_id, started_here=False, tracking_uri=uri)
    active = mlflow.active_run()
    if active is not None:
        return RunBinding(active.info.run_id, started_here=False, tracking_uri=uri)
    if not uri.startswith(("http://", "https://")):
        run = mlflow.start_run(run_name=run_name, tags=dict(tags or {}))
        return RunBinding(run.info.run_id, started_here=True, tracking_uri=uri,
                          pushed_active=True)
    return _create_over_rest(uri, run_name, dict(tags or {}), start_timeout_s)


def _experiment() -> tuple[str | None, str | None]:
    """(experiment id, experiment name) as ``mlflow.start_run`` would pick, without network:
    ``mlflow.set_experiment``'s, else ``MLFLOW_EXPERIMENT_NAME``/``_ID``, else "0"."""
    import os

    from mlflow.tracking import fluent

    if fluent._active_experiment_id:
        return str(fluent._active_experiment_id), None
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if name:
        return None, name
    return os.environ.get("MLFLOW_EXPERIMENT_ID") or "0", None


def _create_over_rest(uri: str, run_name: str | None, tags: dict[str, str],
                      timeout_s: float) -> RunBinding:
    from mlflow.tracking.context import registry as context_registry
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    from mlflow_gpuopt.mlflow_io import delivery

    if run_name:
        tags = {**tags, MLFLOW_RUN_NAME: run_name}
    tags = {k: str(v) for k, v in context_registry.resolve_tags(tags).items()}
    exp_id, exp_name = _experiment()
    local_id = uuid.uuid4().hex
    start_ms = int(time.time() * 1000)
    from mlflow_gpuopt import contract

    transport = delivery.make_transport(uri, timeout_s, deadline_s=timeout_s)
    try:
        if exp_id is None:
            exp_id = transport.experiment_id(exp_name)
        real_id = transport.create_run(exp_id, run_name, start_ms,
                                       {**tags, contract.TAG_LOCAL_RUN_ID: local_id})
    except (delivery.DeliveryError, KeyError, TypeError, ValueError) as exc:
        if not isinstance(exc, delivery.DeliveryError):  # an answer that is not MLflow's
            exc = delivery.DeliveryError(f"{type(exc).__name__}: {exc}", ambiguous=True)
        if exc.permanent or exc.status in (401, 403):  # it answered, and refused: no outage
            raise exc
        from mlflow_gpuopt.redact import redact, redact_uri, uri_secrets

        logger.warning("gpuopt: MLflow at %s did not answer (%s); training goes on, tracking "
                       "into run %s kept in the local journal until the run can be created",
                       redact_uri(uri), redact(str(exc), uri_secrets(uri))[:200], local_id)
        spec = {"experiment_id": exp_id, "experiment_name": exp_name, "run_name": run_name,
                "start_time_ms": start_ms, "tags": tags}
        return RunBinding(local_id, started_here=True, tracking_uri=uri,
                          create_run={k: v for k, v in spec.items() if v is not None})
    pushed = _push_active(real_id, exp_id, run_name, start_ms, tags)
    return RunBinding(real_id, started_here=True, tracking_uri=uri, pushed_active=pushed)


def _push_active(run_id: str, exp_id: str, run_name: str | None, start_ms: int,
                 tags: dict[str, str]) -> bool:
    """Make the created run MLflow's active run (so the user's ``mlflow.log_*`` calls in the
    block go to it), without another request. False where MLflow's internals differ."""
    try:
        from mlflow.entities import Run, RunData, RunInfo, RunStatus, RunTag
        from mlflow.tracking import fluent

        info = RunInfo(run_id=run_id, experiment_id=exp_id, user_id=tags.get("mlflow.user", ""),
                       status=RunStatus.to_string(RunStatus.RUNNING), start_time=start_ms,
                       end_time=None, lifecycle_stage="active", run_name=run_name or "")
        run = Run(info, RunData(tags=[RunTag(k, v) for k, v in tags.items()]))
        fluent._active_run_stack.get().append(fluent.ActiveRun(run))
        return True
    except Exception as exc:  # a different MLflow: the run is tracked, just not "active"
        logger.debug("gpuopt: could not make run %s MLflow's active run: %s", run_id, exc)
        return False


def release_run(binding: RunBinding) -> None:
    """Take the run off MLflow's active-run stack without a request (its end status goes
    through the writer). For a non-http store, the run is ended by ``mlflow.end_run``."""
    if not binding.pushed_active:
        return
    from mlflow.tracking import fluent

    stack = fluent._active_run_stack.get()
    if stack and stack[-1].info.run_id == binding.run_id:
        stack.pop()


def end_run(binding: RunBinding, failed: bool) -> None:
    """End the run through MLflow's client (used when no writer could be made)."""
    if not binding.started_here or binding.create_run is not None:
        return
    import mlflow

    from mlflow_gpuopt.redact import no_url_echo

    release_run(binding)
    with no_url_echo(mlflow.get_tracking_uri()):  # MLflow would print the URI's password
        from mlflow.tracking import MlflowClient

        MlflowClient().set_terminated(binding.run_id, status="FAILED" if failed else "FINISHED")
