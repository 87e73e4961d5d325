"""``compare`` on bad input: one line on stderr, exit 2, nothing written to MLflow."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _compare(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "mlflow-gpuopt"), "compare", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def _one_error_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out.stderr
    return lines[0]


@pytest.fixture
def env(tracking_uri):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    plain = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    client.set_terminated(plain.info.run_id)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
            "MLFLOW_TRACKING_URI": tracking_uri}, client, plain.info.run_id


@pytest.mark.parametrize(("args", "message"), [
    (["--experiment", "nope"], "no MLflow experiment named 'nope'"),
    (["--experiment", "Default"], "has no runs with gpuopt measurements"),
    (["--run-id", "0123456789abcdef0123456789abcdef"], "unknown run id"),
    (["--run-id", "{plain}"], "has no gpuopt measurements"),
    (["--run-id", "{plain}", "--dataset-size", "lots"], "cannot read --dataset-size"),
    (["--run-id", "{plain}", "--experiment", "Default"], "not both"),
    ([], "give --run-id ID or --experiment NAME"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(env, args, message):
    environ, client, plain = env
    before = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    line = _one_error_line(_compare(environ, *[a.format(plain=plain) for a in args]))
    assert message in line
    after = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    assert [r.info.run_id for r in after] == [r.info.run_id for r in before]
    assert len(client.search_experiments()) == 1


@pytest.mark.parametrize("args", [["--experiment", "x"], ["--run-id", "abc"]])
def test_unreachable_tracking_server_is_one_line_not_a_traceback(args):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}",
               "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    line = _one_error_line(_compare(environ, *args))
    assert "cannot read" in line and "unknown run id" not in line


def _train_tracked(name: str, *, profile: bool) -> str:
    """A few real CPU steps of a small MLP under ``gpuopt.track()``; returns the run id."""
    import mlflow
    import torch

    import mlflow_gpuopt as gpuopt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with (mlflow.start_run(run_name=name) as run,
          gpuopt.track(model=model, optimizer=opt, print_summary=False, profile=profile)):
        for _ in range(12):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return run.info.run_id


def test_compare_lists_every_tracked_run_with_blanks_for_missing_figures(tracking_uri):
    import json

    import mlflow

    mlflow.set_experiment("cmp")
    profiled = _train_tracked("profiled", profile=True)
    unprofiled = _train_tracked("unprofiled", profile=False)
    client = mlflow.MlflowClient(tracking_uri)
    assert "gpuopt.flops_per_sample" in client.get_run(profiled).data.params
    assert "gpuopt.flops_per_sample" not in client.get_run(unprofiled).data.params
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
               "MLFLOW_TRACKING_URI": tracking_uri}
    out = _compare(environ, "--experiment", "cmp", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["run_id"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {profiled, unprofiled}
    assert rows[profiled]["flops_per_sample"] > 0
    assert rows[unprofiled]["flops_per_sample"] is None
    assert rows[unprofiled]["throughput_samples_per_s"] > 0  # what it has is still shown
    out = _compare(environ, "--experiment", "cmp")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines[0].split()
    col = header.index("GFLOP/sample")
    by_name = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(by_name) == {"profiled", "unprofiled"}
    assert by_name["unprofiled"][col] == "—"
    assert float(by_name["profiled"][col]) > 0
    out = _compare(environ, "--run-id", unprofiled, "--json")
    assert out.returncode == 0, out.stderr
    assert [r["run_id"] for r in json.loads(out.stdout)] == [unprofiled]
