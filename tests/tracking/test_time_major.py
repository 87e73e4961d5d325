"""Samples of time-major models: inputs of shape (sequence, batch), PyTorch's recurrent and
attention modules' default and Transformer-XL's, count the batch, not the tokens
(:mod:`mlflow_gpuopt.tracking.batch_dim`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from support.tracking import params_and_profile, samples_per_step

import mlflow_gpuopt as gpuopt

OPTS = {"interval_s": 0.1, "print_summary": False, "warmup_steps": 1}
VOCAB, WIDTH, SEQ, BATCH = 50, 16, 12, 3


class RecurrentLM(nn.Module):
    """An LSTM language model over (sequence, batch) ids, or (batch, sequence) with
    ``batch_first``."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.rnn = nn.LSTM(WIDTH, WIDTH, batch_first=batch_first)
        self.out = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        return self.out(self.rnn(self.embed(ids))[0])


class SegmentLM(nn.Module):
    """Transformer-XL's interface: (tgt_len, batch) ids, the segment length in ``tgt_len``,
    no module that states a layout."""

    def __init__(self) -> None:
        super().__init__()
        self.tgt_len = SEQ
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.ff = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        return self.out(torch.relu(self.ff(self.embed(ids))))


def train(model: nn.Module, time_major: bool, steps: int = 4) -> str:
    """``steps`` Adam steps on seeded random ids of ``BATCH`` sequences of ``SEQ`` tokens,
    laid out as the model takes them; the run id."""
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with gpuopt.track(model, opt, profile_step=1, **OPTS) as t:
        for _ in range(steps):
            ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
            x, y = ids[:, :-1], ids[:, 1:]
            if time_major:
                x, y = x.t(), y.t()
            logits = model(x)
            F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
    return t.run_id


@pytest.mark.parametrize(("model", "time_major"), [
    (lambda: RecurrentLM(batch_first=False), True),
    (lambda: RecurrentLM(batch_first=True), False),
    (SegmentLM, True),
], ids=["lstm-time-major", "lstm-batch-first", "tgt_len-time-major"])
def test_samples_are_the_batch_whichever_the_layout(tracking_uri, model, time_major):
    import mlflow

    run_id = train(model(), time_major)
    params, profile = params_and_profile(run_id)
    metrics = mlflow.get_run(run_id).data.metrics
    assert samples_per_step(metrics) == pytest.approx(BATCH)
    assert profile["micro_batch"] == BATCH
    assert profile["tokens_per_sample"] == SEQ
    assert params["gpuopt.micro_batch"] == str(BATCH)


def test_same_model_same_profile_in_either_layout(tracking_uri):
    """The per-sample FLOPs of the time-major LSTM are the batch-first one's: per sample,
    not per token."""
    flops = {}
    for time_major in (True, False):
        _, profile = params_and_profile(train(RecurrentLM(not time_major), time_major))
        flops[time_major] = profile["flops_per_sample"]
    # the output projection alone: 2 * 3 (fwd + bwd) * SEQ tokens * WIDTH * VOCAB per sample
    assert flops[True] > 6 * SEQ * WIDTH * VOCAB
    assert flops[True] == pytest.approx(flops[False], rel=1e-6)
