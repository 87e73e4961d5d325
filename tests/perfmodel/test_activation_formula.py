"""The transformer activation formula (perfmodel/activations.py) against the paper's figures
and against what PyTorch really saves for the backward of small GPT-shaped models on CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F  # noqa: N812 (the usual name)
from torch import nn
from torch.utils.checkpoint import checkpoint

from mlflow_gpuopt.perfmodel.activations import (
    NORM_STATS_BYTES,
    TransformerDims,
    activation_bytes,
    layer_bytes_per_token,
)


def _dims(layers=2, h=128, s=128, heads=4, vocab=256, ffn=None, gated=False, kv_heads=None):
    return TransformerDims(num_layers=layers, hidden_size=h, seq_len=s, num_heads=heads,
                           ffn_hidden_size=ffn or 4 * h, gated_mlp=gated, vocab_size=vocab,
                           num_kv_heads=kv_heads)


def test_per_layer_bytes_are_korthikanti_at_16_bit_with_byte_masks():
    d = _dims(h=1024, s=2048, heads=16)
    a, s, h = 16, 2048, 1024
    norms = 2 * NORM_STATS_BYTES  # LayerNorm mean and 1/sigma, which the paper leaves out
    eager = layer_bytes_per_token(d, 2, 1, "eager", attention_dropout=True)
    assert eager == pytest.approx(h * (34 + 5 * a * s / h) + norms)
    # Tensor parallel without sequence parallelism: sbh(10 + 24/t + 5as/(ht)) (Sec. 4.2.1)
    t = 8
    no_sp = layer_bytes_per_token(d, 2, 1, "eager", True, tp=t, sequence_parallel=False)
    assert no_sp == pytest.approx(h * (10 + 24 / t + 5 * a * s / (h * t)) + norms)
    # ... with it, everything divides by t (Sec. 4.2.2)
    sp = layer_bytes_per_token(d, 2, 1, "eager", True, tp=t)
    assert sp == pytest.approx(eager / t)
    # Selective recomputation drops the scores: 34 remains (Sec. 5)
    sel = layer_bytes_per_token(d, 2, 1, "eager", True, recompute="selective")
    assert sel == pytest.approx(34 * h + norms)
    # FlashAttention keeps no scores either, but the fp32 log-sum-exp per head
    flash = layer_bytes_per_token(d, 2, 1, "flash", True)
    assert flash == pytest.approx(34 * h + norms + 4 * a)


def test_full_recompute_keeps_layer_inputs_and_rebuilds_one_layer():
    d = _dims(layers=24, h=1024, s=512, heads=16, vocab=None)
    none = activation_bytes(d, 4, 2, 1, attention="eager")
    full = activation_bytes(d, 4, 2, 1, attention="eager", recompute="full")
    tokens = 4 * 512
    per_layer = layer_bytes_per_token(d, 2, 1, "eager", True)
    assert full.recompute_bytes == pytest.approx(per_layer * tokens)
    outside = none.stored_bytes - 24 * per_layer * tokens  # embedding and head
    assert full.stored_bytes == pytest.approx(24 * 2 * 1024 * tokens + outside)
    assert full.peak_bytes < none.peak_bytes / 5


def test_pipeline_first_stage_holds_p_micro_batches_of_its_layers():
    d = _dims(layers=32, h=4096, s=2048, heads=32, vocab=32000)
    one = activation_bytes(d, 1, 2, 1, pp=1)
    four = activation_bytes(d, 1, 2, 1, pp=4, grad_accum=16)
    # 4 micro-batches of 8 layers in flight on stage 1: about the 32 layers of one
    assert four.stored_bytes == pytest.approx(one.stored_bytes, rel=0.05)
    assert activation_bytes(d, 1, 2, 1, pp=4, grad_accum=1).stored_bytes < \
        four.stored_bytes / 3
    inter = activation_bytes(d, 1, 2, 1, pp=4, grad_accum=16, virtual_stages=2)
    assert inter.stored_bytes > four.stored_bytes


# --- measured: what autograd saves for the backward of a real model on CPU -------------------

class _Block(nn.Module):
    """GPT-2's block; with ``kv_heads`` below ``heads``, grouped-query attention as Llama
    writes it: a query projection and a K/V projection of ``2·h·kv_heads/heads``, SDPA taking
    K and V at ``kv_heads`` (``enable_gqa``), eager attention expanding them to every head
    (``repeat_interleave``, Hugging Face's ``repeat_kv``); ``selective`` checkpoints the core
    attention (Megatron's selective recomputation)."""

    def __init__(self, h: int, heads: int, dropout: float, sdpa: bool, seq: int,
                 kv_heads: int | None = None, selective: bool = False) -> None:
        super().__init__()
        self.heads, self.p, self.sdpa, self.selective = heads, dropout, sdpa, selective
        self.kv_heads = kv_heads or heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        if self.kv_heads == heads:
            self.qkv = nn.Linear(h, 3 * h)
        else:
            self.q, self.kv = nn.Linear(h, h), nn.Linear(h, 2 * h * self.kv_heads // heads)
        self.proj = nn.Linear(h, h)
        self.fc1, self.act, self.fc2 = nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s, d = q.shape[2], q.shape[3]
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=self.kv_heads != self.heads)
        if self.kv_heads != self.heads:
            k, v = (z.repeat_interleave(self.heads // self.kv_heads, dim=1) for z in (k, v))
        w = (q @ k.transpose(-2, -1)) * d ** -0.5
        w = torch.softmax(w.masked_fill(self.causal[:s, :s], float("-inf")), dim=-1)
        return F.dropout(w, self.p, self.training) @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d, y = h // self.heads, self.ln1(x)
        if self.kv_heads == self.heads:
            q, k, v = self.qkv(y).view(b, s, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        else:
            q = self.q(y).view(b, s, self.heads, d).transpose(1, 2)
            k, v = self.kv(y).view(b, s, 2, self.kv_heads, d).permute(2, 0, 3, 1, 4)
        if self.selective:
            o = checkpoint(self._attention, q, k, v, use_reentrant=True)
        else:
            o = self._attention(q, k, v)
        x = x + F.dropout(self.proj(o.transpose(1, 2).reshape(b, s, h)), self.p, self.training)
        return x + F.dropout(self.fc2(self.act(self.fc1(self.ln2(x)))), self.p, self.training)


class _GPT(nn.Module):
    def __init__(self, layers, h, heads, vocab, seq, dropout, sdpa, recompute, kv_heads=None,
                 selective=False):
        super().__init__()
        self.p, self.recompute = dropout, recompute
        self.tok, self.pos = nn.Embedding(vocab, h), nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(_Block(h, heads, dropout, sdpa, seq, kv_heads, selective)
                                    for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = F.dropout(self.tok(ids) + self.pos(torch.arange(ids.shape[1])), self.p,
                      self.training)
        for block in self.blocks:
            # reentrant checkpointing saves the block's input through autograd's hooks
            x = checkpoint(block, x, use_reentrant=True) if self.recompute else block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def _saved_bytes(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> int:
    """Bytes of the distinct storages one forward saves for backward, parameters and buffers
    left out (they are model state, not activations)."""
    state = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in state:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, targets)
    return sum(saved.values())


@pytest.mark.parametrize("layers,h,s,heads,b", [(2, 64, 64, 4, 2), (3, 128, 128, 4, 2)])
@pytest.mark.parametrize("attention", ["flash", "eager"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_formula_matches_saved_tensor_bytes(layers, h, s, heads, b, attention, dropout,
                                            recompute):
    torch.manual_seed(0)
    vocab = 256
    model = _GPT(layers, h, heads, vocab, s, dropout, attention == "flash",
                 recompute == "full").train()
    ids = torch.randint(0, vocab, (b, s))
    measured = _saved_bytes(model, ids, torch.randint(0, vocab, (b, s)))
    # fp32 on CPU: 4-byte activations; CPU dropout keeps its mask in the input's dtype
    predicted = activation_bytes(
        _dims(layers, h, s, heads, vocab), b, element_bytes=4,
        mask_bytes=4 if dropout else 0, attention=attention, attention_dropout=dropout > 0,
        recompute=recompute).stored_bytes
    assert predicted == pytest.approx(measured, rel=0.15), (measured, predicted)


@pytest.mark.parametrize("attention,recompute", [("flash", "none"), ("eager", "none"),
                                                 ("eager", "selective"), ("flash", "full")])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_formula_matches_saved_tensor_bytes_with_grouped_query_attention(attention, recompute,
                                                                          dropout):
    """8 query heads sharing 2 key/value heads: SDPA with ``enable_gqa`` saves K and V at 2
    heads, eager attention saves the copies ``repeat_interleave`` expanded to 8 (as many bytes
    as multi-head attention), and checkpointing the core attention keeps the 2-head K and V."""
    torch.manual_seed(0)
    layers, h, s, heads, kv_heads, b, vocab = 2, 128, 64, 8, 2, 2, 256
    model = _GPT(layers, h, heads, vocab, s, dropout, attention == "flash",
                 recompute == "full", kv_heads=kv_heads,
                 selective=recompute == "selective").train()
    ids = torch.randint(0, vocab, (b, s))
    measured = _saved_bytes(model, ids, torch.randint(0, vocab, (b, s)))

    def predicted(kv):
        return activation_bytes(
            _dims(layers, h, s, heads, vocab, kv_heads=kv), b, element_bytes=4,
            mask_bytes=4 if dropout else 0, attention=attention,
            attention_dropout=dropout > 0, recompute=recompute).stored_bytes

    assert predicted(kv_heads) == pytest.approx(measured, rel=0.02), (measured,
                                                                      predicted(kv_heads))
    # K and V at 2 of 8 heads: 2 × 3/4 × h × 4 bytes per token per layer fewer than MHA saves
    smaller = layers * b * s * 2 * (1 - kv_heads / heads) * h * 4
    if attention == "flash" and recompute == "none" or recompute == "selective":
        assert predicted(None) - predicted(kv_heads) == pytest.approx(smaller)
    else:
        assert predicted(None) == predicted(kv_heads)
