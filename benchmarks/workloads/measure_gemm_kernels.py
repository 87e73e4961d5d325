"""Measure ``kernels_per_micro_step`` for the GEMM-heavy benchmark workloads.

Builds, from plain ``torch.nn`` modules (no torchvision, no transformers):

- ResNet-50 v1.5 (He et al. 2016 with the stride on the bottleneck's 3x3 convolution, as
  NVIDIA DeepLearningExamples trains it): a 7x7/2 stem with BatchNorm, ReLU and a 3x3/2 max
  pool, bottleneck stages [3, 4, 6, 3] of widths 64-512 (x4 expansion), global average pool,
  a 1000-way classifier; 224x224 images, cross-entropy, SGD with momentum;
- BERT-large (Devlin et al. 2019): word (30522), position (512) and segment embeddings with
  LayerNorm and dropout, 24 post-LN encoder layers (``nn.TransformerEncoderLayer``: hidden
  1024, 16 heads, feed-forward 4096, GELU, dropout 0.1), then either the pretraining heads
  (the masked-LM transform + LayerNorm + decoder tied to the word embeddings, the pooler and
  next-sentence classifier; losses MLM + NSP) at sequence 128 or 512, or the SQuAD span head
  (start/end logits, two cross-entropies) at sequence 384; AdamW.

and runs gpuopt's own workload profiler
(:class:`mlflow_gpuopt.tracking.profiler.WorkloadProfiler`) over one training step of each,
the way ``track()`` does: the count runs from the first forward to the optimizer's pre-hook,
so the optimizer's kernels (and the choice of optimizer: LAMB in the benchmark's BERT rows,
AdamW here) do not enter it.

It runs on the CPU, which counts operators as the CPU splits them; DeepLearningExamples'
CUDA builds fuse some (bias+GELU, LayerNorm, the attention's softmax/dropout in their own
kernels; cuDNN's fused BatchNorm+ReLU under ``channels_last``), so this is a measurement of the
eager operator count, not of CUDA kernels. Attention goes through
``scaled_dot_product_attention`` (``nn.MultiheadAttention``'s training path), one operator
either way. The count does not depend on the micro-batch from 2 up: the script measures each
model at two micro-batches (2 and 3) and prints DIFFERS, exit 1, if they disagree. At
micro-batch 1 size-one dimensions let some reshapes stay views, so fewer copies run (BERT-large
at seq 128: 1,588 against 1,661), which is why 1 is not used.

Measured (torch 2.13 CPU): ResNet-50 v1.5 409; BERT-large pretraining 1,661 at seq 128 and
at seq 512; SQuAD fine-tuning at seq 384 1,642.

Run: ``OMP_NUM_THREADS=1 python benchmarks/workloads/measure_gemm_kernels.py`` (about ten
minutes on one core, most of it BERT-large at seq 512; about 6 GB of memory with AdamW).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as nnf

from mlflow_gpuopt.tracking.profiler import WorkloadProfiler

# ---------------------------------------------------------------- ResNet-50 v1.5
RESNET_LAYERS = (3, 4, 6, 3)
RESNET_WIDTHS = (64, 128, 256, 512)
EXPANSION = 4
IMAGE = 224
CLASSES = 1000


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here: v1.5) -> 1x1, BatchNorm after each, identity or projection."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = width * EXPANSION
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = nnf.relu(self.bn1(self.conv1(x)))
        y = nnf.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return nnf.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        blocks, c_in = [], 64
        for stage, (n, width) in enumerate(zip(RESNET_LAYERS, RESNET_WIDTHS, strict=True)):
            for i in range(n):
                blocks.append(Bottleneck(c_in, width, 2 if i == 0 and stage > 0 else 1))
                c_in = width * EXPANSION
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, CLASSES)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nnf.adaptive_avg_pool2d(x, 1), 1))


# ---------------------------------------------------------------- BERT-large
VOCAB, MAX_POS, SEGMENTS = 30522, 512, 2
HIDDEN, HEADS, FFN, LAYERS = 1024, 16, 4096, 24
DROPOUT = 0.1


class Bert(nn.Module):
    """BERT-large encoder with the pretraining heads (``squad=False``) or the span head."""

    def __init__(self, squad: bool) -> None:
        super().__init__()
        self.word = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(MAX_POS, HIDDEN)
        self.seg = nn.Embedding(SEGMENTS, HIDDEN)
        self.emb_norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, FFN, DROPOUT, activation="gelu",
                                           batch_first=True, layer_norm_eps=1e-12)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.squad = squad
        if squad:
            self.qa = nn.Linear(HIDDEN, 2)
        else:
            self.mlm_dense = nn.Linear(HIDDEN, HIDDEN)
            self.mlm_norm = nn.LayerNorm(HIDDEN, eps=1e-12)
            self.mlm_bias = nn.Parameter(torch.zeros(VOCAB))
            self.pooler = nn.Linear(HIDDEN, HIDDEN)
            self.nsp = nn.Linear(HIDDEN, 2)

    def forward(self, tokens, segments):
        pos = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        x = self.word(tokens) + self.pos(pos) + self.seg(segments)
        x = nnf.dropout(self.emb_norm(x), DROPOUT, self.training)
        x = self.encoder(x)
        if self.squad:
            start, end = self.qa(x).unbind(-1)
            return start, end
        h = self.mlm_norm(nnf.gelu(self.mlm_dense(x)))
        mlm = h @ self.word.weight.t() + self.mlm_bias
        nsp = self.nsp(torch.tanh(self.pooler(x[:, 0])))
        return mlm, nsp


# ---------------------------------------------------------------- profiling
def _profile(model: nn.Module, opt: torch.optim.Optimizer, name: str, inputs: tuple,
             loss_of, batch: int) -> float:
    profiler = WorkloadProfiler(model, opt, name=name)
    profiler.begin_step(inputs[0])
    out = model(*inputs)
    loss = loss_of(out)
    profiler.end_forward()
    loss.backward()
    opt.step()
    profiler.end_step()
    return profiler.result(batch, 1).kernels_per_micro_step


def resnet_count(batch: int) -> float:
    torch.manual_seed(0)
    model = ResNet50().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.875, weight_decay=3e-5)
    images = torch.randn(batch, 3, IMAGE, IMAGE)
    labels = torch.randint(0, CLASSES, (batch,))
    return _profile(model, opt, "resnet50_v1.5", (images,),
                    lambda out: nnf.cross_entropy(out, labels), batch)


def bert_count(batch: int, seq: int, squad: bool) -> float:
    torch.manual_seed(0)
    model = Bert(squad).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, VOCAB, (batch, seq))
    segments = torch.zeros(batch, seq, dtype=torch.long)
    if squad:
        starts = torch.randint(0, seq, (batch,))
        ends = torch.randint(0, seq, (batch,))

        def loss_of(out):
            return (nnf.cross_entropy(out[0], starts) + nnf.cross_entropy(out[1], ends)) / 2
    else:
        mlm_labels = torch.full((batch, seq), -100)
        mlm_labels[:, ::7] = torch.randint(0, VOCAB, (batch, len(range(0, seq, 7))))
        nsp_labels = torch.randint(0, 2, (batch,))

        def loss_of(out):
            return (nnf.cross_entropy(out[0].reshape(-1, VOCAB), mlm_labels.reshape(-1),
                                      ignore_index=-100)
                    + nnf.cross_entropy(out[1], nsp_labels))
    name = "bert_large_squad" if squad else f"bert_large_pretrain_seq{seq}"
    return _profile(model, opt, name, (tokens, segments), loss_of, batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs=2, default=(2, 3),
                    help="two micro-batches to measure at (the count must not change)")
    ap.add_argument("--only", choices=("resnet", "bert128", "bert512", "squad"), nargs="*",
                    help="measure only these (default: all)")
    a = ap.parse_args()
    jobs = {
        "resnet": ("resnet50_v1.5 (224x224)", resnet_count),
        "bert128": ("bert_large_pretrain_seq128", lambda b: bert_count(b, 128, False)),
        "bert512": ("bert_large_pretrain_seq512", lambda b: bert_count(b, 512, False)),
        "squad": ("bert_large_squad_finetune (seq 384)", lambda b: bert_count(b, 384, True)),
    }
    status = 0
    for key in a.only or jobs:
        label, count = jobs[key]
        counts = [count(b) for b in a.batches]
        same = len(set(counts)) == 1
        status |= not same
        print(f"{label}: kernels_per_micro_step "
              + (f"{counts[0]:.0f}" if same else "DIFFERS")
              + f" (cpu, torch {torch.__version__}; micro-batches {a.batches[0]}, "
              f"{a.batches[1]}: {', '.join(f'{c:.0f}' for c in counts)})", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
