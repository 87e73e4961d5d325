"""The price snapshot lives in the repository's ``pricing/`` folder and ships inside the
package (``mlflow_gpuopt/pricing_data/``): a source checkout reads its own folder, a built
wheel holds it as package data, and no top-level ``pricing`` module is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mlflow_gpuopt
from mlflow_gpuopt.catalog import PROVIDERS, load_catalog
from mlflow_gpuopt.catalog.store import shipped_text, snapshot_dir

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_FILES = ("gpus.csv", *(f"{p}.csv" for p in PROVIDERS))
# What setuptools needs to build the wheel; copied so the build writes nothing in the checkout.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "mlflow_gpuopt", "pricing")


def test_a_source_checkout_reads_its_own_pricing_folder():
    if Path(mlflow_gpuopt.__file__).resolve().parents[1] != ROOT:
        pytest.skip("mlflow_gpuopt is imported from an installed copy, not this checkout")
    assert Path(str(snapshot_dir())) == ROOT / "pricing"
    for name in SNAPSHOT_FILES:
        assert shipped_text(name) == (ROOT / "pricing" / name).read_text(encoding="utf-8")
    assert not (ROOT / "pricing" / "__init__.py").exists()  # data, not a module


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    build = ("import sys; from setuptools import build_meta; "
             "print(build_meta.build_wheel(sys.argv[1]))")
    proc = subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / proc.stdout.strip().splitlines()[-1]


def test_the_wheel_ships_the_snapshot_inside_the_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"mlflow_gpuopt"}
    for name in SNAPSHOT_FILES:
        assert f"mlflow_gpuopt/pricing_data/{name}" in names
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["mlflow_gpuopt"]


def test_the_unpacked_wheel_loads_the_catalog_without_a_pricing_module(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import json, importlib.util\n"
        "from mlflow_gpuopt.catalog.store import load_catalog, snapshot_dir\n"
        "cat = load_catalog(use_user_cache=False)\n"
        "print(json.dumps({'dir': str(snapshot_dir()), 'offers': len(cat.offers),\n"
        "                  'gpus': len(cat.gpus),\n"
        "                  'pricing': importlib.util.find_spec('pricing') is not None}))\n")
    # -S: no site-packages (so nothing installed elsewhere, editable or not, is seen).
    env = {**os.environ, "PYTHONPATH": str(site), "GPUOPT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    here = load_catalog(use_user_cache=False)
    assert Path(got["dir"]) == site / "mlflow_gpuopt" / "pricing_data"
    assert (got["offers"], got["gpus"]) == (len(here.offers), len(here.gpus))
    assert got["pricing"] is False
