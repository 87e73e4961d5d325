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
