"""Networks as rented: the node network a multi-node prediction assumes (an instance type,
``--inter-node-gbps``, or the catalog's multi-node offers of the GPU), multi-rail per-GPU
bandwidth and NCCL's hierarchical all-reduce."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.catalog import load_catalog
from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.hardware import DEFAULT_INTER_NODE_GBPS, multi_node_network
from mlflow_gpuopt.perfmodel import Hardware, ParallelConfig
from mlflow_gpuopt.perfmodel import comm
from mlflow_gpuopt.perfmodel.layout import resolve_layout

#: A 7B decoder (32 layers, hidden 4096, sequence 2048, bf16, AdamW): 6·N·s FLOPs per sample.
WORKLOAD = {"schema": "gpuopt.workload/1", "name": "decoder-7b", "params": 6.7e9,
            "flops_per_sample": 6 * 6.7e9 * 2048, "precision": "bf16", "micro_batch": 2,
            "optimizer": "adamw", "tokens_per_sample": 2048, "num_layers": 32,
            "hidden_size": 4096, "activation_bytes_per_sample": 1.0e9,
            "memory_traffic_bytes_per_sample": 6.0e9}
OBS = ("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,precision\n"
       "H100-SXM5-80GB,8,1,2,30,fsdp,bf16\n")
# (the ``files`` fixture of tests/conftest.py writes WORKLOAD and OBS for each test)


def _predict(files, gpus, *extra):
    w, o = files
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", w, "--observations", o, "--gpu",
                                    "H100", "--gpus", str(gpus), "--strategy", "fsdp", "--json",
                                    *extra], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_catalog_network_of_h100_is_what_its_multi_node_offers_provide():
    net = multi_node_network(load_catalog().offers, "H100-SXM5-80GB")
    # p5.48xlarge and ND H100 v5 (3,200) outnumber a3-high (1,000) and a3-mega (1,800);
    # the 1-GPU p5.4xlarge (100 Gbit/s) is not a node a multi-node job rents.
    assert net.inter_node_gbps == 3200
    assert "p5.48xlarge" in net.source and net.rdma is True


def test_gpu_without_multi_node_offers_falls_back_to_ethernet_and_says_so():
    net = multi_node_network(load_catalog().offers, "RTX-4090")
    assert net.inter_node_gbps == DEFAULT_INTER_NODE_GBPS
    assert net.source.startswith("default:")


@pytest.mark.parametrize("gpus", [16, 64, 512])
def test_predict_multi_node_h100_uses_rented_network_and_says_which(files, gpus):
    default = _predict(files, gpus)
    assert default["network"]["inter_node_gbps"] == 3200
    assert default["network"]["source"].startswith("catalog:")
    p5 = _predict(files, gpus, "--instance-type", "p5.48xlarge")
    assert p5["network"]["source"] == "instance type aws p5.48xlarge"
    assert p5["instance_type"] == "p5.48xlarge"
    a3 = _predict(files, gpus, "--instance-type", "a3-highgpu-8g")
    assert a3["network"]["inter_node_gbps"] == 1000
    mega = _predict(files, gpus, "--instance-type", "a3-megagpu-8g")
    assert mega["network"]["inter_node_gbps"] == 1800
    nd = _predict(files, gpus, "--instance-type", "Standard_ND96isr_H100_v5")
    assert nd["network"]["inter_node_gbps"] == 3200
    eth = _predict(files, gpus, "--inter-node-gbps", "100")
    assert eth["network"] == {"inter_node_gbps": 100.0, "source": "--inter-node-gbps",
                              "rdma": None}
    # A faster network is faster, and 100 Gbit/s Ethernet is far slower than either.
    assert (eth["throughput_samples_per_s"] < a3["throughput_samples_per_s"]
            < mega["throughput_samples_per_s"] < p5["throughput_samples_per_s"])
    assert nd["throughput_samples_per_s"] == pytest.approx(p5["throughput_samples_per_s"])
    assert p5["throughput_samples_per_s"] > 2 * eth["throughput_samples_per_s"]


def test_throughput_grows_with_the_network(files):
    seen = [_predict(files, 128, "--inter-node-gbps", str(g))["throughput_samples_per_s"]
            for g in (100, 400, 1600, 3200, 6400)]
    assert seen == sorted(seen) and seen[-1] > seen[0]


def test_human_output_names_the_network(files):
    w, o = files
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", w, "--observations", o, "--gpu",
                                    "H100", "--gpus", "32", "--strategy", "fsdp",
                                    "--instance-type", "Standard_ND96isr_H100_v5"])
    assert r.exit_code == 0, r.output
    assert "network      3,200 Gbit/s per node (instance type azure Standard_ND96isr_H100_v5)" \
        in r.output


@pytest.mark.parametrize("extra, message", [
    (["--instance-type", "p9.huge"], "unknown --instance-type"),
    (["--instance-type", "p4d.24xlarge"], "holds A100-40GB-SXM4, not H100-SXM5-80GB"),
    (["--instance-type", "gpu_8x_h100_sxm5"], "runs on at most 1 node(s)"),
    (["--inter-node-gbps", "0"], "--inter-node-gbps"),
])
def test_bad_network_input_is_one_line_and_exit_2(files, extra, message):
    w, o = files
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", w, "--observations", o, "--gpu",
                                    "H100", "--gpus", "16", *extra])
    assert r.exit_code == 2
    assert message in r.output and "Traceback" not in r.output


H100_NODE = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9,
                     memory_bandwidth_bytes_per_s=3350e9, peak_flops_per_s={"bf16": 989e12},
                     intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=3200e9 / 8,
                     gpus_per_node=8)


def test_multi_rail_gives_each_gpu_its_nic():
    assert comm.nic_bytes_per_s_per_gpu(H100_NODE) == pytest.approx(50e9)  # 400 Gbit/s


def test_hierarchical_allreduce_as_nccl_runs_it():
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=64, strategy="ddp"))
    s = 4e9
    eff = comm.BUS_EFFICIENCY
    inside = 2 * (7 / 8 * s / (450e9 * eff) + 7 * comm.INTRA_NODE_LATENCY_S)
    between = comm.ring_allreduce_s(s / 8, 64, 50e9 * eff, comm.INTER_NODE_LATENCY_S)
    tree = comm.tree_allreduce_s(s / 8, 64, 50e9 * eff, comm.INTER_NODE_LATENCY_S)
    assert comm.hierarchical_allreduce_s(s, layout, H100_NODE) == pytest.approx(
        inside + min(between, tree))
    flat = comm.ring_allreduce_s(s, 512, 400e9 * eff, comm.INTER_NODE_LATENCY_S)
    # NCCL's tuner takes the faster; at 512 ranks the flat ring's 2(n-1) latency steps lose
    # for a small message, and the hierarchical form is never slower than what it replaces.
    assert comm.dp_allreduce_s(s, layout, H100_NODE) == pytest.approx(
        min(flat, comm.hierarchical_allreduce_s(s, layout, H100_NODE)))
    small = 1e6
    assert comm.dp_allreduce_s(small, layout, H100_NODE) < comm.ring_allreduce_s(
        small, 512, 400e9 * eff, comm.INTER_NODE_LATENCY_S)


def test_tree_latency_is_logarithmic():
    assert comm.tree_allreduce_s(0.0, 64, 1e9) == 0.0
    t64 = comm.tree_allreduce_s(1.0, 64, 1e12, 1e-5)
    t512 = comm.tree_allreduce_s(1.0, 512, 1e12, 1e-5)
    assert t512 - t64 == pytest.approx(2 * 3 * 1e-5, rel=1e-3)
