"""Bring every rank's interval figures to rank 0, off the training step.

Each rank keeps a small vector of floats (per-step timings and per-GPU hardware samples of
the last interval). A daemon thread calls ``all_gather`` on a dedicated gloo process group
every interval, so the collective never interleaves with the model's own NCCL/gloo traffic
and the step loop never waits on it. Rank 0 hands the gathered matrix to a callback, which
logs it. Rounds go on until every rank has said it is done, so ranks that finish early keep
answering and no rank is left waiting in a collective.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Callable, Sequence

logger = logging.getLogger(__name__)

#: Index of the "this rank has stopped" flag at the end of every vector.
_DONE = -1


class RankGatherer:
    """Periodic all-gather of fixed-length float vectors over a private gloo group.

    Args:
        width: floats per rank (the caller's layout; a done flag is appended).
        collect: called on this rank's gatherer thread each round with ``final`` (this rank
            has stopped: the last report); returns ``width`` floats.
        on_round: rank 0 only; receives one row per rank (``width`` floats each).
        interval_s: seconds between rounds.
        timeout_s: a rank that stops answering for this long ends the gathering with a
            warning instead of hanging the job.
    """

    def __init__(self, width: int, collect: Callable[[bool], Sequence[float]],
                 on_round: Callable[[list[list[float]]], None] | None,
                 interval_s: float = 1.0, timeout_s: float = 120.0) -> None:
        import torch.distributed as dist

        self._width = width
        self._collect = collect
        self._on_round = on_round
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # Collective: every rank constructs its gatherer at the same point (main thread).
        self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self._thread = threading.Thread(target=self._run, name="GpuOptRankGather", daemon=True)
        self._failed = False

    def start(self) -> None:
        self._thread.start()

    def _round(self, done: bool) -> bool:
        import torch
        import torch.distributed as dist

        values = list(self._collect(done))
        if len(values) != self._width:
            raise ValueError(f"collect() gave {len(values)} values, expected {self._width}")
        local = torch.tensor([*values, 1.0 if done else 0.0], dtype=torch.float64)
        rows = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(rows, local, group=self._group)
        matrix = [row.tolist() for row in rows]
        if self.rank == 0 and self._on_round is not None:
            try:
                self._on_round([row[:_DONE] for row in matrix])
            except Exception as exc:  # logging must not stop the rounds
                logger.warning("gpuopt: could not log the gathered ranks: %s", exc)
        return all(row[_DONE] >= 0.5 for row in matrix)

    def _run(self) -> None:
        try:
            while True:
                self._stop.wait(self._interval_s)
                if self._round(done=self._stop.is_set()):
                    return
        except Exception as exc:  # a dead peer or a destroyed group
            self._failed = True
            logger.warning("gpuopt: gathering metrics from other ranks stopped: %s", exc)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Finish: a last round carries everything, then the private group is destroyed;
        returns False if peers did not answer."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # still inside a collective: its group must stay
            return False
        self._destroy_group()
        return not self._failed

    def _destroy_group(self) -> None:
        """Destroy the private group now, on the caller's thread, while Python runs.

        Each round's tensors are Python tensors. The group's gloo worker thread drops its
        references to them when it discards the finished collective, and that takes the GIL.
        A group left alive until interpreter exit (``destroy_process_group()`` only forgets
        it while this object holds it) can have a worker reach that point after
        finalization began: Python then ends the thread inside a C++ destructor, which is
        ``std::terminate`` ("terminate called without an active exception", SIGABRT).
        Dropping the last reference runs the group's destructor, which joins its workers
        (torch releases the GIL there, so a worker waiting for it finishes first).
        """
        import torch.distributed as dist

        group, self._group = self._group, None
        if group is None:
            return
        try:
            if dist.is_initialized():  # else the job's groups were destroyed already
                dist.destroy_process_group(group)
        except Exception as exc:  # already destroyed with the job's groups
            logger.debug("gpuopt: gatherer group already destroyed: %s", exc)
        del group  # the last reference: the destructor joins the worker threads
