"""The 1F1B all-to-all overlap (``moe_a2a_overlap``, Megatron-core's
``overlap_moe_expert_parallel_comm``): each of a layer's four all-to-alls under one compute
chunk of the paired micro-batch, the unpaired warm-up and cool-down exposed, worked out by
hand from docs/models.md#mixture-of-experts; the layouts Megatron refuses it on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel import moe, step
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.predictor import fit
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Workload

H, F, L, SEQ = 4096, 14336, 32, 4096
MIXTRAL = Workload(params=46_702_792_704, flops_per_sample=3.4e14, precision="bf16",
                   micro_batch=1, tokens_per_sample=SEQ, num_layers=L, hidden_size=H,
                   num_heads=32, num_kv_heads=8, vocab_size=32000, ffn_hidden_size=2 * F,
                   mlp="swiglu", num_experts=8, experts_per_token=2, expert_ffn_hidden_size=F,
                   optimizer="adamw")
H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"fp32": 66.9e12, "bf16": 989.4e12, "fp8": 1978.9e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9)


def _layout(strategy, nodes=1, **kw):
    return resolve_layout(ParallelConfig(gpus_per_node=8, nodes=nodes, strategy=strategy,
                                         **kw))


def test_attention_share_counts_projections_and_scores_against_the_active_experts():
    # Mixtral per token, forward: Q/O 2 x 4096^2, K/V 2 x 4096 x 1024, x 2 FLOPs; scores
    # 4 x 2048 keys x 4096; the top-2 experts 2 x 3 x 4096 x 14336 x 2, the router 2 x 4096 x 8
    attention = 2 * (4096 * (4096 + 2 * 1024) + 4096 * 4096) + 4 * 2048 * 4096
    mlp = 2 * 2 * 3 * 4096 * 14336 + 2 * 4096 * 8
    assert moe.attention_share(MIXTRAL, SEQ) == pytest.approx(attention / (attention + mlp))
    assert moe.attention_share(replace(MIXTRAL, hidden_size=None), SEQ) == 0.5


def test_each_alltoall_hides_under_its_paired_chunk():
    ep8 = _layout("ep8xfsdp", nodes=2)
    a = moe.attention_share(MIXTRAL, SEQ)
    layer, a2a = 0.012, 32 * 4 * 0.001  # 12 ms a layer, 1 ms per all-to-all
    # paired, every chunk runs at 1 - 0.2 of its speed (the SMs the communication holds)
    slow = layer / (1 - moe.A2A_OVERLAP_GEMM_COST)
    fwd, bwd = slow / 3, 2 * slow / 3
    chunks = (a * fwd, (1 - a) * bwd, (1 - a) * fwd, a * bwd)
    assert min(chunks) < 0.001  # the forward attention does not cover its 1 ms
    # each all-to-all under one chunk of the other micro-batch: the longer of the two
    per_layer = sum(max(c, 0.001) for c in chunks) - layer
    got = moe.overlapped_alltoall_s(MIXTRAL, ep8, a2a, 32 * layer, 0.0, SEQ)
    assert got == pytest.approx(32 * per_layer)
    assert got < a2a
    # the unpaired share stays whole; with no compute to pair, nothing hides
    assert moe.overlapped_alltoall_s(MIXTRAL, ep8, a2a, 32 * layer, 0.25, SEQ) == \
        pytest.approx(0.25 * a2a + 0.75 * 32 * per_layer)
    assert moe.overlapped_alltoall_s(MIXTRAL, ep8, a2a, 0.0, 0.0, SEQ) == pytest.approx(a2a)


def test_a_small_alltoall_costs_more_paired_than_alone():
    # 0.1 ms all-to-alls under 12 ms layers: all of it hides, but the paired GEMMs' 20 %
    # lost efficiency (a quarter more time) is more than the 0.4 ms a layer it hid
    ep8 = _layout("ep8xfsdp", nodes=2)
    layer, a2a = 0.012, 32 * 4 * 0.0001
    got = moe.overlapped_alltoall_s(MIXTRAL, ep8, a2a, 32 * layer, 0.0, SEQ)
    assert got == pytest.approx(32 * layer * moe.A2A_OVERLAP_GEMM_COST
                                / (1 - moe.A2A_OVERLAP_GEMM_COST))
    assert got > a2a


def test_unpaired_share_is_the_first_forward_or_the_interleaved_warm_up():
    w = MIXTRAL
    assert step.a2a_unpaired_share(w, _layout("ep8xfsdp"), 8) == pytest.approx(1 / 8)
    assert step.a2a_unpaired_share(w, _layout("ep8xfsdp"), 1) == 1.0
    # pp4 x vp2 over 2 nodes, 64 micro-batches: (4 - 1) + (2 - 1) x 4 + 1 = 8 of 128 chunks
    pp = _layout("pp4xep4xzero1", nodes=2, virtual_stages=2)
    assert step.a2a_unpaired_share(w, pp, 64) == pytest.approx(8 / 128)
    # torchtitan-style runs of the schedule over 16 micro-batches each: 8 of 32
    assert step.a2a_unpaired_share(replace(w, pp_microbatches=16), pp, 64) == \
        pytest.approx(8 / 32)


def test_megatron_refuses_it_without_ep_with_allgather_or_a_plain_pipeline():
    assert moe.a2a_overlap_blocker(MIXTRAL, _layout("ep8xfsdp")) is None
    assert "expert parallelism" in moe.a2a_overlap_blocker(MIXTRAL, _layout("fsdp"))
    assert "allgather" in moe.a2a_overlap_blocker(replace(MIXTRAL, moe_dispatcher="allgather"),
                                                  _layout("ep8xfsdp"))
    assert "interleaved" in moe.a2a_overlap_blocker(MIXTRAL, _layout("pp2xep4xzero1"))
    assert moe.a2a_overlap_blocker(MIXTRAL, _layout("pp2xep4xzero1", virtual_stages=2)) is None


def _plain_and_overlapped(hardware, gpus_per_node, nodes):
    cfg = ParallelConfig(gpus_per_node=gpus_per_node, nodes=nodes, strategy="ep8xfsdp",
                         micro_batch=1, grad_accum=8)
    return (fit(MIXTRAL, [], {}).predict(cfg, hardware),
            fit(replace(MIXTRAL, moe_a2a_overlap="1f1b"), [], {}).predict(cfg, hardware))


def test_the_overlap_shortens_the_step_where_the_alltoall_is_large():
    # ep8 over 4 nodes of 2 GPUs on 100 GB/s a node: the all-to-all is ~30 % of the compute
    plain, over = _plain_and_overlapped(replace(H100, inter_node_bytes_per_s=100e9), 2, 4)
    assert 0 < over.alltoall_s < plain.alltoall_s
    # shorter by about the all-to-all seconds saved: ep8 over all 8 GPUs leaves no expert
    # replica to gather from (expert data parallel 1), so FSDP's gathers are the dense
    # weights' alone, which the step hides either way
    assert over.step_time_s < plain.step_time_s
    assert plain.step_time_s - over.step_time_s == pytest.approx(
        plain.alltoall_s - over.alltoall_s, rel=0.05)
    assert any("1F1B overlap" in a for a in over.assumptions)
    assert any("not overlapped" in a for a in plain.assumptions)
    assert not any("costs more here" in a for a in over.assumptions)


def test_the_overlap_costs_more_than_it_hides_where_the_alltoall_is_small():
    # ep8 inside one 8-GPU NVLink node: the all-to-all is ~3 % of the compute, less than the
    # quarter more time the paired GEMMs take beside the communication stream
    plain, over = _plain_and_overlapped(H100, 8, 2)
    assert over.alltoall_s > plain.alltoall_s > 0
    assert over.step_time_s > plain.step_time_s
    note = next(a for a in over.assumptions if "costs more here than it hides" in a)
    assert "without --moe-a2a-overlap" in note
    assert f"{plain.alltoall_s * 1e3:.3g} ms of all-to-all without it" in note


def test_auto_runs_the_overlap_only_where_it_pays():
    modes = ("none", "1f1b", "auto")
    for hardware, per_node, nodes, pays in ((replace(H100, inter_node_bytes_per_s=100e9), 2, 4,
                                             True), (H100, 8, 2, False)):
        cfg = ParallelConfig(gpus_per_node=per_node, nodes=nodes, strategy="ep8xfsdp",
                             micro_batch=1, grad_accum=8)
        got = {m: fit(replace(MIXTRAL, moe_a2a_overlap=m), [], {}).predict(cfg, hardware)
               for m in modes}
        best = "1f1b" if pays else "none"
        assert got["auto"].step_time_s == pytest.approx(got[best].step_time_s)
        assert got["auto"].a2a_overlap is pays
        assert got["1f1b"].a2a_overlap and not got["none"].a2a_overlap
        left_off = any("auto, left off" in a for a in got["auto"].assumptions)
        assert left_off is not pays
    # where Megatron cannot run it (a pipeline without virtual stages), auto plans without it
    plain = _layout("pp2xep4xzero1")
    assert not step.a2a_overlapped(replace(MIXTRAL, moe_a2a_overlap="auto"), plain)


@pytest.mark.parametrize("word, canonical", [("1f1b", "1f1b"), ("True", "1f1b"),
                                             ("auto", "auto"), ("AUTO", "auto"),
                                             ("overlap-moe-expert-parallel-comm", "1f1b"),
                                             ("none", "none"), ("false", "none"),
                                             (None, "none")])
def test_spellings(word, canonical):
    assert moe.normalize_a2a_overlap(word) == canonical


def test_unknown_word_is_refused():
    with pytest.raises(ValueError, match="moe_a2a_overlap"):
        moe.normalize_a2a_overlap("dualpipe")


def test_two_streams_follow_the_schedules_events():
    # no compute: the four all-to-alls of each layer run back to back
    assert moe.paired_layers_s((0, 0, 0, 0), 1.0, 3) == pytest.approx(12.0)
    # no communication: the compute alone
    assert moe.paired_layers_s((1, 2, 3, 4), 0.0, 2) == pytest.approx(20.0)
    # one layer, all-to-alls of 2 against chunks of 1: F.attn 0-1 beside B.combine 0-2;
    # F.dispatch 2-4 beside B.expert 2-3; B.dispatch 4-6 (after F.dispatch); F.expert 4-5;
    # F.combine 6-8; B.attn 6-7 (after B.dispatch): 8 in all, 4 of compute
    assert moe.paired_layers_s((1, 1, 1, 1), 2.0, 1) == pytest.approx(8.0)
