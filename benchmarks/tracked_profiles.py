"""CPU runs of the DeepLearningExamples models under ``gpuopt.track()``, for the accuracy
benchmark's tracked-profile tasks (``bench_accuracy.py --tracked``).

What a user on the tracked path has: a CPU proxy run of their own training script, tracked
into MLflow, whose profile (FLOPs, activations, kernels per micro-step, memory traffic per
sample) ``predict --run-id`` reads. Each model is built in plain PyTorch at its published
shape (no torchvision, not installable here; no download: BERT from its config):

- ``resnet50_v1.5``: ``workloads/measure_gemm_kernels.py``'s ResNet-50 v1.5, 224x224,
  cross-entropy, SGD with momentum; tracked twice, in NCHW (``contiguous``: DLE's FP32 and
  TF32 rows) and ``channels_last`` (its AMP rows), as the job runs each;
- ``ncf``: NeuMF as DLE's ``PyTorch/Recommendation/NCF`` builds it for ML-20m (138,493
  users, 26,744 items; GMF 64-d, MLP embeddings 128-d, layers 256-256-128-64, dropout 0.5),
  binary cross-entropy, Adam;
- ``tacotron2``: ``workloads/measure_tacotron2_kernels.py``'s model (570 mel frames, text 150),
  its loss, Adam;
- ``gnmt``: GNMT v2 as DLE's ``PyTorch/Translation/GNMT`` builds it (``seq2seq/models``:
  shared 32,320-token embedding of 1,024, a bidirectional first encoder layer then three
  LSTM layers with residuals from the third, a decoder LSTM followed by normalised Bahdanau
  attention over the whole target at once, three decoder LSTM layers fed the attention
  context, residuals from the third, the classifier; dropout 0.2), label-smoothed (0.1)
  cross-entropy, Adam; 27 source and 27 target tokens (the workload file's ~54 per pair);
- ``bert_large_pretrain_seq128`` / ``seq512``: ``transformers``' ``BertForPreTraining`` from a
  BERT-large ``BertConfig`` with eager attention (as DLE's BERT runs it), MLM + NSP, AdamW;
  seq 512 (phase 2, which DLE runs on LDDL's bins of 64) pads each of 40 steps to its bin's
  upper edge, the bins' steps in proportion to their shares, so the profile logs the
  ``sequence_bins`` the job ran at.
- ``waveglow``: WaveGlow as DLE's ``PyTorch/SpeechSynthesis/Tacotron2`` trains it
  (``waveglow/arg_parser.py`` defaults: 12 flows, groups of 8, an early output of 2 channels
  every 4 flows, WN of 8 weight-normed layers of 512 channels, kernel 3; the mel upsampled by
  a 1024-wide transposed convolution of stride 256), 8000-sample segments
  (``train_waveglow.sh``) conditioned on 32 mel frames, its flow loss (sigma 1), Adam; 268.3 M
  parameters;
- ``ssd300``: SSD300 v1.1 as DLE's ``PyTorch/Detection/SSD`` builds it (ResNet-50 to conv4,
  its first block at stride 1: 38x38 maps; five extra blocks; 3x3 box and 81-label heads on
  six maps, 8,732 default boxes), 300x300, smooth-L1 plus hard-negative-mined (3:1)
  cross-entropy, SGD with momentum; channels-last (``--data-layout``'s default); 22.9 M;
- ``transformerxl_base`` / ``large``: Transformer-XL as DLE's
  ``PyTorch/LanguageModeling/Transformer-XL`` trains it on WT103 (``wt103_base.yaml`` 16 x
  512, 8 heads, d_inner 2048, tgt/mem 192; ``wt103_large.yaml`` 18 x 1024, 16 heads, 4096,
  384, div_val 4): relative attention with its shift, a full memory, the tied adaptive
  softmax at cutoffs 19,997/39,997/199,997 over Zipf-distributed targets; Adam for DLE's
  LAMB (the same two moments per parameter); 192.0 M and 285.2 M parameters.

Each run trains a few steps at a small CPU batch (``CPU_BATCH``) into a temporary sqlite
store; the profile is per sample, so the batch of a DLE row is given to ``predict`` (with
the row's precision). Nothing is cached in the repository.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))

#: Samples per CPU training step (small: the profile is per sample).
CPU_BATCH = {"resnet50_v1.5": 2, "ncf": 4096, "tacotron2": 2, "gnmt": 4,
             "bert_large_pretrain_seq128": 2, "bert_large_pretrain_seq512": 1,
             "waveglow": 1, "ssd300": 2, "transformerxl_base": 1,
             "transformerxl_large": 1}
#: Steps tracked: the profiled one (``profile_step`` 0) and two timed after a warm-up of one
#: (BERT-large seq 512: ``BERT_BINNED_STEPS``, its padded lengths).
STEPS = 3


@dataclass(frozen=True)
class Job:
    """One model's CPU training: ``make()`` returns (model, optimizer, step), where
    ``step()`` runs one forward, backward and optimizer step."""

    name: str
    make: Callable[[], tuple]
    memory_format: str | None = None  # as the job ran: channels_last, contiguous, None
    steps: int = STEPS  # training steps tracked


def _resnet(channels_last: bool) -> tuple:
    import torch
    import torch.nn.functional as nnf
    from measure_gemm_kernels import CLASSES, IMAGE, ResNet50

    torch.manual_seed(0)
    model = ResNet50().train()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.875, weight_decay=3e-5)
    b = CPU_BATCH["resnet50_v1.5"]
    images = torch.randn(b, 3, IMAGE, IMAGE).contiguous(memory_format=fmt)
    labels = torch.randint(0, CLASSES, (b,))

    def step() -> None:
        nnf.cross_entropy(model(images), labels).backward()
        opt.step()
        opt.zero_grad()
    return model, opt, step


NCF_USERS, NCF_ITEMS, NCF_MF, NCF_LAYERS = 138493, 26744, 64, (256, 256, 128, 64)


def _ncf() -> tuple:
    import torch
    import torch.nn as nn
    import torch.nn.functional as nnf

    class NeuMF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            half = NCF_LAYERS[0] // 2
            self.mf_user = nn.Embedding(NCF_USERS, NCF_MF)
            self.mf_item = nn.Embedding(NCF_ITEMS, NCF_MF)
            self.mlp_user = nn.Embedding(NCF_USERS, half)
            self.mlp_item = nn.Embedding(NCF_ITEMS, half)
            self.mlp = nn.ModuleList(nn.Linear(a, b)
                                     for a, b in zip(NCF_LAYERS, NCF_LAYERS[1:], strict=False))
            self.final = nn.Linear(NCF_LAYERS[-1] + NCF_MF, 1)

        def forward(self, users, items):
            mf = self.mf_user(users) * self.mf_item(items)
            x = torch.cat((self.mlp_user(users), self.mlp_item(items)), dim=1)
            for layer in self.mlp:
                x = nnf.dropout(nnf.relu(layer(x)), 0.5, self.training)
            return self.final(torch.cat((mf, x), dim=1)).squeeze(1)

    torch.manual_seed(0)
    model = NeuMF().train()
    opt = torch.optim.Adam(model.parameters(), lr=4.5e-3)
    b = CPU_BATCH["ncf"]
    users = torch.randint(0, NCF_USERS, (b,))
    items = torch.randint(0, NCF_ITEMS, (b,))
    labels = torch.randint(0, 2, (b,)).float()

    def step() -> None:
        nnf.binary_cross_entropy_with_logits(model(users, items), labels).backward()
        opt.step()
        opt.zero_grad()
    return model, opt, step


def _tacotron2() -> tuple:
    import torch
    from measure_tacotron2_kernels import N_MEL, N_SYMBOLS, Tacotron2Shaped, loss_fn

    torch.manual_seed(0)
    model = Tacotron2Shaped().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    b = CPU_BATCH["tacotron2"]
    text = torch.randint(0, N_SYMBOLS, (b, 150))
    mels = torch.randn(b, N_MEL, 570)
    gate = torch.zeros(b, 570)

    def step() -> None:
        loss_fn(model(text, mels), mels, gate).backward()
        opt.step()
        opt.zero_grad()
    return model, opt, step


GNMT_VOCAB, GNMT_HIDDEN, GNMT_SRC, GNMT_TGT = 32320, 1024, 27, 27


def _gnmt() -> tuple:
    import torch
    import torch.nn as nn
    import torch.nn.functional as nnf

    h = GNMT_HIDDEN

    class Bahdanau(nn.Module):
        """Normalised Bahdanau attention (DLE's ``BahdanauAttention(normalize=True)``)."""

        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(h, h, bias=False)
            self.k = nn.Linear(h, h, bias=False)
            self.v = nn.Parameter(torch.empty(h).uniform_(-0.1, 0.1))
            self.g = nn.Parameter(torch.tensor(1 / h ** 0.5))
            self.b = nn.Parameter(torch.zeros(h))

        def forward(self, query, keys):  # (b, tq, h), (b, tk, h)
            v = self.g * self.v / self.v.norm()
            scores = torch.tanh(self.q(query).unsqueeze(2) + self.k(keys).unsqueeze(1)
                                + self.b) @ v
            return torch.bmm(nnf.softmax(scores, dim=-1), keys)

    class GNMT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(GNMT_VOCAB, h)  # shared by encoder and decoder
            self.enc = nn.ModuleList([nn.LSTM(h, h, batch_first=True, bidirectional=True),
                                      nn.LSTM(2 * h, h, batch_first=True),
                                      nn.LSTM(h, h, batch_first=True),
                                      nn.LSTM(h, h, batch_first=True)])
            self.att_rnn = nn.LSTM(h, h, batch_first=True)
            self.attention = Bahdanau()
            self.dec = nn.ModuleList(nn.LSTM(2 * h, h, batch_first=True) for _ in range(3))
            self.classifier = nn.Linear(h, GNMT_VOCAB)

        def forward(self, src, tgt):
            x = nnf.dropout(self.embed(src), 0.2, self.training)
            for i, rnn in enumerate(self.enc):
                y = rnn(x)[0]
                x = y + x if i >= 2 else y
                x = nnf.dropout(x, 0.2, self.training)
            y = self.att_rnn(nnf.dropout(self.embed(tgt), 0.2, self.training))[0]
            context = self.attention(y, x)
            for i, rnn in enumerate(self.dec):
                z = rnn(nnf.dropout(torch.cat((y, context), -1), 0.2, self.training))[0]
                y = z + y if i >= 1 else z
            return self.classifier(nnf.dropout(y, 0.2, self.training))

    torch.manual_seed(0)
    model = GNMT().train()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    b = CPU_BATCH["gnmt"]
    src = torch.randint(0, GNMT_VOCAB, (b, GNMT_SRC))
    tgt = torch.randint(0, GNMT_VOCAB, (b, GNMT_TGT + 1))

    def step() -> None:
        logits = model(src, tgt[:, :-1])
        nnf.cross_entropy(logits.reshape(-1, GNMT_VOCAB), tgt[:, 1:].reshape(-1),
                          label_smoothing=0.1).backward()
        opt.step()
        opt.zero_grad()
    return model, opt, step


#: Steps of the seq-512 job: one pass over its bins in miniature (:func:`lddl_lengths`).
BERT_BINNED_STEPS = 40


def lddl_lengths(steps: int, seed: int = 0) -> list[int]:
    """Padded lengths of ``steps`` phase-2 steps as LDDL's binned loader runs them: each
    step's batch from one bin of 64 tokens, each bin's steps in proportion to its samples
    (the shares ``workloads/bert_large_pretrain_seq512.json`` states: an epoch consumes every
    bin's samples), shuffled, and each padded to its bin's upper edge, where the longest of
    DLE's 16-32 samples a batch lies within 2 tokens (the workload file's notes). The counts
    are the shares' largest-remainder rounding to ``steps``."""
    import json
    import random

    doc = json.loads((HERE / "workloads" / "bert_large_pretrain_seq512.json").read_text())
    bins = sorted((int(t), float(w)) for t, w in doc["sequence_bins"].items())
    total = sum(w for _, w in bins)
    exact = [(t, w / total * steps) for t, w in bins]
    counts = {t: int(x) for t, x in exact}
    by_remainder = sorted(exact, key=lambda tx: tx[1] - int(tx[1]), reverse=True)
    for t, _ in by_remainder[:steps - sum(counts.values())]:
        counts[t] += 1
    lengths = [t for t, n in counts.items() for _ in range(n)]
    random.Random(seed).shuffle(lengths)
    return lengths


def _bert(seq: int) -> tuple:
    """BERT-large pre-training; at 512 tokens (phase 2) each step padded to its LDDL bin
    (:func:`lddl_lengths`), at 128 every batch at 128 (phase 1 packs it full)."""
    import torch
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                        num_attention_heads=16, intermediate_size=4096,
                        max_position_embeddings=512, attn_implementation="eager")
    model = BertForPreTraining(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b = CPU_BATCH[f"bert_large_pretrain_seq{seq}"]
    lengths = iter(lddl_lengths(BERT_BINNED_STEPS) if seq == 512 else [seq] * STEPS)
    nsp = torch.randint(0, 2, (b,))

    def step() -> None:
        n = next(lengths)
        tokens = torch.randint(0, config.vocab_size, (b, n))
        labels = torch.full((b, n), -100)
        labels[:, ::7] = tokens[:, ::7]  # ~15 % of positions masked, as MLM pre-training
        model(input_ids=tokens, labels=labels, next_sentence_label=nsp).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt, step


# WaveGlow as DLE's PyTorch/SpeechSynthesis/Tacotron2 trains it (waveglow/arg_parser.py
# defaults, scripts/train_waveglow.sh's --segment-length 8000; hop 256 -> 32 mel frames).
WG_MELS, WG_FLOWS, WG_GROUP, WG_EARLY_EVERY, WG_EARLY_SIZE = 80, 12, 8, 4, 2
WG_LAYERS, WG_CHANNELS, WG_KERNEL, WG_SEGMENT, WG_FRAMES = 8, 512, 3, 8000, 32


def _waveglow() -> tuple:
    import warnings

    import torch
    import torch.nn as nn

    def wnorm(conv):  # DLE's torch.nn.utils.weight_norm, deprecated for parametrizations
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return nn.utils.weight_norm(conv, name="weight")

    class WN(nn.Module):
        """Dilated 1-D convolutions with gated tanh-sigmoid units, conditioned on the mel."""

        def __init__(self, n_in: int) -> None:
            super().__init__()
            c = WG_CHANNELS
            self.start = wnorm(nn.Conv1d(n_in, c, 1))
            self.end = nn.Conv1d(c, 2 * n_in, 1)
            self.ins = nn.ModuleList(
                wnorm(nn.Conv1d(c, 2 * c, WG_KERNEL, dilation=2 ** i, padding=2 ** i))
                for i in range(WG_LAYERS))
            self.conds = nn.ModuleList(wnorm(nn.Conv1d(WG_MELS * WG_GROUP, 2 * c, 1))
                                       for _ in range(WG_LAYERS))
            self.res_skips = nn.ModuleList(
                wnorm(nn.Conv1d(c, 2 * c if i < WG_LAYERS - 1 else c, 1))
                for i in range(WG_LAYERS))

        def forward(self, audio, spect):
            c = WG_CHANNELS
            audio, out = self.start(audio), None
            for i in range(WG_LAYERS):
                z = self.ins[i](audio) + self.conds[i](spect)
                acts = torch.tanh(z[:, :c]) * torch.sigmoid(z[:, c:])
                rs = self.res_skips[i](acts)
                if i < WG_LAYERS - 1:
                    audio, skip = rs[:, :c] + audio, rs[:, c:]
                else:
                    skip = rs
                out = skip if out is None else skip + out
            return self.end(out)

    class WaveGlow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.upsample = nn.ConvTranspose1d(WG_MELS, WG_MELS, 1024, stride=256)
            self.convinv, self.wn = nn.ModuleList(), nn.ModuleList()
            remaining = WG_GROUP
            for k in range(WG_FLOWS):
                if k % WG_EARLY_EVERY == 0 and k > 0:
                    remaining -= WG_EARLY_SIZE
                w = torch.linalg.qr(torch.randn(remaining, remaining))[0]
                conv = nn.Conv1d(remaining, remaining, 1, bias=False)
                conv.weight.data = w.unsqueeze(-1)
                self.convinv.append(conv)
                self.wn.append(WN(remaining // 2))

        def forward(self, spect, audio):
            spect = self.upsample(spect)[:, :, :audio.size(1)]
            spect = spect.unfold(2, WG_GROUP, WG_GROUP).permute(0, 2, 1, 3)
            spect = spect.contiguous().view(spect.size(0), spect.size(1), -1).permute(0, 2, 1)
            audio = audio.unfold(1, WG_GROUP, WG_GROUP).permute(0, 2, 1)
            out, log_s_total, log_det_total = [], 0, 0
            for k in range(WG_FLOWS):
                if k % WG_EARLY_EVERY == 0 and k > 0:
                    out.append(audio[:, :WG_EARLY_SIZE])
                    audio = audio[:, WG_EARLY_SIZE:]
                conv = self.convinv[k]
                audio = conv(audio)  # invertible 1x1 convolution, its log-determinant below
                log_det_total = log_det_total + (audio.size(0) * audio.size(2)
                                                 * torch.logdet(conv.weight.squeeze(-1)))
                half = audio.size(1) // 2
                a0, a1 = audio[:, :half], audio[:, half:]
                o = self.wn[k](a0, spect)
                log_s, b = o[:, half:], o[:, :half]
                audio = torch.cat((a0, torch.exp(log_s) * a1 + b), 1)
                log_s_total = log_s_total + log_s.sum()
            z = torch.cat((*out, audio), 1)
            # WaveGlowLoss, sigma 1.0
            return (0.5 * (z * z).sum() - log_s_total - log_det_total) / z.numel()

    torch.manual_seed(0)
    model = WaveGlow().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    b = CPU_BATCH["waveglow"]
    mels = torch.randn(b, WG_MELS, WG_FRAMES)
    audio = 0.1 * torch.randn(b, WG_SEGMENT)

    def step() -> None:
        model(mels, audio).backward()
        opt.step()
        opt.zero_grad()
    return model, opt, step


# SSD300 v1.1 as DLE's PyTorch/Detection/SSD builds it (src/model.py): ResNet-50 up to
# conv4 (layer3) with conv4's first block at stride 1 (38x38 maps at 300x300), five extra
# feature blocks, 3x3 loc/conf heads on six maps (8,732 default boxes, 81 COCO labels);
# its loss: smooth-L1 on the positives' boxes, cross-entropy with 3:1 hard negative mining.
SSD_IMAGE, SSD_LABELS, SSD_DEFAULTS = 300, 81, (4, 6, 6, 6, 4, 4)
SSD_CHANNELS, SSD_MID = (1024, 512, 512, 256, 256, 256), (256, 256, 128, 128, 128)


def _ssd300(channels_last: bool) -> tuple:
    import torch
    import torch.nn as nn
    import torch.nn.functional as nnf
    from measure_gemm_kernels import EXPANSION, RESNET_LAYERS, RESNET_WIDTHS, Bottleneck

    class SSD300(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            blocks, c_in = [], 64
            for stage, (n, width) in enumerate(zip(RESNET_LAYERS[:3], RESNET_WIDTHS[:3],
                                                   strict=True)):
                for i in range(n):
                    blocks.append(Bottleneck(c_in, width, 2 if i == 0 and stage == 1 else 1))
                    c_in = width * EXPANSION
            self.features = nn.Sequential(
                nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1), *blocks)
            self.extra = nn.ModuleList(
                nn.Sequential(nn.Conv2d(a, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                              nn.Conv2d(mid, b, 3, padding=1 if i < 3 else 0,
                                        stride=2 if i < 3 else 1, bias=False),
                              nn.BatchNorm2d(b), nn.ReLU())
                for i, (a, b, mid) in enumerate(zip(SSD_CHANNELS[:-1], SSD_CHANNELS[1:],
                                                    SSD_MID, strict=True)))
            self.loc = nn.ModuleList(nn.Conv2d(c, d * 4, 3, padding=1)
                                     for d, c in zip(SSD_DEFAULTS, SSD_CHANNELS, strict=True))
            self.conf = nn.ModuleList(nn.Conv2d(c, d * SSD_LABELS, 3, padding=1)
                                      for d, c in zip(SSD_DEFAULTS, SSD_CHANNELS, strict=True))

        def forward(self, x):
            feeds = [self.features(x)]
            for block in self.extra:
                feeds.append(block(feeds[-1]))
            n = x.size(0)
            locs = torch.cat([h(f).reshape(n, 4, -1) for h, f in zip(self.loc, feeds,
                                                                   strict=True)], 2)
            confs = torch.cat([h(f).reshape(n, SSD_LABELS, -1) for h, f in zip(self.conf, feeds,
                                                                             strict=True)], 2)
            return locs.contiguous(), confs.contiguous()

    def loss_fn(ploc, plabel, gloc, glabel):
        mask = glabel > 0
        pos = mask.sum(dim=1)
        sl1 = (mask.float() * nnf.smooth_l1_loss(ploc, gloc, reduction="none").sum(1)).sum(1)
        con = nnf.cross_entropy(plabel, glabel, reduction="none")
        con_neg = con.clone()
        con_neg[mask] = 0
        rank = con_neg.sort(dim=1, descending=True)[1].sort(dim=1)[1]
        neg = rank < torch.clamp(3 * pos, max=mask.size(1)).unsqueeze(-1)
        closs = (con * (mask | neg).float()).sum(1)
        return ((sl1 + closs) * (pos > 0).float() / pos.float().clamp(min=1e-6)).mean()

    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = SSD300().train().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=2.6e-3, momentum=0.9, weight_decay=5e-4)
    b = CPU_BATCH["ssd300"]
    images = torch.randn(b, 3, SSD_IMAGE, SSD_IMAGE).contiguous(memory_format=fmt)
    boxes = 8732
    gloc = torch.randn(b, 4, boxes)
    glabel = torch.where(torch.rand(b, boxes) < 0.01,  # ~1 % of default boxes matched
                         torch.randint(1, SSD_LABELS, (b, boxes)), torch.zeros(b, boxes).long())

    def step() -> None:
        loss_fn(*model(images), gloc, glabel).backward()
        opt.step()
        opt.zero_grad()
    return model, opt, step


# Transformer-XL as DLE's PyTorch/LanguageModeling/Transformer-XL trains it on WT103
# (wt103_base.yaml, wt103_large.yaml; train.py's defaults: relative attention attn_type 0,
# post-LayerNorm, adaptive embedding and softmax at cutoffs 19997/39997/199997 with tied
# weights, tie_projs False for the head cluster and True for the tails).
TXL_VOCAB, TXL_CUTOFFS, TXL_DHEAD = 267735, (19997, 39997, 199997), 64


@dataclass(frozen=True)
class TxlShape:
    """One wt103 configuration: layers, d_model, heads (of 64), d_inner, tgt_len (tokens per
    batch item), mem_len, dropout, dropatt, div_val (cluster i's embedding is d_model ÷
    div_val**i wide, projected to d_model)."""

    layers: int
    d_model: int
    heads: int
    d_inner: int
    tgt_len: int
    mem_len: int
    dropout: float
    dropatt: float
    div_val: int


TXL = {"transformerxl_base": TxlShape(16, 512, 8, 2048, 192, 192, 0.1, 0.0, 1),
       "transformerxl_large": TxlShape(18, 1024, 16, 4096, 384, 384, 0.2, 0.2, 4)}


def _transformerxl(name: str) -> tuple:
    import torch
    import torch.nn as nn
    import torch.nn.functional as nnf

    c = TXL[name]
    n, dh, d, p = c.heads, TXL_DHEAD, c.d_model, c.dropout
    edges = (0, *TXL_CUTOFFS, TXL_VOCAB)

    class RelLayer(nn.Module):
        """``RelPartialLearnableDecoderLayer``: relative multi-head attention over memory and
        segment (content term AC, position term BD after the relative shift), then the FFN,
        each with a residual and a LayerNorm after it."""

        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(d, 3 * n * dh, bias=False)
            self.r_net = nn.Linear(d, n * dh, bias=False)
            self.o_net = nn.Linear(n * dh, d, bias=False)
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff1, self.ff2 = nn.Linear(d, c.d_inner), nn.Linear(c.d_inner, d)

        def forward(self, w, r, r_w_bias, r_r_bias, mask, mem):
            qlen, b = w.shape[:2]
            heads = self.qkv(torch.cat((mem, w), 0))
            q, k, v = heads.chunk(3, dim=-1)
            klen = k.size(0)
            q = q[-qlen:].view(qlen, b, n, dh)
            k, v = k.view(klen, b, n, dh), v.view(klen, b, n, dh)
            rk = self.r_net(r).view(klen, n, dh)
            ac = torch.einsum("ibnd,jbnd->bnij", q + r_w_bias, k)
            bd = torch.einsum("ibnd,jnd->bnij", q + r_r_bias, rk)
            pad = torch.zeros(b, n, qlen, 1, dtype=bd.dtype)  # _rel_shift
            bd = torch.cat((pad, bd), 3).view(b, n, klen + 1, qlen)[:, :, 1:].view_as(ac)
            score = ((ac + bd) * dh ** -0.5).masked_fill(mask, float("-inf"))
            prob = nnf.dropout(nnf.softmax(score, dim=3), c.dropatt, self.training)
            vec = torch.einsum("bnij,jbnd->ibnd", prob, v)
            out = nnf.dropout(self.o_net(vec.reshape(qlen, b, n * dh)), p, self.training)
            w = self.norm1(w + out)
            ff = nnf.dropout(nnf.relu(self.ff1(w)), p, self.training)
            return self.norm2(w + nnf.dropout(self.ff2(ff), p, self.training))

    class TransformerXL(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            widths = [d // c.div_val ** i for i in range(len(edges) - 1)]
            # one table at div_val 1, else one per cluster
            self.embeds = nn.ModuleList(
                [nn.Embedding(TXL_VOCAB, d)] if c.div_val == 1 else
                [nn.Embedding(hi - lo, e)
                 for lo, hi, e in zip(edges, edges[1:], widths, strict=False)])
            # (d_model, d_emb) projections where div_val > 1; the tails' are the softmax's too
            self.emb_projs = nn.ParameterList(nn.Parameter(0.01 * torch.randn(d, e))
                                              for e in widths) if c.div_val > 1 else None
            self.head_proj = nn.Parameter(0.01 * torch.randn(d, d)) if c.div_val > 1 else None
            self.out_bias = nn.Parameter(torch.zeros(TXL_VOCAB))
            self.cluster_weight = nn.Parameter(torch.zeros(len(TXL_CUTOFFS), widths[0]))
            self.cluster_bias = nn.Parameter(torch.zeros(len(TXL_CUTOFFS)))
            self.r_w_bias = nn.Parameter(torch.zeros(n, dh))
            self.r_r_bias = nn.Parameter(torch.zeros(n, dh))
            self.layers = nn.ModuleList(RelLayer() for _ in range(c.layers))
            self.tgt_len = c.tgt_len  # DLE's MemTransformerLM's: its inputs are time-major

        def embed(self, tokens):
            if self.emb_projs is None:
                return self.embeds[0](tokens)
            flat = tokens.reshape(-1)
            out = torch.zeros(flat.numel(), d)
            for i, emb in enumerate(self.embeds):
                idx = ((flat >= edges[i]) & (flat < edges[i + 1])).nonzero().squeeze(1)
                if idx.numel():
                    e = nnf.linear(emb(flat.index_select(0, idx) - edges[i]), self.emb_projs[i])
                    out = out.index_copy(0, idx, e)
            return out.view(*tokens.shape, d)

        def forward(self, tokens, target, mems):
            # time-major, (tgt_len, batch), as DLE's: track() counts the batch (self.tgt_len)
            qlen, b = tokens.shape
            klen = qlen + c.mem_len
            x = nnf.dropout(self.embed(tokens) * d ** 0.5, p, self.training)
            mask = torch.triu(torch.ones(qlen, klen, dtype=torch.bool), 1 + c.mem_len)
            pos = torch.arange(klen - 1, -1, -1.0)
            r = torch.outer(pos, 1 / 10000 ** (torch.arange(0.0, d, 2.0) / d))
            r = nnf.dropout(torch.cat((r.sin(), r.cos()), -1), p, self.training)
            hids = [x]
            for layer, mem in zip(self.layers, mems, strict=False):
                x = layer(x, r, self.r_w_bias, self.r_r_bias, mask, mem)
                hids.append(x)
            new_mems = [torch.cat((m, h), 0)[-c.mem_len:].detach()
                        for m, h in zip(mems, hids, strict=False)]
            return self._adaptive_nll(nnf.dropout(x, p, self.training).reshape(-1, d),
                                      target.reshape(-1)), new_mems

        def _logits(self, hidden, i, weight, bias):
            """A cluster's logits: through its projection where div_val > 1 (the head's its
            own, untied), then its (tied) embedding table."""
            if self.emb_projs is not None:
                hidden = hidden @ (self.head_proj if i == 0 else self.emb_projs[i])
            return nnf.linear(hidden, weight, bias)

        def _adaptive_nll(self, hidden, target):
            """``ProjectedAdaptiveLogSoftmax``: the head (the first cutoff's words and one
            logit per tail cluster) for every token, each tail cluster's words only for the
            tokens whose target is in it."""
            head = TXL_CUTOFFS[0]
            head_logp = nnf.log_softmax(self._logits(
                hidden, 0, torch.cat((self.table(0), self.cluster_weight)),
                torch.cat((self.out_bias[:head], self.cluster_bias))), dim=1)
            nll = torch.zeros_like(target, dtype=hidden.dtype)
            for i in range(len(edges) - 1):
                lo, hi = edges[i], edges[i + 1]
                idx = ((target >= lo) & (target < hi)).nonzero().squeeze(1)
                if idx.numel() == 0:
                    continue
                t = target.index_select(0, idx) - lo
                h_logp = head_logp.index_select(0, idx)
                if i == 0:
                    logp = h_logp.gather(1, t[:, None]).squeeze(1)
                else:
                    tail = nnf.log_softmax(self._logits(hidden.index_select(0, idx), i,
                                                        self.table(i),
                                                        self.out_bias[lo:hi]), dim=1)
                    logp = h_logp[:, head + i - 1] + tail.gather(1, t[:, None]).squeeze(1)
                nll = nll.index_copy(0, idx, -logp)
            return nll.mean()

        def table(self, i):
            """Cluster ``i``'s embedding rows (the softmax's weight: tied)."""
            if self.emb_projs is None:
                return self.embeds[0].weight[edges[i]:edges[i + 1]]
            return self.embeds[i].weight

    torch.manual_seed(0)
    model = TransformerXL().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    b = CPU_BATCH[name]
    # WT103's words are Zipf-distributed (~80 % of tokens in the 19,997-word head cluster)
    zipf = 1 / torch.arange(1, TXL_VOCAB + 1, dtype=torch.float64)
    stream = torch.multinomial(zipf, (c.tgt_len + 1) * b, replacement=True).view(b, -1)
    # the memory of a run past its first segment: mem_len positions of every layer's input
    state = {"mems": [torch.zeros(c.mem_len, b, d) for _ in range(c.layers + 1)]}

    def step() -> None:
        loss, state["mems"] = model(stream[:, :-1].t(), stream[:, 1:].t(), state["mems"])
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt, step

JOBS = {
    "resnet50_v1.5": (Job("resnet50_v1.5", lambda: _resnet(False), "contiguous"),
                      Job("resnet50_v1.5", lambda: _resnet(True), "channels_last")),
    "ncf": (Job("ncf", _ncf),),
    "tacotron2": (Job("tacotron2", _tacotron2),),
    "gnmt": (Job("gnmt", _gnmt),),
    "bert_large_pretrain_seq128": (Job("bert_large_pretrain_seq128", lambda: _bert(128)),),
    "bert_large_pretrain_seq512": (Job("bert_large_pretrain_seq512", lambda: _bert(512),
                                       steps=BERT_BINNED_STEPS),),
    "waveglow": (Job("waveglow", _waveglow),),
    "ssd300": (Job("ssd300", lambda: _ssd300(True), "channels_last"),),
    **{name: (Job(name, lambda name=name: _transformerxl(name)),) for name in TXL},
}


def track_job(job: Job) -> str:
    """Train ``job`` for its ``steps`` under ``gpuopt.track()`` into the current tracking
    URI; its run id."""
    import torch

    import mlflow_gpuopt as gpuopt

    torch.set_num_threads(1)
    model, opt, step = job.make()
    t0 = time.perf_counter()
    with gpuopt.track(model, opt, run_name=f"{job.name}-{job.memory_format or 'cpu'}",
                      warmup_steps=1, profile_step=0, interval_s=1.0,
                      print_summary=False) as tracker:
        for _ in range(job.steps):
            step()
    print(f"  tracked {job.name} ({job.memory_format or 'default layout'}) on the CPU in "
          f"{time.perf_counter() - t0:.0f} s: run {tracker.run_id}", flush=True)
    return tracker.run_id
