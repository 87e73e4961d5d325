"""Bad track() options and step floods: one clear error, or a warning that says what happened."""

from __future__ import annotations

import logging
import math

import pytest
import torch

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.tracking.config import MIN_INTERVAL_S, TrackConfig

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("kwargs", [{"interval_s": math.inf}, {"interval_s": math.nan},
                                    {"flush_timeout_s": math.nan},
                                    {"flush_timeout_s": math.inf}, {"flush_timeout_s": -1.0},
                                    {"max_step_records": 0}])
def test_non_finite_or_negative_options_are_refused_at_start(kwargs):
    model = torch.nn.Linear(4, 1)
    with pytest.raises(ValueError) as info, gpuopt.track(model, **kwargs):
        pass
    assert "\n" not in str(info.value) and next(iter(kwargs)) in str(info.value)


def test_interval_below_the_floor_is_raised_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = TrackConfig(interval_s=0.01)
    assert cfg.interval_s == MIN_INTERVAL_S
    assert any("interval_s=0.01" in r.getMessage() for r in caplog.records)


def test_more_steps_than_max_step_records_in_one_interval_are_counted(tracking_uri, caplog):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 8)
    with caplog.at_level(logging.WARNING), gpuopt.track(
            model, opt, interval_s=5.0, max_step_records=10, print_summary=False,
            profile=False):
        for _ in range(200):  # all within one 5 s interval
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    said = [r.getMessage() for r in caplog.records if "not timed" in r.getMessage()]
    assert said and "max_step_records=10" in said[0]
