"""Run ``tests/support/skypilot_check.py`` under an interpreter that has SkyPilot, offline.

That interpreter is the tests' own when ``mlflow-gpuopt[skypilot]`` is installed, else
``$GPUOPT_SKYPILOT_PYTHON``; without either the calling test is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parent / "skypilot_check.py"


def skypilot_python() -> str:
    """The interpreter with SkyPilot (skips the test when there is none)."""
    if importlib.util.find_spec("sky") is not None:
        return sys.executable
    other = os.environ.get("GPUOPT_SKYPILOT_PYTHON")
    if other and Path(other).exists():
        return other
    pytest.skip("SkyPilot is not installed (pip install 'mlflow-gpuopt[skypilot]', or set "
                "GPUOPT_SKYPILOT_PYTHON to an interpreter that has it)")


def _offline() -> list[str]:
    """``unshare -rn``: run without a network where the kernel allows it (proves offline)."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0:
        return [unshare, "-rn"]
    return []


def skypilot_check(*args: str, stdin: str = "") -> dict:
    """Run skypilot_check.py with ``args`` under SkyPilot's interpreter; its JSON answer."""
    out = subprocess.run([*_offline(), skypilot_python(), str(CHECK), *args],
                         input=stdin, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
