"""A self-contained HTML report of a recommendation (inline CSS, charts as base64 PNGs).

One file, no scripts, no external fetches, so it renders the same in MLflow's artifact viewer
(a sandboxed iframe), in a browser from disk and in an email.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from typing import Any

from mlflow_gpuopt.recommend.explain import hours_figure, money
from mlflow_gpuopt.recommend.ranking import DOMINATED_REASON
from mlflow_gpuopt.report.table import PLAN_COLUMNS, plan_cells

_CSS = """
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:16px;
color:#1f2328;font-size:14px;line-height:1.45}
h1{font-size:20px;margin:0 0 6px}
h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #d0d7de}
.target{color:#57606a;margin-bottom:10px}
.verdict{padding:10px 12px;border-radius:6px;margin:10px 0}
.ok{background:#dafbe1;border:1px solid #4ac26b}.miss{background:#fff8c5;border:1px solid #d4a72c}
table{border-collapse:collapse;font-size:12.5px;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 6px;text-align:right;white-space:nowrap}
th{background:#f6f8fa}td.l,th.l{text-align:left}
tr.win td{background:#fff5b1;font-weight:600}tr.nomeet td{color:#8c959f}
code{font-family:SFMono-Regular,Consolas,monospace;font-size:12px;background:#f6f8fa;
padding:6px;display:block;white-space:pre-wrap;word-break:break-all}
.charts img{max-width:100%;height:auto;border:1px solid #d0d7de;margin:4px 0}
ul{margin:4px 0 4px 18px;padding:0}.small{color:#57606a;font-size:12px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _row(c: Mapping[str, Any], winner_rank: int | None) -> str:
    cls = "win" if c["rank"] == winner_rank else ("" if c["meets_deadline"] else "nomeet")
    tds = "".join(f'<td class="{"l" if col.left else ""}">{_e(text)}</td>'
                  for col, text in zip(PLAN_COLUMNS, plan_cells(c), strict=True))
    return f'<tr class="{cls}" title="{_e(c.get("why", ""))}">{tds}</tr>'


def _table(rows: list[Mapping[str, Any]], winner_rank: int | None, table_id: str) -> str:
    head = "".join(f'<th class="{"l" if col.left else ""}">{_e(col.header)}</th>'
                   for col in PLAN_COLUMNS)
    body = "".join(_row(c, winner_rank) for c in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _advice_section(advice: Mapping[str, Any] | None) -> str:
    """The run's top advice findings (``mlflow gpuopt advise``), priced on the winner."""
    if not advice or not advice.get("findings"):
        return ""
    items = []
    for f in advice["findings"][:5]:
        worth = (f"saves {hours_figure(f['hours_saved'])} h, {money(f['usd_saved'])}"
                 if f.get("usd_saved") is not None else "not priced")
        ev = "; ".join(e["text"] for e in f["evidence"][:2])
        items.append(f"<li><b>{_e(f['title'])}</b> ({_e(worth)}): {_e(ev)}"
                     f"<code>{_e(f['fix'])}</code></li>")
    return ("<h2>Advice: what to change in the script</h2><ol id='advice'>" + "".join(items)
            + "</ol><p class='small'>Each saving is the plan predicted with and without the "
              "fix; all findings: <code>mlflow gpuopt advise --run-id ...</code></p>")


def render_html(doc: Mapping[str, Any], charts: Mapping[str, bytes], *,
                title: str = "GPU recommendation", source: str = "") -> str:
    """The report for ``doc`` (``recommend.recommendation_dict``) with PNG ``charts``."""
    t = doc["target"]
    from mlflow_gpuopt.recommend.explain import hours_text

    deadline = hours_text(t["deadline_hours"]) if t.get("deadline_hours") else "none"
    winner = doc.get("winner")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<div class='target'>Target: {_e(t.get('description') or '')} "
        f"({t['total_samples']:,.0f} samples), deadline {_e(deadline)}, confidence "
        f"{t['confidence']:.0%}. {_e(source)}</div>",
    ]
    if winner:
        parts.append("<div class='verdict ok' id='verdict'>")
        parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in doc["explanation"]
                                      if not line.startswith("Launch:")) + "</ul>")
        parts.append(f"<b>Launch</b><code id='launch'>{_e(winner['launch'])}</code></div>")
    else:
        parts.append("<div class='verdict miss' id='verdict'>"
                     + "".join(f"<p>{_e(n)}</p>" for n in doc["notes"][:-1] or doc["notes"])
                     + "</div>")
        for label in ("fastest", "cheapest"):
            c = doc.get(label)
            if c:
                parts.append(f"<p><b>{label.title()}</b>: {_e(c['provider'])} "
                             f"{_e(c['instance_type'])} × {c['nodes']}, "
                             f"{hours_figure(c['predicted_hours'])} h, "
                             f"{money(c['predicted_cost_usd'])}"
                             f"<code>{_e(c['launch'])}</code></p>")
    parts.append("<h2>Ranked plans</h2>")
    parts.append(_table(doc["candidates"], winner["rank"] if winner else None, "candidates"))
    hidden = sum(v for k, v in (doc.get("dropped") or {}).items()
                 if k == DOMINATED_REASON)
    parts.append(f"<p class='small'>{len(doc['candidates'])} of {doc['feasible']} ranked plans "
                 f"shown (offer × shape × pricing, from {doc['searched']} model evaluations"
                 + (f"; {hidden} more hidden: a cheaper plan on the same provider, GPU and "
                    "pricing is as fast" if hidden else "") + "); "
                 "greyed rows do not meet the deadline at the asked confidence. "
                 "Hours include start-up and expected restarts; cost includes billing "
                 "increments and minimums.</p>")
    parts.append(_advice_section(doc.get("advice")))
    parts.append("<h2>Charts</h2><div class='charts'>")
    for name, png in charts.items():
        b64 = base64.b64encode(png).decode("ascii")
        parts.append(f"<img id='chart-{_e(name)}' alt='{_e(name)} chart' "
                     f"src='data:image/png;base64,{b64}'>")
    parts.append("</div><h2>Cost-vs-time frontier (Pareto set)</h2>")
    parts.append(_table(doc["pareto"], winner["rank"] if winner else None, "pareto"))
    if doc.get("dropped"):
        parts.append("<h2>Dropped</h2><ul>" + "".join(
            f"<li>{_e(k)}: {v}</li>" for k, v in sorted(doc["dropped"].items())) + "</ul>")
    parts.append("<p class='small'>" + " ".join(_e(n) for n in doc["notes"][-1:]) + "</p>")
    parts.append("</body></html>")
    return "".join(parts)
