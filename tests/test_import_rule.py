"""The import rule: only the MLflow edge imports ``mlflow``, layers import downwards, no
module imports itself back, and ``tracking/distributed/`` imports none of the tracker.

Every module of the package is parsed with ``ast`` (no import is executed). Any ``import
mlflow``/``from mlflow... import`` — at module level or inside a function — outside
``mlflow_io/``, ``plugin.py`` and ``_mlflow_cli_hook.py`` fails, naming the file and line.
Imports inside functions count everywhere: the package imports lazily for start-up speed, and
a lazy import is a dependency all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mlflow_gpuopt

PACKAGE = Path(mlflow_gpuopt.__file__).resolve().parent
ALLOWED = ("mlflow_io/", "plugin.py", "_mlflow_cli_hook.py")


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
    ("contract.py", "errors.py", "redact.py", "validation.py", "quantities.py",
     "bounded_read.py", "atomic_write.py", "file_lock.py"),
    ("devices", "catalog"),  # readings; prices and GPU specs
    ("perfmodel",),  # pure scaling models
    ("hardware.py", "workload_files.py", "hf_config.py", "recommend"),  # model inputs; search
    ("advice", "launch", "report"),  # pure rules; launch artefacts; charts and HTML
    ("mlflow_io",),  # the MLflow edge
    ("planning",),  # use cases: read, fit, search, advise, log, emit
    ("tracking",),  # track(): measures, writes through mlflow_io
    ("integrations", "cli", "plugin.py", "_mlflow_cli_hook.py", "__main__.py", "__init__.py",
     "testing.py", "py.typed"),  # entry points
)
#: Imports that go up a layer, each for a stated reason (module, imported layer).
UPWARD_ALLOWED = {
    # skypilot_time_estimator(run_id=...) is a public convenience that reads and fits the
    # run as every command does; a lazy call into the use-case layer, the estimator itself
    # is pure
    ("launch/estimator.py", "planning"),
    # the second import path of Lightning's callback that docs/tracking.md gives; a
    # re-export of the integration, nothing in tracking/ uses it
    ("tracking/lightning.py", "integrations"),
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


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_edges(path: Path, name: str, modules: set[str]) -> dict[str, int]:
    """``{imported package module: first line}`` of every import in ``path`` (module
    ``name``), module-level and inside functions alike; ``from pkg import sub`` names the
    submodule ``pkg.sub``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base not in modules:
                continue
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            targets = subs + ([base] if len(subs) < len(node.names) else [])
        else:
            continue
        for t in targets:
            if t != name:
                out.setdefault(t, node.lineno)
    return out


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each import cycle of ``graph`` once, as the modules along it (Tarjan's strongly
    connected components, then one path round each component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for comp in components:
        members, start = set(comp), min(comp)
        path, seen = [start], {start}
        while True:  # walk inside the component until it closes
            nxt = sorted(w for w in graph[path[-1]] if w in members)
            back = [w for w in nxt if w == start]
            if back and len(path) > 1:
                break
            fresh = [w for w in nxt if w not in seen]
            if not fresh:
                break
            path.append(fresh[0])
            seen.add(fresh[0])
        out.append(path + [start])
    return out


def _import_graph(root: Path) -> dict[str, dict[str, int]]:
    names = {p: _module_name(p, root) for p in sorted(root.rglob("*.py"))}
    modules = set(names.values())
    return {name: _module_edges(p, name, modules) for p, name in names.items()}


def test_no_module_imports_itself_back():
    graph = _import_graph(PACKAGE)
    assert sum(len(e) for e in graph.values()) > 300  # lazy imports included
    cycles = _cycles(graph)
    assert not cycles, "import cycles (a module reaching itself through others): " + "; ".join(
        " -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_same_layer_and_lazy_cycles(tmp_path):
    pkg = tmp_path / "mlflow_gpuopt"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "cli" / "a.py").write_text("from mlflow_gpuopt.cli import b\n")
    (pkg / "cli" / "b.py").write_text("def f():\n    from mlflow_gpuopt.cli.c import g\n")
    (pkg / "cli" / "c.py").write_text("def g():\n    from . import a\n")
    (pkg / "cli" / "d.py").write_text("from mlflow_gpuopt.cli import a\n")  # no cycle
    cycles = _cycles(_import_graph(pkg))
    assert cycles == [["mlflow_gpuopt.cli.a", "mlflow_gpuopt.cli.b", "mlflow_gpuopt.cli.c",
                       "mlflow_gpuopt.cli.a"]]


#: What ``tracking/distributed/`` may import from the package besides itself: the layers
#: below ``tracking`` (names, devices). Nothing of the tracker (``tracker.py``,
#: ``reporting.py``, the step clock): the tracker builds each rank's report and hands the job
#: parts plain figures, so the dependency goes one way.
DISTRIBUTED = "tracking/distributed/"


def _distributed_offenders(root: Path) -> list[str]:
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    graph = _import_graph(root)
    prefix = root.name + ".tracking.distributed"
    out = []
    for path in sorted((root / DISTRIBUTED).rglob("*.py")):
        name = _module_name(path, root)
        for target, line in sorted(graph[name].items()):
            if target == prefix or target.startswith(prefix + "."):
                continue
            parts = target.split(".")
            top = parts[1] if len(parts) > 1 else ""
            layer = top if (root / top).is_dir() else f"{top}.py"
            if rank.get(layer, len(LAYERS)) >= rank["tracking"]:
                out.append(f"{path.relative_to(root).as_posix()}:{line} -> {target}")
    return out


def test_distributed_imports_only_itself_and_lower_layers():
    assert len(list((PACKAGE / DISTRIBUTED).glob("*.py"))) >= 5  # the folder was found
    offenders = _distributed_offenders(PACKAGE)
    assert not offenders, ("tracking/distributed/ imports the tracker's modules: "
                           + ", ".join(offenders))


def test_the_distributed_rule_sees_an_import_of_the_tracker(tmp_path):
    pkg = tmp_path / "mlflow_gpuopt"
    (pkg / "tracking" / "distributed").mkdir(parents=True)
    for rel in ("__init__.py", "contract.py", "tracking/__init__.py", "tracking/reporting.py",
                "tracking/distributed/__init__.py", "tracking/distributed/rows.py"):
        (pkg / rel).write_text("")
    (pkg / "tracking" / "distributed" / "job.py").write_text(
        "from mlflow_gpuopt import contract\n"
        "from mlflow_gpuopt.tracking.distributed import rows\n"
        "def f():\n    from mlflow_gpuopt.tracking.reporting import JobReporter\n")
    assert _distributed_offenders(pkg) == [
        "tracking/distributed/job.py:4 -> mlflow_gpuopt.tracking.reporting"]
