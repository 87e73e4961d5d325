"""``mlflow gpuopt advise`` on real CPU training into a real sqlite store: each flaw produced
for real (a slow DataLoader, odd matmul shapes, fp32 without autocast, nn.DataParallel, and a
fake NVML GPU idling while busy loader workers fill the cores), named with its evidence, fix
and, given a target, its priced saving on the recommended plan; a clean run gets none."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time

import mlflow
import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.cli import gpuopt as cli
from mlflow_gpuopt.testing import FakeGPU, fake_nvml

TARGET = ("--epochs", "10", "--dataset-size", "1M")


class SlowDataset(torch.utils.data.Dataset):
    """Samples that take ``sleep_s`` each to "decode" on the training thread."""

    def __init__(self, n: int, d_in: int, sleep_s: float) -> None:
        self.n, self.d_in, self.sleep_s = n, d_in, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.d_in, generator=g), torch.randint(0, 8, (), generator=g)


def fit(model, opt, batches, autocast: bool = False):
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(model(x).float(), y % model_out(model))
        loss.backward()
        opt.step()
        opt.zero_grad()


def model_out(model) -> int:
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1].out_features


def mlp(d_in: int, hidden: int, d_out: int):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def tracked(model, batches, *, autocast: bool = False, **kw):
    """Train under track(); (tracker, what the exit summary printed)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    out = io.StringIO()
    with (contextlib.redirect_stdout(out),
          gpuopt.track(model, opt, interval_s=0.1, **kw) as t):
        fit(model, opt, batches, autocast)
    return t, out.getvalue()


def advise(*args):
    result = CliRunner().invoke(cli, ["advise", *args])
    assert result.exit_code == 0, result.output[-3000:] + repr(result.exc_info)
    return json.loads(result.stdout)


def by_rule(doc):
    return {f["rule"]: f for f in doc["findings"]}


def test_slow_dataloader_is_input_starvation_priced_on_the_plan(tracking_uri):
    model = mlp(64, 64, 8)  # aligned shapes, fp32, no wrapper
    # 10 ms per sample, 160 ms per step: the wait dominates the step even when a loaded
    # machine slows the (tiny) compute many times over
    loader = torch.utils.data.DataLoader(SlowDataset(16 * 14, 64, 0.01), batch_size=16)
    t, printed = tracked(model, loader)
    assert "gpuopt advice: Input pipeline starves the training step" in printed
    m = mlflow.get_run(t.run_id).data.metrics
    assert m["gpuopt/summary/input_wait_fraction"] >= 0.5  # 160 ms of sleep per step
    assert m["gpuopt/input_wait_s"] > 0.1
    doc = advise("--run-id", t.run_id, *TARGET, "--json")
    found = by_rule(doc)
    wait = found["input_wait"]
    ev = {e["name"]: e["value"] for e in wait["evidence"]}
    assert ev["gpuopt/summary/input_wait_fraction"] == pytest.approx(
        m["gpuopt/summary/input_wait_fraction"], rel=1e-3)
    assert "num_workers" in wait["fix"] and "pin_memory=True" in wait["fix"]
    assert wait["hours_saved"] > 0 and wait["usd_saved"] > 0
    # ~10 ms of waiting per sample over 10M samples: thousands of hours, the largest saving
    assert doc["findings"][0]["rule"] == "input_wait"
    usd = [f["usd_saved"] for f in doc["findings"] if f["usd_saved"] is not None]
    assert usd == sorted(usd, reverse=True)
    # fp32 without autocast: the precision rule is about the plan's GPU; a 64-wide MLP's
    # step is bound by kernel launches, which autocast's casts add to, so it is advised only
    # where the plan's prediction prices it as a saving
    if "precision_amp" in found:
        amp = found["precision_amp"]
        assert doc["plan"]["gpu"] in amp["title"] and "torch.autocast" in amp["fix"]
        assert amp["hours_saved"] >= 0
    else:
        (amp,) = [x for x in doc["not_evaluated"] if x["rule"] == "precision_amp"]
        assert doc["plan"]["gpu"] in amp["reason"] and "slower" in amp["reason"]
    # the savings are measured from the script as it runs now on the plan's offer: printed
    base = doc["plan"]["baseline"]
    assert base["precision"] == "fp32"  # the script's, not the plan's
    assert base["hours"] > 0 and base["cost_usd"] > 0
    # a fix saves part of the time it runs now
    assert "hours_saved" not in amp or base["hours"] > amp["hours_saved"]
    text = CliRunner().invoke(cli, ["advise", "--run-id", t.run_id, *TARGET, "--no-log"])
    assert text.exit_code == 0, text.output[-3000:]
    assert (f"Savings are measured from the script as it runs now on that plan (fp32, "
            f"micro-batch {base['micro_batch']} × accumulation {base['grad_accum']}): "
            f"{base['hours']:,.1f} h") in text.output
    assert "gemm_shapes" not in found and "data_parallel" not in found
    logged = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/advice.json")
    assert logged == json.loads(json.dumps(doc)) and logged["schema"] == "gpuopt.advice/1"
    # recommend carries the same advice, priced on its winner, into its report
    result = CliRunner().invoke(cli, ["recommend", "--run-id", t.run_id, *TARGET, "--json"])
    assert result.exit_code == 0, result.output[-3000:]
    rec = json.loads(result.stdout)
    assert rec["advice"]["findings"][0]["rule"] == "input_wait"
    html = mlflow.artifacts.load_text(f"runs:/{rec['mlflow_run_id']}/gpuopt/report.html")
    assert "<ol id='advice'>" in html and "Input pipeline starves" in html


def test_odd_matmul_shapes_are_a_shape_finding(tracking_uri):
    model = nn.Sequential(nn.Linear(1000, 1001))
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 1000, generator=gen), torch.randint(0, 1001, (16,),
                                                                    generator=gen))
               for _ in range(6)]
    t, printed = tracked(model, batches)
    assert (16, 1000, 1001) in t.profile.gemm_shapes
    profile = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    assert [16, 1000, 1001] in profile["gemm_shapes"]
    doc = advise("--run-id", t.run_id, "--json", "--no-log")
    shape = by_rule(doc)["gemm_shapes"]
    assert "1001" in shape["evidence"][0]["text"] and "1001 -> 1024" in shape["fix"]
    assert shape["hours_saved"] is None  # no target: not priced
    assert any("give a target" in n for n in doc["notes"])
    listed = [f.path for f in mlflow.MlflowClient().list_artifacts(t.run_id, "gpuopt")]
    assert "gpuopt/advice.json" not in listed  # --no-log wrote nothing


def test_data_parallel_wrapper_is_a_parallelism_finding(tracking_uri):
    model = nn.DataParallel(mlp(32, 64, 8))  # on a CPU it calls the module as is
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 32, generator=gen), torch.randint(0, 8, (16,), generator=gen))
               for _ in range(6)]
    t, _ = tracked(model, batches)
    assert mlflow.get_run(t.run_id).data.params["gpuopt.model_wrapper"] == "DataParallel"
    doc = advise("--run-id", t.run_id, *TARGET, "--json", "--no-log")
    dp = by_rule(doc)["data_parallel"]
    assert dp["evidence"][0] == {"name": "gpuopt.model_wrapper", "value": "DataParallel",
                                 "text": "the tracked model is an nn.DataParallel"}
    assert "DistributedDataParallel" in dp["fix"]
    assert dp["hours_saved"] is not None  # priced (0 on a one-GPU plan, with the reason)
    if doc["plan"]["gpus"] == 1:
        assert dp["hours_saved"] == 0 and "one GPU" in dp["worth_note"]


def test_clean_run_has_no_finding_for_those_rules(tracking_uri):
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 64))
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(128, 512, generator=gen),
                torch.randint(0, 64, (128,), generator=gen)) for _ in range(12)]
    t, printed = tracked(model, batches, autocast=True)  # bf16 autocast
    assert t.profile.precision == "bf16"
    assert mlflow.get_run(t.run_id).data.params["gpuopt.model_wrapper"] == "none"
    doc = advise("--run-id", t.run_id, *TARGET, "--json", "--no-log")
    found = by_rule(doc)
    for rule in ("input_wait", "gemm_shapes", "data_parallel", "precision_amp",
                 "precision_tf32", "precision_fp8", "gpu_idle_cpu_busy"):
        assert rule not in found, found.get(rule)
    skipped = {x["rule"]: x["reason"] for x in doc["not_evaluated"]}
    assert "no GPU readings" in skipped["gpu_idle_cpu_busy"]
    assert "Input pipeline" not in printed


def test_idle_gpu_with_busy_loader_workers_with_fake_nvml(tracking_uri):
    """A fake NVML GPU at 15% utilisation; DataLoader workers burn every core decoding."""
    cores = os.cpu_count() or 2

    def busy_collate(items):
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:  # a CPU-bound decode
            pass
        return torch.utils.data.default_collate(items)

    loader = torch.utils.data.DataLoader(SlowDataset(8 * 30 * cores, 32, 0.0), batch_size=8,
                                         num_workers=cores, collate_fn=busy_collate)
    with fake_nvml([FakeGPU(utilization_percent=15)]):
        t, _ = tracked(mlp(32, 64, 8), loader)
    m = mlflow.get_run(t.run_id).data.metrics
    assert m["gpuopt/summary/gpu_utilization_percent"] == 15.0
    assert m["gpuopt/summary/cpu_utilization_percent"] >= 80.0
    doc = advise("--run-id", t.run_id, "--json", "--no-log")
    idle = by_rule(doc)["gpu_idle_cpu_busy"]
    ev = {e["name"]: e["value"] for e in idle["evidence"]}
    assert ev["gpuopt/summary/gpu_utilization_percent"] == 15.0
    assert ev["gpuopt/cpu_utilization_percent"] >= 80.0
    assert "num_workers" in idle["fix"]
    # a GPU the catalog knows: the precision rule judges the measured A100 unpriced
    assert "precision_amp" in by_rule(doc)


@pytest.mark.parametrize("args, says", [
    (["--run-id", "no-such-run"], "unknown run id"),
    (["--run-id", "{run}", "--deadline", "24h"], "--deadline needs a target"),
    (["--run-id", "{run}", "--epochs", "3"], "--epochs needs --dataset-size"),
    (["--run-id", "{run}", "--deadline", "soon", "--samples", "1M"], "--deadline"),
    (["--run-id", "{bare}"], "has no gpuopt data"),
    (["--run-id", ""], "empty"),
])
def test_bad_input_is_one_line_and_exit_2(tracking_uri, args, says):
    with mlflow.start_run() as bare:
        mlflow.log_param("lr", 0.1)
    with mlflow.start_run() as run:
        mlflow.log_param("gpuopt.device", "cpu")
    argv = [a.format(run=run.info.run_id, bare=bare.info.run_id) for a in args]
    result = CliRunner().invoke(cli, ["advise", *argv])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.stderr
    for r in (bare, run):
        listed = [f.path for f in mlflow.MlflowClient().list_artifacts(r.info.run_id,
                                                                       "gpuopt")]
        assert "gpuopt/advice.json" not in listed



def _example_run(tmp_path, experiment: str, *args) -> str:
    """Train ``examples/train_tiny_gpt.py`` into the test's store, experiment
    ``experiment``; its run id."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MLFLOW_EXPERIMENT_NAME": experiment}
    out = subprocess.run([sys.executable, str(repo / "examples" / "train_tiny_gpt.py"),
                          "--steps", "8", *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run.info.run_id


def test_example_as_shipped_and_its_fp32_variant(tracking_uri, tmp_path):
    """The tiny-GPT example (bf16 autocast, aligned sizes) gets no precision, shape or input
    finding; run in fp32 it gets the precision finding, priced on the plan's GPU."""
    doc = advise("--run-id", _example_run(tmp_path, "shipped"), "--tokens", "2B", "--json",
                 "--no-log")
    assert doc["plan"] is not None
    clean = by_rule(doc)
    for rule in ("input_wait", "gemm_shapes", "data_parallel", "precision_amp"):
        assert rule not in clean
    for f in doc["findings"]:
        assert f["evidence"] and f["fix"] and f["worth_note"] is not None
    doc = advise("--run-id", _example_run(tmp_path, "fp32", "--precision", "fp32"),
                 "--tokens", "2B", "--json", "--no-log")
    # the tiny GPT's step is bound by kernel launches, which autocast's casts add to: the
    # precision rule is a finding only where the plan's prediction prices it as a saving
    if "precision_amp" in by_rule(doc):
        amp = by_rule(doc)["precision_amp"]
        assert amp["evidence"][0]["value"] == "fp32" and doc["plan"]["gpu"] in amp["title"]
        assert amp["hours_saved"] is not None and amp["hours_saved"] >= 0
    else:
        (amp,) = [x for x in doc["not_evaluated"] if x["rule"] == "precision_amp"]
        assert amp["reason"].startswith("fp32 on a") and "h slower" in amp["reason"]
