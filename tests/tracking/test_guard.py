"""The never-raise guard (``tracking/guard.py``) on its own and inside a real tracked run."""

from __future__ import annotations

import logging

import mlflow
import pytest
import torch
import torch.nn as nn

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt.tracking._warn import WarnOnce
from mlflow_gpuopt.tracking.guard import suppress
from support.tracking import train


class _Part:
    def __init__(self) -> None:
        self._warn = WarnOnce(logging.getLogger("gpuopt.test.guard"), every=3)
        self.calls = 0

    @suppress("part", "the part failed: %s", default=-1)
    def work(self, x: int) -> int:
        self.calls += 1
        if x < 0:
            raise ValueError(f"negative {x}")
        return 2 * x


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "gpuopt.test.guard"]


def test_suppress_returns_the_value_or_the_default_and_warns_once_then_every_nth(caplog):
    part = _Part()
    with caplog.at_level(logging.WARNING):
        assert part.work(4) == 8
        assert _said(caplog) == []
        results = [part.work(-i) for i in range(1, 7)]
    assert results == [-1] * 6
    assert part.calls == 7  # the decorated body ran each time
    # said the first time, then at the 3rd and 6th failure with the count
    assert _said(caplog) == ["gpuopt: the part failed: negative -1",
                             "gpuopt: the part failed: negative -3 (x3)",
                             "gpuopt: the part failed: negative -6 (x6)"]


def test_suppress_lets_base_exceptions_through():
    class Stopped(_Part):
        @suppress("part", "failed: %s")
        def work(self, x: int) -> int:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Stopped().work(1)


@pytest.mark.faults
def test_failing_end_of_run_parts_cost_only_their_own_output(tracking_uri, caplog,
                                                             monkeypatch):
    """The advice rules and the hardware fingerprint both raise at the end: the summary is
    logged without an advice line, the profile artifact without a fingerprint, one warning
    each, and training's losses are those of an untracked run."""
    import mlflow_gpuopt.devices.fingerprint as fingerprint
    import mlflow_gpuopt.tracking.summary as summary_mod

    def broken(*args, **kwargs):
        raise RuntimeError("rules bug")

    def no_fingerprint():
        raise OSError("lspci missing")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = train(model, opt, 6)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monkeypatch.setattr(summary_mod, "advice_line", broken)
    monkeypatch.setattr(fingerprint, "hardware_fingerprint", no_fingerprint)
    with caplog.at_level(logging.WARNING), gpuopt.track(model, opt, interval_s=0.05,
                                                        print_summary=False) as t:
        losses = train(model, opt, 6)
    assert losses == expected
    assert t.summary.total_steps == 6 and t.summary.advice is None
    run = mlflow.get_run(t.run_id)
    assert run.data.metrics["gpuopt/summary/steps"] == 6
    profile = mlflow.artifacts.load_dict(f"runs:/{t.run_id}/gpuopt/profile.json")
    hw = profile["hardware"]
    assert hw["device"] == "cpu" and hw["world_size"] == 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("could not evaluate the advice rules: rules bug" in m for m in said) == 1
    assert sum("hardware fingerprint failed: lspci missing" in m for m in said) == 1
