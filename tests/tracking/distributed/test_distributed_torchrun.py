"""torchrun jobs tracked as ONE MLflow run, for real: gloo on CPU, 2 processes / 2 "nodes".

Each test launches the examples with ``python -m torch.distributed.run`` into a sqlite store in
``tmp_path`` and reads the run back through MLflow.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import mlflow
import pytest
from support.ports import free_port
from support.torchrun import TIMEOUT_S, history, job_env, only_run, torchrun

from mlflow_gpuopt.mlflow_io.runs import load_run_inputs

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
MLP_PARAMS = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10  # examples/_dist_common.MLP
GRAD_BYTES = 4 * MLP_PARAMS  # fp32 gradients all-reduced per step by DDP


def run_job(tmp_path: Path, script: str, *extra: str, steps: int = 60) -> str:
    cmd = torchrun("--nproc-per-node=2", f"--master-port={free_port()}",
                   str(EXAMPLES / script), "--steps", str(steps), "--interval", "0.2", *extra)
    out = subprocess.run(cmd, cwd=tmp_path, env=job_env(tmp_path), capture_output=True,
                         text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def check_job(run, strategy: str) -> tuple[dict, dict]:
    """The checks every job shares: layout params, both ranks, global = sum of ranks."""
    assert run.info.status == "FINISHED"
    p, m = run.data.params, run.data.metrics
    assert p["gpuopt.strategy"] == strategy
    assert p["gpuopt.world_size"] == "2" and p["gpuopt.backend"] == "gloo"
    for name in ("gpus_per_node", "device_count", "interconnect", "params", "flops_per_sample"):
        assert f"gpuopt.{name}" in p, name
    rid = run.info.run_id
    r0 = history(rid, "gpuopt/rank_0/throughput_samples_per_s")
    r1 = history(rid, "gpuopt/rank_1/throughput_samples_per_s")
    total = history(rid, "gpuopt/throughput_samples_per_s")
    assert r0 and r1 and history(rid, "gpuopt/rank_1/step_time_s")
    both = [s for s in total if s in r0 and s in r1]
    assert both, "no round with both ranks"
    for s in both:
        assert total[s] == pytest.approx(r0[s] + r1[s], rel=1e-9)
    # the summary: the sum of the ranks' steady states. Every rank runs micro_batch samples a
    # step, so that sum is micro_batch x world_size x the ranks' mean steady steps/s.
    world, batch = int(p["gpuopt.world_size"]), int(p["gpuopt.micro_batch"])
    assert m["gpuopt/summary/throughput_samples_per_s"] > 0
    assert m["gpuopt/summary/throughput_samples_per_s"] == pytest.approx(
        batch * world * m["gpuopt/summary/throughput_steps_per_s"], rel=1e-6)
    assert m["gpuopt/comm_time_s"] > 0 and m["gpuopt/summary/comm_time_per_step_s"] > 0
    assert 0 <= m["gpuopt/summary/exposed_comm_fraction"] <= 1
    return p, m


def test_ddp_two_processes_one_run(tmp_path):
    log = run_job(tmp_path, "train_ddp.py", "--autolog")  # autolog on every rank: still 1 run
    run = only_run(tmp_path)
    p, m = check_job(run, "ddp")
    assert p["gpuopt.nodes"] == "1" and p["gpuopt.interconnect"] == "loopback"
    assert int(p["gpuopt.params"]) == MLP_PARAMS
    # DDP all-reduces every gradient once per step
    assert m["gpuopt/summary/comm_bytes_per_step"] == pytest.approx(GRAD_BYTES, rel=0.01)
    assert m["gpuopt/comm_bytes"] == pytest.approx(GRAD_BYTES, rel=0.01)
    assert history(run.info.run_id, "gpuopt/node_0/cpu_utilization_percent")
    assert history(run.info.run_id, "gpuopt/rank_1/process_rss_bytes")
    prof = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/gpuopt/profile.json")
    assert prof["hardware"]["world_size"] == 2 and prof["hardware"]["strategy"] == "ddp"
    # what the scaling model reads back
    obs = load_run_inputs([run.info.run_id]).observations[0]
    assert (obs.gpu_count, obs.nodes, obs.strategy) == (2, 1, "ddp")
    assert obs.exposed_comm_fraction == pytest.approx(m["gpuopt/summary/exposed_comm_fraction"])
    assert log.count("gpuopt: run ") == 1  # the summary line: rank 0 only


def test_fsdp_two_processes_one_run(tmp_path):
    run_job(tmp_path, "train_fsdp.py", steps=40)
    run = only_run(tmp_path)
    p, m = check_job(run, "fsdp")
    # all-gather (forward and backward) + reduce-scatter: ~3x the parameter bytes per step
    assert m["gpuopt/summary/comm_bytes_per_step"] == pytest.approx(3 * GRAD_BYTES, rel=0.05)
    assert m["gpuopt/summary/collectives_per_step"] >= 3


def test_tensor_parallel_by_fsdp_on_a_2d_mesh_one_run(tmp_path):
    """4 processes on a (dp=2, tp=2) DeviceMesh: the degrees come from the mesh the DTensor
    parameters live on, the strategy is the compound layout, every sample is counted once
    (a TP pair reads the same batch), and the run reads back as a tp2xfsdp observation."""
    cmd = torchrun("--nproc-per-node=4", f"--master-port={free_port()}",
                   str(EXAMPLES / "train_tp_fsdp.py"), "--steps", "20", "--interval", "0.2")
    out = subprocess.run(cmd, cwd=tmp_path, env=job_env(tmp_path), capture_output=True,
                         text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = only_run(tmp_path)
    p, m = run.data.params, run.data.metrics
    assert run.info.status == "FINISHED"
    assert (p["gpuopt.tp"], p["gpuopt.dp"], p["gpuopt.pp"], p["gpuopt.cp"]) == ("2", "2", "1", "1")
    assert p["gpuopt.strategy"] == "tp2xfsdp" and p["gpuopt.world_size"] == "4"
    # global samples per step: dp replicas x the batch of 32 (not world x 32)
    per_step = (m["gpuopt/summary/throughput_samples_per_s"]
                / m["gpuopt/summary/throughput_steps_per_s"])
    assert per_step == pytest.approx(2 * 32, rel=0.05)
    obs = load_run_inputs([run.info.run_id]).observations[0]
    assert (obs.strategy, obs.tp, obs.pp, obs.gpu_count) == ("tp2xfsdp", 2, 1, 4)


def test_two_nodes_on_loopback_one_run(tmp_path):
    port = free_port()
    env = job_env(tmp_path)

    def node(rank: int) -> subprocess.Popen:
        cmd = torchrun("--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=1",
                       "--master-addr=127.0.0.1", f"--master-port={port}",
                       str(EXAMPLES / "train_ddp.py"), "--steps", "60", "--interval", "0.2")
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    procs = [node(0), node(1)]
    try:
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    run = only_run(tmp_path)
    p, m = check_job(run, "ddp")
    assert p["gpuopt.nodes"] == "2"
    assert p["gpuopt.interconnect"].startswith("gloo-tcp")
    rid = run.info.run_id
    for k in (0, 1):
        assert history(rid, f"gpuopt/node_{k}/cpu_utilization_percent"), k
        assert history(rid, f"gpuopt/node_{k}/host_memory_used_bytes"), k


GATHERER_RANK = """
import json, time

import psutil
import torch.distributed as dist

from mlflow_gpuopt.tracking.distributed.rank_gather import RankGatherer

dist.init_process_group("gloo")
rank, proc, rounds = dist.get_rank(), psutil.Process(), []
before = proc.num_threads()
gatherer = RankGatherer(1, lambda final: [float(rank)], rounds.append if rank == 0 else None,
                        interval_s=0.05)
gatherer.start()
deadline = time.monotonic() + 60
while rank == 0 and not rounds and time.monotonic() < deadline:  # rank 0 has a round of rows
    time.sleep(0.01)
dist.barrier()  # (rank 1's gatherer takes part in that round meanwhile)
stopped = gatherer.stop()
with open(f"rank{rank}.json", "w") as f:  # in the job's working directory
    json.dump({"stopped": stopped, "rounds": len(rounds), "threads_before": before,
               "threads_after": proc.num_threads()}, f)
dist.destroy_process_group()
"""


def test_rank_gatherer_stop_joins_its_groups_threads(tmp_path):
    """After ``stop()`` no native thread of the gatherer's private gloo group is left. Such a
    worker drops the last round's Python tensors (it takes the GIL to) when it gets to it; left
    alive to interpreter exit it can get there during finalization, where Python ends it inside
    a C++ destructor: SIGABRT, "terminate called without an active exception"."""
    script = tmp_path / "gather_rank.py"
    script.write_text(GATHERER_RANK)
    cmd = torchrun("--nproc-per-node=2", f"--master-port={free_port()}", str(script))
    out = subprocess.run(cmd, cwd=tmp_path, env=job_env(tmp_path), capture_output=True,
                         text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, seen in enumerate(ranks):
        assert seen["stopped"], (r, seen)
        # the gatherer's group (its gloo workers and transport loop) is gone with stop()
        assert seen["threads_after"] <= seen["threads_before"], (r, seen)
    assert ranks[0]["rounds"] >= 1  # rank 0 received every rank's rows
