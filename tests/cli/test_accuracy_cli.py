"""``mlflow gpuopt accuracy`` on a sqlite store holding runs with known values.

A recommendation run carries a hand-written ``gpuopt/recommendation.json``; job runs carry
``gpuopt.plan`` and a measured throughput; the ledger's numbers are checked against the ones
computed by hand here.
"""

from __future__ import annotations

import json

import pytest
from support.sqlite_store import sqlite_uri
from click.testing import CliRunner

from mlflow_gpuopt import contract
from mlflow_gpuopt.cli import gpuopt

CANDIDATE = {"rank": 1, "provider": "aws", "instance_type": "p4d.24xlarge",
             "gpu": "A100-40GB-SXM4", "nodes": 1, "gpus": 8, "gpus_per_node": 8,
             "strategy": "ddp", "micro_batch": 16, "grad_accum": 1, "precision": "bf16",
             "throughput_samples_per_s": 1000.0, "throughput_low_samples_per_s": 800.0,
             "throughput_high_samples_per_s": 1250.0, "step_time_s": 0.128,
             "memory_per_gpu_bytes": 2e10, "predicted_hours": 10.5,
             "predicted_hours_low": 8.5, "predicted_hours_high": 13.0,
             "predicted_cost_usd": 210.0, "startup_hours": 0.5, "overhead_hours": 0.0}


@pytest.fixture
def store(tmp_path, monkeypatch):
    import mlflow

    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("ledger")
    client.create_experiment("empty")
    rec = client.create_run(exp, tags={contract.TAG_KIND: contract.KIND_RECOMMENDATION})
    second = dict(CANDIDATE, rank=2, throughput_samples_per_s=2000.0,
                  throughput_low_samples_per_s=1900.0, throughput_high_samples_per_s=2100.0)
    client.log_dict(rec.info.run_id, {"target": {"total_samples": 3.6e7},
                                      "source_run_ids": ["no-such-run"],
                                      "candidates": [CANDIDATE, second]},
                    contract.RECOMMENDATION_JSON)
    rid = rec.info.run_id
    jobs = {}
    for name, plan, thr in (("a", f"{rid}:1", 900.0), ("b", f"{rid}:1", 700.0),
                            ("c", f"{rid}:2", 3000.0)):
        run = client.create_run(exp, run_name=name, tags={contract.TAG_PLAN: plan,
                                                          contract.TAG_TRACKED: "true"})
        client.log_metric(run.info.run_id, contract.SUMMARY_THROUGHPUT_SAMPLES, thr)
        jobs[name] = run.info.run_id
    # a job whose plan names no recommendation: a note, not a pair
    other = client.create_run(exp, tags={contract.TAG_PLAN: "nosuchrun:1"})
    client.log_metric(other.info.run_id, contract.SUMMARY_THROUGHPUT_SAMPLES, 5.0)
    # a job without a plan is not in the ledger
    plain = client.create_run(exp, tags={contract.TAG_TRACKED: "true"})
    client.log_metric(plain.info.run_id, contract.SUMMARY_THROUGHPUT_SAMPLES, 5.0)
    return rid, jobs, other.info.run_id


def _run(*args):
    return CliRunner().invoke(gpuopt, list(args), catch_exceptions=False)


def test_ledger_numbers_match_the_hand_computed_ones(store):
    rid, jobs, other = store
    out = _run("accuracy", "--experiment", "ledger", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    by_run = {p["run_id"]: p for p in doc["pairs"]}
    assert set(by_run) == set(jobs.values())
    a, b, c = (by_run[jobs[k]] for k in "abc")
    assert a["error"] == pytest.approx(-0.1) and a["covered"] is True
    assert b["error"] == pytest.approx(-0.3) and b["covered"] is False
    assert c["error"] == pytest.approx(0.5) and c["covered"] is False
    assert a["measured_hours"] == pytest.approx(0.5 + 3.6e7 / 900 / 3600)  # 11.611 h
    assert a["measured_cost_usd"] == pytest.approx(210 * (0.5 + 1e4 / 900) / 10.5)
    assert a["predicted_hours"] == 10.5 and a["predicted_cost_usd"] == 210.0
    t = doc["totals"]["plan"]
    assert t["pairs"] == 3
    assert t["median_abs_error"] == pytest.approx(0.3)
    assert t["p90_abs_error"] == pytest.approx(0.3 + 0.8 * 0.2)
    assert t["coverage"] == pytest.approx(1 / 3)
    # the recommendation's source run does not exist: no refit, said per pair
    assert doc["totals"]["refit"]["pairs"] == 0
    assert all("unknown run id" in p["refit_note"] for p in doc["pairs"])
    assert any(other in n and "nosuchrun" in n for n in doc["notes"])


def test_ledger_table(store):
    out = _run("accuracy", "--experiment", "ledger")
    assert out.exit_code == 0, out.output
    assert "Plans as predicted: 3 pair(s), median |error| 30.0%, p90 |error| 46.0%, 90% " \
           "interval covered 33%" in out.output
    assert "-10%" in out.output and "+50%" in out.output


@pytest.mark.parametrize("args, message", [
    (["--experiment", "nope"], "no MLflow experiment named 'nope'"),
    (["--experiment", "empty"], "has no runs launched as a plan"),
    (["--experiment", ""], "--experiment is empty"),
    ([], "Missing option '--experiment'"),
])
def test_bad_input_is_one_line_and_exit_2(store, args, message):
    out = CliRunner().invoke(gpuopt, ["accuracy", *args])
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.output
