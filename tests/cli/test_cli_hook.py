"""``mlflow gpuopt …`` through MLflow's own command, and the hook's defences."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mlflow_gpuopt import _mlflow_cli_hook

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)


def test_real_mlflow_command_has_gpuopt():
    out = _run(str(BIN / "mlflow"), "gpuopt", "--help")
    assert out.returncode == 0, out.stderr
    assert "recommend" in out.stdout and "compare" in out.stdout
    assert "Usage: mlflow gpuopt" in out.stdout


def test_mlflow_itself_still_works_and_lists_gpuopt():
    out = _run(str(BIN / "mlflow"), "--help")
    assert out.returncode == 0, out.stderr
    assert "server" in out.stdout and "gpuopt" in out.stdout


def test_recommend_help_through_mlflow():
    out = _run(str(BIN / "mlflow"), "gpuopt", "recommend", "--help")
    assert out.returncode == 0, out.stderr
    for flag in ("--run-id", "--experiment", "--samples", "--deadline", "--provider",
                 "--spot / --no-spot", "--max-gpus", "--confidence", "--top", "--json",
                 "--no-log"):
        assert flag in out.stdout


@pytest.mark.parametrize("argv", [
    [str(BIN / "mlflow-gpuopt"), "--help"],
    [sys.executable, "-m", "mlflow_gpuopt", "--help"],
])
def test_supported_spellings(argv):
    out = _run(*argv)
    assert out.returncode == 0, out.stderr
    assert "recommend" in out.stdout


def test_install_is_cheap_it_imports_neither_click_nor_mlflow_cli():
    code = ("import sys; from mlflow_gpuopt import _mlflow_cli_hook as h; h.install(); "
            "print('click' in sys.modules, 'mlflow.cli' in sys.modules)")
    out = _run(sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_a_broken_gpuopt_package_leaves_mlflow_working():
    # Make `from mlflow_gpuopt.cli import gpuopt` fail inside the hook.
    code = ("import sys; sys.modules['mlflow_gpuopt.cli'] = None; "
            "from mlflow.cli import cli; from click.testing import CliRunner; "
            "r = CliRunner().invoke(cli, ['--help']); "
            "print(r.exit_code, 'server' in r.output, 'gpuopt' in cli.commands)")
    out = _run(sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "True", "False"]


def test_attach_refuses_modules_without_a_click_group():
    assert _mlflow_cli_hook.attach(types.ModuleType("mlflow.cli")) is False
    fake = types.ModuleType("mlflow.cli")
    fake.cli = object()
    assert _mlflow_cli_hook.attach(fake) is False


def test_attach_is_idempotent_on_a_click_group():
    import click

    @click.group()
    def cli():
        pass

    fake = types.ModuleType("mlflow.cli")
    fake.cli = cli
    assert _mlflow_cli_hook.attach(fake) and _mlflow_cli_hook.attach(fake)
    assert list(cli.commands) == ["gpuopt"]


def test_install_attaches_at_once_when_mlflow_cli_is_loaded():
    import mlflow.cli

    mlflow.cli.cli.commands.pop("gpuopt", None)
    _mlflow_cli_hook.install()
    assert "gpuopt" in mlflow.cli.cli.commands


@pytest.mark.parametrize("argv", [
    ["recommend", "--run-id", "x", "--samples", "1M", "--provider", "nope"],
    ["recommend", "--run-id", "x", "--max-gpus", "0"],
    ["recommend", "--confidence", "1.5"],
    ["recommend", "--bogus"],
    ["replay", str(Path(__file__).parent)],
    ["no-such-command"],
])
@pytest.mark.parametrize("prog", ["mlflow-gpuopt", "mlflow"])
def test_click_usage_errors_are_one_line_exit_2(prog, argv):
    cmd = [str(BIN / "mlflow-gpuopt")] if prog == "mlflow-gpuopt" else [str(BIN / "mlflow"),
                                                                        "gpuopt"]
    out = _run(*cmd, *argv)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out.stderr


@pytest.mark.parametrize(("argv", "named"), [
    (["--bogus"], "--bogus"),
    (["--bogus", "recommend"], "--bogus"),
    (["bogus-command"], "bogus-command"),
])
@pytest.mark.parametrize("prog", [
    [str(BIN / "mlflow-gpuopt")],
    [sys.executable, "-m", "mlflow_gpuopt"],
    [str(BIN / "mlflow"), "gpuopt"],
], ids=["console-script", "python-m", "mlflow"])
def test_group_level_usage_errors_are_one_line_exit_2(prog, argv, named):
    """An unknown option of the group itself (click fails it while parsing, before any
    subcommand) or an unknown command: one line naming it, no usage block, exit 2."""
    out = _run(*prog, *argv)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("Error: ") and f"'{named}'" in lines[0], out.stderr
