"""The profile's ``gemm_reduction_per_micro_step``: Σ K over the forward's matrix products and
their data gradients (K + N each) whose output rows are the micro-batch's samples alone, a
fused RNN's hidden products at every time step (a bidirectional layer's two directions, run
side by side, once); products over batch × sequence rows are recorded apart and left out.
Real CPU steps through the real profiler; expected sums from the layers' sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from mlflow_gpuopt.tracking.dispatch_count import gemm_shape_mode_class, rnn_reduction
from mlflow_gpuopt.tracking.profiler import WorkloadProfiler


def lstm_layer(inp: int, hidden: int, steps: int) -> int:
    """One LSTM layer and direction: the input projection and its data gradient once (K =
    input, K = 4·hidden), at every step the hidden product and its data gradient."""
    gates = 4 * hidden
    return inp + gates + steps * (hidden + gates)


def bidirectional_layer(inp: int, hidden: int, steps: int) -> int:
    """Both directions' input projections, the steps' hidden products once for the pair."""
    return inp + 4 * hidden + lstm_layer(inp, hidden, steps)


class Seq(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.rnn = nn.LSTM(16, 32, num_layers=2, batch_first=batch_first, bidirectional=True)
        self.head = nn.Linear(64, 8)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def profile(model: nn.Module, x: torch.Tensor, batch: int):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = WorkloadProfiler(model, opt)
    prof.begin_step(x)
    out = model(x)
    prof.end_forward(out)
    out.pow(2).mean().backward()
    opt.step()
    prof.end_step()
    return prof.result(batch, 1)


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_fused_lstm_counts_every_time_step(batch_first):
    steps, batch = 5, 3
    x = torch.randn(batch, steps, 16) if batch_first else torch.randn(steps, batch, 16)
    p = profile(Seq(batch_first), x, batch)
    # two layers' hidden products and their gradients (K 32 and 4 x 32) at every step, each
    # layer's reverse direction beside its forward one; the input projections and the head
    # run over batch x steps rows
    assert p.micro_batch == batch
    assert p.gemm_reduction_per_micro_step == 2 * steps * (32 + 128)


def test_the_rows_of_every_product_are_kept_apart():
    steps, batch = 5, 3
    with gemm_shape_mode_class()() as mode:
        Seq(True)(torch.randn(batch, steps, 16))
    # over batch x steps rows: two input projections of layer 1 (K 16 and 4 x 32), two of
    # layer 2 (K 64), the head (64 -> 8); over the batch: the hidden products at every step,
    # a layer's two directions once
    assert mode.reduction_by_rows == {
        batch * steps: 2 * (16 + 128) + 2 * (64 + 128) + (64 + 8),
        batch: 2 * steps * (32 + 128)}
    assert mode.reduction == (bidirectional_layer(16, 32, steps)
                              + bidirectional_layer(64, 32, steps) + 64 + 8)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_directions_of_a_bidirectional_layer_share_their_steps(bidirectional):
    steps, batch = 6, 4
    with gemm_shape_mode_class()() as mode:
        nn.LSTM(8, 16, bidirectional=bidirectional)(torch.randn(steps, batch, 8))
    # the input projections over 24 rows (K 8, gradient K 64) once per direction; the
    # hidden products (K 16, gradient K 64) at every step once, either way
    directions = 2 if bidirectional else 1
    assert mode.reduction_by_rows == {steps * batch: directions * (8 + 64),
                                      batch: steps * (16 + 64)}


def test_a_packed_sequence_counts_its_longest_length():
    with gemm_shape_mode_class()() as mode:
        packed = nn.utils.rnn.pack_padded_sequence(torch.randn(7, 3, 16), [7, 4, 2])
        nn.LSTM(16, 32)(packed)
    assert mode.reduction == lstm_layer(16, 32, 7)
    # the projection over the 13 packed rows; the CPU runs the hidden product step by step
    # at the batch still running: 3, 3, 2, 2, 1, 1, 1
    assert mode.reduction_by_rows == {13: 16 + 128, 3: 2 * 160, 2: 2 * 160, 1: 3 * 160}


def test_products_over_fewer_rows_than_the_batch_count():
    model = nn.LSTM(16, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = WorkloadProfiler(model, opt)
    padded = torch.randn(7, 3, 16)
    prof.begin_step(padded)
    out = model(nn.utils.rnn.pack_padded_sequence(padded, [7, 4, 2]))[0].data
    prof.end_forward(out)
    out.pow(2).mean().backward()
    opt.step()
    prof.end_step()
    # all seven steps' hidden products (each over at most the 3 samples), not the projection
    assert prof.result(3, 1, {"micro_batch": 3}).gemm_reduction_per_micro_step == 7 * 160


def test_cells_and_linears_count_per_call():
    cell, proj = nn.LSTMCell(16, 32), nn.Linear(32, 10)
    with gemm_shape_mode_class()() as mode:
        h = c = torch.zeros(2, 32)
        for _ in range(6):  # a decoder loop: the cell's two products and the projection
            h, c = cell(torch.randn(2, 16), (h, c))
            proj(h)
    assert mode.reduction_by_rows == {2: 6 * ((16 + 128) + (32 + 128) + (32 + 10))}


def test_layer_shaped_products_are_left_out():
    # a transformer-like block: every product runs over batch x sequence rows, many waves
    # at a training batch, whose tails the attainable efficiency already holds
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    p = profile(model, torch.randn(2, 9, 16), 2)
    assert p.gemm_reduction_per_micro_step is None


def test_a_batched_product_counts_its_matrices_rows():
    with gemm_shape_mode_class()() as mode:
        torch.bmm(torch.randn(4, 3, 8), torch.randn(4, 8, 5))
    assert mode.reduction_by_rows == {12: 8 + 5}


def test_a_model_without_products_records_none():
    model = nn.Sequential(nn.Conv1d(4, 4, 3))
    p = profile(model, torch.randn(2, 4, 9), 2)
    assert p.gemm_reduction_per_micro_step is None


def test_cudnns_weight_list_takes_each_layers_reverse_direction_beside_the_forward():
    # _cudnn_rnn's arguments as PyTorch hands them (no CUDA here: the count reads shapes):
    # two layers, both directions, weights per layer-direction w_ih, w_hh, b_ih, b_hh
    hidden, inp, steps, batch = 16, 8, 5, 3
    weights = []
    for layer in range(2):
        for _direction in range(2):
            weights += [torch.zeros(4 * hidden, inp if layer == 0 else 2 * hidden),
                        torch.zeros(4 * hidden, hidden), torch.zeros(4 * hidden),
                        torch.zeros(4 * hidden)]
    args = (torch.zeros(steps, batch, inp), weights, 4, None, None, None, 2, hidden, 0, 2,
            False, 0.0, True, True, [], None)
    assert rnn_reduction("_cudnn_rnn", args) == [
        (15, 8 + 64), (3, steps * (16 + 64)), (15, 8 + 64),
        (15, 32 + 64), (3, steps * (16 + 64)), (15, 32 + 64)]
    one_way = args[:13] + (False,) + args[14:]
    assert [r for rows, r in rnn_reduction("_cudnn_rnn", one_way) if rows == 3] == [
        steps * (16 + 64)] * 4
