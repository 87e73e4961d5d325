"""Context parallelism: the ``cp`` degree of a strategy string, where it must divide, the
activations and FLOPs it splits, the key/value exchange it costs (bytes by hand, ring vs
all-gather) and the buffers it holds; a 128k-token Llama-3-8B fits 8 × H100 with it and not
without it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel import context, fit
from mlflow_gpuopt.perfmodel.activations import activation_bytes, transformer_dims
from mlflow_gpuopt.perfmodel.comm import BUS_EFFICIENCY, INTRA_NODE_LATENCY_S
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import (
    context_degree,
    parse_layout,
    resolve_layout,
    with_degree,
    without_degree,
)
from mlflow_gpuopt.perfmodel.memory import memory_per_gpu
from mlflow_gpuopt.perfmodel.types import Hardware, Observation, ParallelConfig
from mlflow_gpuopt.workload_files import read_workload

H100 = Hardware(gpu="H100-SXM5-80GB", memory_bytes=80e9, memory_bandwidth_bytes_per_s=3.35e12,
                peak_flops_per_s={"bf16": 989.4e12, "fp32": 67e12},
                intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=400e9)
# Meta-Llama-3-8B's config.json (the keys its shape depends on), trained at 128k tokens
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
SEQ = 131072
KV_WIDTH = 8 * (4096 // 32)  # key/value heads x head width = 1024


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    return replace(read_workload(path, seq_len=SEQ).workload, micro_batch=1)


def _layout(strategy, gpus=8, nodes=1):
    return resolve_layout(ParallelConfig(gpus_per_node=gpus, nodes=nodes, strategy=strategy))


def test_cp_is_a_degree_of_the_strategy_string():
    assert context_degree("cp4xfsdp") == 4 and context_degree("tp2xcp4xfsdp") == 4
    assert context_degree("fsdp") == 1
    assert parse_layout("tp2xcp4xfsdp") == ("fsdp", 2, 1, 1, 0)
    layout = _layout("tp2xcp4xfsdp", nodes=2)
    # 16 GPUs: tp2 leaves 8 ranks holding the same shard, 2 replicas of cp4
    assert (layout.tp, layout.dp, layout.cp, layout.replicas) == (2, 8, 4, 2)
    assert not layout.cp_spans_nodes  # 4 such ranks per node, 4 in the group
    assert _layout("tp2xcp8xfsdp", nodes=2).cp_spans_nodes
    assert _layout("cp2xdp4").dp == 8  # dp4 names the replicas: 4 x cp2 = 8 GPUs


@pytest.mark.parametrize("text, words", [
    ("cp", "cp needs a number"), ("cp2xcp4", "context-parallel part twice")])
def test_bad_cp_parts_are_one_line(text, words):
    with pytest.raises(PerfModelError, match=words):
        parse_layout(text)


def test_cp_must_divide_and_the_sequence_must_split(llama):
    with pytest.raises(PerfModelError, match="does not divide 8 GPUs"):
        _layout("tp4xcp4xfsdp")
    with pytest.raises(PerfModelError, match="is not the 8 GPUs"):
        _layout("cp2xdp2")
    with pytest.raises(PerfModelError, match="8 equal chunks"):
        context.check_context(replace(llama, tokens_per_sample=1001), _layout("cp4xfsdp"))
    with pytest.raises(PerfModelError, match="fused attention"):
        context.check_context(replace(llama, attention="eager"), _layout("cp4xfsdp"))


def test_activations_per_gpu_are_a_quarter_at_cp4(llama):
    dims = transformer_dims(llama)
    for recompute in ("none", "full", "selective-op"):
        one = activation_bytes(dims, 1, 2, 0, recompute=recompute)
        four = activation_bytes(dims, 1, 2, 0, recompute=recompute, cp=4)
        assert four.peak_bytes == pytest.approx(one.peak_bytes / 4, rel=1e-12)
    cfg = ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=1, recompute="full")
    base = memory_per_gpu(llama, cfg)
    cp4 = memory_per_gpu(llama, replace(cfg, strategy="fsdpxcp4"))
    assert cp4.activations_bytes == pytest.approx(base.activations_bytes / 4, rel=1e-12)
    # cp ranks hold the same weights: FSDP shards them over all 8 (dp x cp) either way
    assert cp4.weights_bytes == base.weights_bytes
    assert cp4.optimizer_bytes == base.optimizer_bytes


def test_exchange_bytes_by_hand(llama):
    # forward: the other 3 ranks' K and V: 2 x 131072 x 1024 x 2 bytes x 3/4
    assert context.exchange_bytes_per_layer(llama, 1, SEQ, 2, 1, 4) == 402_653_184
    # tensor parallel 2 halves the key/value heads each rank exchanges
    assert context.exchange_bytes_per_layer(llama, 1, SEQ, 2, 2, 4) == 201_326_592
    assert context.exchange_bytes_per_layer(llama, 1, SEQ, 2, 1, 1) == 0
    # a ring holds 4 chunks of 2 x 32768 x 1024 x 2 bytes; the all-gather 2 x 4 of them
    ring = memory_per_gpu(llama, ParallelConfig(gpus_per_node=8, strategy="fsdpxcp4",
                                                micro_batch=1))
    assert ring.cp_buffers_bytes == 4 * 2 * 32768 * KV_WIDTH * 2
    gathered = memory_per_gpu(replace(llama, cp_exchange="allgather"),
                              ParallelConfig(gpus_per_node=8, strategy="fsdpxcp4",
                                             micro_batch=1))
    assert gathered.cp_buffers_bytes == 8 * 2 * 32768 * KV_WIDTH * 2


def test_the_exchange_shows_only_beyond_the_attention_beneath_it(llama):
    layout = _layout("fsdpxcp4")
    bw = 450e9 * BUS_EFFICIENCY
    fwd = 402_653_184
    # one chunk pair's forward attention on a GPU: its quarter of the sample in 4 steps
    attn = context.attention_s_per_sample(llama, H100, "bf16") / (4 * 32 * 3 * 4)
    total, exposed = context.exchange_s(replace(llama, cp_exchange="allgather"), layout, H100,
                                        "bf16", 1, SEQ, 2)
    # 32 layers x (forward gather + backward gather and reduce-scatter), 3 latencies each,
    # each under the local chunk's attention only
    one = fwd / bw + 3 * INTRA_NODE_LATENCY_S
    assert total == pytest.approx(32 * 3 * one)
    assert exposed == pytest.approx(32 * (max(0, one - attn) + max(0, 2 * one - 2 * attn)))
    total, exposed = context.exchange_s(llama, layout, H100, "bf16", 1, SEQ, 2)
    chunk = fwd / 3
    ring = 32 * 3 * ((chunk / bw + INTRA_NODE_LATENCY_S) + (2 * chunk / bw
                                                          + INTRA_NODE_LATENCY_S))
    assert total == pytest.approx(ring)
    assert exposed == 0.0  # a 32k x 32k block of attention outlasts its 134 MB transfer
    # on a link 1000 x slower the transfer is the longer: what attention does not cover shows
    slow = replace(H100, intra_node_bytes_per_s=450e6)
    total, exposed = context.exchange_s(llama, layout, slow, "bf16", 1, SEQ, 2)
    attn = context.attention_s_per_sample(llama, slow, "bf16") / (4 * 32 * 3 * 4)
    x_f, x_b = chunk / (450e6 * BUS_EFFICIENCY), 2 * chunk / (450e6 * BUS_EFFICIENCY)
    want = 32 * 3 * ((x_f + INTRA_NODE_LATENCY_S - attn) + (x_b + INTRA_NODE_LATENCY_S
                                                           - 2 * attn))
    assert exposed == pytest.approx(want) and 0 < exposed < total


def test_128k_llama_fits_8_h100_with_cp_and_not_without(llama):
    predictor = fit(llama, [], {})
    cfg = ParallelConfig(gpus_per_node=8, strategy="fsdp", micro_batch=1, recompute="full")
    without = predictor.predict(cfg, H100)
    with_cp = predictor.predict(replace(cfg, strategy="fsdpxcp4"), H100)
    assert not without.fits and with_cp.fits
    # 2 replicas of cp4 take 2 samples per step; each GPU runs a quarter of a sample's work
    assert without.samples_per_step == 8 and with_cp.samples_per_step == 2
    assert with_cp.step_time_s == pytest.approx(without.step_time_s / 4, rel=0.05)
    assert with_cp.cp_exchange_s == 0.0 and without.cp_exchange_s == 0.0
    assert any("context parallel cp4" in n for n in with_cp.assumptions)


def test_a_context_parallel_run_calibrates_its_own_configuration(llama):
    """A measured cp4 run (its strategy spelled as track() logs it) is fitted in its own
    layout: predicting that configuration gives back what was measured."""
    cfg = ParallelConfig(gpus_per_node=8, strategy="fsdpxcp4", micro_batch=1,
                         recompute="full")
    prior = fit(llama, [], {}).predict(cfg, H100)
    measured = 0.7 * prior.throughput_samples_per_s  # a run slower than the prior
    obs = Observation(gpu=H100.gpu, gpu_count=8, throughput_samples_per_s=measured,
                      micro_batch=1, strategy="fsdpxcp4", precision="bf16", recompute="full")
    fitted = fit(llama, [obs], {H100.gpu: H100}).predict(cfg, H100)
    assert fitted.throughput_samples_per_s == pytest.approx(measured, rel=0.02)
    assert fitted.basis == "measured"


@pytest.mark.parametrize(("strategy", "kind", "degree", "spelled"), [
    ("fsdp", "cp", 4, "cp4xfsdp"), ("tp2xfsdp", "cp", 2, "tp2xcp2xfsdp"),
    ("tp2xep4xfsdp", "cp", 2, "tp2xcp2xep4xfsdp"), ("zero1", "ep", 8, "ep8xzero1"),
    ("tp2xcp2xfsdp", "ep", 4, "tp2xcp2xep4xfsdp"), ("tp4", "cp", 2, "tp4xcp2")])
def test_one_spelling_for_added_degrees(strategy, kind, degree, spelled):
    """recommend and a run's gpuopt.cp add a degree where track() and --strategy put it."""
    assert with_degree(strategy, kind, degree) == spelled
    assert without_degree(spelled, kind) == strategy
    assert parse_layout(spelled) == parse_layout(strategy)
