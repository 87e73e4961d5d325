"""A measured run's own MoE token dispatcher and routing (the observations CSV's
``moe_dispatcher`` / ``moe_routing``, ``Observation.moe_dispatcher``): the fit reads the run
with the settings it ran with, whatever the planned run uses (docs/metrics.md#the-observations-csv,
docs/models.md#mixture-of-experts)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel.fitting import fit_calibration, run_workload
from mlflow_gpuopt.perfmodel.predictor import Predictor, fit, observed_fit
from mlflow_gpuopt.perfmodel.types import Hardware, Observation, ParallelConfig, Workload
from mlflow_gpuopt.workload_files import (
    WorkloadFileError,
    observations_to_csv,
    parse_observations_csv,
)

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"fp32": 66.9e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9, tdp_w=700.0)
B200 = Hardware(gpu="B200", memory_bytes=180e9, memory_bandwidth_bytes_per_s=7.7e12,
                peak_flops_per_s={"fp32": 80e12, "bf16": 2250e12, "fp8": 4500e12},
                intra_node_bytes_per_s=900e9, inter_node_bytes_per_s=400e9, tdp_w=1000.0)
HW = {"H100-SXM5-80GB": H100, "B200": B200}
# Qwen3-30B-A3B's MoE shape: 48 layers, hidden 2048, 128 experts, top-8, 768 wide
QWEN = Workload(params=30_532_122_624, flops_per_sample=8.1e13, precision="bf16",
                micro_batch=1, tokens_per_sample=4096, num_layers=48, hidden_size=2048,
                num_heads=32, num_kv_heads=4, vocab_size=151936, ffn_hidden_size=8 * 768,
                mlp="swiglu", num_experts=128, experts_per_token=8, expert_ffn_hidden_size=768,
                optimizer="adamw")
# 2 nodes of 8 H100, expert parallel 16: the all-to-all crosses the network, where DeepEP
# sends a token once per node and NCCL every routed copy
MEASURED = Observation(gpu="H100-SXM5-80GB", gpu_count=16, nodes=2, micro_batch=1,
                       strategy="ep16xfsdp", precision="bf16", grad_accum=4,
                       throughput_samples_per_s=40.0)
HEADER = "gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy"
ROW = "H100-SXM5-80GB,16,2,1,40,ep16xfsdp"


def test_the_csv_reads_the_runs_dispatcher_and_routing_in_their_words():
    (obs,) = parse_observations_csv(f"{HEADER},moe_dispatcher,moe_routing\n"
                                    f"{ROW},DeepEP,round-robin\n")
    assert (obs.moe_dispatcher, obs.moe_routing) == ("flex", "round_robin")
    (plain,) = parse_observations_csv(f"{HEADER},moe_dispatcher\n{ROW},\n")
    assert (plain.moe_dispatcher, plain.moe_routing) == (None, None)


def test_the_csv_round_trips_the_runs_dispatcher():
    obs = [replace(MEASURED, moe_dispatcher="flex", moe_routing="random"), MEASURED]
    assert parse_observations_csv(observations_to_csv(obs)) == obs


def test_an_unknown_dispatcher_in_the_csv_is_one_line_naming_the_row():
    with pytest.raises(WorkloadFileError) as err:
        parse_observations_csv(f"{HEADER},moe_dispatcher\n{ROW},carrier-pigeon\n")
    assert "row 2" in str(err.value) and "moe_dispatcher" in str(err.value)


def test_the_run_is_read_with_its_own_dispatcher():
    planned = replace(QWEN, moe_dispatcher="alltoall")
    run = run_workload(planned, replace(MEASURED, moe_dispatcher="deepep"))
    assert run == replace(QWEN, moe_dispatcher="flex")
    # nothing given, or the same words: the workload itself
    assert run_workload(planned, MEASURED) is planned
    assert run_workload(planned, replace(MEASURED, moe_dispatcher="a2a")) is planned


def test_a_deepep_run_fits_as_deepep_whatever_the_plan_uses():
    deepep = replace(MEASURED, moe_dispatcher="flex")
    # the planned run without DeepEP, fitted on the DeepEP run ...
    marked = fit_calibration(replace(QWEN, moe_dispatcher="alltoall"), [deepep], HW)
    # ... is the fit of a DeepEP workload on the same run
    as_run = fit_calibration(replace(QWEN, moe_dispatcher="flex"), [MEASURED], HW)
    # and not the fit that reads the DeepEP run as NCCL all-to-all
    misread = fit_calibration(replace(QWEN, moe_dispatcher="alltoall"), [MEASURED], HW)
    key = ("H100-SXM5-80GB", "bf16")
    assert marked.log_compute_scale[key] == pytest.approx(as_run.log_compute_scale[key])
    assert marked.comm_scale == pytest.approx(as_run.comm_scale)
    # NCCL's 8 copies a token over the network against DeepEP's one per node: read as
    # all-to-all, the same throughput leaves the GPU less time, a faster compute scale
    assert misread.log_compute_scale[key] + 0.1 < marked.log_compute_scale[key]
    assert misread.comm_scale < 0.9 * marked.comm_scale


def test_carried_to_another_gpu_the_plan_pays_its_own_dispatcher():
    deepep = replace(MEASURED, moe_dispatcher="flex")
    planned = replace(QWEN, moe_dispatcher="alltoall")
    target = ParallelConfig(gpus_per_node=8, nodes=2, strategy="ep16xfsdp", micro_batch=1,
                            grad_accum=4, precision="bf16")
    got = fit(planned, [deepep], HW).predict(target, B200)
    # the same calibration built from the DeepEP workload, predicting the all-to-all plan
    reference = Predictor(planned, fit_calibration(replace(QWEN, moe_dispatcher="flex"),
                                                   [MEASURED], HW),
                          observed_fit(planned, [MEASURED], HW), HW).predict(target, B200)
    assert got.throughput_samples_per_s == pytest.approx(reference.throughput_samples_per_s)
    misread = fit(planned, [MEASURED], HW).predict(target, B200)
    assert abs(misread.throughput_samples_per_s / got.throughput_samples_per_s - 1) > 0.01
