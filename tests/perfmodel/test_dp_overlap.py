"""Data-parallel collectives on the hardware rented: bus bandwidth per fabric class (PCIe vs
NVLink), DDP's 25 MB buckets under the backward with the last one exposed, FSDP per unit; and
the explanation of a cross-GPU prediction by operator class."""

from __future__ import annotations

import math

import pytest

from mlflow_gpuopt.catalog import load_gpus
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import Hardware, Observation, ParallelConfig, Workload, comm, fit
from mlflow_gpuopt.perfmodel.compute import (
    OPERATOR_CLASSES,
    operator_class_times_s,
    optimizer_time_prior_s,
)
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms

NVLINK = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2.0e12,
                  peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                                    "bf16": 312e12},
                  intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=200e9, gpus_per_node=8,
                  intra_node_link="nvswitch")
PCIE = Hardware(gpu="L4", memory_bytes=24e9, memory_bandwidth_bytes_per_s=300e9,
                peak_flops_per_s={"fp32": 30e12, "fp16": 121e12, "bf16": 121e12},
                intra_node_bytes_per_s=32e9, inter_node_bytes_per_s=12.5e9, gpus_per_node=8,
                intra_node_link="pcie4")
BERT = Workload(params=336_000_000, flops_per_sample=264e9, precision="fp32", name="bert",
                tokens_per_sample=128, num_layers=24, hidden_size=1024, num_heads=16,
                vocab_size=30522, attention="eager")


def _ring(nbytes, n, bw, lat):
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


def test_pcie_bus_efficiency_is_nccl_measured_share_by_ring_size():
    assert comm.intra_bus_efficiency(PCIE) == pytest.approx(28 / 64)
    assert comm.intra_bus_efficiency(PCIE, 4) == pytest.approx(35 / 64)
    assert comm.intra_bus_efficiency(NVLINK) == comm.BUS_EFFICIENCY


def test_catalog_hardware_names_its_fabric():
    gpus = load_gpus()
    assert hardware_for_gpu(gpus["L4"], gpus_per_node=8).intra_node_link.startswith("pcie")
    assert hardware_for_gpu(gpus["A100-80GB-SXM4"], gpus_per_node=8).intra_node_link == "nvlink"


def test_bucketed_overlap_exposes_the_last_bucket_or_the_queue_overrun():
    # comm well inside the window: only the last bucket's own time
    assert comm.bucketed_exposed_s(0.010, 1.0, 40, 0.002) == pytest.approx(0.002)
    # comm longer than the window: the queue overruns the window's first (1 - 1/n)
    assert comm.bucketed_exposed_s(2.0, 1.0, 4, 0.1) == pytest.approx(0.1 + 1.9 - 0.75)
    assert comm.bucketed_exposed_s(0.0, 1.0, 4, 0.1) == 0.0


def test_ddp_last_bucket_is_the_embedding_gradient_after_the_backward():
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ddp"))
    grad = 336e6 * 4
    embedding = 30522 * 1024 * 4  # 125 MB: one parameter, a bucket of its own
    bw = 300e9 * comm.BUS_EFFICIENCY
    expected = _ring(embedding, 8, bw, comm.INTRA_NODE_LATENCY_S)
    got = comm.ddp_exposed_s(grad, embedding, layout, NVLINK, backward_s=10.0)
    assert got == pytest.approx(expected, rel=1e-6)
    # no embedding known: the last of ceil(grad / 25 MiB) equal buckets
    buckets = math.ceil(grad / comm.DDP_BUCKET_BYTES)
    share = _ring(grad / buckets, 8, bw, comm.INTRA_NODE_LATENCY_S)
    assert comm.ddp_exposed_s(grad, 0.0, layout, NVLINK, 10.0) == pytest.approx(share, rel=1e-6)
    # on PCIe the same all-reduce takes the PCIe share of the slot
    pcie = comm.ddp_exposed_s(grad, embedding, layout, PCIE, 10.0)
    assert pcie == pytest.approx(_ring(embedding, 8, 32e9 * 28 / 64, comm.INTRA_NODE_LATENCY_S),
                                 rel=1e-6)


def test_ddp_step_adds_the_exposed_buckets_to_the_micro_steps():
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="ddp", micro_batch=32))
    single = resolve_layout(ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=32))
    shape = model_shape(BERT)
    one = step_terms(BERT, PCIE, "fp32", single, 32, 1, shape, 8.0, Calibration())
    eight = step_terms(BERT, PCIE, "fp32", layout, 32, 1, shape, 8.0, Calibration())
    t_micro = one.step_s - optimizer_time_prior_s(336e6, 8.0, PCIE, "fp32")
    exposed = comm.ddp_exposed_s(336e6 * 4, 30522 * 1024 * 4, layout, PCIE,
                                 comm.BACKWARD_SHARE * t_micro)
    straggle = comm.sync_overhead_s(t_micro, 8)
    assert eight.step_s == pytest.approx(one.step_s + exposed + straggle, rel=1e-9)
    assert eight.exposed_comm_s > 0
    # the fitted communication scale scales the collectives and the straggler share together
    two = step_terms(BERT, PCIE, "fp32", layout, 32, 1, shape, 8.0, Calibration(comm_scale=2.0))
    exposed2 = comm.ddp_exposed_s(336e6 * 4, 30522 * 1024 * 4, layout, PCIE,
                                  comm.BACKWARD_SHARE * t_micro, 2.0)
    # ... the straggler share's first doubling: 2% x (log2(8) - 1 + 2) of the micro-step
    assert two.step_s == pytest.approx(one.step_s + exposed2 + 0.02 * 4 * t_micro, rel=1e-9)
    assert straggle == pytest.approx(0.02 * 3 * t_micro)


def test_fsdp_gathers_hide_under_a_long_micro_step_but_not_the_first_and_last_unit():
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, strategy="fsdp"))
    shard, unit = 7e9 * 2, 2e8 * 2
    bw = 300e9 * comm.BUS_EFFICIENCY
    half_unit = 0.5 * _ring(unit, 8, bw, comm.INTRA_NODE_LATENCY_S)
    got = comm.fsdp_exposed_s(shard, unit, 32, layout, NVLINK, forward_s=10.0, backward_s=20.0)
    assert got == pytest.approx(2 * half_unit, rel=1e-6)
    short = comm.fsdp_exposed_s(shard, unit, 32, layout, NVLINK, 1e-4, 2e-4)
    assert short > 0.5 * _ring(shard, 8, bw, comm.INTRA_NODE_LATENCY_S)


def test_operator_classes_sum_to_the_micro_step_and_explain_a_transfer():
    a100 = NVLINK
    v100 = Hardware(gpu="V100-SXM2-16GB", memory_bytes=16e9,
                    memory_bandwidth_bytes_per_s=900e9,
                    peak_flops_per_s={"fp32": 15.7e12, "fp16": 125e12},
                    intra_node_bytes_per_s=150e9, inter_node_bytes_per_s=50e9)
    single = resolve_layout(ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=16))
    t = step_terms(BERT, v100, "fp16", single, 16, 1, model_shape(BERT), 8.0, Calibration())
    classes = operator_class_times_s(BERT, v100, "fp16", 16)
    assert set(classes) == set(OPERATOR_CLASSES)
    opt = optimizer_time_prior_s(336e6, 8.0, v100, "fp16")
    assert sum(classes.values()) == pytest.approx(t.compute_s - opt, rel=1e-9)

    obs = [Observation(gpu=v100.gpu, gpu_count=1, throughput_samples_per_s=200.0,
                       micro_batch=16, strategy="single", precision="fp16")]
    pred = fit(BERT, obs, {v100.gpu: v100})
    config = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=16,
                            precision="fp16")
    rows = pred.transfer_classes(config, a100)
    assert rows and rows[0]["source"] == f"{v100.gpu} fp16"
    # the matmuls move most: A100's 16-bit peak is 2.5x V100's, its bandwidth 2.2x
    assert rows[0]["class"] == "matmuls" and rows[0]["step_change"] < 0
    note = [n for n in pred.predict(config, a100).assumptions if "operator class" in n]
    assert note and "matmuls" in note[0] and v100.gpu in note[0]
    assert pred.transfer_classes(config, v100) == []  # measured there: nothing carried


def test_prior_width_is_built_from_what_was_assumed():
    from mlflow_gpuopt.perfmodel import uncertainty as unc

    v100 = Hardware(gpu="V100-SXM2-16GB", memory_bytes=16e9,
                    memory_bandwidth_bytes_per_s=900e9,
                    peak_flops_per_s={"fp32": 15.7e12, "fp16": 125e12},
                    intra_node_bytes_per_s=150e9, inter_node_bytes_per_s=50e9)
    described = fit(BERT, [], {})
    bare = fit(Workload(params=336_000_000, flops_per_sample=264e9, precision="fp16"), [], {})

    def sigma(pred, hw, precision):
        return pred.predict(ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=16,
                                           precision=precision), hw).log_sigma

    # Ampere at 16 bit: GENERATION_MFU has it, the whole prior's published spread
    assert sigma(described, NVLINK, "fp16") == pytest.approx(unc.SIGMA_PRIOR_TRANSFORMER)
    # Volta: no published MFU, Ampere's carried with the generations' spread
    assert sigma(described, v100, "fp16") == pytest.approx(
        math.hypot(unc.SIGMA_PRIOR_TRANSFORMER, unc.SIGMA_GENERATION_UNMEASURED))
    # TF32 on Ampere: another operator path
    assert sigma(described, NVLINK, "tf32") == pytest.approx(
        math.hypot(unc.SIGMA_PRIOR_TRANSFORMER, unc.SIGMA_OTHER_PRECISION))
    # V100 fp32: both pieces, still narrower than a workload given by its size alone
    both = sigma(described, v100, "fp32")
    assert both == pytest.approx(math.sqrt(unc.SIGMA_PRIOR_TRANSFORMER ** 2
                                           + unc.SIGMA_GENERATION_UNMEASURED ** 2
                                           + unc.SIGMA_OTHER_PRECISION ** 2))
    assert sigma(bare, v100, "fp16") == pytest.approx(unc.SIGMA_PRIOR_ONLY)
    assert both < unc.SIGMA_PRIOR_ONLY


def test_predict_names_the_operator_classes_of_a_cross_gpu_prediction(tmp_path):
    import json

    from click.testing import CliRunner

    from mlflow_gpuopt.cli import gpuopt

    w = tmp_path / "workload.json"
    w.write_text(json.dumps({"schema": "gpuopt.workload/1", "name": "bert", "params": 336e6,
                             "flops_per_sample": 264e9, "precision": "fp16",
                             "tokens_per_sample": 128, "num_layers": 24, "hidden_size": 1024,
                             "num_heads": 16, "vocab_size": 30522, "attention": "eager"}))
    o = tmp_path / "obs.csv"
    o.write_text("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,precision\n"
                 "V100-SXM2-16GB,1,1,64,224,single,fp16\n")

    def run(gpu, *extra):
        r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(w), "--observations",
                                        str(o), "--gpu", gpu, "--gpus", "1", "--micro-batch",
                                        "64", *extra], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    carried = json.loads(run("A100-80GB-SXM4", "--json"))
    classes = carried["operator_classes"]
    assert classes[0]["class"] == "matmuls" and classes[0]["source"] == "V100-SXM2-16GB fp16"
    assert abs(classes[0]["step_change"]) >= abs(classes[-1]["step_change"])
    assert "by operator class" in run("A100-80GB-SXM4")  # the human output says it
    assert json.loads(run("V100-SXM2-16GB", "--json"))["operator_classes"] == []
