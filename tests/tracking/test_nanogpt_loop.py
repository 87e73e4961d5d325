"""Conformance: a nanoGPT-structured training loop (tests/tracking/_nanogpt_train.py) is
measured right, in one process and as a 2-process torchrun job (gloo).

The loop is the one most LLM training code copies: gradient accumulation whose micro-steps
set ``require_backward_grad_sync`` instead of using ``no_sync()``, the loss computed inside
``forward(idx, targets)`` under ``with ctx:`` autocast, the next batch fetched between the
forward and the backward, GradScaler / unscale / clipping, a learning rate written into the
param groups every iteration, and an ``estimate_loss`` of several no-grad forwards between
iterations. Every expected figure is computed here from the loop's settings and the model's
dimensions, not read from the run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient
from support.ports import free_port
from support.torchrun import TIMEOUT_S, history, job_env, only_run, torchrun

import _nanogpt_train as nano

SCRIPT = Path(__file__).resolve().parent / "_nanogpt_train.py"
WARMUP_STEPS = 3  # TrackConfig's default warm-up: the steady state starts after it


def expected_params(cfg: nano.GPTConfig) -> int:
    """Parameters of the GPT from its dimensions; the tied LM head / token embedding once."""
    d, v, t = cfg.n_embd, cfg.vocab_size, cfg.block_size
    ln = 2 * d
    block = (ln + (3 * d * d + 3 * d) + (d * d + d)  # ln_1, attention QKV and output
             + ln + (4 * d * d + 4 * d) + (4 * d * d + d))  # ln_2, MLP up and down
    return v * d + t * d + cfg.n_layer * block + ln


def bf16_autocast_on_cpu() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    except Exception:
        return False


def check_loop(run, facts: dict, *, iters: int, batch: int, accum: int, block: int,
               precision: str) -> tuple[dict, dict]:
    """What a nanoGPT loop of ``iters`` iterations of ``accum`` micro-steps of ``batch``
    sequences of ``block`` tokens must log (per process: micro-batch, accumulation)."""
    assert run.info.status == "FINISHED"
    p, m = run.data.params, run.data.metrics
    world = facts["world_size"]
    # the loop did what it was asked (so the figures below are about this loop)
    assert facts["iterations"] == iters
    assert facts["train_forwards"] == iters * accum
    assert facts["eval_forwards"] > 0
    # steps: one per iteration, whatever estimate_loss ran in between
    assert m["gpuopt/summary/steps"] == iters
    assert max(history(run.info.run_id, "gpuopt/step_time_s")) == iters  # the last step
    # the batch: per process, as the contract logs it
    assert int(p["gpuopt.micro_batch"]) == batch
    assert int(p["gpuopt.grad_accum"]) == accum
    assert int(p["gpuopt.tokens_per_sample"]) == block
    assert p["gpuopt.precision"] == precision
    assert p["gpuopt.optimizer"] == "AdamW"
    cfg = nano.GPTConfig(block_size=block)
    assert int(p["gpuopt.params"]) == expected_params(cfg) == facts["params"]
    # the architecture nanoGPT's GPTConfig declares (it names no MLP kind or width)
    assert (int(p["gpuopt.num_layers"]), int(p["gpuopt.hidden_size"]),
            int(p["gpuopt.num_heads"]), int(p["gpuopt.vocab_size"])) == (
        cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size)
    assert "gpuopt.mlp" not in p and "gpuopt.ffn_hidden_size" not in p
    # samples and tokens per optimizer step, from the steady-state summary (job: all ranks)
    per_step = (m["gpuopt/summary/throughput_samples_per_s"]
                / m["gpuopt/summary/throughput_steps_per_s"])
    assert per_step == pytest.approx(batch * accum * world, rel=1e-6)
    tokens_per_step = (m["gpuopt/summary/throughput_tokens_per_s"]
                       / m["gpuopt/summary/throughput_steps_per_s"])
    assert tokens_per_step == pytest.approx(batch * accum * world * block, rel=1e-6)
    # FLOPs: the profiled step's micro-steps ÷ its samples, against 6·N·T + 12·L·T²·d. The
    # profile counts model FLOPs: SDPA's backward is charged 2 × its forward (not torch's
    # formula, which adds the backward's recomputation of QKᵀ: +1.2 % here), so the count
    # is the formula's; the tolerance is float rounding only.
    prof = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/gpuopt/profile.json")
    analytic = nano.analytic_flops_per_sample(cfg)
    assert prof["flops_per_sample"] == pytest.approx(analytic, rel=1e-6)
    assert prof["recompute_flops_per_sample"] == 0  # no activation checkpointing
    assert prof["micro_batch"] == batch and prof["grad_accum"] == accum
    assert prof["attention"] == "sdpa"
    return p, m


def run_single(tmp_path: Path, *args: str) -> tuple[object, dict]:
    facts = nano.main([*args, "--interval", "0.2", "--out", str(tmp_path / "facts")])
    run = mlflow.get_run(facts["run_id"])
    assert len(mlflow.search_runs(search_all_experiments=True, output_format="list")) == 1
    return run, facts


@pytest.mark.skipif(not bf16_autocast_on_cpu(), reason="no bf16 autocast on this CPU")
def test_bf16_autocast_with_eval_every_iteration(tracking_uri, tmp_path):
    """estimate_loss before every iteration (so also inside the profiled step's window): its
    no-grad forwards are neither micro-batches nor steps, and not input wait either."""
    iters, batch, accum = 8, 4, 3
    run, facts = run_single(tmp_path, "--max-iters", str(iters), "--batch-size", str(batch),
                            "--gradient-accumulation-steps", str(accum), "--dtype", "bfloat16",
                            "--eval-interval", "1", "--eval-iters", "4")
    assert facts["eval_forwards"] == iters * 2 * 4  # both splits, every iteration
    p, m = check_loop(run, facts, iters=iters, batch=batch, accum=accum,
                      block=nano.GPTConfig.block_size, precision="bf16")
    assert p["gpuopt.strategy"] == "single" and p["gpuopt.world_size"] == "1"
    # input wait is the time from a step's end to the next step's first forward, less the
    # evaluation in between: the loop's next batch is already fetched, so the wait is a
    # small part of the evaluation that precedes it (which it would exceed if counted)
    steady_eval_s = facts["eval_s"][WARMUP_STEPS:]
    mean_eval_s = sum(steady_eval_s) / len(steady_eval_s)
    assert 0 <= m["gpuopt/summary/input_wait_mean_s"] < 0.25 * mean_eval_s
    waits = MlflowClient().get_metric_history(run.info.run_id, "gpuopt/input_wait_s")
    assert waits and all(w.value < 0.25 * mean_eval_s for w in waits)


def fp16_autocast_on_cpu() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    except Exception:
        return False


@pytest.mark.parametrize("dtype,precision", [
    ("float32", "fp32"),  # ctx is a nullcontext, the GradScaler disabled
    pytest.param("float16", "fp16", marks=pytest.mark.skipif(
        not fp16_autocast_on_cpu(), reason="no fp16 autocast on this CPU")),  # scaler on
])
def test_without_bf16(tracking_uri, tmp_path, dtype, precision):
    """fp32: no autocast at all; fp16: nanoGPT's enabled GradScaler, started at a scale that
    overflows fp16 gradients, so its first iterations (the profiled one among them) skip
    the update: still iterations, each one step of the same samples."""
    iters, batch, accum = 6, 2, 4
    run, facts = run_single(tmp_path, "--max-iters", str(iters), "--batch-size", str(batch),
                            "--gradient-accumulation-steps", str(accum), "--dtype", dtype,
                            "--eval-interval", "2", "--eval-iters", "2", "--block-size", "16",
                            "--init-scale", str(2.0 ** 23))
    check_loop(run, facts, iters=iters, batch=batch, accum=accum, block=16, precision=precision)
    if dtype == "float16":
        assert 1 <= facts["skipped_steps"] < iters
    else:
        assert facts["skipped_steps"] == 0


@pytest.mark.slow
def test_torchrun_two_gloo_processes_one_run(tmp_path):
    """nanoGPT divides the job's accumulation steps by the world size; each rank runs its
    share with ``require_backward_grad_sync`` off but on the last micro-step."""
    iters, batch, accum_total, world = 6, 4, 4, 2
    out = tmp_path / "facts"
    cmd = torchrun(f"--nproc-per-node={world}", f"--master-port={free_port()}", str(SCRIPT),
                   "--max-iters", str(iters), "--batch-size", str(batch),
                   "--gradient-accumulation-steps", str(accum_total), "--dtype", "float32",
                   "--eval-interval", "2", "--eval-iters", "2", "--interval", "0.2",
                   "--out", str(out))
    proc = subprocess.run(cmd, cwd=tmp_path, env=job_env(tmp_path), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)]
    assert [f["iterations"] for f in facts] == [iters, iters]  # both ranks, the same steps
    assert facts[0]["run_id"] and facts[1]["run_id"] is None  # only rank 0 opens the run
    accum = accum_total // world
    run = only_run(tmp_path)
    p, m = check_loop(run, facts[0], iters=iters, batch=batch, accum=accum,
                      block=nano.GPTConfig.block_size, precision="fp32")
    assert p["gpuopt.strategy"] == "ddp" and p["gpuopt.model_wrapper"] == "DistributedDataParallel"
    assert p["gpuopt.world_size"] == str(world) and p["gpuopt.backend"] == "gloo"
    rid = run.info.run_id
    r0 = history(rid, "gpuopt/rank_0/throughput_samples_per_s")
    r1 = history(rid, "gpuopt/rank_1/throughput_samples_per_s")
    total = history(rid, "gpuopt/throughput_samples_per_s")
    both = [s for s in total if s in r0 and s in r1]
    assert both, "no round with both ranks"
    for s in both:
        assert total[s] == pytest.approx(r0[s] + r1[s], rel=1e-9)
    # gradients are all-reduced once per iteration (the last micro-step), not per
    # micro-step: fp32 gradients of every parameter, the tied one once
    grad_bytes = 4 * facts[0]["params"]
    assert m["gpuopt/summary/comm_bytes_per_step"] == pytest.approx(grad_bytes, rel=0.01)
    assert 0 <= m["gpuopt/summary/exposed_comm_fraction"] <= 1
    assert proc.stdout.count("gpuopt: run ") + proc.stderr.count("gpuopt: run ") == 1
