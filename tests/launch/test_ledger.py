"""The accuracy ledger's arithmetic on pairs with known values (pure)."""

from __future__ import annotations

import pytest

from mlflow_gpuopt.launch.ledger import (
    Refit,
    ledger_row,
    ledger_totals,
    percentile,
    refit_run_ids,
)
from mlflow_gpuopt.launch.plan_check import PlanPrediction


def _plan(pid="rec:1", thr=1000.0, low=800.0, high=1250.0) -> PlanPrediction:
    return PlanPrediction(plan_id=pid, recommendation_run_id="rec", rank=1,
                          throughput_samples_per_s=thr, throughput_low_samples_per_s=low,
                          throughput_high_samples_per_s=high, step_time_s=0.1,
                          memory_per_gpu_bytes=1e9, hours=10.5, hours_low=8.5, hours_high=13.0,
                          cost_usd=210.0, total_samples=3.6e7, fixed_hours=0.5,
                          source_run_ids=("src1", "src2"))


def test_one_pair_by_hand():
    row = ledger_row("job1", "n", _plan(), 900.0)
    assert row.error == pytest.approx(-0.1)
    assert row.covered is True
    # 3.6e7 samples at 900/s = 11.111 h of compute, + 0.5 h start-up
    assert row.measured_hours == pytest.approx(0.5 + 3.6e7 / 900 / 3600)
    assert row.measured_cost_usd == pytest.approx(210.0 * (0.5 + 3.6e7 / 900 / 3600) / 10.5)
    assert row.refit_error is None
    assert ledger_row("job2", "n", _plan(), 700.0).covered is False
    assert ledger_row("job3", "n", _plan(low=None, high=None), 700.0).covered is None


def test_totals_median_p90_and_coverage_by_hand():
    rows = [ledger_row("a", "", _plan(), 900.0, Refit(950.0, 850.0, 1050.0, ("src1",))),
            ledger_row("b", "", _plan(), 700.0, Refit(750.0, 700.0, 800.0, ("src1",))),
            ledger_row("c", "", _plan(), 1500.0, "refit failed: x")]
    t = ledger_totals(rows)
    # |errors| 0.1, 0.3, 0.5: median 0.3; p90 at position 1.8 -> 0.3 + 0.8 * 0.2 = 0.46
    assert t["plan"]["pairs"] == 3
    assert t["plan"]["median_abs_error"] == pytest.approx(0.3)
    assert t["plan"]["p90_abs_error"] == pytest.approx(0.46)
    assert t["plan"]["coverage"] == pytest.approx(1 / 3)
    # refit: 900/950 - 1 and 700/750 - 1, both covered
    e = sorted([abs(900 / 950 - 1), abs(700 / 750 - 1)])
    assert t["refit"]["pairs"] == 2
    assert t["refit"]["median_abs_error"] == pytest.approx((e[0] + e[1]) / 2)
    assert t["refit"]["p90_abs_error"] == pytest.approx(e[0] + 0.9 * (e[1] - e[0]))
    assert t["refit"]["coverage"] == 1.0
    assert rows[2].refit_note == "refit failed: x"


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    xs = [0.4, 0.05, 0.3, 0.9, 0.12]
    for q in (0, 10, 50, 90, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_leave_one_out_never_fits_on_the_scored_run():
    plan = _plan()
    assert refit_run_ids(plan, "job1", ["job1", "job2", "src1"]) == ("src1", "src2", "job2")
    assert "job1" not in refit_run_ids(_plan(), "job1", ["job1"])
