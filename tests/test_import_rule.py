"""The import rule: only the MLflow edge imports ``mlflow``.

Every module of the package is parsed with ``ast`` (no import is executed); any ``import
mlflow``/``from mlflow... import`` — at module level or inside a function — outside
``mlflow_io/``, ``cli/``, ``plugin.py`` and ``_mlflow_cli_hook.py`` fails the test, naming the
file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mlflow_gpuopt

PACKAGE = Path(mlflow_gpuopt.__file__).resolve().parent
ALLOWED = ("mlflow_io/", "cli/", "plugin.py", "_mlflow_cli_hook.py")


def _mlflow_imports(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_the_mlflow_edge_imports_mlflow():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50  # the whole package was walked
    offenders = []
    allowed_seen = 0
    for path in modules:
        rel = path.relative_to(PACKAGE).as_posix()
        lines = _mlflow_imports(path)
        if rel.startswith(ALLOWED):
            allowed_seen += bool(lines)
            continue
        offenders += [f"{rel}:{n}" for n in lines]
    assert not offenders, "mlflow imported outside the MLflow edge: " + ", ".join(offenders)
    assert allowed_seen >= 3  # the edge itself does import it (the check looks at the right thing)


def test_the_checker_sees_function_level_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\n\ndef f():\n    from mlflow.tracking import MlflowClient\n"
                   "    import mlflow\n    from mlflow_gpuopt import contract\n")
    assert _mlflow_imports(src) == [4, 5]


#: The package's layers, lowest first: a module imports only its own layer or lower ones, so
#: the pure model never reaches for I/O and the MLflow edge never for the tracker.
LAYERS = (
    # names and checks
    ("contract.py", "redact.py", "validation.py", "quantities.py", "bounded_read.py"),
    ("devices", "catalog"),  # readings; prices and GPU specs
    ("perfmodel",),  # pure scaling models
    ("hardware.py", "workload_files.py", "hf_config.py", "recommend"),  # model inputs; search
    ("advice", "launch", "report"),  # pure rules; launch artefacts; charts and HTML
    ("mlflow_io",),  # the MLflow edge
    ("tracking",),  # track(): measures, writes through mlflow_io
    ("integrations", "cli", "plugin.py", "_mlflow_cli_hook.py", "__main__.py", "__init__.py",
     "testing.py", "py.typed"),  # entry points
)
#: Imports that go up a layer, each for a stated reason (module, imported layer).
UPWARD_ALLOWED = {
    # skypilot_time_estimator(run_id=...) is a public convenience that reads the run; the
    # read is a lazy call into the MLflow edge, the estimator itself is pure
    ("launch/estimator.py", "mlflow_io"),
}


def _layer_of(rel: str) -> str:
    top = rel.split("/", 1)[0]
    return top if "/" in rel else rel


def _package_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level part of the package) of every ``mlflow_gpuopt`` import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "mlflow_gpuopt":
            parts = node.module.split(".")
            targets = ([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".")[1] for a in node.names
                       if a.name.startswith("mlflow_gpuopt.")]
        else:
            continue
        for t in targets:
            out.append((node.lineno, t if (PACKAGE / t).is_dir() else f"{t}.py"))
    return out


def test_layers_import_only_downwards():
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    offenders, seen = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        src = _layer_of(rel)
        assert src in rank, f"{rel}: add {src!r} to LAYERS"
        for line, target in _package_imports(path):
            assert target in rank, f"{rel}:{line} imports {target!r}: add it to LAYERS"
            seen += 1
            if rank[target] > rank[src] and (rel, target.removesuffix(".py")) \
                    not in UPWARD_ALLOWED and (rel, target) not in UPWARD_ALLOWED:
                offenders.append(f"{rel}:{line} -> {target}")
    assert seen > 100  # the package's own imports were read
    assert not offenders, "imports that go up a layer: " + ", ".join(offenders)
