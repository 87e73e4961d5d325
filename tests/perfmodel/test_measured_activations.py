"""A measured activation figure holds what the run kept under its own recomputation: a
prediction at the same mode uses it as it is, another mode scales it (by the per-layer
formula's ratio where the architecture is known)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mlflow_gpuopt.perfmodel import ParallelConfig, Workload
from mlflow_gpuopt.perfmodel.activations import TransformerDims, activation_bytes
from mlflow_gpuopt.perfmodel.memory import memory_per_gpu

MEASURED = 3.0e6  # activation bytes per sample, as a profile logs them
MB = 4
#: 24 layers and no architecture: full checkpointing keeps 1/max(2, sqrt(24)) of the rest
CF = math.sqrt(24)
PLAIN = Workload(params=350_000_000, flops_per_sample=6 * 350e6 * 1024, precision="bf16",
                 micro_batch=MB, optimizer="AdamW", activation_bytes_per_sample=MEASURED,
                 num_layers=24)


def act(workload: Workload, recompute: str | None = None) -> float:
    cfg = ParallelConfig(gpus_per_node=1, strategy="single", recompute=recompute)
    return memory_per_gpu(workload, cfg).activations_bytes


def test_a_checkpointed_run_is_predicted_with_what_it_kept():
    measured_full = dataclasses.replace(PLAIN, recompute="full")
    # the run's own mode: its figure as measured, not divided by the recomputation again
    assert act(measured_full) == pytest.approx(MEASURED * MB)
    # without checkpointing it keeps what checkpointing dropped
    assert act(measured_full, "none") == pytest.approx(MEASURED * MB * CF)


def test_a_run_without_recomputation_scales_down_for_full():
    assert act(PLAIN) == pytest.approx(MEASURED * MB)
    assert act(PLAIN, "full") == pytest.approx(MEASURED * MB / CF)
    assert act(PLAIN, "selective") == pytest.approx(MEASURED * MB)  # no architecture: as none


def test_with_the_architecture_the_formula_gives_the_ratio():
    dims = dict(num_layers=24, hidden_size=1024, tokens_per_sample=1024, num_heads=16,
                ffn_hidden_size=4096, mlp="gelu", vocab_size=50304, attention="sdpa",
                dropout=0.0)
    workload = dataclasses.replace(PLAIN, recompute="full", **dims)
    d = TransformerDims(num_layers=24, hidden_size=1024, seq_len=1024, num_heads=16,
                        ffn_hidden_size=4096, vocab_size=50304)

    def kept(mode: str) -> float:  # bf16, no dropout masks, SDPA
        return activation_bytes(d, 1, 2, 0.0, attention="sdpa", attention_dropout=False,
                                recompute=mode).peak_bytes

    assert act(workload) == pytest.approx(MEASURED * MB)
    assert act(workload, "none") == pytest.approx(MEASURED * MB * kept("none") / kept("full"))
    assert act(workload, "selective-op") == pytest.approx(
        MEASURED * MB * kept("selective-op") / kept("full"))
    # the formula's ratio (the logits and one layer rebuilt stay in full's peak), not sqrt(L)
    assert kept("none") / kept("full") != pytest.approx(CF, rel=0.1)


def test_the_runs_own_recomputation_costs_what_it_replayed():
    """The profile counts the forward operators a checkpointed run replayed; at that mode the
    step's extra work is that share, not the assumed full forward (× 4/3)."""
    from mlflow_gpuopt.perfmodel.memory import recompute_factor
    from mlflow_gpuopt.workload_files import workload_from_dict

    flops = PLAIN.flops_per_sample
    replayed = dataclasses.replace(PLAIN, recompute="full",
                                   recompute_flops_per_sample=0.2 * flops)
    assert recompute_factor(replayed, "full") == pytest.approx(1.2)
    assert recompute_factor(replayed, "none") == 1.0
    assert recompute_factor(PLAIN, "full") == pytest.approx(4 / 3)  # not measured: assumed
    doc = {"params": 1000, "flops_per_sample": 6000.0, "precision": "fp32",
           "recompute": "full", "recompute_flops_per_sample": 1500.0}
    assert recompute_factor(workload_from_dict(doc), "full") == pytest.approx(1.25)
