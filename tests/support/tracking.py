"""What tracking tests read back from a tracked run, and the small training loop they track
(shared by tests/tracking/)."""

from __future__ import annotations

import logging

import mlflow


def logged(run_id: str) -> tuple[dict, dict]:
    """The run's (params, metrics)."""
    run = mlflow.get_run(run_id)
    return run.data.params, run.data.metrics


def params_and_profile(run_id: str) -> tuple[dict, dict]:
    """The run's (params, its gpuopt/profile.json)."""
    params = mlflow.get_run(run_id).data.params
    return params, mlflow.artifacts.load_dict(f"runs:/{run_id}/gpuopt/profile.json")


def samples_per_step(metrics: dict) -> float:
    """Samples per optimizer step, from the steady-state summary."""
    return (metrics["gpuopt/summary/throughput_samples_per_s"]
            / metrics["gpuopt/summary/throughput_steps_per_s"])


def gpuopt_warnings(caplog) -> list[str]:
    """The ``gpuopt:`` warnings the test captured."""
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.getMessage().startswith("gpuopt:")]


def train(model, opt, steps: int) -> list[float]:
    """``steps`` SGD steps of ``model`` (16 inputs) on seeded random batches of 8; the losses."""
    import torch

    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(8, 16, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
