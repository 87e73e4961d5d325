"""Reading gpuopt runs from a real sqlite MLflow store into Workload + Observations."""

from __future__ import annotations

import mlflow
import pytest
from mlflow import MlflowClient

from mlflow_gpuopt.mlflow_io.runs import RunInputError, load_run_inputs

PROFILE = {"schema": "gpuopt.workload/1", "name": "tiny_gpt", "params": 1_234_567,
           "trainable_params": 1_234_567, "flops_per_sample": 3.1e9, "precision": "fp32",
           "micro_batch": 8, "grad_accum": 1, "optimizer": "AdamW",
           "optimizer_state_bytes_per_param": 8, "activation_bytes_per_sample": 2.5e6,
           "activation_saved_bytes_per_sample": 2.0e6, "tokens_per_sample": 128,
           "largest_layer_params": 65536, "hardware": {"device": "cpu"}}


@pytest.fixture
def client(tracking_uri, tmp_path):
    c = MlflowClient(tracking_uri)
    mlflow.set_experiment("gpuopt-io")
    return c


def _log_run(client, *, device="cpu", world=1, count=1, nodes=1, thr=42.0, profile=PROFILE,
             params_extra=None, metric=True):
    exp = client.get_experiment_by_name("gpuopt-io").experiment_id
    run = client.create_run(exp)
    rid = run.info.run_id
    params = {"gpuopt.device": device, "gpuopt.device_count": count, "gpuopt.nodes": nodes,
              "gpuopt.world_size": world, "gpuopt.precision": "fp32", "gpuopt.micro_batch": 8,
              "gpuopt.grad_accum": 1, "gpuopt.strategy": "single" if world == 1 else "ddp",
              "gpuopt.params": 1_234_567, "gpuopt.flops_per_sample": "3.1e+09"}
    params.update(params_extra or {})
    for k, v in params.items():
        client.log_param(rid, k, v)
    if metric:
        client.log_metric(rid, "gpuopt/summary/throughput_samples_per_s", thr)
    if profile is not None:
        client.log_dict(rid, profile, "gpuopt/profile.json")
    client.set_terminated(rid)
    return rid


def test_reads_workload_and_observations(client):
    a = _log_run(client, thr=42.0)
    b = _log_run(client, device="NVIDIA A100-SXM4-80GB", world=8, count=8, thr=9000.0)
    inputs = load_run_inputs([a, b], client=client)
    assert inputs.run_ids == (a, b)
    w = inputs.workload
    assert (w.params, w.flops_per_sample, w.precision, w.tokens_per_sample) == (
        1_234_567, 3.1e9, "fp32", 128)
    assert w.activation_bytes_per_sample == 2.5e6 and w.largest_layer_params == 65536
    cpu, gpu = inputs.observations
    assert (cpu.gpu, cpu.gpu_count, cpu.throughput_samples_per_s) == ("cpu", 1, 42.0)
    assert (gpu.gpu, gpu.gpu_count, gpu.strategy, gpu.micro_batch) == (
        "A100-80GB-SXM4", 8, "ddp", 8)


def test_profile_missing_falls_back_to_params(client):
    rid = _log_run(client, profile=None)
    w = load_run_inputs([rid], client=client).workload
    assert (w.params, w.flops_per_sample, w.micro_batch) == (1_234_567, 3.1e9, 8)


def test_kernel_count_from_profile_or_param_and_absent_in_old_runs(client):
    profiled = _log_run(client, profile={**PROFILE, "kernels_per_micro_step": 68400.0})
    assert load_run_inputs([profiled], client=client).workload.kernels_per_micro_step == 68400.0
    by_param = _log_run(client, profile=None,
                        params_extra={"gpuopt.kernels_per_micro_step": "1234.5"})
    assert load_run_inputs([by_param], client=client).workload.kernels_per_micro_step == 1234.5
    old = _log_run(client)  # a profile written before the count existed
    assert load_run_inputs([old], client=client).workload.kernels_per_micro_step is None


def test_unknown_run_id(client):
    with pytest.raises(RunInputError, match="unknown run id 'deadbeef"):
        load_run_inputs(["deadbeef00000000000000000000000"], client=client)


def test_run_without_gpuopt_data(client):
    exp = client.get_experiment_by_name("gpuopt-io").experiment_id
    rid = client.create_run(exp).info.run_id
    client.log_param(rid, "lr", 0.1)
    with pytest.raises(RunInputError, match=r"no gpuopt data; run it under gpuopt.track\(\)"):
        load_run_inputs([rid], client=client)


def test_run_without_throughput(client):
    rid = _log_run(client, metric=False)
    with pytest.raises(RunInputError, match="throughput_samples_per_s"):
        load_run_inputs([rid], client=client)


def test_runs_of_different_workloads(client):
    a = _log_run(client)
    other = dict(PROFILE, params=999, flops_per_sample=1e6)
    b = _log_run(client, profile=other, params_extra={"gpuopt.params": 999})
    with pytest.raises(RunInputError, match="different workloads"):
        load_run_inputs([a, b], client=client)


def test_unknown_gpu_name_is_reported(client):
    rid = _log_run(client, device="Acme Flux 9000")
    with pytest.raises(RunInputError, match="unknown GPU"):
        load_run_inputs([rid], client=client)


def test_both_readers_parse_params_alike(client):
    """runs.py and measured.py read params with one helper: "8.0" is 8; "None", "inf" and
    text are missing (the reader's default), never an exception."""
    from mlflow_gpuopt.mlflow_io.measured import measured_runs

    rid = _log_run(client, device="NVIDIA A100-SXM4-80GB", world=8, count="8.0",
                   params_extra={"gpuopt.world_size": "None", "gpuopt.micro_batch": "16.0",
                                 "gpuopt.grad_accum": "lots", "gpuopt.params": "inf"})
    (obs,) = load_run_inputs([rid], client=client).observations
    assert (obs.gpu_count, obs.micro_batch, obs.grad_accum) == (8, 16, 1)
    (run,) = measured_runs([rid], client=client)
    assert (run.device_count, run.world_size, run.micro_batch) == (8, 1, 16)
    assert run.params is None and run.flops_per_sample == 3.1e9


def test_compound_layouts_and_degrees_read_back(client):
    """A tensor-parallel run (``gpuopt.strategy`` a compound layout, degrees as params) and
    one whose strategy alone names the degrees become observations with tp/pp set; the
    profile's attention / recompute / FP8 recipe reach the workload."""
    profile = {**PROFILE, "precision": "fp8", "attention": "eager", "recompute": "selective",
               "fp8_recipe": "rowwise"}
    a = _log_run(client, device="NVIDIA H100 80GB HBM3", world=16, count=8, nodes=2,
                 thr=900.0, profile=profile,
                 params_extra={"gpuopt.strategy": "tp2xfsdp", "gpuopt.tp": 2, "gpuopt.pp": 1,
                               "gpuopt.dp": 8, "gpuopt.cp": 1, "gpuopt.recompute": "selective",
                               "gpuopt.precision": "fp8"})
    b = _log_run(client, device="NVIDIA H100 80GB HBM3", world=96, count=8, nodes=12,
                 thr=800.0, profile=profile, params_extra={"gpuopt.strategy": "tp8xpp12xddp"})
    inputs = load_run_inputs([a, b], client=client)
    w = inputs.workload
    assert (w.precision, w.attention, w.recompute, w.fp8_recipe) == (
        "fp8", "eager", "selective", "rowwise")
    tp_run, megatron = inputs.observations
    assert (tp_run.strategy, tp_run.tp, tp_run.pp, tp_run.gpu_count, tp_run.nodes) == (
        "tp2xfsdp", 2, 1, 16, 2)
    assert tp_run.recompute == "selective" and tp_run.precision == "fp8"
    assert (megatron.strategy, megatron.tp, megatron.pp, megatron.gpu_count) == (
        "tp8xpp12xddp", 8, 12, 96)


def test_a_context_parallel_degree_joins_the_strategy(client):
    """``gpuopt.cp`` is part of the layout: a run whose strategy does not spell it gets it
    added; one that spells it (as track() logs it) keeps it."""
    a = _log_run(client, device="NVIDIA H100 80GB HBM3", world=8, count=8, nodes=1,
                 thr=10.0, profile=PROFILE,
                 params_extra={"gpuopt.strategy": "fsdp", "gpuopt.dp": 4, "gpuopt.cp": 2})
    b = _log_run(client, device="NVIDIA H100 80GB HBM3", world=8, count=8, nodes=1,
                 thr=10.0, profile=PROFILE,
                 params_extra={"gpuopt.strategy": "tp2xfsdpxcp2", "gpuopt.tp": 2,
                               "gpuopt.cp": 2})
    first, second = load_run_inputs([a, b], client=client).observations
    assert first.strategy == "cp2xfsdp"
    assert (second.strategy, second.tp) == ("tp2xfsdpxcp2", 2)


def test_layouts_that_cannot_be_are_one_line_errors(client):
    bad = _log_run(client, world=4, count=4, params_extra={"gpuopt.strategy": "tp2xwhat"})
    with pytest.raises(RunInputError, match="unknown gpuopt.strategy 'tp2xwhat'"):
        load_run_inputs([bad], client=client)
    odd = _log_run(client, world=4, count=4,
                   params_extra={"gpuopt.strategy": "tp3xddp", "gpuopt.tp": 3})
    with pytest.raises(RunInputError, match="gpuopt.tp 3 does not divide"):
        load_run_inputs([odd], client=client)
