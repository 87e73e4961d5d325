"""The CLI layer predict, recommend and compare share: training-target flags checked (with the
flags' names) before anything is read, the catalog and GPU names as one-line errors, and the
hardware of the GPUs the runs measured."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from mlflow_gpuopt.catalog import UnknownGpuError, load_catalog
from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.cli._errors import UsageError
from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt.cli.options import (
    TrainingTarget,
    load_catalog_or_fail,
    parse_target,
    resolve_gpu_or_fail,
)
from mlflow_gpuopt.hardware import measured_hardware
from mlflow_gpuopt.perfmodel import Observation

NONE = {"samples": None, "epochs": None, "dataset_size": None, "tokens": None, "steps": None}


def _target(required=True, **flags):
    return parse_target(**{**NONE, **flags}, required=required)


@pytest.mark.parametrize(("flags", "message"), [
    ({}, "give exactly one target: --samples N, --epochs E --dataset-size N, --tokens T or "
         "--steps S (got none)"),
    ({"samples": "1M", "steps": "10"}, "(got --samples, --steps)"),
    ({"dataset_size": "1M"}, "--dataset-size goes with --epochs"),
    ({"epochs": "3"}, "--epochs needs --dataset-size"),
    ({"samples": "lots"}, "cannot read --samples 'lots'"),
    ({"epochs": "0", "dataset_size": "1M"}, "--epochs must be a positive number"),
])
def test_bad_target_flags_name_the_flags(flags, message):
    # the flag checks raise UsageError, the quantity parser an InputError: both are one
    # line and exit 2 through the CLI group
    with pytest.raises((UsageError, InputError)) as info:
        _target(**flags)
    err = info.value
    assert message in (err.format_message() if isinstance(err, UsageError) else str(err))


def test_targets_parse_into_counts_and_descriptions():
    assert _target(required=False) is None
    t = _target(epochs="90", dataset_size="1.2M")
    assert (t.epochs, t.dataset_size, t.samples) == (90, 1.2e6, None)
    assert t.description == "90 epochs × 1.2M samples"
    assert t.total_samples(tokens_per_sample=None, samples_per_step=None) == 90 * 1.2e6
    steps = _target(steps="1k")
    assert steps.total_samples(tokens_per_sample=None, samples_per_step=512) == 512_000
    tokens = _target(tokens="2B")
    assert tokens.total_samples(tokens_per_sample=1024, samples_per_step=None) == 2e9 / 1024


def test_what_only_the_workload_can_answer_is_checked_with_it():
    with pytest.raises(InputError, match="--tokens needs a workload with tokens_per_sample"):
        TrainingTarget(tokens=2e9).total_samples(tokens_per_sample=None, samples_per_step=8)
    # The model's own message, unchanged: --steps without a global batch.
    with pytest.raises(InputError, match="a target in steps needs the global batch"):
        TrainingTarget(steps=10).total_samples(tokens_per_sample=None, samples_per_step=None)


def test_predict_and_recommend_say_the_same_line_for_the_same_bad_target(tmp_path):
    flags = ["--samples", "1M", "--steps", "10"]
    runner = CliRunner()
    pred = runner.invoke(gpuopt, ["predict", "--workload", str(tmp_path / "w.json"), "--gpu",
                                  "H100", "--gpus", "8", *flags])
    rec = runner.invoke(gpuopt, ["recommend", "--run-id", "0" * 32, *flags])
    assert pred.exit_code == rec.exit_code == 2
    assert pred.stderr == rec.stderr
    assert pred.stderr.startswith("Error: give exactly one target")


def test_catalog_and_gpu_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPT_CACHE_DIR", str(tmp_path))
    catalog = load_catalog_or_fail()
    assert resolve_gpu_or_fail(catalog, "NVIDIA H100 80GB HBM3") == "H100-SXM5-80GB"
    with pytest.raises(UsageError, match="unknown GPU 'Voodoo 5'"):
        resolve_gpu_or_fail(catalog, "Voodoo 5")
    bad = tmp_path / "catalog-v1" / "aws.csv"
    bad.parent.mkdir()
    bad.write_text("provider,instance_type\naws,p5\n")
    with pytest.raises(UsageError, match=r"^cannot load the price catalog: .*aws\.csv"):
        load_catalog_or_fail()


def test_measured_hardware_uses_the_largest_node_measured_per_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPT_CACHE_DIR", str(tmp_path))
    catalog = load_catalog(use_user_cache=False)
    runs = [Observation("NVIDIA A100-SXM4-80GB", 1, 100.0),
            Observation("NVIDIA A100-SXM4-80GB", 16, 1400.0, nodes=2),
            Observation("cpu", 1, 3.0)]
    hardware = measured_hardware(runs, catalog)
    assert set(hardware) == {"NVIDIA A100-SXM4-80GB"}  # keyed as the runs name it; no CPU
    hw = hardware["NVIDIA A100-SXM4-80GB"]
    assert (hw.gpu, hw.gpus_per_node) == ("A100-80GB-SXM4", 8)
    with pytest.raises(UnknownGpuError):
        measured_hardware([Observation("Voodoo 5", 1, 1.0)], catalog)


_FREEZE_COUNTS: list[int] = []


@click.command("freeze-probe")
def _freeze_probe() -> None:
    import gc

    _FREEZE_COUNTS.append(gc.get_freeze_count())


def test_a_command_freezes_the_collector_only_while_it_runs(monkeypatch):
    """The group freezes what MLflow's import left (so full collections skip it) and thaws it
    when the command ends: a process that stays, like this one, collects all of it again."""
    import gc

    from mlflow_gpuopt import cli

    monkeypatch.setitem(cli._SUBCOMMANDS, "freeze-probe", f"{__name__}:_freeze_probe")
    _FREEZE_COUNTS.clear()
    result = CliRunner().invoke(gpuopt, ["freeze-probe"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert _FREEZE_COUNTS and _FREEZE_COUNTS[0] > 1000  # frozen during the command
    assert gc.get_freeze_count() == 0
