"""Group-limited (node-limited) routing, DeepSeek's ``n_group`` / ``topk_group``
(``Workload.num_expert_groups`` / ``expert_groups_per_token``): the ranks and nodes a token's
experts reach, and what DeepEP's dispatch sends over the network for it, worked out by hand
from docs/models.md#mixture-of-experts."""

from __future__ import annotations

import json
from dataclasses import replace
from math import comb
from pathlib import Path

import pytest

from mlflow_gpuopt.perfmodel import moe
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Workload
from mlflow_gpuopt.workload_files import WorkloadFileError, read_workload, workload_from_dict

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"
H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"fp32": 66.9e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9)
# DeepSeek-V3's MoE: 256 experts in 8 groups of 32, top-8 inside the best 4 groups
V3 = Workload(params=671e9, flops_per_sample=1e15, precision="bf16", micro_batch=1,
              tokens_per_sample=4096, num_layers=61, hidden_size=7168, num_experts=256,
              experts_per_token=8, expert_ffn_hidden_size=2048, first_dense_layers=3,
              num_expert_groups=8, expert_groups_per_token=4, moe_dispatcher="flex")


def test_one_group_a_node_reaches_the_chosen_groups():
    # 8 nodes of 32 experts, one group each: a node is reached when its group is among the 4
    # chosen, 1 - C(7,4)/C(8,4) = 1/2, and each chosen group takes 2 of the 8 experts
    assert moe.distinct_groups(256, 8, 8, "random", 8, 4) == pytest.approx(8 * (1 - 35 / 70))
    assert moe.distinct_groups(256, 8, 8, "random", 8, 4) == pytest.approx(4.0)
    # without the limit: 8 of 256 anywhere, a node of 32 missed with C(224,8)/C(256,8)
    assert moe.distinct_groups(256, 8, 8) == pytest.approx(8 * (1 - comb(224, 8) / comb(256, 8)))


def test_a_group_over_two_nodes_reaches_one_or_both():
    # 16 nodes of 16 experts (4 expert ranks a node): a node is half of one group; reached
    # when the group is chosen (4/8) and one of its 2 picks falls in the node's 16 of 32
    expected = 16 * 4 / 8 * (1 - comb(16, 2) / comb(32, 2))
    assert moe.distinct_groups(256, 8, 16, "random", 8, 4) == pytest.approx(expected)
    assert expected == pytest.approx(6.0645, abs=1e-4)
    # ranks of 4 experts (ep 64): a rank is an eighth of a group
    ranks = 64 * 4 / 8 * (1 - comb(28, 2) / comb(32, 2))
    assert moe.distinct_groups(256, 8, 64, "random", 8, 4) == pytest.approx(ranks)


def test_a_node_of_two_groups_is_reached_when_either_is_chosen():
    # 4 nodes of 64 experts, 2 groups each: missed when both are outside the chosen 4
    assert moe.distinct_groups(256, 8, 4, "random", 8, 4) == pytest.approx(
        4 * (1 - comb(6, 4) / comb(8, 4)))


def test_picks_that_do_not_split_evenly_over_the_groups():
    # top-6 in 4 groups: 2 groups take 2, 2 take 1; a node half a group (16 of 32)
    half_two = 1 - comb(16, 2) / comb(32, 2)
    half_one = 1 - comb(16, 1) / comb(32, 1)
    assert moe.distinct_groups(256, 6, 16, "random", 8, 4) == pytest.approx(
        16 * 4 / 8 * (0.5 * half_two + 0.5 * half_one))
    # a node a group: every chosen group takes one at least
    assert moe.distinct_groups(256, 6, 8, "random", 8, 4) == pytest.approx(4.0)


def test_blocks_that_do_not_nest_in_the_groups_count_without_the_limit():
    # 24 experts in 4 groups of 6, 6 ranks of 4: neither divides the other
    assert moe.group_limited_blocks(24, 4, 6, 4, 2) is None
    assert moe.distinct_groups(24, 4, 6, "random", 4, 2) == pytest.approx(
        moe.distinct_groups(24, 4, 6))


def test_round_robin_and_no_limit_ignore_the_groups():
    assert moe.distinct_groups(256, 8, 64, "round_robin", 8, 4) == 2.0
    assert moe.distinct_groups(256, 8, 16, "random", 8, 8) == pytest.approx(
        moe.distinct_groups(256, 8, 16))
    assert moe.routing_groups(replace(V3, expert_groups_per_token=8)) == (1, 0)
    assert moe.routing_groups(replace(V3, num_expert_groups=None)) == (1, 0)
    assert moe.routing_groups(V3) == (8, 4)


def test_deepep_sends_a_token_once_to_each_remote_node_it_reaches():
    # tp2 x pp8 x ep64 on 128 nodes: 4 expert ranks a node, the group over 16 nodes
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=128,
                                           strategy="tp2xpp8xep64xzero1"))
    assert (layout.ep, layout.ep_ranks_per_node) == (64, 4)
    row = 4096 / 2 * 7168 * 2  # the GPU's tokens (1/tp), bf16
    nodes = 16 * 4 / 8 * (1 - comb(16, 2) / comb(32, 2))
    inter = row * nodes * 15 / 16 / (400e9 / 8 * 43 / 50)
    ranks = 64 * 4 / 8 * (1 - comb(28, 2) / comb(32, 2))
    intra = row * ranks * 63 / 64 / (450e9 * 153 / 160)
    assert inter > intra
    assert moe.flex_dispatch_s(V3, layout, H100, 4096 / 2, 2) == pytest.approx(20e-6 + inter)
    # without the limit the token reaches more nodes: more bytes over the network
    free = replace(V3, num_expert_groups=None, expert_groups_per_token=None)
    assert moe.flex_dispatch_s(free, layout, H100, 4096 / 2, 2) == pytest.approx(
        20e-6 + row * moe.distinct_groups(256, 8, 16) * 15 / 16 / (400e9 / 8 * 43 / 50))


def test_the_nccl_all_to_all_sends_every_copy_whatever_the_groups():
    layout = resolve_layout(ParallelConfig(gpus_per_node=8, nodes=128,
                                           strategy="tp2xpp8xep64xzero1"))
    nccl = replace(V3, moe_dispatcher="alltoall")
    free = replace(nccl, num_expert_groups=None, expert_groups_per_token=None)
    assert moe.alltoall_s(nccl, layout, H100, 1, 4096, 2) == pytest.approx(
        moe.alltoall_s(free, layout, H100, 1, 4096, 2))


def test_deepseek_v3_config_gives_its_groups():
    wl = read_workload(FIXTURES / "deepseek_v3.json", seq_len=4096)
    assert (wl.workload.num_expert_groups, wl.workload.expert_groups_per_token) == (8, 4)
    assert any("inside 4 of 8 expert groups" in n for n in wl.notes)
    # DeepSeek-V2-Lite's config.json states none: no limit
    lite = read_workload(FIXTURES / "deepseek_v2_lite.json", seq_len=4096).workload
    assert lite.num_expert_groups is None


def test_the_workload_keys_take_deepseeks_and_megatrons_names():
    base = {"params": 1e9, "flops_per_sample": 1e12, "precision": "bf16", "num_experts": 64,
            "experts_per_token": 6}
    for names in (("n_group", "topk_group"), ("moe_router_num_groups", "moe_router_group_topk"),
                  ("num_expert_groups", "expert_groups_per_token")):
        w = workload_from_dict({**base, names[0]: 8, names[1]: 3})
        assert (w.num_expert_groups, w.expert_groups_per_token) == (8, 3)


@pytest.mark.parametrize("groups, per_token, words", [
    (7, 2, "must divide 'num_experts'"), (8, 9, "must be 1 to 'num_expert_groups'"),
    (32, 1, "does not fit")])
def test_bad_groups_are_one_clear_line(groups, per_token, words):
    doc = {"params": 1e9, "flops_per_sample": 1e12, "precision": "bf16", "num_experts": 64,
           "experts_per_token": 6, "num_expert_groups": groups,
           "expert_groups_per_token": per_token}
    with pytest.raises(WorkloadFileError) as err:
        workload_from_dict(doc)
    assert words in str(err.value)


def test_a_config_whose_groups_cannot_hold_the_top_k_is_refused(tmp_path):
    doc = json.loads((FIXTURES / "deepseek_v3.json").read_text(encoding="utf-8"))
    doc.update(n_group=64, topk_group=1)  # 4 experts a group, 8 per token in one group
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(WorkloadFileError) as err:
        read_workload(path, seq_len=4096)
    assert "n_group" in str(err.value)
