"""Measure ``kernels_per_micro_step`` for the Tacotron 2 benchmark workload.

Builds a model of Tacotron 2's architecture at NVIDIA DeepLearningExamples' published
hyper-parameters (PyTorch/SpeechSynthesis/Tacotron2/tacotron2/arg_parser.py defaults:
512-d symbol embedding and encoder, three 5-wide encoder convolutions, a bidirectional
LSTM encoder, prenet 2 x 256, attention LSTM 1024, location-sensitive attention 128-d with
32 filters of width 31, decoder LSTM 1024, one 80-bin mel frame per decoder step, postnet
five 5-wide convolutions of 512 channels) and runs gpuopt's own workload profiler
(:class:`mlflow_gpuopt.tracking.profiler.WorkloadProfiler`) over one training step of it:
teacher-forced decoding of ``--frames`` mel frames (570, the benchmark workload's frames
per clip), the Tacotron 2 loss (MSE before and after the postnet + BCE on the gate), Adam.

It runs on the CPU (no GPU here), which counts operators as the CPU splits them: an
``LSTMCell`` forward+backward is about 34 operators on a CPU, fewer on CUDA (where the cell's
element-wise part is one fused kernel), and dropout three instead of one. The decoder's two
cells per frame make this count an overstatement of what the same step launches on a GPU;
it is a measurement, not a CUDA figure. The encoder's LSTM is one operator either way (a CPU
kernel here, cuDNN on a GPU) and printed separately; the count does not depend on the batch.
The text is ``--text-len`` symbols (padded batch, no packing).

Run: ``OMP_NUM_THREADS=1 python benchmarks/workloads/measure_tacotron2_kernels.py``.
"""

from __future__ import annotations

import argparse
import torch
import torch.nn as nn
import torch.nn.functional as nnf

from mlflow_gpuopt.tracking.dispatch_count import kernel_count_mode
from mlflow_gpuopt.tracking.profiler import WorkloadProfiler

# DeepLearningExamples Tacotron2 arg_parser.py defaults
N_MEL, N_SYMBOLS, EMB = 80, 148, 512
ENC_CONVS, ENC_KERNEL = 3, 5
PRENET, ATT_RNN, DEC_RNN, ATT_DIM = 256, 1024, 1024, 128
LOC_FILTERS, LOC_KERNEL = 32, 31
POST_CONVS, POST_DIM, POST_KERNEL = 5, 512, 5
P_ATT_DROPOUT = P_DEC_DROPOUT = 0.1


def conv_bn(c_in: int, c_out: int, k: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv1d(c_in, c_out, k, padding=(k - 1) // 2), nn.BatchNorm1d(c_out))


class Attention(nn.Module):
    """Location-sensitive attention (Chorowski et al. 2015, as in Tacotron 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(ATT_RNN, ATT_DIM, bias=False)
        self.memory = nn.Linear(EMB, ATT_DIM, bias=False)
        self.v = nn.Linear(ATT_DIM, 1, bias=False)
        self.loc_conv = nn.Conv1d(2, LOC_FILTERS, LOC_KERNEL, padding=(LOC_KERNEL - 1) // 2,
                                  bias=False)
        self.loc_dense = nn.Linear(LOC_FILTERS, ATT_DIM, bias=False)

    def forward(self, query, memory, processed_memory, weights_cat, mask):
        location = self.loc_dense(self.loc_conv(weights_cat).transpose(1, 2))
        energies = self.v(torch.tanh(self.query(query.unsqueeze(1)) + location
                                     + processed_memory)).squeeze(-1)
        energies = energies.masked_fill(mask, -float("inf"))
        weights = nnf.softmax(energies, dim=1)
        return torch.bmm(weights.unsqueeze(1), memory).squeeze(1), weights


class Tacotron2Shaped(nn.Module):
    """Tacotron 2's layers and decoder loop (training, teacher forcing)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(N_SYMBOLS, EMB)
        self.enc_convs = nn.ModuleList(conv_bn(EMB, EMB, ENC_KERNEL) for _ in range(ENC_CONVS))
        self.enc_lstm = nn.LSTM(EMB, EMB // 2, batch_first=True, bidirectional=True)
        self.prenet = nn.ModuleList([nn.Linear(N_MEL, PRENET, bias=False),
                                     nn.Linear(PRENET, PRENET, bias=False)])
        self.att_rnn = nn.LSTMCell(PRENET + EMB, ATT_RNN)
        self.attention = Attention()
        self.dec_rnn = nn.LSTMCell(ATT_RNN + EMB, DEC_RNN)
        self.proj = nn.Linear(DEC_RNN + EMB, N_MEL)
        self.gate = nn.Linear(DEC_RNN + EMB, 1)
        dims = [N_MEL] + [POST_DIM] * (POST_CONVS - 1) + [N_MEL]
        self.postnet = nn.ModuleList(conv_bn(a, b, POST_KERNEL)
                                     for a, b in zip(dims, dims[1:], strict=False))

    def encode(self, text):
        x = self.embedding(text).transpose(1, 2)
        for conv in self.enc_convs:
            x = nnf.dropout(nnf.relu(conv(x)), 0.5, self.training)
        return self.enc_lstm(x.transpose(1, 2))[0]

    def forward(self, text, mels):
        memory = self.encode(text)
        b, t_in = text.shape
        go = mels.new_zeros(1, b, N_MEL)
        x = torch.cat((go, mels.permute(2, 0, 1)), dim=0)
        for linear in self.prenet:
            x = nnf.dropout(nnf.relu(linear(x)), p=0.5, training=True)
        att_h = att_c = dec_h = dec_c = memory.new_zeros(b, ATT_RNN)
        weights = weights_cum = memory.new_zeros(b, t_in)
        context = memory.new_zeros(b, EMB)
        processed = self.attention.memory(memory)
        mask = torch.zeros(b, t_in, dtype=torch.bool, device=text.device)
        outs, gates = [], []
        for i in range(mels.shape[2]):
            att_h, att_c = self.att_rnn(torch.cat((x[i], context), -1), (att_h, att_c))
            att_h = nnf.dropout(att_h, P_ATT_DROPOUT, self.training)
            cat = torch.cat((weights.unsqueeze(1), weights_cum.unsqueeze(1)), dim=1)
            context, weights = self.attention(att_h, memory, processed, cat, mask)
            weights_cum = weights_cum + weights
            dec_h, dec_c = self.dec_rnn(torch.cat((att_h, context), -1), (dec_h, dec_c))
            dec_h = nnf.dropout(dec_h, P_DEC_DROPOUT, self.training)
            hc = torch.cat((dec_h, context), dim=1)
            outs.append(self.proj(hc))
            gates.append(self.gate(hc).squeeze(1))
        mel = torch.stack(outs).permute(1, 2, 0)
        post = mel
        for i, conv in enumerate(self.postnet):
            post = conv(post)
            post = nnf.dropout(torch.tanh(post) if i < len(self.postnet) - 1 else post, 0.5,
                             self.training)
        return mel, mel + post, torch.stack(gates).transpose(0, 1)


def loss_fn(outputs, mels, gate_target):
    mel, mel_post, gate = outputs
    return (nnf.mse_loss(mel, mels) + nnf.mse_loss(mel_post, mels)
            + nnf.binary_cross_entropy_with_logits(gate, gate_target))


def profile_step(batch: int, text_len: int, frames: int) -> float:
    """Kernels per micro-step from the workload profiler over one training step on the CPU."""
    torch.manual_seed(0)
    model = Tacotron2Shaped()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    text = torch.randint(0, N_SYMBOLS, (batch, text_len))
    mels = torch.randn(batch, N_MEL, frames)
    gate_target = torch.zeros(batch, frames)
    profiler = WorkloadProfiler(model, opt, name="tacotron2")
    profiler.begin_step(text)
    loss = loss_fn(model(text, mels), mels, gate_target)
    profiler.end_forward()
    loss.backward()
    opt.step()
    profiler.end_step()
    return profiler.result(batch, 1).kernels_per_micro_step


def encoder_kernels(batch: int, text_len: int) -> int:
    """Kernels of the encoder alone, forward + backward (its share of the count)."""
    model = Tacotron2Shaped()
    text = torch.randint(0, N_SYMBOLS, (batch, text_len))
    with kernel_count_mode() as mode:
        model.encode(text).sum().backward()
    return mode.count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=570, help="mel frames per clip")
    ap.add_argument("--text-len", type=int, default=150, help="symbols per (padded) text")
    ap.add_argument("--batch", type=int, default=2, help="micro-batch (the count does not "
                    "depend on it; small keeps the CPU run short)")
    a = ap.parse_args()
    n = profile_step(a.batch, a.text_len, a.frames)
    enc = encoder_kernels(a.batch, a.text_len)
    print(f"kernels_per_micro_step {n:.0f} (cpu, {a.frames} frames, text {a.text_len}): "
          f"encoder {enc}, decoder + postnet + loss {n - enc:.0f} = "
          f"{(n - enc) / a.frames:.1f} per mel frame")


if __name__ == "__main__":
    main()
