"""Pipeline point-to-point traffic in the step: what one GPU sends across a stage boundary
(sequence parallelism splits it over the tensor-parallel ranks) and which schedule hides it
(the interleaved one overlaps its sends with compute, 1F1B waits on them; the fill and drain
cross the pipe in the open). Expected values are the boundary's bytes over the link, by hand."""

from __future__ import annotations

import dataclasses

import pytest

from mlflow_gpuopt.perfmodel import Hardware, ParallelConfig, Workload, comm
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms

LAYERS, HIDDEN, SEQ = 24, 4096, 2048
WORKLOAD = Workload(params=5_000_000_000, flops_per_sample=6 * 5e9 * SEQ, precision="bf16",
                    micro_batch=1, tokens_per_sample=SEQ, num_layers=LAYERS,
                    hidden_size=HIDDEN, num_heads=32, ffn_hidden_size=4 * HIDDEN,
                    vocab_size=32000, optimizer="adamw")
#: Two GPUs a node on a slow network (each GPU its NIC share: 25e9 / 2 B/s), and the same
#: node on a network fast enough that its sends cost only their latency.
SLOW = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2000e9,
                peak_flops_per_s={"fp32": 20e12, "tf32": 160e12, "fp16": 320e12,
                                  "bf16": 320e12},
                intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9, gpus_per_node=2)
FAST = dataclasses.replace(SLOW, inter_node_bytes_per_s=1e18)
ACCUM = 8


def _step(hardware: Hardware, strategy: str, gpus_per_node: int):
    layout = resolve_layout(ParallelConfig(gpus_per_node=gpus_per_node, nodes=4,
                                           strategy=strategy))
    assert layout.dp == 1 and layout.pp_spans_nodes  # no data-parallel term, stages on the NIC
    return step_terms(WORKLOAD, hardware, "bf16", layout, 1.0, ACCUM, model_shape(WORKLOAD),
                      8.0, Calibration()), layout


def _crossing_s(tp: int) -> float:
    """One micro-batch across one boundary, activation forward + gradient back, bandwidth
    part only: the GPU's share of the ``b·s·h`` bf16 boundary over its NIC share."""
    nbytes = 1 * SEQ * HIDDEN * 2 / tp
    return 2 * nbytes / (SLOW.inter_node_bytes_per_s / SLOW.gpus_per_node * comm.BUS_EFFICIENCY)


def test_1f1b_waits_on_every_send_and_the_fill_and_drain():
    slow, layout = _step(SLOW, "tp2xpp4", 2)
    fast, _ = _step(FAST, "tp2xpp4", 2)
    # s micro-steps each wait on their crossing, and the bubble's p-1 crossings
    crossings = ACCUM + layout.pp - 1
    assert slow.step_s - fast.step_s == pytest.approx(crossings * _crossing_s(2), rel=1e-4)
    assert slow.bubble_s - fast.bubble_s == pytest.approx((layout.pp - 1) * _crossing_s(2),
                                                          rel=1e-4)


def test_interleaved_schedule_hides_its_sends_under_compute():
    slow, layout = _step(SLOW, "tp2xpp4xvp2", 2)
    fast, _ = _step(FAST, "tp2xpp4xvp2", 2)
    assert layout.vp == 2
    # v = 2 crossings a micro-step (under its compute: overlapped), only the fill and drain's
    # p-1 crossings are in the open
    assert 2 * _crossing_s(2) < fast.compute_s / ACCUM
    assert slow.step_s - fast.step_s == pytest.approx((layout.pp - 1) * _crossing_s(2),
                                                      rel=1e-4)


def test_sequence_parallel_splits_the_boundary_over_the_tensor_parallel_ranks():
    tp1_slow, _ = _step(SLOW, "pp4", 1)
    tp1_fast, _ = _step(FAST, "pp4", 1)
    tp2_slow, _ = _step(SLOW, "tp2xpp4", 2)
    tp2_fast, _ = _step(FAST, "tp2xpp4", 2)
    crossings = ACCUM + 4 - 1
    tp1 = tp1_slow.step_s - tp1_fast.step_s
    tp2 = tp2_slow.step_s - tp2_fast.step_s
    assert tp1 == pytest.approx(crossings * _crossing_s(1), rel=1e-4)
    assert tp1 == pytest.approx(2 * tp2, rel=1e-4)


def test_each_run_of_the_schedule_fills_and_drains_the_pipeline():
    # torchtitan / AutoModel: 8 micro-batches a schedule run, 32 a step: 4 runs, 4 bubbles
    from mlflow_gpuopt.perfmodel.step import pipeline_flushes

    assert pipeline_flushes(WORKLOAD, 32) == 1  # Megatron: one schedule per step
    per_run = dataclasses.replace(WORKLOAD, pp_microbatches=8)
    assert pipeline_flushes(per_run, 32) == 4
    assert pipeline_flushes(per_run, 30) == 4  # the last run takes the 6 left
    assert pipeline_flushes(per_run, 8) == 1
    layout = resolve_layout(ParallelConfig(gpus_per_node=2, nodes=4, strategy="tp2xpp4"))
    one = step_terms(WORKLOAD, SLOW, "bf16", layout, 1.0, 32, model_shape(WORKLOAD), 8.0,
                     Calibration())
    four = step_terms(per_run, SLOW, "bf16", layout, 1.0, 32, model_shape(WORKLOAD), 8.0,
                      Calibration())
    assert four.bubble_s == pytest.approx(4 * one.bubble_s)
    # the steady state is the same: the step grows by the 3 extra bubbles
    assert four.step_s - one.step_s == pytest.approx(3 * one.bubble_s)
    assert four.compute_s == pytest.approx(one.compute_s)


def test_each_run_of_the_schedule_reduces_its_gradients():
    """torch.distributed.pipelining ends every run of the schedule with REDUCE_GRAD (FSDP's
    post-backward and reshard, DDP's sync on the run's last chunk), so 4 runs a step pay the
    data-parallel sync 4 times; Megatron's single run pays it once."""
    layout = resolve_layout(ParallelConfig(gpus_per_node=2, nodes=4, strategy="pp2xfsdp"))
    assert layout.dp == 4 and layout.dp_spans_nodes
    per_run = dataclasses.replace(WORKLOAD, pp_microbatches=8)

    def terms(workload, hardware):
        return step_terms(workload, hardware, "bf16", layout, 1.0, 32, model_shape(workload),
                          8.0, Calibration())

    # what the sync adds: the slow network against one that makes it free
    once = terms(WORKLOAD, SLOW).step_s - terms(WORKLOAD, FAST).step_s
    four = terms(per_run, SLOW).step_s - terms(per_run, FAST).step_s
    # (the two stages share a node: their boundary is on NVLink in both)
    assert once > 0
    assert four == pytest.approx(4 * once, rel=1e-6)
