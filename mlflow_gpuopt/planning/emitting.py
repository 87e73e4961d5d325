"""``recommend --emit``: one plan's launch artefact (torchrun script, SkyPilot YAML) on disk.

The request is checked before anything is read or logged (:func:`check_request`). The
artefact is written to a temporary file beside ``--out`` before the recommendation is logged
(:func:`stage`), and moved into place after (:func:`finish`): a directory that refuses the
file, or a full disk, fails the command with nothing logged. An existing file is never
replaced unless ``force``; a failed write leaves neither a partial nor a temporary file.

Plan ids: ``<recommendation_run_id>:<rank>`` when the recommendation is logged to MLflow,
the bare rank (``"3"``) when it is not (it names a row of the printed result only).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlflow_gpuopt.errors import InputError
from mlflow_gpuopt.recommend.result import Emitted, PlanIds, PlanResult

EMIT_CHOICES = ("torchrun", "skypilot")
_DEFAULT_NAMES = {"torchrun": "gpuopt-plan{rank}-torchrun.sh",
                  "skypilot": "gpuopt-plan{rank}-skypilot.yaml"}
#: Stands for the recommendation run's id until it is logged: as long as MLflow's run ids
#: (32 hex digits), so the staged file takes the room the final one needs.
_PROVISIONAL_RUN_ID = "0" * 32


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


def _parse_plan(value: str | int | None) -> tuple[str | None, int]:
    """``(recommendation run id or None, rank)`` of ``--plan``."""
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
            raise InputError(f"--plan {text}: expected a rank (1 = the winner) or a plan id "
                             "<recommendation_run_id>:<rank>") from None
    if rank < 1:
        raise InputError(f"--plan {rank}: plans are ranked from 1 (the winner)")
    return None, rank


def check_request(emit: str | None, rank: str | int | None, out: str | None, force: bool,
                  script: str | None, top: int) -> EmitRequest | None:
    """The checked request (``None`` without ``--emit``)."""
    if emit is None:
        given = [flag for flag, v in (("--plan", rank), ("--out", out), ("--script", script))
                 if v is not None] + (["--force"] if force else [])
        if given:
            raise InputError(f"{', '.join(given)}: only with --emit torchrun|skypilot")
        return None
    if script is not None and not script.isprintable():  # argv's non-UTF-8 bytes: surrogates
        raise InputError("--script: the path holds a byte that is not UTF-8, or a control "
                         "character")
    rec_id, rank = _parse_plan(rank)
    if rec_id is None and rank > top:
        raise InputError(f"--plan {rank} is beyond the {top} plans shown (--top {top})")
    path = Path(out if out is not None else _DEFAULT_NAMES[emit].format(rank=rank))
    path = path.expanduser().absolute()
    _check_writable(path, force)
    return EmitRequest(kind=emit, rank=rank, out=path, force=force, script=script,
                       recommendation_run_id=rec_id)


def _check_writable(path: Path, force: bool) -> None:
    if path.is_dir():
        raise InputError(f"--out {path} is a directory; give a file name")
    if path.exists() and not force:
        raise InputError(f"--out {path} exists; pass --force to replace it or another --out")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise InputError(f"--out {path}: {parent} is not a directory")
    if not parent.is_dir():
        raise InputError(f"--out {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {path}: directory {parent} is not writable")


def check_logged_plan(req: EmitRequest | None, workload: Any) -> dict[str, Any] | None:
    """``--plan <run>:<rank>``: that plan's row, checked to be a plan of ``workload``
    (the runs this command read). Read-only."""
    if req is None or req.plan_id is None:
        return None
    from mlflow_gpuopt.mlflow_io.plans import PlanError, logged_plan_row

    try:
        return logged_plan_row(req.plan_id, workload)
    except PlanError as exc:
        raise PlanError(f"--plan {req.plan_id}: {exc}") from None


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


def check_plan(req: EmitRequest | None, listed: Sequence[Any],
               logged_row: dict[str, Any] | None = None) -> None:
    """The asked plan exists in the ranked plans shown (``listed``, best first) and the
    launcher can start it."""
    if req is None:
        return
    if logged_row is not None:
        provider = logged_row["provider"]
    elif req.rank > len(listed):
        raise InputError(f"--plan {req.rank}: the recommendation has only {len(listed)} "
                         "ranked plan(s)")
    else:
        provider = listed[req.rank - 1].offer.provider
    if req.kind == "skypilot":
        from mlflow_gpuopt.launch.skypilot import SKYPILOT_CLOUDS

        if provider not in SKYPILOT_CLOUDS:
            raise InputError(f"--plan {req.plan_id or req.rank} is a {provider} plan: "
                             "SkyPilot cannot launch it; use --emit torchrun or another --plan")


def find_logged_plan(req: EmitRequest | None, rec: Any,
                     logged_row: dict[str, Any] | None) -> int | None:
    """``--plan <run>:<rank>``: the rank in ``rec`` of that plan (:class:`InputError` if this
    search no longer finds it); ``None`` otherwise."""
    if req is None or logged_row is None:
        return None
    found = _matching_rank(logged_row, rec)
    if found is None:
        raise InputError(f"--plan {req.plan_id}: this search does not find that plan any "
                         "more (other target, options, prices or runs); emit a rank of this "
                         "result instead")
    return found


@dataclass(frozen=True)
class Staged:
    """An artefact written to a temporary file beside ``--out``, not yet in place."""

    req: EmitRequest
    plan: Any  # recommend.Candidate
    #: the logged plan's id (``--plan <run>:<rank>``), else None: the id comes with the log
    fixed_plan_id: str | None
    ctx: Any  # launch.LaunchContext, its plan id provisional until finish()
    notes: tuple[str, ...]
    tmp: str


def _render(staged_req: EmitRequest, plan: Any, ctx: Any) -> str:
    from mlflow_gpuopt.launch import skypilot_yaml, torchrun_script

    return torchrun_script(plan, ctx) if staged_req.kind == "torchrun" \
        else skypilot_yaml(plan, ctx)


def _stage_text(req: EmitRequest, text: str) -> str:
    """``text`` in a temporary file beside ``--out``, synced to disk (a full disk fails
    here, not later); its path."""
    from mlflow_gpuopt.atomic_write import stage as stage_file

    try:
        return str(stage_file(req.out, text, mode=0o755 if req.kind == "torchrun" else 0o644))
    except OSError as exc:
        raise InputError(f"cannot write --out {req.out}: {exc.strerror or exc}") from None


def stage(req: EmitRequest | None, rec: Any, source_run_ids: Sequence[str],
          found_rank: int | None, *,
          logging: bool) -> Staged | None:
    """Render the artefact and write it to a temporary file beside ``req.out``; ``None``
    without a request. ``found_rank``: where ``--plan <run>:<rank>`` sits in ``rec`` (the
    artefact then names the logged plan, whose predictions the job is held against);
    ``logging``: whether the recommendation is about to be logged (its plan ids then hold
    the recommendation run's id)."""
    if req is None:
        return None
    from mlflow_gpuopt.launch import LaunchContext, plan_id, public_tracking_uri
    from mlflow_gpuopt.mlflow_io.source import current_tracking_uri, recorded_source

    plan = rec.candidates[(found_rank or req.rank) - 1]
    fixed = req.plan_id if found_rank is not None else None
    recorded, experiment = (recorded_source(source_run_ids[0]) if source_run_ids
                            else (None, None))
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
    uri, stripped = public_tracking_uri(current_tracking_uri())
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
    provisional = fixed or plan_id(_PROVISIONAL_RUN_ID if logging else None, req.rank)
    ctx = LaunchContext(plan_id=provisional, tracking_uri=uri, experiment_name=experiment,
                        script=script)
    tmp = _stage_text(req, _render(req, plan, ctx))
    return Staged(req=req, plan=plan, fixed_plan_id=fixed, ctx=ctx, notes=tuple(notes),
                  tmp=tmp)


@contextlib.contextmanager
def unstaged_on_error(staged: Staged | None, *, always: bool = True) -> Iterator[None]:
    """Remove the staged temporary file when the block ends (``always``), or only when it
    fails; a file already moved into place is left alone."""
    try:
        yield
    except BaseException:
        _remove(staged)
        raise
    if always:
        _remove(staged)


def _remove(staged: Staged | None) -> None:
    if staged is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged.tmp)


def finish(staged: Staged | None, result: PlanResult, logged: Any) -> PlanResult:
    """``result`` with its plan ids (the logged run's, else bare ranks); with a staged
    artefact, the artefact given its final plan id, moved to ``--out`` and recorded."""
    from mlflow_gpuopt.launch import plan_id

    ids = PlanIds(logged.run_id, tuple(logged.child_run_ids)) if logged is not None \
        else PlanIds()
    result = replace(result, plan_ids=ids)
    if staged is None:
        return result
    from mlflow_gpuopt.atomic_write import move_into_place

    req = staged.req
    final_id = staged.fixed_plan_id or plan_id(ids.recommendation_run_id, req.rank)
    if final_id != staged.ctx.plan_id:
        _remove(staged)  # first: the final file takes the room the staged one held
        staged = replace(staged, tmp=_stage_text(
            req, _render(req, staged.plan, replace(staged.ctx, plan_id=final_id))))
    try:
        with unstaged_on_error(staged):
            # without --force a hard link, which fails if --out appeared meanwhile
            move_into_place(Path(staged.tmp), req.out, replace=req.force)
    except FileExistsError:
        raise InputError(f"--out {req.out} exists; pass --force to replace it") from None
    except OSError as exc:
        raise InputError(f"cannot write --out {req.out}: {exc.strerror or exc}") from None
    return replace(result, emitted=Emitted(kind=req.kind, path=str(req.out), rank=req.rank,
                                           plan_id=final_id, script=staged.ctx.script,
                                           notes=staged.notes))
