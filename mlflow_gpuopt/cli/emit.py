"""``recommend --emit {torchrun,skypilot} [--plan K] [--out PATH]``: the file-writing edge.

The artefact's text comes from :mod:`mlflow_gpuopt.launch` (pure); here the options are
checked before anything is read or logged, the plan ids are added to the result, the
training script and experiment are read from the measured run, and the file is written
atomically. An existing file is never replaced unless ``--force`` is given; a failed write
leaves nothing behind (neither a partial file nor a temporary one).

Plan ids: ``<recommendation_run_id>:<rank>`` when the recommendation is logged to MLflow,
the bare rank (``"3"``) under ``--no-log`` (it names a row of the printed result only).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mlflow_gpuopt.cli._errors import UsageError

EMIT_CHOICES = ("torchrun", "skypilot")
_DEFAULT_NAMES = {"torchrun": "gpuopt-plan{rank}-torchrun.sh",
                  "skypilot": "gpuopt-plan{rank}-skypilot.yaml"}
#: Names MLflow records as ``mlflow.source.name`` that are not a script one can relaunch.
_NOT_A_SCRIPT = ("ipykernel_launcher.py",)


@dataclass(frozen=True)
class EmitRequest:
    """What ``--emit`` asked for, checked: the artefact kind, the plan's rank, the path."""

    kind: str
    rank: int
    out: Path
    force: bool
    script: str | None
    #: ``--plan <recommendation_run_id>:<rank>``: that logged plan, not a rank of this result
    recommendation_run_id: str | None = None

    @property
    def plan_id(self) -> str | None:
        """The plan id asked for, when ``--plan`` named a logged plan."""
        return f"{self.recommendation_run_id}:{self.rank}" if self.recommendation_run_id \
            else None


def emit_options(command):
    """The ``--emit``, ``--plan``, ``--out``, ``--force`` and ``--script`` options."""
    options = [
        click.option("--emit", type=click.Choice(EMIT_CHOICES), default=None,
                     help="Write the launch artefact of one plan: a torchrun script or a "
                          "SkyPilot task YAML."),
        click.option("--plan", "plan_rank", default=None, metavar="K|PLAN_ID",
                     help="Plan to --emit: a rank of this result (default 1, the winner), or "
                          "a logged plan's id <recommendation_run_id>:<rank> (same workload "
                          "and target)."),
        click.option("--out", "out_path", metavar="PATH", default=None,
                     help="Where --emit writes (default ./gpuopt-plan<K>-torchrun.sh or "
                          "./gpuopt-plan<K>-skypilot.yaml)."),
        click.option("--force", is_flag=True,
                     help="Let --emit replace an existing file."),
        click.option("--script", metavar="PATH", default=None,
                     help="Training script for --emit (default: the one the measured run "
                          "recorded, MLflow's mlflow.source.name tag)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _parse_plan(value: str | int | None) -> tuple[str | None, int]:
    """``(recommendation run id or None, rank)`` of ``--plan``; :class:`UsageError` if bad."""
    if value is None:
        return None, 1
    text = str(value).strip()
    try:
        rank = int(text)
    except ValueError:
        from mlflow_gpuopt.launch.plan_ids import parse_plan_id

        try:
            return parse_plan_id(text)
        except ValueError:
            raise UsageError(f"--plan {text}: expected a rank (1 = the winner) or a plan id "
                             "<recommendation_run_id>:<rank>") from None
    if rank < 1:
        raise UsageError(f"--plan {rank}: plans are ranked from 1 (the winner)")
    return None, rank


def check_request(emit: str | None, rank: str | int | None, out: str | None, force: bool,
                  script: str | None, top: int) -> EmitRequest | None:
    """The checked request (``None`` without ``--emit``); :class:`UsageError` if bad."""
    if emit is None:
        given = [flag for flag, v in (("--plan", rank), ("--out", out), ("--script", script))
                 if v is not None] + (["--force"] if force else [])
        if given:
            raise UsageError(f"{', '.join(given)}: only with --emit torchrun|skypilot")
        return None
    if script is not None and not script.isprintable():  # argv's non-UTF-8 bytes: surrogates
        raise UsageError("--script: the path holds a byte that is not UTF-8, or a control "
                         "character")
    rec_id, rank = _parse_plan(rank)
    if rec_id is None and rank > top:
        raise UsageError(f"--plan {rank} is beyond the {top} plans shown (--top {top})")
    path = Path(out if out is not None else _DEFAULT_NAMES[emit].format(rank=rank))
    path = path.expanduser().absolute()
    _check_writable(path, force)
    return EmitRequest(kind=emit, rank=rank, out=path, force=force, script=script,
                       recommendation_run_id=rec_id)


def check_logged_plan(req: EmitRequest | None, workload: Any) -> dict[str, Any] | None:
    """``--plan <run>:<rank>``: that plan's row, checked to be a plan of ``workload``
    (the runs this command read); :class:`UsageError` (one line) if it is not. Read-only."""
    if req is None or req.plan_id is None:
        return None
    from mlflow_gpuopt.mlflow_io.plans import PlanError, logged_plan_row

    try:
        return logged_plan_row(req.plan_id, workload)
    except PlanError as exc:
        raise UsageError(f"--plan {req.plan_id}: {exc}") from None


#: What makes two plans the same plan (the candidate JSON's keys).
_SAME_PLAN = ("provider", "instance_type", "region", "gpu", "nodes", "gpus_per_node",
              "strategy", "tp", "pp", "micro_batch", "grad_accum", "precision", "pricing")


def _matching_rank(row: dict[str, Any], rec: Any) -> int | None:
    """The 1-based rank in ``rec`` of the plan that ``row`` describes, or None."""
    from mlflow_gpuopt.recommend.serialize import candidate_dict

    for i, cand in enumerate(rec.candidates, start=1):
        d = candidate_dict(cand, i)
        if all(d.get(k) == row.get(k) for k in _SAME_PLAN if k in row):
            return i
    return None


def _check_writable(path: Path, force: bool) -> None:
    if path.is_dir():
        raise UsageError(f"--out {path} is a directory; give a file name")
    if path.exists() and not force:
        raise UsageError(f"--out {path} exists; pass --force to replace it or another --out")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"--out {path}: {parent} is not a directory")
    if not parent.is_dir():
        raise UsageError(f"--out {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {path}: directory {parent} is not writable")


def check_plan(req: EmitRequest | None, doc: dict[str, Any],
               logged_row: dict[str, Any] | None = None) -> None:
    """The asked plan exists in the ranked result and the launcher can start it."""
    if req is None:
        return
    cands = doc["candidates"]
    if logged_row is not None:
        provider = logged_row["provider"]
    elif req.rank > len(cands):
        raise UsageError(f"--plan {req.rank}: the recommendation has only {len(cands)} ranked "
                         "plan(s)")
    else:
        provider = cands[req.rank - 1]["provider"]
    if req.kind == "skypilot":
        from mlflow_gpuopt.launch.skypilot import SKYPILOT_CLOUDS

        if provider not in SKYPILOT_CLOUDS:
            raise UsageError(f"--plan {req.plan_id or req.rank} is a {provider} plan: "
                             "SkyPilot cannot launch it; use --emit torchrun or another --plan")


def add_plan_ids(doc: dict[str, Any], logged: Any) -> None:
    """Add ``plan_id`` (and ``plan_run_id`` where a child run holds the plan) by rank."""
    from mlflow_gpuopt.launch import plan_id

    run_id = logged.run_id if logged is not None else None
    children = dict(enumerate(logged.child_run_ids, start=1)) if logged is not None else {}
    rows = list(doc["candidates"]) + list(doc.get("pareto") or [])
    rows += [doc[k] for k in ("winner", "fastest", "cheapest") if doc.get(k)]
    for row in rows:
        if row.get("rank"):
            row["plan_id"] = plan_id(run_id, row["rank"])
            if row["rank"] in children:
                row["plan_run_id"] = children[row["rank"]]


def _source(source_run_id: str) -> tuple[str | None, str | None]:
    """(training script recorded by the run, its experiment's name); ``None`` where unknown."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient()
        run = client.get_run(source_run_id)
        experiment = client.get_experiment(run.info.experiment_id).name
    except MlflowException:
        return None, None
    name = run.data.tags.get("mlflow.source.name") or ""
    ok = name.endswith(".py") and os.path.basename(name) not in _NOT_A_SCRIPT
    return (name if ok else None), experiment


def _tracking_uri() -> tuple[str | None, bool]:
    """The current tracking URI, local paths made absolute, credentials removed."""
    import mlflow

    from mlflow_gpuopt.launch import public_tracking_uri

    uri = mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + os.path.abspath(uri[len("sqlite:///"):])
    elif "://" not in uri and not uri.startswith(("databricks", "file:")):
        uri = os.path.abspath(uri)
    return public_tracking_uri(uri)


def _write_atomically(path: Path, text: str, *, force: bool, mode: int) -> None:
    """Write ``text`` to ``path`` all at once; never replace an existing file unless
    ``force``. On failure nothing is left behind."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        if force:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path appeared meanwhile: no overwrite, atomically
    except FileExistsError:
        raise UsageError(f"--out {path} exists; pass --force to replace it") from None
    except OSError as exc:
        raise UsageError(f"cannot write --out {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def find_logged_plan(req: EmitRequest | None, rec: Any,
                     logged_row: dict[str, Any] | None) -> int | None:
    """``--plan <run>:<rank>``: the rank in ``rec`` of that plan (:class:`UsageError` if this
    search no longer finds it); ``None`` otherwise."""
    if req is None or logged_row is None:
        return None
    found = _matching_rank(logged_row, rec)
    if found is None:
        raise UsageError(f"--plan {req.plan_id}: this search does not find that plan any more "
                         "(other target, options, prices or runs); emit a rank of this "
                         "result instead")
    return found


def emit(req: EmitRequest | None, rec: Any, doc: dict[str, Any], logged: Any,
         source_run_ids: list[str], found_rank: int | None = None) -> None:
    """Add plan ids to ``doc``; with ``req``, write the artefact and record it in ``doc``.

    ``found_rank``: where ``--plan <run>:<rank>`` sits in ``rec``; the artefact then names the
    logged plan, whose predictions the job will be held against."""
    add_plan_ids(doc, logged)
    if req is None:
        return
    from mlflow_gpuopt.launch import LaunchContext, LaunchError, skypilot_yaml, torchrun_script
    from mlflow_gpuopt.recommend.serialize import candidate_dict

    if found_rank is not None:
        plan = rec.candidates[found_rank - 1]
        row = {**candidate_dict(plan, req.rank), "plan_id": req.plan_id}
    else:
        row = doc["candidates"][req.rank - 1]
        plan = rec.candidates[req.rank - 1]
    recorded, experiment = _source(source_run_ids[0])
    script = req.script or recorded
    notes = []
    if req.kind == "skypilot" and script and os.path.isabs(script):
        # SkyPilot syncs the current directory (workdir: .): name the script inside it
        relative = os.path.relpath(script)
        if relative.startswith(os.pardir):
            notes.append(f"the training script {script} is outside this directory, which "
                         "SkyPilot syncs as the workdir: run sky launch from a directory "
                         "that holds it, or set GPUOPT_SCRIPT")
        else:
            script = relative
    uri, stripped = _tracking_uri()
    ctx = LaunchContext(plan_id=row["plan_id"], tracking_uri=uri, experiment_name=experiment,
                        script=script)
    try:
        text = (torchrun_script(plan, ctx) if req.kind == "torchrun"
                else skypilot_yaml(plan, ctx))
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    _write_atomically(req.out, text, force=req.force,
                      mode=0o755 if req.kind == "torchrun" else 0o644)
    if script is None:
        notes.append("the measured run did not record its training script: set "
                     "GPUOPT_SCRIPT when launching (or pass --script)")
    if stripped:
        notes.append("credentials were removed from the tracking URI: give the job "
                     "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or _TOKEN)")
    if req.kind == "skypilot" and uri and not uri.startswith(("http://", "https://",
                                                              "databricks")):
        notes.append(f"the tracking URI {uri} is local to this machine: point "
                     "MLFLOW_TRACKING_URI at a server the cloud nodes can reach")
    doc["emitted"] = {"kind": req.kind, "path": str(req.out), "rank": req.rank,
                      "plan_id": row["plan_id"], "script": script, "notes": notes}


def print_lines(doc: dict[str, Any], out: Any) -> None:
    """The plan-id line and, after ``--emit``, where the artefact is and how to run it."""
    cands = doc["candidates"]
    if cands and cands[0].get("plan_id"):
        first = cands[0]["plan_id"]
        scheme = ("<recommendation run>:<rank>" if ":" in first
                  else "the rank (not logged)")
        click.echo(f"Plan ids: {scheme}, e.g. #1 = {first}; launch one with "
                   "--emit torchrun|skypilot --plan K", file=out)
    e = doc.get("emitted")
    if not e:
        return
    if e["kind"] == "torchrun":
        how = f"run it on each node: NODE_RANK=<rank> MASTER_ADDR=<node 0> bash {e['path']}"
    else:
        how = f"launch it: sky launch -c gpuopt {e['path']}"
    click.echo(f"Wrote the {e['kind']} launch artefact of plan {e['plan_id']} to {e['path']}; "
               f"{how}", file=out)
    for note in e["notes"]:
        click.echo(f"Note: {note}", file=out)
