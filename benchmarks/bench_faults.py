"""The fault suite's figures: what tracking delivers, loses and doubles under each outage of a
real ``mlflow server``, what it costs the training steps, and where planted secrets end up.

Each scenario trains a small real PyTorch MLP under ``gpuopt.track()`` against ``mlflow
server`` (sqlite store, served artifacts) on 127.0.0.1, with the server killed (SIGKILL),
frozen (SIGSTOP) or not yet started at the points named, or with a misbehaving proxy in front
of it (``tests/support/bad_proxy.py``: a login page as ``200 text/html``, a ``302 -> /login``, the
answer dripped one byte a second); afterwards the server (and proxy) behave again and
``mlflow gpuopt replay`` delivers any journal left. Printed per scenario: metric values
produced by tracking, delivered (distinct), lost, duplicated, the p99 of the training step
time against the undisturbed run, the seconds spent entering (``start``) and leaving
(``exit``) the ``with`` block.
A password in the tracking URI and provider keys in the environment are planted in every
scenario; every output line, journal and server file is searched for them afterwards.
Then ``benchmarks/bench_bad_input.py`` runs (bad CLI inputs and how each ended).

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_faults.py [steps_per_phase [scenario,...]]``
(about 6 min on one core, CPU only).
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

PASSWORD = "FAKE-bench-uri-password-5e6f"
PLANTED_ENV = {"LAMBDA_API_KEY": "FAKE-lambda-key-bench-1a2b3c4d",
               "GPUOPT_GCP_API_KEY": "FAKE-gcp-key-bench-9z8y7x6w"}


def _p99(times: list[float]) -> float:
    import numpy as np

    return float(np.percentile(times, 99)) if times else float("nan")


class _Scenario:
    def __init__(self, root: Path, name: str) -> None:
        from support.mlflow_server import MlflowServer

        self.name = name
        self.root = root / name
        self.server = MlflowServer(self.root / "server")
        self.step_s: list[float] = []
        self.proxy = None
        if name.startswith(("html", "redirect", "drip")):
            from support.bad_proxy import BadProxy

            self.proxy = BadProxy(self.server.port).start()

    @property
    def uri(self) -> str:
        port = self.proxy.port if self.proxy is not None else self.server.port
        return f"http://gpuopt:{PASSWORD}@127.0.0.1:{port}"

    def train(self, training, n: int) -> None:
        for _ in range(n):
            t = time.perf_counter()
            training.step()
            self.step_s.append(time.perf_counter() - t)

    def train_until(self, training, cond, limit_s: float = 90.0) -> None:
        deadline = time.monotonic() + limit_s
        while not cond() and time.monotonic() < deadline:
            self.train(training, 20)


def _run(sc: _Scenario, steps: int, plan: str) -> dict:
    """One scenario. ``plan``: which fault at which point (see SCENARIOS)."""
    import mlflow

    from support.mlflow_server import TinyTraining
    from mlflow_gpuopt.tracking.tracker import track

    journal_dir = sc.root / "journal"
    os.environ["GPUOPT_JOURNAL_DIR"] = str(journal_dir)
    if plan not in ("down-at-start", "down-throughout"):
        sc.server.start()
    mlflow.set_tracking_uri(sc.uri)
    training = TinyTraining()
    frozen = False
    proxy = sc.proxy
    bad = {"html-mid-run": "html", "redirect-mid-run": "redirect", "html-at-start": "html",
           "drip-at-start": "drip_status", "drip-mid-run-until-exit": "drip_body"}.get(plan)
    if plan in ("html-at-start", "drip-at-start"):
        proxy.mode = bad
    try:
        t_enter = time.monotonic()
        with track(training.model, training.opt, interval_s=0.1, flush_timeout_s=5.0,
                   print_summary=False) as tracker:
            start_s = time.monotonic() - t_enter
            if plan == "drip-at-start":
                proxy.mode = "pass"
            sc.train(training, steps)
            if plan in ("killed-mid-run", "killed-until-exit"):
                sc.server.kill()
            elif plan == "frozen-until-exit":
                os.killpg(sc.server.proc.pid, signal.SIGSTOP)
                frozen = True
            elif plan in ("html-mid-run", "redirect-mid-run", "drip-mid-run-until-exit"):
                proxy.mode = bad
            sc.train(training, steps)
            if plan in ("killed-mid-run", "down-at-start"):
                sc.server.launch()
                sc.train_until(training, sc.server.healthy)
            elif plan in ("html-mid-run", "redirect-mid-run", "html-at-start"):
                proxy.mode = "pass"
            sc.train(training, steps)
            writer = tracker._run.writer
            t_exit = time.monotonic()
        exit_s = time.monotonic() - t_exit
    finally:
        mlflow.set_tracking_uri(None)
    produced = writer.produced_metrics if writer is not None else 0
    if frozen:
        os.killpg(sc.server.proc.pid, signal.SIGCONT)
    if proxy is not None:
        proxy.mode = "pass"
    if not sc.server.healthy():
        sc.server.start()
    replays = []
    for path in sorted(journal_dir.glob("*.jsonl")):
        r = subprocess.run([str(Path(sys.executable).with_name("mlflow")), "gpuopt", "replay",
                            str(path)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "MLFLOW_TRACKING_URI": sc.uri})
        replays.append((r.returncode, r.stdout + r.stderr))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sc.uri)
    run_id = tracker.run_id
    runs = client.search_runs(["0"])
    if plan in ("down-at-start", "down-throughout", "html-at-start"):
        run_id = runs[0].info.run_id if runs else None
    total = distinct = 0
    status = None
    if run_id:
        run = client.get_run(run_id)
        status = run.info.status
        for key in run.data.metrics:
            hist = client.get_metric_history(run_id, key)
            total += len(hist)
            distinct += len({(m.step, m.timestamp, m.value) for m in hist})
    sc.server.kill()
    if proxy is not None:
        proxy.stop()
    return {"scenario": sc.name, "produced": produced, "delivered": distinct,
            "lost": produced - distinct, "duplicated": total - distinct,
            "p99_step_ms": 1000 * _p99(sc.step_s), "start_s": start_s, "exit_s": exit_s,
            "status": status,
            "runs": len(runs), "replays": [rc for rc, _ in replays],
            "replay_output": "\n".join(out for _, out in replays)}


SCENARIOS = ["undisturbed", "killed-mid-run", "down-at-start", "down-throughout",
             "killed-until-exit", "frozen-until-exit", "html-mid-run", "redirect-mid-run",
             "html-at-start", "drip-at-start", "drip-mid-run-until-exit"]


def main(steps: int = 300, only: str = "") -> int:
    names = [n for n in SCENARIOS if not only or n == "undisturbed" or n in only.split(",")]
    os.environ.update(PLANTED_ENV)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger().addHandler(handler)
    out = io.StringIO()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuopt-faults-") as tmp:
        root = Path(tmp)
        for name in names:
            with redirect_stdout(out):
                rows.append(_run(_Scenario(root, name), steps, name))
            r = rows[-1]
            print(f"{name:23s} produced {r['produced']:5d}  delivered {r['delivered']:5d}  "
                  f"lost {r['lost']:3d}  duplicated {r['duplicated']:3d}  "
                  f"step p99 {r['p99_step_ms']:6.2f} ms  start {r['start_s']:5.2f} s  "
                  f"exit {r['exit_s']:5.2f} s  "
                  f"run {r['status']}  runs {r['runs']}  replay exits {r['replays']}",
                  flush=True)
        texts = [log.getvalue(), out.getvalue(), *(r["replay_output"] for r in rows)]
        found = []
        secrets = [PASSWORD, *PLANTED_ENV.values()]
        files = [p for p in root.rglob("*") if p.is_file()]
        for secret in secrets:
            hits = sum(secret in t for t in texts)
            hits += sum(secret.encode() in p.read_bytes() for p in files)
            if hits:
                found.append(secret)
    base = rows[0]["p99_step_ms"]
    print(f"\nstep p99 vs undisturbed ({base:.2f} ms): " + ", ".join(
        f"{r['scenario']} x{r['p99_step_ms'] / base:.2f}" for r in rows[1:]))
    print(f"secrets planted: {len(secrets)} (URI password, 2 provider keys); found in "
          f"{len(files)} files and every output line: {len(found)}")
    lost = sum(r["lost"] for r in rows)
    dup = sum(r["duplicated"] for r in rows)
    print(json.dumps({"values_lost": lost, "values_duplicated": dup, "secrets_found": len(found)}))
    print("\nbad inputs (benchmarks/bench_bad_input.py):", flush=True)
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_bad_input.py")],
                         capture_output=True, text=True, timeout=900)
    at = bad.stdout.find("bad inputs tried")
    summary = bad.stdout[bad.stdout.rfind("\n", 0, at) + 1:] if at >= 0 else bad.stderr
    print(summary.strip())
    return 0 if lost == 0 and dup == 0 and not found and bad.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:2]), *sys.argv[2:3]))
