"""Grouped-query attention in the activation formula: a Llama 3 70B layer worked out by hand,
multi-head attention unchanged, and ``num_kv_heads`` read from workload files."""

from __future__ import annotations

import itertools

import pytest

from mlflow_gpuopt.perfmodel.activations import (
    TransformerDims,
    activation_bytes,
    layer_bytes_per_token,
    matmul_outputs_per_token,
    recompute_time_factor,
    selective_op_bytes_per_token,
    selective_op_recompute_flops_per_token,
)
from mlflow_gpuopt.perfmodel.memory import transformer_dims
from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict

# Llama 3 70B (Meta's params.json: dim 8192, 64 heads, 8 key/value heads, FFN 28672, SwiGLU)
H, HEADS, KV, FFN, SEQ = 8192, 64, 8, 28672, 4096


def _llama70b(kv_heads=KV, layers=80, vocab=128256):
    return TransformerDims(num_layers=layers, hidden_size=H, seq_len=SEQ, num_heads=HEADS,
                           ffn_hidden_size=FFN, gated_mlp=True, vocab_size=vocab,
                           num_kv_heads=kv_heads)


def test_llama3_70b_layer_by_hand_bf16_sdpa_no_dropout():
    e = 2  # bf16 bytes
    head_dim = H // HEADS  # 128
    per_token = (
        e * H          # attention LayerNorm input
        + e * H        # its output, the Q/K/V projections' input
        + e * H        # Q: 64 heads x 128
        + e * KV * head_dim  # K: 8 heads x 128 = 1024
        + e * KV * head_dim  # V
        + e * H        # SDPA output, the output projection's input
        + 4 * HEADS    # SDPA's fp32 log-sum-exp, one per query head
        + e * H        # MLP LayerNorm input
        + e * H        # its output, the gate and up projections' input
        + e * FFN      # gate projection output
        + e * FFN      # silu(gate)
        + e * FFN      # up projection output
        + e * FFN      # silu(gate) * up, the down projection's input
        + 2 * 8        # the two norms' fp32 mean and 1/sigma
    )
    assert per_token == 332048
    got = layer_bytes_per_token(_llama70b(), e, 0.0, "flash", attention_dropout=False)
    assert got == per_token
    # multi-head attention keeps K and V at 8192 each: 2 x 2 x (8192 - 1024) bytes more
    mha = layer_bytes_per_token(_llama70b(None), e, 0.0, "flash", attention_dropout=False)
    assert mha - got == 2 * e * (H - KV * head_dim) == 28672
    # tensor parallel 8 with sequence parallelism splits all of it but nothing else changes
    tp8 = layer_bytes_per_token(_llama70b(), e, 0.0, "flash", False, tp=8)
    assert tp8 == pytest.approx(per_token / 8)
    # eager attention's score products save K and V expanded to all 64 heads
    eager_sel = layer_bytes_per_token(_llama70b(), e, 0.0, "eager", False,
                                      recompute="selective")
    assert eager_sel == per_token - 4 * HEADS  # checkpointed core attention: k-head K, V
    eager = layer_bytes_per_token(_llama70b(), e, 0.0, "eager", False)
    assert eager == mha - 4 * HEADS + HEADS * SEQ * e  # plus the bf16 softmax output


def test_llama3_70b_per_op_selective_checkpointing_by_hand():
    dims, e = _llama70b(), 2
    kv = KV * (H // HEADS)
    # projection outputs in forward order: Q, K, V, output, gate, up, down
    assert matmul_outputs_per_token(dims) == (H, kv, kv, H, FFN, FFN, H)
    # kept: layer input, the 1st/3rd/5th/7th outputs (Q, V, gate, down), SDPA output + LSE
    kept = e * (H + H + kv + FFN + H + H) + 4 * HEADS
    assert selective_op_bytes_per_token(dims, e) == kept == 125184
    # rerun in the backward: the 2nd/4th/6th projections (K, output, up), 2 FLOPs per weight
    flops = 2 * (H * kv + H * H + H * FFN)
    assert selective_op_recompute_flops_per_token(dims) == flops
    assert selective_op_recompute_flops_per_token(_llama70b(None)) == flops + 2 * H * (H - kv)


def test_multi_head_attention_is_unchanged_bit_for_bit():
    """num_kv_heads None and num_kv_heads == num_heads give the same numbers, in every mode."""
    for attention, recompute, tp, sp, gated in itertools.product(
            ("flash", "eager"), ("none", "selective", "full", "selective-op"), (1, 4),
            (True, False), (True, False)):
        base = TransformerDims(num_layers=24, hidden_size=2048, seq_len=2048, num_heads=16,
                               ffn_hidden_size=5632 if gated else 8192, gated_mlp=gated,
                               vocab_size=50257)
        same = TransformerDims(**{**base.__dict__, "num_kv_heads": 16})
        for dims in (base, same):
            assert dims.kv_share == 1.0
        args = dict(attention=attention, recompute=recompute, tp=tp, pp=2, grad_accum=8,
                    sequence_parallel=sp)
        assert activation_bytes(base, 2, 2, 1, **args) == activation_bytes(same, 2, 2, 1, **args)
        assert selective_op_recompute_flops_per_token(base) == \
            selective_op_recompute_flops_per_token(same) == 2 * (2048 * 2048 * 2 + 2048 *
                                                                  (5632 if gated else 8192))
        assert recompute_time_factor(recompute, attention, 1e15, base) == \
            recompute_time_factor(recompute, attention, 1e15, same)


def test_grouped_query_attention_saves_memory_only_where_k_and_v_are_kept_small():
    gqa, mha = _llama70b(), _llama70b(None)
    for attention, recompute in itertools.product(("sdpa", "eager"),
                                                  ("none", "selective", "full", "selective-op")):
        g = activation_bytes(gqa, 1, 2, 0, attention=attention, recompute=recompute, tp=8)
        m = activation_bytes(mha, 1, 2, 0, attention=attention, recompute=recompute, tp=8)
        if attention == "eager" and recompute in ("none", "full"):
            assert g == m  # the expanded K and V are what the score products save
        else:
            assert g.peak_bytes < m.peak_bytes


def _doc(**keys):
    return {"params": 70_553_706_496, "flops_per_sample": 1.8e15, "precision": "bf16",
            "num_layers": 80, "hidden_size": H, "tokens_per_sample": SEQ, "mlp": "swiglu",
            "ffn_hidden_size": FFN, "vocab_size": 128256, **keys}


def test_workload_file_takes_hugging_face_num_key_value_heads():
    # the keys of meta-llama/Meta-Llama-3-70B's config.json
    w = workload_from_dict(_doc(num_attention_heads=64, num_key_value_heads=8,
                                intermediate_size=FFN))
    assert (w.num_heads, w.num_kv_heads) == (64, 8)
    assert transformer_dims(w) == _llama70b()
    assert workload_from_dict(_doc(num_heads=64, num_kv_heads=8)) == w
    # absent or null: multi-head attention
    plain = workload_from_dict(_doc(num_heads=64, num_key_value_heads=None))
    assert plain.num_kv_heads is None and transformer_dims(plain).kv_share == 1.0
    assert workload_from_dict(_doc(num_heads=64, num_kv_heads=64)).num_kv_heads == 64


@pytest.mark.parametrize("keys,message", [
    ({"num_heads": 64, "num_kv_heads": 7}, "'num_kv_heads' must divide 'num_heads' (64), got 7"),
    ({"num_heads": 64, "num_kv_heads": 128}, "must divide 'num_heads' (64), got 128"),
    ({"num_heads": 64, "num_kv_heads": 0}, "'num_kv_heads' must be >= 1, got 0"),
    ({"num_heads": 64, "num_kv_heads": -8}, "'num_kv_heads' must be a finite number >= 0"),
    ({"num_heads": 64, "num_kv_heads": 2.5}, "'num_kv_heads' must be a whole number"),
    ({"num_heads": 64, "num_kv_heads": "eight"}, "'num_kv_heads' must be a number"),
    ({"num_kv_heads": 8}, "'num_kv_heads' needs 'num_heads'"),
])
def test_bad_num_kv_heads_is_one_line(keys, message):
    with pytest.raises(WorkloadFileError) as err:
        workload_from_dict(_doc(**keys), where="w.json")
    text = str(err.value)
    assert "\n" not in text and text.startswith("w.json: ") and message in text, text
