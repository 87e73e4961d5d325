"""One recommendation, one document: ``recommend --json``, the logged
``gpuopt/recommendation.json``, the HTML report and the printed table of one run agree.

A real example trains for a few steps into a sqlite MLflow store; ``recommend`` runs on it
in-process, once logged (``--json`` with ``--emit``), once not (the table).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt

REPO = Path(__file__).resolve().parents[2]
#: What only the end of the command knows: the run logged, its child runs, the artefact.
RUN_TIME_KEYS = ("mlflow_run_id", "emitted")


@pytest.fixture(scope="module")
def tracked(tiny_gpt_run, tmp_path_factory):
    """(tracking URI, run id) of a tracked CPU run of examples/train_tiny_gpt.py."""
    uri = tiny_gpt_run.store_in(tmp_path_factory.mktemp("document"))
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("gpuopt-examples")
    return uri, client.search_runs([exp.experiment_id])[0].info.run_id


def _rows(doc):
    return [*doc["candidates"], *doc["pareto"],
            *(doc[k] for k in ("winner", "fastest", "cheapest") if doc[k])]


def _html_rows(page: str, table_id: str) -> list[list[str]]:
    import html

    table = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S).group(1)
    return [[html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr)]
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)][1:]


def test_json_output_and_logged_artifact_are_one_document(tracked, tmp_path, monkeypatch):
    uri, run_id = tracked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    res = CliRunner().invoke(gpuopt, [
        "recommend", "--run-id", run_id, "--tokens", "2B", "--deadline", "24h", "--top", "7",
        "--json", "--emit", "torchrun", "--plan", "2", "--out", str(tmp_path / "plan.sh")])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    rec_id = printed["mlflow_run_id"]
    import mlflow

    client = mlflow.MlflowClient(uri)
    local = Path(client.download_artifacts(rec_id, "gpuopt"))
    logged = json.loads((local / "recommendation.json").read_text())

    # The artifact is the printed document without what is known only after it was written.
    expected = copy.deepcopy(printed)
    for key in RUN_TIME_KEYS:
        del expected[key]
    for row in _rows(expected):
        row.pop("plan_run_id", None)
    assert logged == expected
    assert list(printed) == [*logged, *RUN_TIME_KEYS]  # same order, the run's keys last
    assert printed["emitted"]["plan_id"] == f"{rec_id}:2"
    # every ranked row of both names the logged run; the top five have their child runs
    children = {int(c.data.params["rank"]): c.info.run_id for c in client.search_runs(
        [client.get_run(rec_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{rec_id}'")}
    assert len(children) == 5
    for row in _rows(printed):
        assert row["plan_id"] == f"{rec_id}:{row['rank']}"
        assert row.get("plan_run_id") == children.get(row["rank"])
    assert all(r["plan_id"] == f"{rec_id}:{r['rank']}" for r in _rows(logged))
    assert printed["source_run_ids"] == logged["source_run_ids"] == [run_id]

    # The HTML report of the same run shows the same rows, cell for cell.
    from mlflow_gpuopt.report.table import plan_cells

    page = (local / "report.html").read_text()
    assert _html_rows(page, "candidates") == [plan_cells(c) for c in printed["candidates"]]
    assert _html_rows(page, "pareto") == [plan_cells(c) for c in printed["pareto"]]


def test_printed_table_is_the_json_rows(tracked, monkeypatch):
    uri, run_id = tracked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    args = ["recommend", "--run-id", run_id, "--steps", "50k", "--deadline", "2d", "--top",
            "5", "--no-log"]
    as_json = CliRunner().invoke(gpuopt, [*args, "--json"])
    text = CliRunner().invoke(gpuopt, args)
    assert as_json.exit_code == 0 and text.exit_code == 0, as_json.output + text.output
    doc = json.loads(as_json.stdout)
    lines = text.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#  "))
    table = lines[start + 2:start + 2 + len(doc["candidates"])]
    cells = [[c.strip() for c in re.split(r"\s{2,}", line.strip())] for line in table]
    from mlflow_gpuopt.report.table import plan_cells

    assert cells == [plan_cells(c) for c in doc["candidates"]]
    for note in doc["notes"]:
        if not note.startswith("searched "):  # the search's own timing differs per run
            assert f"Note: {note}" in lines
    assert f"Plan ids: the rank (not logged), e.g. #1 = {doc['candidates'][0]['plan_id']}; " \
           "launch one with --emit torchrun|skypilot --plan K" in lines
