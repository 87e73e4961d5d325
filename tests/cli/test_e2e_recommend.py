"""End to end on CPU, as a user would: train with tracking, then recommend on that run.

A real example trains for a few steps into a sqlite MLflow store; ``mlflow-gpuopt recommend``
runs on its run id as a subprocess; the JSON, the table and the MLflow artifacts are checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A sqlite store with one tracked tiny-GPT run; yields (env, run_id)."""
    tmp = tmp_path_factory.mktemp("e2e")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    out = subprocess.run([sys.executable, str(REPO / "examples" / "train_tiny_gpt.py"),
                          "--steps", "8"], cwd=tmp, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("gpuopt-examples")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    return env, runs[0].info.run_id, client


def _cli(env, *args, timeout=300):
    return subprocess.run([str(BIN / "mlflow-gpuopt"), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _all_runs(client):
    return [r for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id])]


def test_recommend_json_and_mlflow_artifacts(store):
    env, run_id, client = store
    out = _cli(env, "recommend", "--run-id", run_id, "--tokens", "2B", "--deadline", "24h",
               "--top", "10", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert set(doc) >= {"target", "candidates", "pareto"}
    assert doc["target"]["deadline_hours"] == 24.0
    assert doc["target"]["total_samples"] == pytest.approx(2e9 / 64)  # 64-token samples
    cands = doc["candidates"]
    assert 1 <= len(cands) <= 10
    keys = {"rank", "provider", "instance_type", "gpu", "nodes", "gpus", "strategy",
            "micro_batch", "grad_accum", "precision", "pricing", "throughput_samples_per_s",
            "predicted_hours", "predicted_hours_low", "predicted_hours_high",
            "predicted_cost_usd", "cost_low_usd", "cost_high_usd", "p_meets_deadline",
            "meets_deadline", "why", "launch"}
    for c in cands:
        assert keys <= set(c)
        assert c["launch"].startswith("torchrun --nnodes ")
    meeting = [c for c in cands if c["meets_deadline"]]
    assert meeting and meeting == cands[:len(meeting)]
    costs = [c["predicted_cost_usd"] for c in meeting]
    assert costs == sorted(costs)
    assert all(c["p_meets_deadline"] >= 0.9 for c in meeting)
    assert cands[0]["predicted_hours"] < 24
    # the source run is bf16 (tiny GPT on CPU): no plan may use a GPU without bf16
    assert all(not c["gpu"].startswith(("V100", "T4")) for c in cands)

    rec_run = client.get_run(doc["mlflow_run_id"])
    assert rec_run.data.tags["mlflow.parentRunId"] == run_id
    assert rec_run.data.metrics["predicted_cost_usd"] == pytest.approx(
        cands[0]["predicted_cost_usd"])
    files = {f.path for f in client.list_artifacts(rec_run.info.run_id, "gpuopt")}
    assert {"gpuopt/recommendation.json", "gpuopt/candidates_table.json", "gpuopt/pareto.png",
            "gpuopt/scaling.png", "gpuopt/report.html"} <= files
    local = Path(client.download_artifacts(rec_run.info.run_id, "gpuopt"))
    assert (local / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    html = (local / "report.html").read_text()
    assert "data:image/png;base64," in html and "<table id=\"candidates\"" in html
    assert "<script" not in html and "http://" not in html and "https://" not in html
    logged = json.loads((local / "recommendation.json").read_text())
    assert logged["candidates"][0]["launch"] == cands[0]["launch"]
    table = json.loads((local / "candidates_table.json").read_text())
    assert len(table["data"]) == len(cands)
    children = client.search_runs(
        [rec_run.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{rec_run.info.run_id}'")
    assert len(children) == min(5, len(cands))
    by_rank = {int(c.data.params["rank"]): c for c in children}
    assert by_rank[1].data.params["instance_type"] == cands[0]["instance_type"]
    assert by_rank[1].data.metrics["predicted_hours"] == pytest.approx(
        cands[0]["predicted_hours"])
    assert {"provider", "gpus", "strategy", "precision"} <= set(by_rank[1].data.params)
    assert {"predicted_cost_usd", "p_meets_deadline",
            "throughput_samples_per_s"} <= set(by_rank[1].data.metrics)


def test_table_output_and_no_log(store, monkeypatch):
    env, run_id, client = store
    before = len(_all_runs(client))
    from mlflow_gpuopt.cli import gpuopt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    res = CliRunner().invoke(gpuopt, ["recommend", "--run-id", run_id, "--steps", "50k",
                                      "--deadline", "2d", "--provider", "aws", "--no-spot",
                                      "--top", "5", "--no-log"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("#"))
    for col in ("provider", "instance × nodes", "GPUs", "strategy", "mb × accum", "prec",
                "hours (low–high)", "cost (low–high)", "P(deadline)"):
        assert col in header
    rows = [line for line in lines if line.strip()[:2].strip().isdigit()]
    assert len(rows) == 5 and all(" aws " in r and "on-demand" in r for r in rows)
    assert "Recommended:" in res.output and "Launch: torchrun" in res.output
    assert len(_all_runs(client)) == before  # --no-log wrote nothing
    res = CliRunner().invoke(gpuopt, ["recommend", "--run-id", run_id, "--steps", "50k",
                                      "--no-log", "--json", "--top", "1"])
    assert res.exit_code == 0, res.output
    params = client.get_run(run_id).data.params  # one CPU rank: global batch = mb × accum
    batch = int(params["gpuopt.micro_batch"]) * int(params.get("gpuopt.grad_accum", "1"))
    assert json.loads(res.output)["target"]["total_samples"] == pytest.approx(50_000 * batch)


def test_nothing_meets_the_deadline_exits_0_with_fastest_and_cheapest(store, monkeypatch):
    env, run_id, client = store
    from mlflow_gpuopt.cli import gpuopt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    res = CliRunner().invoke(gpuopt, ["recommend", "--run-id", run_id, "--tokens", "10T",
                                      "--deadline", "1m", "--no-log", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["meets_deadline"] is False and doc["winner"] is None
    assert doc["fastest"]["predicted_hours"] > 1 / 60
    assert doc["cheapest"]["predicted_cost_usd"] <= doc["fastest"]["predicted_cost_usd"]
    assert not any(c["meets_deadline"] for c in doc["candidates"])
    res = CliRunner().invoke(gpuopt, ["recommend", "--run-id", run_id, "--tokens", "10T",
                                      "--deadline", "1m", "--no-log"])
    assert res.exit_code == 0
    assert "no plan meets the 1 min deadline" in res.output
    assert "Fastest:" in res.output and "Cheapest:" in res.output


@pytest.mark.parametrize(("args", "message"), [
    (["--run-id", "0123456789abcdef0123456789abcdef", "--samples", "1M"], "unknown run id"),
    (["--run-id", "{run}", "--samples", "lots"], "cannot read --samples"),
    (["--run-id", "{run}", "--samples", "1M", "--deadline", "soon"], "cannot read --deadline"),
    (["--run-id", "{run}", "--samples", "1M", "--epochs", "3"], "exactly one target"),
    (["--run-id", "{run}", "--epochs", "3"], "--dataset-size"),
    (["--run-id", "{run}"], "exactly one target"),
    (["--run-id", "{run}", "--experiment", "x", "--samples", "1"], "not both"),
    (["--samples", "1M"], "--run-id ID or --experiment NAME"),
    (["--run-id", "{run}", "--samples", "1M", "--provider", "lambda", "--region", "mars-1"],
     "no catalog offers in region mars-1"),
    (["--run-id", "{run}", "--samples", "1M", "--provider", "colab", "--spot"],
     "no catalog offers for provider colab, spot"),
    (["--run-id", "{plain}", "--samples", "1M"], "no gpuopt data"),
    (["--experiment", "no-such-experiment", "--samples", "1M"], "no MLflow experiment"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(store, args, message):
    env, run_id, client = store
    import mlflow

    plain = client.create_run(client.get_experiment_by_name("gpuopt-examples").experiment_id)
    client.set_terminated(plain.info.run_id)
    before = len(_all_runs(client))
    argv = [a.format(run=run_id, plain=plain.info.run_id) for a in args]
    out = _cli(env, "recommend", *argv)
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = [line for line in out.stderr.splitlines() if line.strip()]
    assert err[-1].startswith("Error:") and message in err[-1]
    assert "Traceback" not in out.stderr
    assert len(_all_runs(client)) == before
    client.delete_run(plain.info.run_id)
    del mlflow


def test_recommend_by_experiment_and_compare(store, monkeypatch):
    env, run_id, client = store
    from mlflow_gpuopt.cli import gpuopt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    res = CliRunner().invoke(gpuopt, ["recommend", "--experiment", "gpuopt-examples",
                                      "--samples", "1e7", "--no-log", "--json", "--top", "3"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["source_run_ids"] == [run_id]
    res = CliRunner().invoke(gpuopt, ["compare", "--experiment", "gpuopt-examples",
                                      "--dataset-size", "1M"])
    assert res.exit_code == 0, res.output
    assert "CPU run: no catalog price" in res.output and "samples/s" in res.output
    res = CliRunner().invoke(gpuopt, ["compare", "--run-id", run_id, "--json"])
    rows = json.loads(res.output)
    assert rows[0]["device"] == "cpu" and rows[0]["throughput_samples_per_s"] > 0
    assert rows[0]["usd_per_million_samples"] is None


def test_compare_prices_gpu_runs_from_the_catalog():
    from mlflow_gpuopt.catalog import load_catalog
    from mlflow_gpuopt.cli.compare import compare_rows
    from mlflow_gpuopt.mlflow_io.measured import MeasuredRun

    cat = load_catalog()
    run = MeasuredRun("r1", "a100", "NVIDIA A100-SXM4-80GB", 8, 1, 8, "ddp", "bf16", 64,
                      25_000_000, 2.4e10, 16000.0, 0.41, 0.03, 3e10, 0)
    row = compare_rows([run], cat, 1_281_167)[0]
    per_gpu = min(o.price_per_gpu_hour_usd for o in cat.offers
                  if o.gpu == "A100-80GB-SXM4" and o.pricing == "on_demand")
    assert row["price_per_gpu_hour_usd"] == pytest.approx(per_gpu)
    assert row["usd_per_million_samples"] == pytest.approx(per_gpu * 8 / (16000 * 3600) * 1e6)
    assert row["usd_per_epoch"] == pytest.approx(per_gpu * 8 * 1_281_167 / 16000 / 3600)


def test_real_model_never_places_a_too_large_model_on_v100_16gb_with_ddp():
    """Real catalog, real fitted model: a 1.5B-parameter fp16 model does not fit 16 GB
    with DDP (16 bytes/param = 24 GB of model states), so V100-16GB only appears sharded."""
    from mlflow_gpuopt.catalog import load_catalog
    from mlflow_gpuopt.hardware import hardware_for_gpu
    from mlflow_gpuopt.perfmodel import Observation, Workload, fit
    from mlflow_gpuopt.recommend import Target, recommend

    cat = load_catalog()
    workload = Workload(params=1_500_000_000, flops_per_sample=6 * 1.5e9 * 1024,
                        precision="fp16", name="gpt-1.5b", micro_batch=8, optimizer="AdamW",
                        tokens_per_sample=1024, num_layers=48, hidden_size=1600)
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=8, throughput_samples_per_s=60.0,
                       micro_batch=8, strategy="ddp", precision="fp16")]
    hw = {"A100-80GB-SXM4": hardware_for_gpu(cat.gpus["A100-80GB-SXM4"], gpus_per_node=8)}
    predictor = fit(workload, obs, hw)
    rec = recommend(predictor, workload, cat.offers, cat.gpus,
                    Target(1e7, deadline_hours=None, per_rank_batch=8),
                    hardware_for=lambda s, o: hardware_for_gpu(s, gpus_per_node=o.gpu_count,
                                                               offer=o))
    assert rec.candidates
    assert any(o.gpu == "V100-SXM2-16GB" for o in cat.offers)
    for c in rec.candidates:
        assert c.prediction.fits
        assert c.prediction.memory.total_bytes <= c.prediction.memory_capacity_bytes
        if c.offer.gpu == "V100-SXM2-16GB":
            assert c.config.strategy not in ("ddp", "single"), c.launch
    ddp_on_v100 = predictor.predict(
        replace(rec.candidates[0].config, gpus_per_node=8, nodes=1, strategy="ddp",
                micro_batch=1, grad_accum=8, tp=1, pp=1, precision="fp16"),
        hardware_for_gpu(cat.gpus["V100-SXM2-16GB"], gpus_per_node=8))
    assert not ddp_on_v100.fits  # the case the recommender had to leave out
