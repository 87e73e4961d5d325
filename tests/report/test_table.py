"""The printed plan table and the HTML report's table are one column definition."""

from __future__ import annotations

import html
import re

from support.recommend import GPUS, OFFERS, RESNET, AnalyticPredictor, hardware_for

from mlflow_gpuopt.recommend import Target, recommend, recommendation_dict
from mlflow_gpuopt.report import render_html
from mlflow_gpuopt.report.table import text_table


def _doc():
    target = Target(total_samples=90 * 1_281_167, deadline_hours=24.0, per_rank_batch=256)
    rec = recommend(AnalyticPredictor(RESNET), RESNET, OFFERS, GPUS, target,
                    hardware_for=hardware_for)
    return recommendation_dict(rec, top=5)


def _html_rows(page: str, table_id: str) -> list[list[str]]:
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S).group(1)
    return [[html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr)]
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)]


def test_the_printed_and_the_html_table_show_the_same_columns_and_cells():
    doc = _doc()
    rows = _html_rows(render_html(doc, {}, title="t", source="s"), "candidates")
    text = text_table(doc["candidates"])
    assert len(text) == 2 + len(doc["candidates"]) == 1 + len(rows)
    for line, cells in zip([text[0], *text[2:]], rows, strict=True):
        # the text line is the same cells, padded: split on the two-space column gap
        assert [c.strip() for c in re.split(r"\s{2,}", line.strip())] == cells
    assert rows[0][:4] == ["#", "provider", "instance × nodes", "GPUs"]
    first = doc["candidates"][0]
    assert rows[1][1] == first["provider"] and rows[1][0] == "1"
    assert rows[1][3] == f'{first["gpus"]} {first["gpu"]}'
