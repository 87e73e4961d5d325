"""Large-model memory and layouts end to end: the 7B decoder on 8 x A100-80GB, observed
configurations that always fit, compound layouts through files, interleaved pipelines."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.catalog import load_catalog
from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import Observation, ParallelConfig, PerfModelError, fit
from mlflow_gpuopt.perfmodel.layout import parse_layout, resolve_layout
from mlflow_gpuopt.workload_files import (
    WorkloadFileError,
    load_workload,
    observations_to_csv,
    parse_observations_csv,
    workload_from_dict,
    workload_to_dict,
)

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "benchmarks" / "workloads" / "llama2_7b.json"
A100 = "A100-80GB-SXM4"
OBS_HEADER = "gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,precision"
#: Model states of 6.74e9 parameters under PyTorch FSDP over 8 GPUs in bf16 with AdamW: the
#: fp32 shard (the master), fp32 gradient shard and Adam's m and v, 4 + 4 + 8 bytes/param
#: sharded, plus two gathered bf16 blocks (computing + prefetched, 2 bytes each) and one
#: block's gradient reduce-scattered in fp32 (4 bytes); a block is the file's largest layer.
BLOCK = 202_383_360
STATES_8_GPUS = 16 * 6_738_415_616 / 8 + 2 * 2 * BLOCK + 4 * BLOCK
#: What CUDA can allocate of an 80 GB A100: 80 GiB less the driver's 1 %.
USABLE_80GB = 80 * 2**30 * 0.99


def _predict(*args):
    r = CliRunner().invoke(gpuopt, ["predict", *args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_7b_on_8_a100_with_fsdp_at_micro_batch_6_fits_from_one_observation(tmp_path):
    obs = tmp_path / "obs.csv"
    obs.write_text(f"{OBS_HEADER}\nNVIDIA A100-SXM4-80GB,8,1,6,26.0,fsdp,bf16\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "mlflow", "gpuopt", "predict", "--workload", str(LLAMA),
         "--observations", str(obs), "--gpu", A100, "--gpus", "8", "--strategy", "fsdp",
         "--json"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["micro_batch"] == 6 and out["fits"] is True and out["p_fits"] >= 0.5
    assert STATES_8_GPUS < out["memory_per_gpu_bytes"] <= USABLE_80GB
    assert out["memory_usable_bytes"] == pytest.approx(USABLE_80GB)
    assert out["max_micro_batch"] >= 6
    # The estimate already fits what ran: the observation scales nothing.
    assert not any("scaled by" in a for a in out["assumptions"])
    assert 40e9 < out["memory"]["activations_bytes"] < 63e9


def test_7b_with_the_observation_recording_full_recompute_fits_well_under_80gb(tmp_path):
    obs = tmp_path / "obs.csv"
    obs.write_text(f"{OBS_HEADER},recompute\nA100-80GB-SXM4,8,1,6,26.0,fsdp,bf16,full\n")
    out = _predict("--workload", str(LLAMA), "--observations", str(obs), "--gpu", A100,
                   "--gpus", "8", "--strategy", "fsdp", "--recompute", "full", "--json")
    assert out["fits"] is True and out["memory_per_gpu_bytes"] < 40e9
    assert not any("scaled by" in a for a in out["assumptions"])
    assert out["recompute"] == "full"


def test_7b_without_any_observation_follows_the_physics():
    args = ("--workload", str(LLAMA), "--gpu", A100, "--gpus", "8", "--strategy", "fsdp",
            "--micro-batch", "6", "--json")
    full = _predict(*args, "--recompute", "full")
    alias = _predict(*args, "--activation-checkpointing")
    assert full["fits"] is True and full["memory_per_gpu_bytes"] < 40e9
    assert alias["memory_per_gpu_bytes"] == full["memory_per_gpu_bytes"]
    none = _predict(*args)
    # 32 layers x 12,288 tokens x (8 + 4 x 11008/4096) x 2 bytes x 4096 (LLaMA's SwiGLU MLP,
    # no dropout, SDPA) = 60 GB, plus 1.6 GB of fp32 log-probabilities: not the 1,461 GB the
    # FLOPs-based guess gave.
    per_token_layer = 2 * 4096 * (8 + 4 * 11008 / 4096) + 4 * 32 + 16
    expected = 12288 * (32 * per_token_layer + 4 * 32000 + 2 * 2 * 4096 + 24)
    assert none["memory"]["activations_bytes"] == pytest.approx(expected, rel=0.01)
    # With the model states, the CUDA context (0.75 GB) and the caching allocator's 5 % of
    # what is allocated: 81.9 GB, inside the 85.0 GB CUDA can allocate of the 80 GiB of HBM.
    total = 0.75e9 + 1.05 * (STATES_8_GPUS + expected)
    assert none["memory_per_gpu_bytes"] == pytest.approx(total, rel=0.01)
    assert 80e9 < none["memory_per_gpu_bytes"] < USABLE_80GB and none["fits"] is True
    # Near the edge, so not certain: the activations' 10 % spread (6.2 GB) dominates
    # the peak's standard deviation (6.8 GB with the loss's logits and the allocator's).
    sigma = math.sqrt((0.1 * expected) ** 2 + (4 * 32000 * 12288) ** 2
                      + (0.03 * (STATES_8_GPUS + expected)) ** 2 + 0.25e9 ** 2)
    z = (USABLE_80GB - total) / sigma
    assert none["p_fits"] == pytest.approx(0.5 * (1 + math.erf(z / math.sqrt(2))), abs=0.02)
    assert 0.6 < none["p_fits"] < 0.75
    assert none["max_micro_batch"] == 6
    assert STATES_8_GPUS < full["memory_per_gpu_bytes"] < none["memory_per_gpu_bytes"]


def _hardware():
    catalog = load_catalog()
    return {A100: hardware_for_gpu(catalog.gpus[A100], gpus_per_node=8)}


def test_an_observed_configuration_is_never_called_infeasible():
    workload = load_workload(LLAMA)
    hw = _hardware()
    obs = Observation(gpu=A100, gpu_count=8, throughput_samples_per_s=30.0, micro_batch=8,
                      strategy="fsdp", precision="bf16")
    cfg = ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=8, precision="bf16")
    before = fit(workload, [], hw).predict(cfg, hw[A100])
    assert not before.fits and before.p_fits < 0.5
    p = fit(workload, [obs], hw).predict(cfg, hw[A100])
    assert p.fits and p.memory.total_bytes <= USABLE_80GB
    assert p.memory.activations_bytes < before.memory.activations_bytes
    assert any("scaled by" in a for a in p.assumptions)
    # Twice the micro-batch was never observed and needs twice the activations: no fit.
    assert not fit(workload, [obs], hw).predict(dataclasses.replace(cfg, micro_batch=16),
                                                hw[A100]).fits
    # Even where the model states alone exceed the GPU (DDP keeps 16 bytes/param = 108 GB),
    # a configuration that ran is called fitting, and the prediction says why.
    ddp = dataclasses.replace(obs, strategy="ddp", micro_batch=1)
    q = fit(workload, [ddp], hw).predict(dataclasses.replace(cfg, strategy="ddp",
                                                             micro_batch=1), hw[A100])
    assert q.fits and any("observed to run" in a for a in q.assumptions)


LAYOUTS = [("ddp", 8, 1), ("fsdp", 8, 1), ("zero2", 16, 2), ("tp2xfsdp", 8, 1),
           ("tp8xpp12xddp", 96, 12), ("tp2xpp2xzero1", 8, 1), ("pp4xvp2", 8, 1),
           ("tp4", 8, 1), ("pp2", 8, 1)]


@pytest.mark.parametrize("strategy,gpus,nodes", LAYOUTS)
def test_compound_layouts_round_trip_through_files_and_predict(tmp_path, strategy, gpus, nodes):
    workload = dataclasses.replace(load_workload(LLAMA), strategy=strategy)
    w = tmp_path / "workload.json"
    w.write_text(json.dumps(workload_to_dict(workload)))
    assert load_workload(w) == workload
    obs = [Observation(gpu=A100, gpu_count=gpus, nodes=nodes, throughput_samples_per_s=20.0,
                       micro_batch=2, strategy=strategy, precision="bf16", recompute="full")]
    text = observations_to_csv(obs)
    assert parse_observations_csv(text) == obs
    o = tmp_path / "obs.csv"
    o.write_text(text)
    name, tp, pp, vp, _ = parse_layout(strategy)
    out = _predict("--workload", str(w), "--observations", str(o), "--gpu", A100,
                   "--gpus", str(gpus), "--nodes", str(nodes), "--micro-batch", "2",
                   "--recompute", "full", "--json")
    assert out["strategy"] == strategy  # the workload's layout is the default
    layout = resolve_layout(ParallelConfig(gpus_per_node=gpus // nodes, nodes=nodes,
                                           strategy=strategy))
    assert (out["tp"], out["pp"], out["virtual_stages"]) == (layout.tp, layout.pp, vp)
    assert out["throughput_samples_per_s"] == pytest.approx(20.0, rel=0.05)


def test_bad_layouts_are_one_line_errors(tmp_path):
    with pytest.raises(WorkloadFileError, match="row 2: unknown strategy 'tp2xwarp'"):
        parse_observations_csv(f"{OBS_HEADER}\nA100-80GB-SXM4,8,1,2,20,tp2xwarp,bf16\n")
    with pytest.raises(WorkloadFileError, match="recompute"):
        parse_observations_csv(f"{OBS_HEADER},recompute\nA100-80GB-SXM4,8,1,2,20,ddp,bf16,some\n")
    doc = workload_to_dict(load_workload(LLAMA))
    with pytest.raises(WorkloadFileError, match="attention"):
        workload_from_dict({**doc, "attention": "linear"})
    with pytest.raises(PerfModelError, match="virtual stages need a pipeline"):
        resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ddp", virtual_stages=2))
    with pytest.raises(PerfModelError, match="dp3"):
        resolve_layout(ParallelConfig(gpus_per_node=8, strategy="tp2xdp3"))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(LLAMA), "--gpu", A100,
                                    "--gpus", "8", "--strategy", "tp2xqq"])
    assert r.exit_code == 2 and "unknown strategy" in r.output
    assert "Traceback" not in r.output
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(LLAMA), "--gpu", A100,
                                    "--gpus", "8", "--recompute", "selective",
                                    "--activation-checkpointing"])
    assert r.exit_code == 2 and "--recompute full" in r.output


def test_interleaved_schedule_divides_the_bubble_by_the_virtual_stages():
    """Narayanan et al. 2021, Sec. 2.2: bubble (p-1)/m of the ideal time, (p-1)/(v*m)
    interleaved."""
    workload = load_workload(LLAMA)
    hw = _hardware()
    predictor = fit(workload, [], hw)
    base = ParallelConfig(gpus_per_node=8, strategy="pp8", micro_batch=1, grad_accum=16,
                          precision="bf16", recompute="full")
    one = predictor.predict(base, hw[A100])
    two = predictor.predict(dataclasses.replace(base, virtual_stages=2), hw[A100])
    four = predictor.predict(dataclasses.replace(base, strategy="pp8xvp4"), hw[A100])
    p, m = 8, 16
    ideal = one.step_time_s - one.bubble_s
    assert one.bubble_s == pytest.approx((p - 1) / m * ideal, rel=0.1)
    assert two.bubble_s == pytest.approx(one.bubble_s / 2, rel=0.05)
    assert four.bubble_s == pytest.approx(one.bubble_s / 4, rel=0.05)
    assert four.step_time_s < two.step_time_s < one.step_time_s


def test_recommend_plans_run_with_the_recompute_mode_asked():
    from mlflow_gpuopt.recommend import SearchSpace, Target, recommend

    catalog = load_catalog()
    offers = [o for o in catalog.offers if o.gpu == A100 and o.gpu_count == 8]
    assert offers

    def plans(recompute):
        workload = dataclasses.replace(load_workload(LLAMA), recompute=recompute)
        rec = recommend(fit(workload, [], {}), workload, offers, catalog.gpus,
                        Target(total_samples=1e6, per_rank_batch=6),
                        hardware_for=lambda spec, o: hardware_for_gpu(
                            spec, gpus_per_node=o.gpu_count, offer=o),
                        space=SearchSpace(max_nodes=1), with_scaling=False)
        return [c.config for c in rec.candidates]

    full, none = plans("full"), plans("none")
    assert full and none
    # With full recomputation the whole per-GPU batch of 6 fits at once; without it (60 GB of
    # activations at 6) the plan must split it or fall back to checkpointing.
    assert any(c.micro_batch == 6 and not c.activation_checkpointing for c in full)
    assert not any(c.micro_batch == 6 and not c.activation_checkpointing for c in none)


def test_recommend_cli_refuses_a_bad_recompute_mode():
    r = CliRunner().invoke(gpuopt, ["recommend", "--run-id", "x", "--recompute", "most"])
    assert r.exit_code == 2 and "most" in r.output
    r = CliRunner().invoke(gpuopt, ["recommend", "--run-id", "x", "--recompute", "none",
                                    "--activation-checkpointing"])
    assert r.exit_code == 2 and "--recompute full" in r.output


def test_full_recompute_runs_the_forward_again():
    """A micro-step with full recomputation is 4/3 as long (the forward twice, the backward
    twice the forward); an observation made with it calibrates the model without it."""
    workload = load_workload(LLAMA)
    hw = _hardware()
    obs = Observation(gpu=A100, gpu_count=1, throughput_samples_per_s=3.0, micro_batch=6,
                      strategy="single", precision="bf16", recompute="full")
    predictor = fit(workload, [obs], hw)
    cfg = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=6, precision="bf16")
    full = predictor.predict(dataclasses.replace(cfg, recompute="full"), hw[A100])
    none = predictor.predict(cfg, hw[A100])
    assert full.throughput_samples_per_s == pytest.approx(3.0, rel=0.02)
    # compute = micro-step + optimizer step; only the micro-step grows, by a third
    micro_none = 3.0 * (full.compute_s - none.compute_s)
    optimizer = none.compute_s - micro_none
    assert 0.0 <= optimizer < 0.2 * none.compute_s
    assert full.compute_s - optimizer == pytest.approx(4.0 / 3.0 * micro_none)
    # Selective recomputation with SDPA/flash adds nothing (flash recomputes scores anyway)
    sel = predictor.predict(dataclasses.replace(cfg, recompute="selective"), hw[A100])
    assert sel.throughput_samples_per_s == pytest.approx(none.throughput_samples_per_s)
