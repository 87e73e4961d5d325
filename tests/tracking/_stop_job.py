"""A tracked training process for the signal and fork tests (run as a script).

``python _stop_job.py MODE URI OUT``: trains a small real MLP under ``gpuopt.track()`` into
the tracking URI ``URI`` and writes its run id to ``OUT`` once 20 steps are done. MODE:

* ``default``: trains until killed (SIGTERM/SIGHUP keep Python's default action);
* ``chained``: a handler of its own for SIGTERM is in place first; it writes ``OUT.chained``
  and exits with status 3;
* ``fork``: forks inside the tracked block; parent and child both train a few steps and leave
  the block; the child writes what its tracker said to ``OUT.child`` and exits 0 (through
  ``sys.exit``, so atexit handlers run); the parent waits for it inside the block.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import mlflow
import torch

import mlflow_gpuopt as gpuopt


def main(mode: str, uri: str, out: str) -> None:
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("stop-job")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 32), torch.randn(128, 1)

    def step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    if mode == "chained":
        def mine(signum, frame):
            Path(out + ".chained").write_text(str(signum))
            sys.exit(3)

        signal.signal(signal.SIGTERM, mine)
    pid = None
    with gpuopt.track(model=model, optimizer=opt, interval_s=0.05, flush_timeout_s=5.0,
                      print_summary=False, profile=False) as tracker:
        for _ in range(20):
            step()
        time.sleep(0.2)  # a few sampling intervals of a real job (20 steps take milliseconds)
        if mode == "fork":
            pid = os.fork()
            for _ in range(10):
                step()
            if pid:  # the child leaves the block (and exits) first
                os.waitpid(pid, 0)
        else:
            Path(out + ".tmp").write_text(tracker.run_id or "")
            os.replace(out + ".tmp", out)
            while True:
                step()
                time.sleep(0.002)
    if pid == 0:
        Path(out + ".child").write_text(repr(tracker.summary))
        sys.exit(0)  # atexit handlers run in the child too
    if pid:
        Path(out).write_text(tracker.run_id or "")


if __name__ == "__main__":
    main(*sys.argv[1:4])
