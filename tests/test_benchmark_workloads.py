"""The accuracy benchmarks plan from what a user knows: every key of every workload they read
(``benchmarks/workloads/*.json`` and the files ``bench_llm.py`` writes per published row) is
one docs/metrics.md's workload.json table marks user-supplied (``from`` = card or run), never
a profile-measured one such as ``memory_traffic_bytes_per_sample``."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
METRICS = ROOT / "docs" / "metrics.md"
USER_SUPPLIED = ("card", "run")
#: Keys that describe a workload file rather than the workload; the loader ignores them
#: (docs/metrics.md: "others, such as `schema` ... are ignored").
METADATA = {"schema", "bench"}


def workload_table() -> dict[str, str]:
    """key -> ``from`` of docs/metrics.md's workload.json table."""
    text = METRICS.read_text()
    section = text.split("## workload.json", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| key |"))
    rows = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break  # the first table only: the subsections below have tables of their own
        rows.append(ln)
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header[:2] == ["key", "from"], header
    out = {}
    for line in rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for key in re.findall(r"`([a-z0-9_]+)`", cells[0]):
            out[key] = cells[1]
    return out


def user_keys() -> set[str]:
    return {k for k, src in workload_table().items() if src in USER_SUPPLIED}


@pytest.fixture(scope="module")
def benches():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("bench_llm"), importlib.import_module("bench_accuracy")
    finally:
        sys.path.remove(str(BENCH))


def test_table_marks_every_key_and_profile_figures_are_not_user_supplied():
    table = workload_table()
    assert set(table.values()) <= {"card", "run", "profile"}, table
    for key in ("memory_traffic_bytes_per_sample", "kernels_per_micro_step",
                "activation_bytes_per_sample", "recompute_flops_per_sample"):
        assert table[key] == "profile"
    for key in ("params", "flops_per_sample", "num_layers", "hidden_size", "num_heads",
                "vocab_size", "precision", "micro_batch"):
        assert table[key] in USER_SUPPLIED


def test_every_key_the_loader_reads_is_in_the_table():
    from dataclasses import fields

    from mlflow_gpuopt.perfmodel.types import Workload

    assert {f.name for f in fields(Workload)} <= set(workload_table())


def test_workload_files_hold_only_user_supplied_keys():
    allowed = user_keys()
    paths = sorted((BENCH / "workloads").glob("*.json"))
    assert paths
    for path in paths:
        extra = set(json.loads(path.read_text())) - METADATA - allowed
        assert not extra, f"{path.name} carries {sorted(extra)}"


def test_bench_llm_writes_only_user_supplied_keys(benches):
    bench_llm, _ = benches
    allowed = user_keys()
    rows, _ = bench_llm.load_rows()
    assert len(rows) > 20
    # and the unscored pairs of --derive-transfer-width
    pairs = [r for pair in bench_llm.dgxc_rows() for r in pair]
    assert {r.precision for r in pairs} == {"bf16", "fp8"}
    for row in rows + pairs:
        extra = set(bench_llm.workload_doc(row)) - allowed
        assert not extra, f"{row.source} {row.model}: {sorted(extra)}"


def test_bench_accuracy_reads_only_user_supplied_keys(benches):
    _, bench_accuracy = benches
    allowed = user_keys()
    docs = bench_accuracy.workload_docs()
    assert docs
    for name, doc in docs.items():
        assert not set(doc) - allowed, f"{name}: {sorted(set(doc) - allowed)}"


def test_a_profile_key_in_a_workload_is_caught():
    # The check itself must be able to fail: the key the hidden benchmark knob used.
    doc = {"params": 1, "flops_per_sample": 1.0, "precision": "bf16",
           "memory_traffic_bytes_per_sample": 1e9}
    assert set(doc) - user_keys() == {"memory_traffic_bytes_per_sample"}


def test_bench_llm_observations_carry_the_measured_schedule(benches):
    # A measured run's layout as the observations CSV gives it must be the published one:
    # an interleaved run (vp > 1) read as plain 1F1B has a v-fold bubble the run did not.
    import csv
    import io

    from mlflow_gpuopt.perfmodel.layout import resolve_layout
    from mlflow_gpuopt.perfmodel.types import ParallelConfig
    from mlflow_gpuopt.workload_files import OBSERVATION_COLUMNS, parse_observations_csv

    bench_llm, _ = benches
    rows = [r for r in bench_llm.load_rows()[0] if r.pp > 1]
    assert any(r.vp > 1 for r in rows) and any(r.vp == 1 for r in rows)
    for row in rows:
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(OBSERVATION_COLUMNS)
        writer.writerow(bench_llm.observation_line(row))
        (obs,) = parse_observations_csv(text.getvalue(), resolve_gpu=lambda name: name)
        nodes = int(obs.nodes)
        layout = resolve_layout(ParallelConfig(
            gpus_per_node=obs.gpu_count // nodes, nodes=nodes, strategy=obs.strategy,
            micro_batch=row.micro_batch))
        assert (layout.tp, layout.pp, layout.vp, layout.cp) == (row.tp, row.pp, row.vp,
                                                                 row.cp), (row, obs.strategy)


def test_llm_moe_observations_carry_the_measured_schedule(benches):
    import csv
    import io

    from mlflow_gpuopt.perfmodel.layout import resolve_layout
    from mlflow_gpuopt.perfmodel.types import ParallelConfig
    from mlflow_gpuopt.workload_files import OBSERVATION_COLUMNS, parse_observations_csv

    llm_moe = importlib.import_module("llm_moe")
    rows = [r for r in llm_moe.load_moe_rows() if r.pp > 1 and r.skip_reason() is None]
    assert any(r.vp > 1 for r in rows)
    assert {r.dispatcher for r in rows} == {"alltoall", "flex"}
    for row in rows:
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(OBSERVATION_COLUMNS)
        writer.writerow(llm_moe.observation_line(row))
        (obs,) = parse_observations_csv(text.getvalue(), resolve_gpu=lambda name: name)
        layout = resolve_layout(ParallelConfig(
            gpus_per_node=obs.gpu_count // int(obs.nodes), nodes=int(obs.nodes),
            strategy=obs.strategy, micro_batch=row.micro_batch))
        assert (layout.tp, layout.pp, layout.vp, layout.ep) == (row.tp, row.pp, row.vp,
                                                                 row.ep), (row, obs.strategy)
        # the run's own dispatcher and routing, not the target's
        assert (obs.moe_dispatcher, obs.moe_routing) == (row.dispatcher, row.gate)
        assert obs.expert_tensor_parallel == row.expert_tp
