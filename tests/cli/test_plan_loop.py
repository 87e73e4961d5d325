"""The loop on CPU, as a user runs it: measure -> recommend -> launch -> verify.

The tiny GPT trains into a sqlite store; ``recommend --emit torchrun --plan K`` writes the
launch script of a 2-GPU plan; the script starts the example under ``torchrun`` (2 CPU
processes, gloo) with the plan id in its environment; the job's run carries the plan's tags,
its predicted series and the measured/predicted ratios, the plan's child run points back at
the job, ``mlflow gpuopt accuracy`` prints the pair, and ``recommend --experiment`` fits the
job as one more measurement. A job without a plan is unchanged; a plan that cannot be read is
one warning and training goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.ports import free_port
from support.sqlite_store import sqlite_uri

from mlflow_gpuopt import contract

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow
TARGET = ("--tokens", "2B", "--max-nodes", "1", "--max-gpus", "2", "--keep-micro-batch",
          "--provider", "lambda", "--top", "10")


def _cli(env, *args):
    out = subprocess.run([str(BIN / "mlflow-gpuopt"), *args], env=env, capture_output=True,
                         text=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def loop(tiny_gpt_run, tmp_path_factory):
    """Measure, recommend with --emit, launch the emitted script; what each step left."""
    import mlflow

    tmp = tmp_path_factory.mktemp("loop")
    uri = tiny_gpt_run.store_in(tmp)  # measured: the tiny GPT's tracked run
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MLFLOW_TRACKING_URI": uri, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
           "PYTHONPATH": str(REPO), "GPUOPT_JOURNAL_DIR": str(tmp / "journal")}
    env.pop("GPUOPT_PLAN", None)
    measured = tiny_gpt_run.trained
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("gpuopt-examples")
    (source,) = client.search_runs([exp.experiment_id])
    # the rank of the first 2-GPU plan (the job below runs 2 processes)
    ranked = _cli(env, "recommend", "--run-id", source.info.run_id, *TARGET, "--json",
                  "--no-log")
    assert ranked.returncode == 0, ranked.stderr[-2000:]
    rank = next(c["rank"] for c in json.loads(ranked.stdout)["candidates"] if c["gpus"] == 2)
    script = tmp / "launch.sh"
    rec = _cli(env, "recommend", "--run-id", source.info.run_id, *TARGET, "--json", "--emit",
               "torchrun", "--plan", str(rank), "--out", str(script))
    assert rec.returncode == 0, rec.stderr[-2000:]
    doc = json.loads(rec.stdout)
    job_env = {**env, "PATH": f"{BIN}:{os.environ['PATH']}", "MASTER_PORT": str(free_port())}
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        job_env.pop(name, None)  # the script's own values are used
    job = subprocess.run(["bash", str(script), "--steps", "6", "--interval", "0.2"], cwd=tmp,
                         env=job_env, capture_output=True, text=True, timeout=400)
    assert job.returncode == 0, (job.stdout[-2000:], job.stderr[-3000:])
    runs = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`{contract.TAG_PLAN}` = "
                                            f"'{doc['mlflow_run_id']}:{rank}'")
    jobs = [r for r in runs if contract.TAG_KIND not in r.data.tags]
    assert len(jobs) == 1  # one run for the job, not one per process
    return {"env": env, "client": client, "source": source, "doc": doc, "rank": rank,
            "job": jobs[0], "job_out": job, "measured_out": measured, "tmp": tmp}


def test_the_job_carries_its_plan_predictions_and_ratios(loop):
    client, doc, rank, job = loop["client"], loop["doc"], loop["rank"], loop["job"]
    rec_id = doc["mlflow_run_id"]
    plan = doc["candidates"][rank - 1]
    tags, metrics = job.data.tags, job.data.metrics
    assert tags[contract.TAG_PLAN] == f"{rec_id}:{rank}" == plan["plan_id"]
    assert tags[contract.TAG_RECOMMENDATION_RUN_ID] == rec_id
    assert tags[contract.TAG_PLAN_RANK] == str(rank)
    child = client.get_run(tags[contract.TAG_PLAN_RUN_ID])
    assert child.info.run_id == plan["plan_run_id"]
    assert child.data.tags[contract.TAG_KIND] == contract.KIND_CANDIDATE
    assert child.data.tags[contract.TAG_PLAN] == plan["plan_id"]
    assert child.data.tags[contract.TAG_JOB_RUN_IDS] == job.info.run_id  # and back
    # the predictions, as a series spanning the run (first and last step)
    series = client.get_metric_history(job.info.run_id, contract.PREDICTED_THROUGHPUT_SAMPLES)
    assert len(series) >= 2
    assert [m.value for m in series] == pytest.approx(
        [plan["throughput_samples_per_s"]] * len(series))
    assert {m.step for m in series} >= {0, int(metrics[contract.SUMMARY_STEPS])}
    assert metrics[contract.PREDICTED_HOURS] == pytest.approx(plan["predicted_hours"])
    assert metrics[contract.PREDICTED_COST_USD] == pytest.approx(plan["predicted_cost_usd"])
    assert metrics[contract.PREDICTED_MEMORY_PER_GPU_BYTES] == pytest.approx(
        plan["memory_per_gpu_bytes"])
    assert metrics[contract.PREDICTED_STEP_TIME_S] == pytest.approx(plan["step_time_s"])
    assert metrics[contract.SUMMARY_PREDICTION_RATIO_THROUGHPUT] == pytest.approx(
        metrics[contract.SUMMARY_THROUGHPUT_SAMPLES] / plan["throughput_samples_per_s"])
    assert metrics[contract.SUMMARY_PREDICTION_RATIO_STEP_TIME] == pytest.approx(
        metrics[contract.SUMMARY_STEP_TIME_MEAN_S] / plan["step_time_s"])
    # a CPU's peak is its process RSS, not a GPU's memory: no memory ratio
    assert contract.SUMMARY_PREDICTION_RATIO_MEMORY not in metrics
    assert job.data.params["gpuopt.micro_batch"] == str(plan["micro_batch"])
    # two CPU processes are far below an A6000 pair: said in one line at exit
    off = [ln for ln in loop["job_out"].stdout.splitlines() if "off plan" in ln]
    assert len(off) == 1 and f"below plan {plan['plan_id']}'s 90% interval" in off[0]


def test_accuracy_prints_the_pair_and_refits_without_the_scored_run(loop):
    job, doc, rank = loop["job"], loop["doc"], loop["rank"]
    plan = doc["candidates"][rank - 1]
    out = _cli(loop["env"], "accuracy", "--experiment", "gpuopt-examples", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    ledger = json.loads(out.stdout)
    (pair,) = ledger["pairs"]
    measured = job.data.metrics[contract.SUMMARY_THROUGHPUT_SAMPLES]
    assert pair["run_id"] == job.info.run_id and pair["plan_id"] == plan["plan_id"]
    assert pair["predicted_throughput_samples_per_s"] == pytest.approx(
        plan["throughput_samples_per_s"])
    assert pair["measured_throughput_samples_per_s"] == pytest.approx(measured)
    assert pair["error"] == pytest.approx(measured / plan["throughput_samples_per_s"] - 1)
    assert pair["covered"] is False
    # leave-one-out: with one job, the refit sees only the source run, so it predicts what
    # the recommendation predicted
    assert pair["refit_throughput_samples_per_s"] == pytest.approx(
        plan["throughput_samples_per_s"], rel=1e-6)
    assert ledger["totals"]["plan"]["pairs"] == 1
    table = _cli(loop["env"], "accuracy", "--experiment", "gpuopt-examples")
    assert table.returncode == 0 and job.info.run_id[:12] in table.stdout
    assert "Plans as predicted: 1 pair(s)" in table.stdout


def test_recommend_experiment_fits_the_job_as_a_measurement(loop):
    out = _cli(loop["env"], "recommend", "--experiment", "gpuopt-examples", *TARGET,
               "--json", "--no-log")
    assert out.returncode == 0, out.stderr[-2000:]
    sources = json.loads(out.stdout)["source_run_ids"]
    assert set(sources) == {loop["job"].info.run_id, loop["source"].info.run_id}


def test_a_job_without_a_plan_is_unchanged(loop):
    src = loop["source"]
    assert not any(k in src.data.tags for k in (contract.TAG_PLAN, contract.TAG_PLAN_RUN_ID,
                                                contract.TAG_RECOMMENDATION_RUN_ID))
    assert not any(k.startswith(contract.PREDICTED_PREFIX) or "prediction_ratio" in k
                   for k in src.data.metrics)
    assert "off plan" not in loop["measured_out"].stdout
    assert "plan" not in loop["measured_out"].stderr.lower()


def test_an_unreadable_plan_is_one_warning_and_training_goes_on(loop):
    env = {**loop["env"], "GPUOPT_PLAN": "0123456789abcdef:1",
           "MLFLOW_EXPERIMENT_NAME": "unreadable-plan"}
    out = subprocess.run([sys.executable, str(REPO / "examples" / "train_tiny_gpt.py"),
                          "--steps", "4"], cwd=loop["tmp"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    warned = [ln for ln in out.stderr.splitlines() if "predictions are unavailable" in ln]
    assert len(warned) == 1 and "unknown run id '0123456789abcdef'" in warned[0]
    client = loop["client"]
    (run,) = client.search_runs([client.get_experiment_by_name("unreadable-plan")
                                 .experiment_id])
    assert run.data.tags[contract.TAG_PLAN] == "0123456789abcdef:1"
    assert contract.SUMMARY_THROUGHPUT_SAMPLES in run.data.metrics
    assert not any(k.startswith(contract.PREDICTED_PREFIX) for k in run.data.metrics)


def _all_runs(client):
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_emit_a_logged_plan_by_its_id_without_a_new_recommendation(loop):
    client, doc, rank = loop["client"], loop["doc"], loop["rank"]
    pid = doc["candidates"][rank - 1]["plan_id"]
    before = len(_all_runs(client))
    task = loop["tmp"] / "task.yaml"
    out = _cli(loop["env"], "recommend", "--run-id", loop["source"].info.run_id, *TARGET,
               "--no-log", "--json", "--emit", "skypilot", "--plan", pid, "--out", str(task))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["emitted"]["plan_id"] == pid
    text = task.read_text()
    assert f'GPUOPT_PLAN: "{pid}"' in text and 'accelerators: "A6000:2"' in text
    assert len(_all_runs(client)) == before


@pytest.mark.parametrize("plan, message", [
    ("0", "--plan 0: plans are ranked from 1"),
    ("0123456789abcdef:1", "unknown run id '0123456789abcdef'"),
    ("{rec}:99", "the recommendation has only 10 ranked plan(s)"),
    ("{source}:1", "is not a gpuopt recommendation run"),
    ("{rec}:x", "expected a rank (1 = the winner) or a plan id"),
    ("{other_workload}", "vs 250000 parameters); emit a plan recommended for these"),
])
def test_emit_bad_plan_is_one_line_exit_2_and_writes_nothing(loop, tmp_path, plan, message):
    client, doc, source = loop["client"], loop["doc"], loop["source"]
    rec_id = doc["mlflow_run_id"]
    run_id = source.info.run_id
    if plan == "{other_workload}":
        # a measured run of another model (4x the parameters) asks for the tiny GPT's plan
        exp = source.info.experiment_id
        other = client.create_run(exp, tags={contract.TAG_TRACKED: "true"})
        params = dict(source.data.params, **{contract.PARAM_PARAMS: "250000",
                                             contract.PARAM_FLOPS_PER_SAMPLE: "9.6e+07"})
        for k, v in params.items():
            if k.startswith("gpuopt."):
                client.log_param(other.info.run_id, k, v)
        client.log_metric(other.info.run_id, contract.SUMMARY_THROUGHPUT_SAMPLES, 100.0)
        client.set_terminated(other.info.run_id)
        run_id, plan = other.info.run_id, f"{rec_id}:1"
    before = len(_all_runs(client))
    out = _cli(loop["env"], "recommend", "--run-id", run_id, *TARGET, "--emit", "torchrun",
               "--plan", plan.format(rec=rec_id, source=source.info.run_id), "--out",
               str(tmp_path / "x.sh"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("Error:") and message in err[0], err
    assert len(_all_runs(client)) == before and not any(tmp_path.iterdir())


@pytest.fixture
def full_dir(tmp_path):
    """A directory on a filesystem with no byte left (a real tmpfs, filled: root only)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):  # ENOSPC: every block the tmpfs has is taken
            while os.write(fd, b"\0" * 4096):
                pass
        os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_emit_to_a_full_disk_logs_nothing(loop, full_dir):
    """The artefact is written before the recommendation is logged: a disk that refuses it
    is one line, exit 2, and the store holds no new run (no recommendation, no candidates)."""
    client = loop["client"]
    before = len(_all_runs(client))
    out = _cli(loop["env"], "recommend", "--run-id", loop["source"].info.run_id, *TARGET,
               "--emit", "torchrun", "--out", str(full_dir / "plan.sh"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    err = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "cannot write --out" in err[0] and "No space left" in err[0], err
    assert len(_all_runs(client)) == before
    assert sorted(p.name for p in full_dir.iterdir()) == ["filler"]  # no partial, no temp


def test_emit_under_a_regular_file_logs_nothing(loop, tmp_path):
    client = loop["client"]
    (tmp_path / "a-file").write_text("not a directory")
    before = len(_all_runs(client))
    out = _cli(loop["env"], "recommend", "--run-id", loop["source"].info.run_id, *TARGET,
               "--emit", "torchrun", "--out", str(tmp_path / "a-file" / "plan.sh"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "is not a directory" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert len(_all_runs(client)) == before


def test_compare_shows_the_plans_prediction_next_to_the_measurement(loop):
    job, plan = loop["job"], loop["doc"]["candidates"][loop["rank"] - 1]
    out = _cli(loop["env"], "compare", "--experiment", "gpuopt-examples", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["run_id"]: r for r in json.loads(out.stdout)}
    assert rows[job.info.run_id]["predicted_throughput_samples_per_s"] == pytest.approx(
        plan["throughput_samples_per_s"])
    assert rows[job.info.run_id]["plan_id"] == plan["plan_id"]
    src = rows[loop["source"].info.run_id]
    assert src["predicted_throughput_samples_per_s"] is None and src["plan_id"] is None
    table = _cli(loop["env"], "compare", "--experiment", "gpuopt-examples").stdout.splitlines()
    col = table[0].split().index("predicted/s")
    # the runs are all named tiny-gpt: the job shows its plan's prediction, every other
    # tracked run of the experiment a blank
    shown = sorted(line.split()[col] for line in table[2:])
    assert shown.count(f"{plan['throughput_samples_per_s']:,.1f}") == 1
    assert set(shown) == {"—", f"{plan['throughput_samples_per_s']:,.1f}"}
    assert len(shown) == len(rows)


def test_demo_ends_with_the_launch_artefacts_and_the_loop_closes(tmp_path):
    """``make demo``: measure, recommend, write the winner's torchrun script and SkyPilot
    YAML; then the script trains the example as the plan and ``accuracy`` prints the pair."""
    import mlflow

    uri = sqlite_uri(tmp_path / "mlflow.db", str(tmp_path / "mlruns"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO),
           "GPUOPT_JOURNAL_DIR": str(tmp_path / "journal")}
    env.pop("GPUOPT_PLAN", None)
    demo = subprocess.run([sys.executable, str(REPO / "examples" / "demo.py"), "--steps", "6"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert demo.returncode == 0, demo.stderr[-3000:]
    script, task = tmp_path / "gpuopt-plan1-torchrun.sh", tmp_path / "gpuopt-plan1-skypilot.yaml"
    assert f"  {script}" in demo.stdout.splitlines()
    assert f"  {task}" in demo.stdout.splitlines()
    pid = next(ln.split("GPUOPT_PLAN=")[1] for ln in script.read_text().splitlines()
               if ln.startswith("GPUOPT_PLAN="))
    assert f'GPUOPT_PLAN: "{pid}"' in task.read_text()  # both artefacts name the same plan
    job_env = {**env, "PATH": f"{BIN}:{os.environ['PATH']}", "MASTER_PORT": str(free_port())}
    job_env.pop("MLFLOW_TRACKING_URI")
    job = subprocess.run(["bash", str(script), "--steps", "5", "--interval", "0.2"],
                         cwd=tmp_path, env=job_env, capture_output=True, text=True, timeout=400)
    assert job.returncode == 0, job.stderr[-3000:]
    out = _cli(env, "accuracy", "--experiment", "gpuopt-examples", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    (pair,) = json.loads(out.stdout)["pairs"]
    assert pair["plan_id"] == pid
    client = mlflow.MlflowClient(uri)
    assert client.get_run(pair["run_id"]).data.tags[contract.TAG_PLAN] == pid
