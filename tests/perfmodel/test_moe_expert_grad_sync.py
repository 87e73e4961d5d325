"""The routed experts' gradients are reduced over their own expert data-parallel group, not the
data-parallel one (Megatron's ``expt_dp_group``, torchtitan's FSDP of the experts over
``dp_shard_mod_ep``): where the expert-parallel group fills a node, each rank of that group is
alone in its node, and the experts' whole gradient crosses the GPU's own NIC. Worked out by
hand from docs/models.md#mixture-of-experts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel import comm, moe
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Workload

B200 = Hardware(gpu="B200-SXM-180GB", memory_bytes=180e9, memory_bandwidth_bytes_per_s=8e12,
                peak_flops_per_s={"fp32": 80e12, "bf16": 2250e12, "fp8": 4500e12},
                intra_node_bytes_per_s=900e9, inter_node_bytes_per_s=400e9, tdp_w=1000.0)
# GPT-OSS-120B's shape: 36 MoE layers of 128 experts (3 x 2880 x 2880 weights each), top-4
ROUTED = 36 * 128 * 3 * 2880 * 2880
OSS = Workload(params=117e9, flops_per_sample=1.42e14, precision="bf16", micro_batch=4,
               tokens_per_sample=4096, num_layers=36, hidden_size=2880, num_heads=64,
               vocab_size=201088, num_experts=128, experts_per_token=4,
               expert_ffn_hidden_size=2880, optimizer="adamw")
NIC = 400e9 / 8 * comm.BUS_EFFICIENCY  # one GPU's NIC at NCCL's bus efficiency


def _layout(strategy: str, gpus: int):
    return resolve_layout(ParallelConfig(gpus_per_node=8, nodes=max(1, gpus // 8),
                                         strategy=strategy, micro_batch=4, precision="bf16"))


def test_a_node_filled_by_the_expert_group_leaves_each_expert_replica_alone_in_its_node():
    layout = _layout("ep8xzero1", 64)  # 8 nodes; ep8 fills each node
    params, group = moe.expert_sync(OSS, layout, 8)
    assert params == pytest.approx(ROUTED / 8)
    assert (group.dp, group.dp_ranks_per_node, group.dp_spans_nodes) == (8, 1, True)
    # the experts' whole gradient goes round a ring of 8 nodes on the GPU's own NIC
    nbytes = params * 2
    assert comm.dp_allreduce_s(nbytes, group, B200) == pytest.approx(
        2 * 7 / 8 * nbytes / NIC + 2 * 7 * comm.INTER_NODE_LATENCY_S, rel=1e-9)
    # the dense data-parallel group would have shrunk it 8-fold over NVLink first
    dense_path = comm.dp_allreduce_s(nbytes, layout, B200)
    assert comm.dp_allreduce_s(nbytes, group, B200) > 4 * dense_path


def test_expert_replicas_share_a_node_where_the_group_is_smaller_than_the_node():
    layout = _layout("ep4xzero1", 8)  # one node: 2 expert replicas, both inside it
    params, group = moe.expert_sync(OSS, layout, 8)
    assert params == pytest.approx(ROUTED / 4)
    assert (group.dp, group.dp_ranks_per_node, group.dp_spans_nodes) == (2, 2, False)
    ep4 = _layout("ep4xzero1", 64)  # 8 nodes: 16 replicas, 2 in each node
    _, group = moe.expert_sync(OSS, ep4, 8)
    assert (group.dp, group.dp_ranks_per_node, group.dp_spans_nodes) == (16, 2, True)


def test_folded_expert_parallelism_leaves_no_expert_replica_to_reduce_with():
    # Qwen3-235B on 256 H100 as Megatron-Bridge runs it: tp2 x pp8 x ep32, the experts unsplit
    layout = _layout("tp2xpp8xep32xzero1", 256)
    folded = replace(OSS, expert_tensor_parallel=1)
    _, group = moe.expert_sync(folded, layout, 8)
    assert group.dp == 1
    assert comm.dp_allreduce_s(1e9, group, B200) == 0.0
    assert moe.expert_sync(replace(OSS, num_experts=None), layout, 8) is None
    assert moe.expert_sync(OSS, _layout("zero1", 64), 8) is None  # no ep: dense as before


def test_the_step_pays_the_experts_gradient_across_the_nic_once_per_step():
    """ZeRO-1 on 64 B200, ep8: the experts' reduce-scatter and all-gather (an all-reduce's
    volume) run after the last micro-step's backward, which hides at most its own length; more
    accumulation amortises the same exposed seconds over more samples."""
    shape = model_shape(OSS)
    calib = Calibration()
    layout = _layout("ep8xzero1", 64)

    def terms(accum: int):
        return step_terms(OSS, B200, "bf16", layout, 4, accum, shape, 8.0, calib)

    two, five = terms(2), terms(5)
    experts_s = 2 * 7 / 8 * (ROUTED / 8 * 2) / NIC
    backward = comm.BACKWARD_SHARE * two.step_s / 2  # longer than the last backward
    assert two.exposed_comm_s > experts_s - backward
    # beside the all-to-alls (one set per micro-step), the same exposed seconds per step
    assert (five.exposed_comm_s - five.alltoall_s) == pytest.approx(
        two.exposed_comm_s - two.alltoall_s, rel=0.05)
    per_sample = [t.step_s / t.samples_per_step for t in (two, five)]
    assert per_sample[0] > 1.1 * per_sample[1]
    # with the experts' gradient left on the data-parallel path, as before, the step hid most
    dense = comm.ddp_exposed_s(moe.params_per_shard(OSS, layout) * 2, 0.0, layout, B200,
                               backward)
    assert two.exposed_comm_s > 3 * dense


def test_the_prediction_says_where_the_experts_gradients_go():
    assert moe.expert_sync_notes(OSS, _layout("ep8xzero1", 64), 8) == (
        "routed experts' gradients (14.3 B parameters a GPU) reduced over their expert "
        "data-parallel group of 8 ranks, one in each node: each GPU's whole share crosses "
        "its network",)
    assert "2 in each node, across nodes" in moe.expert_sync_notes(
        OSS, _layout("ep4xzero1", 64), 8)[0]
    assert "inside a node" in moe.expert_sync_notes(OSS, _layout("ep4xzero1", 8), 8)[0]
    # nothing to reduce: no note
    assert moe.expert_sync_notes(OSS, _layout("ep8xzero1", 8), 8) == ()
    assert moe.expert_sync_notes(replace(OSS, num_experts=None), _layout("zero1", 64), 8) == ()
