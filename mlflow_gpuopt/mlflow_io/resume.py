"""Where a resumed job's series continue: the last step a run's ``gpuopt/`` series reached.

A job restarted from a checkpoint into the run it logged before (``track(run_id=...)``, or
inside ``mlflow.start_run(run_id=...)``) counts its steps from 1 again; its metrics are
logged after the steps the run already holds, so each series goes on instead of writing a
second curve over the first. See docs/tracking.md (resuming a run).
"""

from __future__ import annotations

import logging

from mlflow_gpuopt import contract
from mlflow_gpuopt.mlflow_io.run_binding import START_TIMEOUT_S

logger = logging.getLogger(__name__)

#: Series every tracked session logs at its steps (the hardware series at every tick, the
#: step times whenever steps ran, the summary at the last one).
_STEP_SERIES = (contract.METRIC_CPU_UTILIZATION, contract.METRIC_STEP_TIME_S,
                contract.SUMMARY_STEPS)


def last_logged_step(run_id: str, tracking_uri: str | None,
                     timeout_s: float = START_TIMEOUT_S) -> int:
    """The largest step of the run's ``gpuopt/`` series (0: none, or the run cannot be
    read: resuming never stops tracking). A tracking server is asked without retries, each
    request bounded by ``timeout_s``, and not again after one fails."""
    from mlflow_gpuopt.mlflow_io.delivery import make_transport

    last = 0
    try:
        transport = make_transport(tracking_uri, timeout_s=timeout_s)
        for key in _STEP_SERIES:
            last = max([last, *(step for step, _, _ in transport.metric_history(run_id, key))])
    except Exception as exc:  # unreachable or refused: its series start at 0
        logger.debug("gpuopt: could not read the steps of run %s: %s", run_id, exc)
    return last
