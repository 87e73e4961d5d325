"""How every bad input of the fault suite ends: the figures the README's reliability section
quotes ("N bad inputs tried: N one line + exit 2").

Runs each invocation of ``tests/cli/test_bad_input.py`` (``CASES``: those that used to traceback or
pass silently; ``HELD``: those that already ended in one line) through the real CLI against a
fresh sqlite MLflow store, and prints one row per input (exit code, traceback or not, stderr
lines, runs written) and the counts by outcome.

Run: ``python benchmarks/bench_bad_input.py`` (about 30 s on one core, CPU only).
"""

from __future__ import annotations

import collections
import importlib.util
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _suite():
    spec = importlib.util.spec_from_file_location("test_bad_input",
                                                  REPO / "tests" / "cli" / "test_bad_input.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


class _Factory:
    """The one method of pytest's tmp_path_factory the store fixture uses."""

    def __init__(self, root: str):
        self.root = Path(root)

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path


def main() -> int:
    from click.testing import CliRunner

    suite = _suite()
    with tempfile.TemporaryDirectory(prefix="gpuopt-bad-input-") as tmp:
        store = suite.store.__wrapped__(_Factory(tmp))
        ends: collections.Counter[str] = collections.Counter()
        for group, cases in (("CASES", suite.CASES), ("HELD", suite.HELD)):
            for case_id, args, _ in cases:
                before = store.run_count()
                r = CliRunner().invoke(suite.gpuopt, suite._argv(store, args),
                                       env=suite._env(store))
                crashed = r.exception is not None and not isinstance(r.exception, SystemExit)
                lines = [line for line in r.stderr.splitlines() if line.strip()]
                written = store.run_count() - before
                if crashed:
                    end = f"exit {r.exit_code}, traceback ({type(r.exception).__name__})"
                elif r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error:"):
                    end = "one line, exit 2"
                else:
                    end = f"exit {r.exit_code}, {len(lines)} stderr line(s)"
                if written:
                    end += f", {written} run(s) written"
                ends[end] += 1
                print(f"{group:5s}  {case_id:42s}  {end}")
    total = sum(ends.values())
    print(f"\n{total} bad inputs tried:")
    for end, n in ends.most_common():
        print(f"  {n:3d}  {end}")
    return 0 if ends.get("one line, exit 2") == total else 1


if __name__ == "__main__":
    sys.exit(main())
