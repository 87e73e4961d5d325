"""A real ``mlflow server`` on 127.0.0.1 for tests: start, wait for /health, SIGKILL, restart."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

from support.ports import free_port
from support.sqlite_store import sqlite_uri


class MlflowServer:
    """``mlflow server`` with a sqlite (or file) store and served artifacts under ``root``."""

    def __init__(self, root: Path, port: int | None = None, backend: str = "sqlite",
                 env: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.port = port or free_port()
        self.store = (f"sqlite:///{self.root}/db.sqlite" if backend == "sqlite"
                      else f"file://{self.root}/mlruns")
        self.artifacts = self.root / "art"
        self.log_path = self.root / "server.log"
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Start the server process (returns at once; see :meth:`wait_healthy`)."""
        env = dict(os.environ if self.env is None else self.env)
        env.update(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_ALLOW_FILE_STORE="true",
                   OMP_NUM_THREADS="1")
        self.root.mkdir(parents=True, exist_ok=True)
        if self.store.startswith("sqlite:"):  # a fresh store without the migrations' seconds
            sqlite_uri(self.root / "db.sqlite", artifact_root="mlflow-artifacts:/")
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        mlflow_exe = Path(sys.executable).with_name("mlflow")
        self.proc = subprocess.Popen(
            [str(mlflow_exe), "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", self.store, "--artifacts-destination", str(self.artifacts),
             "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout_s: float = 45.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"mlflow server not healthy after {timeout_s}s")

    def start(self, timeout_s: float = 45.0) -> MlflowServer:
        self.launch()
        self.wait_healthy(timeout_s)
        return self

    def kill(self) -> None:
        """SIGKILL the server and its workers (a crash, not a shutdown)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None
        deadline = time.monotonic() + 10
        while self.healthy() and time.monotonic() < deadline:
            time.sleep(0.05)


class TinyTraining:
    """A real, small PyTorch regression: one SGD step per :meth:`step`."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                         torch.nn.Linear(128, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x = torch.randn(256, 64)
        self.y = self.x[:, :1] * 2.0 + 0.5

    def step(self) -> float:
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.detach())
