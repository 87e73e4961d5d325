"""The printed answers of ``predict`` and ``recommend``, from their ``--json`` documents
(docs/metrics.md): the lines the CLI echoes. The plan table is :mod:`.table`'s, shared with
the HTML report."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mlflow_gpuopt.recommend.explain import hours_text, money
from mlflow_gpuopt.report.table import text_table


def recommendation_lines(doc: Mapping[str, Any], logged: Any = None) -> list[str]:
    """``recommend``'s printed answer: target, plan table, the winner's explanation (else
    the fastest and the cheapest plan), notes, assumptions, where it was logged (``logged``:
    ``mlflow_io.recommendation.LoggedRecommendation``), the plan ids and the artefact."""
    t = doc["target"]
    deadline = (f"deadline {hours_text(t['deadline_hours'])}" if t["deadline_hours"]
                else "no deadline")
    out = [f"Target: {t['description']} ({t['total_samples']:,.0f} samples), {deadline}, "
           f"confidence {t['confidence']:.0%}"]
    if not doc["candidates"]:
        # the search's note already starts with "no plan fits: "; say it once
        out.append("No plan fits: " + "; ".join(
            n.removeprefix("no plan fits: ") for n in doc["notes"]))
        return out
    out += text_table(doc["candidates"])
    out.append("")
    if doc["winner"]:
        out += doc["explanation"]
    else:
        for label in ("fastest", "cheapest"):
            c = doc[label]
            out.append(f"{label.title()}: {c['provider']} {c['instance_type']} × {c['nodes']}, "
                       f"{hours_text(c['predicted_hours'])}, {money(c['predicted_cost_usd'])}; "
                       f"launch: {c['launch']}")
    out += [f"Note: {note}" for note in doc["notes"]]
    out += [f"Assumed: {assumed}" for assumed in doc.get("model_assumptions") or ()]
    if logged is not None:
        out.append(f"Logged to MLflow run {logged.run_id} (experiment {logged.experiment_id}) "
                   f"with {len(logged.child_run_ids)} candidate runs; open it with "
                   "`mlflow ui` → the source run → its nested recommendation run → "
                   "Artifacts → gpuopt/report.html")
    return out + _plan_lines(doc)


def _plan_lines(doc: Mapping[str, Any]) -> list[str]:
    """The plan-id line and, after ``--emit``, where the artefact is and how to run it."""
    out = []
    cands = doc["candidates"]
    if cands and cands[0].get("plan_id"):
        first = cands[0]["plan_id"]
        scheme = ("<recommendation run>:<rank>" if ":" in first
                  else "the rank (not logged)")
        out.append(f"Plan ids: {scheme}, e.g. #1 = {first}; launch one with "
                   "--emit torchrun|skypilot --plan K")
    e = doc.get("emitted")
    if not e:
        return out
    if e["kind"] == "torchrun":
        how = f"run it on each node: NODE_RANK=<rank> MASTER_ADDR=<node 0> bash {e['path']}"
    else:
        how = f"launch it: sky launch -c gpuopt {e['path']}"
    out.append(f"Wrote the {e['kind']} launch artefact of plan {e['plan_id']} to {e['path']}; "
               f"{how}")
    return out + [f"Note: {note}" for note in e["notes"]]


def _fmt_hours(h: float) -> str:
    from mlflow_gpuopt.quantities import format_hours

    return format_hours(h) if math.isfinite(h) else "unbounded"


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def prediction_text(result: Mapping[str, Any]) -> str:
    """``predict``'s printed answer, from its ``--json`` object (docs/metrics.md)."""
    lines = [
        f"{result['gpus']} x {result['gpu']} ({result['nodes']} node(s)), "
        f"{result['strategy']}, micro-batch {result['micro_batch']} x accumulation "
        f"{result['grad_accum']}, {result['precision']}"
        + (f", recompute {result['recompute']}" if result["recompute"] != "none" else ""),
        f"  throughput   {result['throughput_samples_per_s']:,.1f} samples/s  "
        f"(90% interval {result['low']:,.1f} - {result['high']:,.1f})",
    ]
    if result.get("tokens_per_s"):
        lines.append(f"  tokens       {result['tokens_per_s']:,.0f} tokens/s")
    t = result["time_breakdown"]
    lines.append(f"  step time    {result['step_time_s'] * 1e3:,.2f} ms  (compute "
                 f"{t['compute_s'] * 1e3:,.2f} ms, exposed communication "
                 f"{t['exposed_comm_s'] * 1e3:,.2f} ms, pipeline bubble "
                 f"{t['bubble_s'] * 1e3:,.2f} ms)")
    m = result["memory"]
    fits = ("fits" if result["fits"] else "DOES NOT FIT") + f", P(fits) {result['p_fits']:.0%}"
    lines.append(f"  memory/GPU   {_fmt_bytes(result['memory_per_gpu_bytes'])} of "
                 f"{_fmt_bytes(result['memory_usable_bytes'])} usable ({fits}; weights "
                 f"{_fmt_bytes(m['weights_bytes'])}, gradients {_fmt_bytes(m['gradients_bytes'])}"
                 f", optimizer {_fmt_bytes(m['optimizer_bytes'])}, activations "
                 f"{_fmt_bytes(m['activations_bytes'])}, workspace "
                 f"{_fmt_bytes(m['workspace_bytes'])}"
                 + (f", context-parallel K/V buffers {_fmt_bytes(m['cp_buffers_bytes'])}"
                    if m.get("cp_buffers_bytes") else "") + ")")
    lines.append(f"  largest micro-batch that fits: {result['max_micro_batch']}")
    net = result.get("network")
    if net and result["nodes"] > 1:
        lines.append(f"  network      {net['inter_node_gbps']:,.0f} Gbit/s per node "
                     f"({net['source']})")
    if "time_to_train_hours" in result:
        b = result["time_breakdown_hours"]
        total = result["time_to_train_hours"]
        lines.append(
            f"  time to train {_fmt_hours(total)} for {result['target_samples']:,.0f} samples "
            f"({result['target_steps']:,} steps; 90% interval "
            f"{_fmt_hours(result['time_to_train_hours_low'])} - "
            f"{_fmt_hours(result['time_to_train_hours_high'])})")
        share = (lambda x: 100.0 * x / total) if total > 0 else (lambda x: 0.0)
        lines.append(f"  where it goes compute {b['compute']:,.2f} h ({share(b['compute']):.0f}%), "
                     f"exposed communication {b['exposed_comm']:,.2f} h "
                     f"({share(b['exposed_comm']):.0f}%), pipeline bubble "
                     f"{b['bubble']:,.2f} h ({share(b['bubble']):.0f}%)")
    basis = (f"{result['observations_used']} measurement(s)"
             + ("; extrapolated to this GPU type" if result["extrapolated"] else ""))
    lines.append(f"  based on     {basis}")
    for note in result["assumptions"]:
        lines.append(f"  assumption   {note}")
    top = next((d for d in result.get("defaults", ()) if d["throughput_change"]), None)
    if top is not None:
        lines.append(f"  decided most by  {top['quantity']} ({top['source']}): moved by its "
                     f"own spread (x{math.exp(top['log_spread']):.2f}) it changes throughput "
                     f"{100 * top['throughput_change']:+.0f}%")
    return "\n".join(lines)
