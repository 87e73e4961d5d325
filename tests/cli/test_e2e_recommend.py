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
from support.skypilot import skypilot_check

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tiny_gpt_run, tmp_path_factory):
    """A sqlite store with one tracked tiny-GPT run; yields (env, run_id)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MLFLOW_TRACKING_URI": tiny_gpt_run.store_in(tmp_path_factory.mktemp("e2e")),
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
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


def test_plans_keep_the_global_batch_unless_asked(store, monkeypatch):
    env, run_id, client = store
    from mlflow_gpuopt.cli import gpuopt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    params = client.get_run(run_id).data.params  # one CPU rank: global batch = mb × accum
    measured = int(params["gpuopt.micro_batch"]) * int(params.get("gpuopt.grad_accum", "1"))

    def doc(*extra):
        res = CliRunner().invoke(gpuopt, ["recommend", "--run-id", run_id, "--steps", "1000",
                                          "--no-log", "--json", "--top", "50", *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    kept = doc()
    assert kept["batch_policy"] == {"global_batch": measured, "mode": "kept",
                                    "per_rank_batch": None}
    assert {c["global_batch"] for c in kept["candidates"]} == {measured}
    assert any(c["gpus"] > 1 for c in kept["candidates"])
    assert any(line.startswith(f"Batch: global batch {measured} ")
               for line in kept["explanation"])
    for c in kept["candidates"]:
        ranks = c["gpus"] // (c["tp"] * c["pp"])
        assert c["micro_batch"] * c["grad_accum"] * ranks == measured
    asked = doc("--global-batch", str(4 * measured))
    assert asked["batch_policy"]["mode"] == "set"
    assert {c["global_batch"] for c in asked["candidates"]} == {4 * measured}
    assert asked["target"]["total_samples"] == pytest.approx(1000 * 4 * measured)
    per_gpu = doc("--keep-micro-batch")
    assert per_gpu["batch_policy"] == {"global_batch": None, "mode": "per-gpu",
                                       "per_rank_batch": measured}
    for c in per_gpu["candidates"]:
        assert c["micro_batch"] * c["grad_accum"] == measured


def test_colab_pay_as_you_go_costs_whole_packs_of_100_cu(store, monkeypatch):
    """A small job on the shipped catalog: Colab pay-as-you-go sells 100 CU for $9.99 at
    least, so no plan costs cents for a fraction of a CU."""
    env, run_id, client = store
    from mlflow_gpuopt.cli import gpuopt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    res = CliRunner().invoke(gpuopt, ["recommend", "--run-id", run_id, "--samples", "2000",
                                      "--provider", "colab", "--no-log", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    payg = [c for c in doc["candidates"] if c["instance_type"].startswith("colab-payg")]
    assert payg
    for c in payg:
        assert c["predicted_cost_usd"] == pytest.approx(9.99)
        assert c["cost_low_usd"] == pytest.approx(9.99)
        assert "bought as 1 pack of 100 CU × $9.99" in c["cost_basis"]
        assert c["cost_basis"] in c["why"]
    assert all(c["predicted_cost_usd"] >= 9.99 - 1e-9 for c in doc["candidates"])
    assert any(line.startswith("Cost: ") and "$9.99" in line for line in doc["explanation"])


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
    (["--run-id", "{run}", "--samples", "1M", "--global-batch", "32", "--keep-micro-batch"],
     "--global-batch N or --keep-micro-batch, not both"),
    (["--run-id", "{run}", "--samples", "1M", "--global-batch", "0"], "--global-batch"),
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


def test_emit_torchrun_names_every_plan_and_writes_the_winner_once(store, tmp_path):
    env, run_id, client = store
    before = len(_all_runs(client))
    script = tmp_path / "launch.sh"
    args = ("recommend", "--run-id", run_id, "--tokens", "2B", "--deadline", "24h", "--top",
            "8", "--json", "--emit", "torchrun", "--out", str(script))
    out = _cli(env, *args)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    rec_id, cands = doc["mlflow_run_id"], doc["candidates"]
    assert [c["plan_id"] for c in cands] == [f"{rec_id}:{i}" for i in range(1, len(cands) + 1)]
    assert doc["winner"]["plan_id"] == f"{rec_id}:1"
    children = client.search_runs([client.get_run(rec_id).info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{rec_id}'")
    by_rank = {int(c.data.params["rank"]): c.info.run_id for c in children}
    assert {c["rank"]: c["plan_run_id"] for c in cands if "plan_run_id" in c} == by_rank
    win = cands[0]
    assert doc["emitted"] == {"kind": "torchrun", "path": str(script), "rank": 1,
                              "plan_id": f"{rec_id}:1", "notes": [],
                              "script": client.get_run(run_id).data.tags["mlflow.source.name"]}
    text = script.read_text()
    assert script.stat().st_mode & 0o111
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    for line in (f"NNODES={win['nodes']}", f"NPROC_PER_NODE={win['gpus_per_node']}",
                 f"GPUOPT_PLAN={rec_id}:1", f"GPUOPT_MICRO_BATCH={win['micro_batch']}",
                 f"GPUOPT_GRAD_ACCUM={win['grad_accum']}", f"GPUOPT_PRECISION={win['precision']}",
                 f"GPUOPT_STRATEGY={win['strategy']}",
                 f"MLFLOW_TRACKING_URI=${{MLFLOW_TRACKING_URI:-{env['MLFLOW_TRACKING_URI']}}}",
                 "MLFLOW_EXPERIMENT_NAME=${MLFLOW_EXPERIMENT_NAME:-gpuopt-examples}",
                 f"SCRIPT=${{GPUOPT_SCRIPT:-{REPO / 'examples' / 'train_tiny_gpt.py'}}}"):
        assert line in text.splitlines(), line
    assert len(_all_runs(client)) == before + 1 + len(children)
    # the file exists: a second emit is refused before anything is read or logged
    again = _cli(env, *args)
    assert again.returncode == 2 and "exists; pass --force" in again.stderr
    assert script.read_text() == text and len(_all_runs(client)) == before + 1 + len(children)
    forced = _cli(env, *args, "--force", "--plan", "2")
    assert forced.returncode == 0, forced.stderr[-2000:]
    doc2 = json.loads(forced.stdout)
    assert f"GPUOPT_PLAN={doc2['mlflow_run_id']}:2" in script.read_text().splitlines()
    assert [p.name for p in tmp_path.iterdir()] == ["launch.sh"]  # no temporary left


def test_emit_script_path_not_utf8_is_one_line(store, tmp_path):
    """A ``--script`` path with a byte that is not UTF-8 (argv keeps it as a surrogate) is one
    line and exit 2, nothing written (it was a traceback)."""
    env, run_id, client = store
    before = len(_all_runs(client))
    path = tmp_path / "plan.sh"
    res = subprocess.run(
        [str(BIN / "mlflow"), "gpuopt", "recommend", "--run-id", run_id, "--steps", "50k",
         "--no-log", "--emit", "torchrun", "--plan", "1", "--out", str(path), "--script",
         os.fsdecode(b"train_\xff.py")], env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert "--script" in lines[0] and "Traceback" not in res.stderr
    assert not path.exists() and len(_all_runs(client)) == before


def test_emit_text_output_and_no_log_plan_ids(store, tmp_path, monkeypatch):
    env, run_id, client = store
    from mlflow_gpuopt.cli import gpuopt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    before = len(_all_runs(client))
    path = tmp_path / "plan.sh"
    res = CliRunner().invoke(gpuopt, ["recommend", "--run-id", run_id, "--steps", "50k",
                                      "--no-log", "--top", "3", "--emit", "torchrun",
                                      "--plan", "3", "--script", "my_train.py", "--out",
                                      str(path)])
    assert res.exit_code == 0, res.output
    assert "Plan ids: the rank (not logged), e.g. #1 = 1" in res.output
    assert f"Wrote the torchrun launch artefact of plan 3 to {path}" in res.output
    lines = path.read_text().splitlines()
    assert "GPUOPT_PLAN=3" in lines and "SCRIPT=${GPUOPT_SCRIPT:-my_train.py}" in lines
    assert len(_all_runs(client)) == before


@pytest.mark.parametrize("args, message", [
    (["--emit", "torchrun", "--plan", "0"], "--plan 0: plans are ranked from 1"),
    (["--emit", "torchrun", "--plan", "4", "--top", "3"], "beyond the 3 plans shown"),
    (["--plan", "2"], "--plan: only with --emit"),
    (["--emit", "torchrun", "--out", "{tmp}/no/such/x.sh"], "does not exist"),
    (["--emit", "torchrun", "--out", "{tmp}/file.txt/x.sh"], "is not a directory"),
    (["--emit", "torchrun", "--out", "{tmp}"], "is a directory"),
    (["--emit", "skypilot", "--provider", "colab"], "colab plan: SkyPilot cannot launch"),
    (["--emit", "torchrun", "--provider", "lambda", "--max-gpus", "1", "--plan", "20"],
     "ranked plan(s)"),
    (["--emit", "ray"], "'ray' is not one of"),
])
def test_emit_bad_input_is_one_line_exit_2_and_writes_nothing(store, tmp_path, args, message):
    env, run_id, client = store
    (tmp_path / "file.txt").write_text("keep me")
    before = len(_all_runs(client))
    argv = [a.format(tmp=tmp_path) for a in args]
    out = subprocess.run([str(BIN / "mlflow-gpuopt"), "recommend", "--run-id", run_id,
                          "--samples", "1e7", *argv], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("Error:") and message in err[0], err
    assert len(_all_runs(client)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]
    assert (tmp_path / "file.txt").read_text() == "keep me"


def test_emit_skypilot_task_is_accepted_by_skypilot(store, tmp_path):
    env, run_id, client = store
    task = tmp_path / "task.yaml"
    out = subprocess.run([str(BIN / "mlflow-gpuopt"), "recommend", "--run-id", run_id,
                          "--tokens", "20B", "--provider", "aws", "--top", "5", "--json",
                          "--emit", "skypilot", "--out", str(task)],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    win = doc["candidates"][0]
    got = skypilot_check("task", str(task))
    assert got["instance_type"] == win["instance_type"] and got["cloud"] == "aws"
    assert got["num_nodes"] == win["nodes"] and got["use_spot"] is (win["pricing"] == "spot")
    assert sum(got["accelerators"].values()) * win["nodes"] == win["gpus"]
    assert got["envs"]["GPUOPT_PLAN"] == f"{doc['mlflow_run_id']}:1"
    assert got["envs"]["GPUOPT_SCRIPT"] == "examples/train_tiny_gpt.py"  # inside the workdir
    assert any("local to this machine" in n for n in doc["emitted"]["notes"])
