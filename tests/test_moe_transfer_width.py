"""The mixture-of-experts transfer widths: ``unexplained time, nature unknown`` as a share of
the two readings' log distance, and the benchmark's derivation of the MoE transfer piece
from pairs no task scores (``benchmarks/llm_moe.py``, ``benchmarks/scores.py``), against
hand-computed figures."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

from mlflow_gpuopt.perfmodel import uncertainty as unc

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("scores"), importlib.import_module("llm_moe")
    finally:
        sys.path.remove(str(BENCH))


def test_unexplained_width_is_the_measured_share_of_the_readings_distance():
    # 0.34 of ln(2): the throughput reading twice as fast as the latency-bound one
    assert unc.unexplained_sigma(2.0, 1.0) == pytest.approx(0.34 * 0.693147, rel=1e-5)
    assert unc.unexplained_sigma(1.0, 2.0) == pytest.approx(0.34 * 0.693147, rel=1e-5)
    assert unc.unexplained_sigma(3.0, 3.0) == 0.0
    assert unc.unexplained_sigma(0.0, 1.0) == 0.0


def test_the_share_follows_from_the_measured_excess_ratios():
    # a = ln(measured / SMs x clock) / ln(FP8 peak / SMs x clock) per release; RMS of a - 1
    a = [math.log(r / 1.12) / math.log(2.27 / 1.12) for r in (2.83, 2.93)]
    assert a[0] == pytest.approx(1.312, abs=1e-3) and a[1] == pytest.approx(1.361, abs=1e-3)
    rms = math.sqrt(((a[0] - 1) ** 2 + (a[1] - 1) ** 2) / 2)
    assert abs(unc.UNEXPLAINED_SCALING_SHARE - rms) <= 0.005


def test_net_piece_and_leave_one_model_out(bench):
    scores, _ = bench
    logs = {"a": [(0.3, 0.1), (-0.1, 0.1)], "b": [(0.2, 0.2)]}
    # rows: mean e^2 0.14/3, mean s^2 0.06/3 -> 0.026667; per model a 0.04, b 0 -> 0.02
    assert scores.net_piece(logs) == pytest.approx(math.sqrt(0.08 / 3), rel=1e-9)
    # without a: b alone nets to 0, so a's 0.3 is outside 1.645 x 0.1 and its -0.1 inside;
    # without b: a nets to 0.2, b's 0.2 inside 1.645 x hypot(0.2, 0.2)
    assert scores.leave_one_model_out(logs) == (2, 3)
    assert scores.net_piece({"a": [(0.1, 0.2)]}) == 0.0
    assert scores.net_piece({}) == 0.0


def test_unscored_pairs_are_the_derivation_releases_and_token_dropping_rows(bench):
    """Each pair's reference is the same release's run on the other GPU type: the token-
    dropping NeMo 25.09 rows and the derivation releases 26.02.01 and 26.04 (GPT-OSS 120B and
    Qwen3-30B-A3B both ways; their DeepSeek-V3 has no H100 row), none of them scored."""
    _, llm_moe = bench
    rows = llm_moe.load_moe_rows()
    pairs = llm_moe.unscored_transfer_pairs(rows)
    got = {(t.model, t.gpu, r.model, r.gpu, r.date) for t, r in pairs}
    rel = "2025-09 (NeMo 25.09)"
    h100, b200 = "H100-SXM-80GB", "B200"
    later = {(m, a, m, b, d) for m in ("GPT OSS 120B", "Qwen3_30B_a3B")
             for a, b in ((h100, b200), (b200, h100))
             for d in ("2026-02 (NeMo 26.02.01)", "2026-04 (NeMo 26.04)")}
    assert got == later | {
        ("DeepSeekV3 (tokendrop)", b200, "DeepSeekV3 (dropless)", h100, rel),
        ("Qwen3_30B_a3B (tokendrop)", b200, "Qwen3_30B_a3B (tokendrop)", h100, rel),
        ("Qwen3_30B_a3B (tokendrop)", h100, "Qwen3_30B_a3B (tokendrop)", b200, rel),
        ("Qwen3_235B_a22B (tokendrop)", b200, "Qwen3_235B_a22B (tokendrop)", h100, rel),
        ("Qwen3_235B_a22B (tokendrop)", h100, "Qwen3_235B_a22B (tokendrop)", b200, rel)}
    assert all(t.source in llm_moe.DERIVATION_SOURCES for t, _ in pairs
               if t.routing != "tokendrop")
    scored = {t for name, p in llm_moe.moe_tasks(rows).items() for t, _ in p}
    assert not scored & {t for t, _ in pairs}
