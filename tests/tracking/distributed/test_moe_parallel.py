"""Expert- and context-parallel jobs tracked as ONE MLflow run, for real: torchrun, gloo,
4 CPU processes on a 2-D ``DeviceMesh`` (``tests/tracking/distributed/_moe_parallel_train.py``).

Expert parallel, a (dp 2, ep 2) mesh: the degrees and the ``ep2xddp`` strategy, the MoE
layer's experts, experts per token and total / active parameters, and the all-to-all bytes
the comm meter measures, against counts made here from the model's sizes. Context parallel,
a (dp 2, cp 2) mesh: the ``cp`` degree, ``cp2xddp``, every sample counted once, and the
profile of a whole sample from rank 0's half of its sequence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _moe_parallel_train as job
import mlflow
import pytest

from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.perfmodel.layout import is_strategy
from support.ports import free_port
from support.sqlite_store import sqlite_uri

pytestmark = pytest.mark.slow

SCRIPT = Path(job.__file__)
TIMEOUT_S = 240


def job_env(tmp_path: Path) -> dict:
    uri = sqlite_uri(tmp_path / "mlflow.db", str(tmp_path / "mlruns"))  # the job's cwd
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": uri,
                "GPUOPT_JOURNAL_DIR": str(tmp_path / "journal"), "PYTHONUNBUFFERED": "1"})
    return env


def only_run(tmp_path: Path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def run_mesh_job(tmp_path: Path, mode: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4",
           f"--master-port={free_port()}", str(SCRIPT), "--mode", mode, "--steps", "12",
           "--interval", "0.2"]
    out = subprocess.run(cmd, cwd=tmp_path, env=job_env(tmp_path), capture_output=True,
                         text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(s for s in out.stdout.splitlines() if s.startswith("FIGURES "))
    return json.loads(line.removeprefix("FIGURES "))


def test_expert_parallel_job_logs_its_experts_and_all_to_all_bytes(tmp_path):
    figures = run_mesh_job(tmp_path, "ep")
    run = only_run(tmp_path)
    p, m = run.data.params, run.data.metrics
    assert run.info.status == "FINISHED"
    # the ep ranks are data-parallel ranks of the dense layers: dp 4, ep 2
    assert (p["gpuopt.dp"], p["gpuopt.ep"], p["gpuopt.tp"], p["gpuopt.cp"]) == ("4", "2", "1", "1")
    assert p["gpuopt.strategy"] == "ep2xddp" and p["gpuopt.world_size"] == "4"
    h, f, e, k = job.HIDDEN, job.WIDTH, job.EXPERTS, job.TOP_K
    expert = 3 * h * f  # w1, w3, w2
    dense = job.VOCAB * h + h * e + h * job.VOCAB  # embedding, router, head
    assert figures["dense_params"] == dense
    # every expert counted, though each rank holds 2 of the 4
    assert int(p["gpuopt.params"]) == dense + e * expert
    assert int(p["gpuopt.active_params"]) == dense + k * expert
    assert (p["gpuopt.num_experts"], p["gpuopt.experts_per_token"],
            p["gpuopt.expert_ffn_hidden_size"]) == (str(e), str(k), str(f))
    assert "gpuopt.num_shared_experts" not in p
    # per rank and step: DDP all-reduces the dense gradients (fp32); the MoE layer sends its
    # per-expert counts (int64) and, forward and backward, dispatch and combine each carry
    # one row per token copy (rows received = rows sent over the ep group, so the mean over
    # ranks is tokens x top-k rows each)
    tokens = job.BATCH * job.SEQ
    alltoall = 8 * e + 4 * tokens * k * h * 4
    assert m["gpuopt/summary/comm_bytes_per_step"] == pytest.approx(4 * dense + alltoall,
                                                                    rel=0.01)
    assert m["gpuopt/summary/collectives_per_step"] == pytest.approx(1 + 5, abs=0.5)
    # the run plans as its workload file would: the MoE keys reach the workload
    inputs = load_run_inputs([run.info.run_id])
    w, obs = inputs.workload, inputs.observations[0]
    assert (w.num_experts, w.experts_per_token, w.expert_ffn_hidden_size) == (e, k, f)
    assert (obs.strategy, obs.gpu_count) == ("ep2xddp", 4)


def test_context_parallel_job_logs_cp_in_its_strategy(tmp_path):
    figures = run_mesh_job(tmp_path, "cp")
    run = only_run(tmp_path)
    p, m = run.data.params, run.data.metrics
    assert run.info.status == "FINISHED"
    assert (p["gpuopt.cp"], p["gpuopt.dp"], p["gpuopt.tp"], p["gpuopt.ep"]) == ("2", "2", "1", "1")
    assert p["gpuopt.strategy"] == "cp2xddp"
    assert int(p["gpuopt.params"]) == figures["dense_params"]
    assert "gpuopt.num_experts" not in p  # a dense model
    # the cp pair reads the same samples: global samples per step = dp x batch
    per_step = (m["gpuopt/summary/throughput_samples_per_s"]
                / m["gpuopt/summary/throughput_steps_per_s"])
    assert per_step == pytest.approx(2 * job.BATCH, rel=0.05)
    assert m["gpuopt/summary/comm_bytes_per_step"] == pytest.approx(
        4 * figures["dense_params"], rel=0.01)  # DDP; the all-gathers are not metered
    # the profile is rank 0's slice (SEQ / 2 tokens of each sample) scaled to a whole sample:
    # per token the qkv and head products, and attention's two products, whose queries
    # meet all SEQ keys (gathered); forward + backward = 3 x the forward (2 per multiply-add)
    h, v, seq = job.HIDDEN, job.VOCAB, job.SEQ
    forward = seq * (2 * h * 3 * h + 2 * h * v) + 2 * (2 * seq * seq * h)
    assert int(p["gpuopt.tokens_per_sample"]) == seq
    assert float(p["gpuopt.flops_per_sample"]) == pytest.approx(3 * forward, rel=1e-5)
    assert int(p["gpuopt.rank_tokens_per_sample"]) == seq // 2
    assert float(p["gpuopt.rank_flops_per_sample"]) == pytest.approx(3 * forward / 2, rel=1e-5)
    profile = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/gpuopt/profile.json")
    assert (profile["sequence_split"], profile["tokens_per_sample"],
            profile["rank_tokens_per_sample"]) == (2, seq, seq // 2)
    if is_strategy("cp2xddp"):  # the models read cp as a degree
        assert load_run_inputs([run.info.run_id]).observations[0].strategy == "cp2xddp"
