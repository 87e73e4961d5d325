"""Tracking as teams deploy it: ``mlflow server`` on a PostgreSQL backend store, 16 tracked
jobs writing at once (15 single-process jobs and one 4-rank torchrun job, gloo on CPU), and
an outage of the server in the middle.

Two rounds of the same 16 jobs, each job training a small real MLP for ``duration_s``:
an undisturbed round, then a round where the tracking server is SIGKILLed at 30 % of the
duration and started again at 60 %. Afterwards any journal left is replayed. Printed per
round: metric values produced by tracking (every job's writer), delivered (distinct, read back
from the server), lost, duplicated, runs created, and the training steps' p50/p99 time over
all jobs; then the outage round's p99 against the undisturbed one.

PostgreSQL: Debian's ``postgresql`` (``/usr/lib/postgresql/*/bin``), started on 127.0.0.1
in a temporary directory by this script (as the ``postgres`` user when run as root) and
removed after. MLflow needs ``psycopg2`` in the *server's* environment: from the venv, or
from ``$GPUOPT_PSYCOPG2_PATH`` (e.g. ``pip install --target DIR psycopg2-binary``). Where
either is missing the script prints one line and exits 0 (skipped).

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_load_postgres.py [duration_s]``
(default 40 s per round; about 3 min in all on 2 cores).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
N_JOBS = 16  # 15 single-process jobs + 1 torchrun job of 4 ranks
DDP_STEPS_PER_S = 20  # the torchrun job's fixed step count per second of duration

JOB = r'''
import json, os, sys, time
import torch
import mlflow
from mlflow_gpuopt.tracking.tracker import track

out, duration_s = sys.argv[1], float(sys.argv[2])
rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
if world > 1:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 64)
y = x[:, :1] * 2.0 + 0.5
times = []
with track(model, opt, interval_s=0.5, flush_timeout_s=10.0, print_summary=False) as t:
    # a DDP job's ranks must take the same number of steps: a fixed count, about duration_s
    end = time.monotonic() + duration_s
    n_steps = int(sys.argv[3]) if world > 1 else None
    while (len(times) < n_steps) if n_steps else (time.monotonic() < end):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        times.append(time.perf_counter() - t0)
writer = t._run.writer
json.dump({"rank": rank, "run_id": t.run_id, "local_run_id": getattr(writer, "local_run_id", None),
           "produced": writer.produced_metrics if writer is not None else 0,
           "times": times}, open(f"{out}.{rank}.json", "w"))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth, one database ``mlflow``)."""

    def __init__(self, root: Path) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise RuntimeError("Debian's postgresql is not installed (apt-get install postgresql)")
        self.bin = Path(bins[-1]).parent
        self.data = root / "pgdata"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        root.chmod(0o755)

    def _cmd(self, *args: str) -> list[str]:
        return (["runuser", "-u", "postgres", "--", *args] if self.as_root else list(args))

    def start(self) -> str:
        self.data.mkdir()
        if self.as_root:
            shutil.chown(self.data, "postgres", "postgres")
        subprocess.run(self._cmd(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                                 "-U", "postgres"), check=True, capture_output=True)
        subprocess.run(self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l",
                                 str(self.data / "log"), "-o",
                                 f"-p {self.port} -k {self.data} -h 127.0.0.1 "
                                 "-c max_connections=300",
                                 "start"), check=True, capture_output=True)
        subprocess.run(self._cmd(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p",
                                 str(self.port), "-U", "postgres", "mlflow"), check=True,
                       capture_output=True)
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/mlflow"

    def stop(self) -> None:
        subprocess.run(self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                                 "immediate", "stop"), capture_output=True)


class Server:
    def __init__(self, root: Path, store: str, env: dict) -> None:
        self.root, self.store, self.env = root, store, env
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        mlflow_exe = Path(sys.executable).with_name("mlflow")
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [str(mlflow_exe), "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", self.store, "--artifacts-destination",
             str(self.root / "art"), "--workers", "2"],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()
        import urllib.request

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("mlflow server did not come up: "
                           + (self.root / "server.log").read_text()[-1500:])

    def kill(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None


def _round(root: Path, server: Server, duration_s: float, outage: bool, env: dict) -> dict:
    import numpy as np
    from mlflow.tracking import MlflowClient

    root.mkdir()
    script = root / "job.py"
    script.write_text(JOB)
    job_env = {**env, "MLFLOW_TRACKING_URI": server.uri, "OMP_NUM_THREADS": "1",
               "GPUOPT_JOURNAL_DIR": str(root / "journal")}
    procs = []
    for i in range(N_JOBS - 1):
        procs.append(subprocess.Popen([sys.executable, str(script), str(root / f"job{i}"),
                                       str(duration_s)], env=job_env, cwd=root,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4",
         f"--master-port={_free_port()}", str(script), str(root / "ddp"), str(duration_s),
         str(DDP_STEPS_PER_S * int(duration_s))],
        env=job_env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    t0 = time.monotonic()
    if outage:
        time.sleep(0.3 * duration_s)
        server.kill()
        time.sleep(max(0.0, 0.6 * duration_s - (time.monotonic() - t0)))
        server.start()
    failed = 0
    for p in procs:
        try:
            _, err = p.communicate(timeout=duration_s + 240)
        except subprocess.TimeoutExpired:  # bounded: a stuck job counts as failed
            p.kill()
            _, err = p.communicate()
        if p.returncode != 0:
            failed += 1
            print(f"  a job failed (exit {p.returncode}): {err.decode()[-400:]}", flush=True)
    replays = []
    for path in sorted((root / "journal").glob("*.jsonl")):
        r = subprocess.run([str(Path(sys.executable).with_name("mlflow")), "gpuopt", "replay",
                            str(path), "--tracking-uri", server.uri], capture_output=True,
                           text=True, env=job_env, timeout=600)
        replays.append(r.returncode)
    results = [json.loads(p.read_text()) for p in sorted(root.glob("*.json"))]
    client = MlflowClient(server.uri)
    produced = delivered = total = 0
    times: list[float] = []
    runs = set()
    for res in results:
        times += res["times"]
        if res["rank"] != 0:
            continue
        produced += res["produced"]
        run_id = res["run_id"]
        try:
            client.get_run(run_id)
        except Exception:  # a locally minted id: the run was created later, with its tag
            found = client.search_runs(["0"], f"tags.`gpuopt.local_run_id` = '{run_id}'")
            run_id = found[0].info.run_id if found else None
        if not run_id:
            continue
        runs.add(run_id)
        for key in client.get_run(run_id).data.metrics:
            hist = client.get_metric_history(run_id, key)
            total += len(hist)
            delivered += len({(m.step, m.timestamp, m.value) for m in hist})
    return {"jobs": sum(1 for r in results if r["rank"] == 0), "failed": failed,
            "produced": produced, "delivered": delivered, "lost": produced - delivered,
            "duplicated": total - delivered, "runs": len(runs), "replays": replays,
            "steps": len(times), "p50_ms": 1000 * float(np.percentile(times, 50)),
            "p99_ms": 1000 * float(np.percentile(times, 99))}


def main(duration_s: float = 40.0) -> int:
    extra = os.environ.get("GPUOPT_PSYCOPG2_PATH", "")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "PYTHONPATH": os.pathsep.join(p for p in (extra, str(REPO),
                                                     os.environ.get("PYTHONPATH", "")) if p)}
    check = subprocess.run([sys.executable, "-c", "import psycopg2"], env=env,
                           capture_output=True)
    if check.returncode != 0:
        print("skipped: psycopg2 is not importable (pip install --target DIR psycopg2-binary; "
              "GPUOPT_PSYCOPG2_PATH=DIR)")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="gpuopt-pg-"))
    try:
        try:
            pg = Postgres(tmp)
            store = pg.start()
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            print(f"skipped: PostgreSQL could not be started here ({exc} "
                  f"{detail.decode(errors='replace')[-200:]})".strip())
            return 0
        server = Server(tmp, store, env)
        try:
            server.start()
            rows = {}
            for name, outage in (("undisturbed", False), ("outage", True)):
                r = _round(tmp / name, server, duration_s, outage, env)
                rows[name] = r
                print(f"{name:12s} jobs {r['jobs']} (failed {r['failed']})  runs {r['runs']}  "
                      f"values produced {r['produced']}  delivered {r['delivered']}  lost "
                      f"{r['lost']}  duplicated {r['duplicated']}  replay exits {r['replays']}  "
                      f"steps {r['steps']}  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms",
                      flush=True)
            server.kill()
            ratio = rows["outage"]["p99_ms"] / rows["undisturbed"]["p99_ms"]
            print(f"outage round step p99 / undisturbed: x{ratio:.2f}")
            bad = any(r["lost"] or r["duplicated"] or r["failed"] for r in rows.values())
            return 1 if bad else 0
        finally:
            server.kill()
            pg.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(*(float(a) for a in sys.argv[1:2])))
