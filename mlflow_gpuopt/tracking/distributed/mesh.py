"""The job's parallel layout: tensor / pipeline / data / context / expert-parallel degrees.

Read, in order, from ``TrackConfig(tp=, pp=, dp=, cp=, ep=)`` (each given degree wins), the
``DeviceMesh`` given as ``TrackConfig(device_mesh=...)``, or the mesh the model's DTensor
parameters live on (``torch.distributed.tensor.parallel`` and ``fully_shard`` make them;
a parameter's mesh may be a slice, so its root mesh is read). A mesh dimension counts by its
name, as torchtitan and PyTorch's tutorials name them: ``tp``/``tensor``, ``pp``/``pipeline``,
``cp``/``context``, ``ep``/``expert``, and ``dp``/``dp_replicate``/``dp_shard``/``data``/
``fsdp``/``ddp``... (the data-parallel ones multiply). Unnamed dimensions say nothing and are
left out.

Expert parallelism splits each MoE layer's experts over ranks that are data-parallel ranks
for the rest of the model (Megatron's expert-model-parallel group, docs/models.md): a mesh's
``ep`` dimension therefore multiplies the data-parallel degree too (a ``(dp 2, ep 2)`` mesh
is ``dp`` 4 with ``ep`` 2, the ``ep2xddp`` of ``--strategy``). torchtitan instead splits
``dp_shard`` into ``dp_shard_mod_ep`` × ``dp_shard_in_ep`` dimensions (data parallel, both)
and flattens the expert-parallel ranks into an ``ep`` mesh kept by the root mesh
(``_flatten``): that mesh's size is the ``ep`` degree, its ranks already counted in ``dp``.

The strategy string is the compound layout ``--strategy`` takes (``tp2xfsdp``, ``tp4xpp2xddp``,
``ep2xfsdp``, ``cp2xfsdp``) when a tensor, pipeline, context or expert-parallel degree is above
1: ``tpN``, ``ppN``, ``cpN``, ``epN``, then the data-parallel flavour where gradients are
reduced over more than one rank. Context parallelism shards the sequence; its ranks reduce
gradients with the data-parallel ones (torchtitan flattens ``dp_shard`` with ``cp``), so the
flavour is named whenever the two together have more than one rank
(docs/models.md#context-parallelism).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from mlflow_gpuopt import contract

logger = logging.getLogger(__name__)

#: Mesh dimension names by the degree they give.
DIM_NAMES = {
    "tp": ("tp", "tensor", "tensor_parallel", "mp", "model"),
    "pp": ("pp", "pipeline", "pipe", "pipeline_parallel"),
    "cp": ("cp", "context", "context_parallel"),
    "ep": ("ep", "expert", "expert_parallel"),
    "dp": ("dp", "data", "data_parallel", "dp_replicate", "dp_shard", "replicate", "shard",
           "fsdp", "ddp", "hsdp", "zero", "dp_shard_mod_ep", "dp_shard_in_ep"),
}


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees of parallelism of the job (1 where not parallel)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1  # expert parallel: a split of the data-parallel ranks (counted in ``dp``)

    @property
    def model_parallel(self) -> bool:
        return self.tp > 1 or self.pp > 1

    def strategy(self, dp_strategy: str) -> str:
        """The compound strategy string for data-parallel flavour ``dp_strategy`` (``ddp``,
        ``fsdp``...): ``tp2xfsdp``, ``tp4xpp2xddp``, ``cp2xfsdp``, ``ep4xfsdp``;
        ``dp_strategy`` unchanged when no tp / pp / cp / ep degree is above 1 (or when it is
        a compound layout already)."""
        split = self.model_parallel or self.cp > 1 or self.ep > 1
        if not split or "x" in dp_strategy or dp_strategy in ("tp", "pp"):
            return dp_strategy
        parts = [f"{kind}{degree}" for kind, degree in
                 (("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("ep", self.ep))
                 if degree > 1]
        if self.dp * self.cp > 1:
            parts.append(dp_strategy if dp_strategy != "single" else "ddp")
        return "x".join(parts)

    def params(self) -> dict[str, int]:
        """``gpuopt.tp`` / ``pp`` / ``dp`` / ``cp`` / ``ep``."""
        return {contract.PARAM_TP: self.tp, contract.PARAM_PP: self.pp,
                contract.PARAM_DP: self.dp, contract.PARAM_CP: self.cp,
                contract.PARAM_EP: self.ep}


def mesh_degrees(mesh: Any) -> dict[str, int]:
    """Degrees by kind (``tp``, ``pp``, ``dp``, ``cp``, ``ep``) from a ``DeviceMesh``'s named
    dimensions (its root mesh when it is a slice); kinds without a named dimension absent."""
    root = _root(mesh)
    names = getattr(root, "mesh_dim_names", None) or ()
    shape = tuple(getattr(root, "shape", ()) or ())
    if len(names) != len(shape):
        return {}
    out: dict[str, int] = {}
    for name, size in zip(names, shape, strict=True):
        key = str(name).lower()
        for kind, spellings in DIM_NAMES.items():
            if key in spellings:
                out[kind] = out.get(kind, 1) * int(size)
                break
    if "ep" not in out:
        flat = _flattened_ep(root)
        if flat:
            out["ep"] = flat
    return out


def _root(mesh: Any) -> Any:
    try:
        return mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
    except Exception:  # a mesh without the private accessor: read it as it is
        return mesh


def _flattened_ep(root: Any) -> int | None:
    """The size of an ``ep`` mesh flattened from ``root``'s dimensions (torchtitan's), or
    None. Reads the root's private ``_flatten_mapping`` (torch 2.9+); never raises."""
    try:
        flat = getattr(root, "_flatten_mapping", None) or {}
        for name, sub in flat.items():
            if str(name).lower() in DIM_NAMES["ep"]:
                return int(sub.size())
    except Exception as exc:  # another torch's layout: no flattened degree read
        logger.debug("gpuopt: flattened meshes not read: %s", exc)
    return None


def _has_ep_dimension(mesh: Any) -> bool:
    names = getattr(_root(mesh), "mesh_dim_names", None) or ()
    return any(str(n).lower() in DIM_NAMES["ep"] for n in names)


def model_mesh(model: Any) -> Any:
    """The ``DeviceMesh`` with the most dimensions among the model's DTensor parameters
    (the root mesh of their slices), or None."""
    if model is None:
        return None
    best = None
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is None or not hasattr(p, "placements"):
            continue
        with contextlib.suppress(Exception):  # a mesh without the accessor: keep the slice
            mesh = mesh._get_root_mesh()
        if best is None or getattr(mesh, "ndim", 0) > getattr(best, "ndim", 0):
            best = mesh
    return best


def detect_layout(model: Any, device_mesh: Any = None, tp: int | None = None,
                  pp: int | None = None, dp: int | None = None, cp: int | None = None,
                  world_size: int = 1, ep: int | None = None) -> ParallelLayout | None:
    """The job's layout (see the module doc), or None when nothing names a degree.

    A data-parallel degree that neither the config nor the mesh gives is what the world size
    leaves: ``world / (tp × pp × cp)``. A mesh's ``ep`` dimension multiplies the mesh's
    data-parallel degree (its ranks are data-parallel ranks of the dense layers).
    """
    degrees: dict[str, int] = {}
    mesh = device_mesh
    if mesh is None:
        try:
            mesh = model_mesh(model)
        except Exception as exc:  # a model whose parameters cannot be walked
            logger.debug("gpuopt: no device mesh from the model: %s", exc)
    if mesh is not None:
        degrees.update(mesh_degrees(mesh))
        if _has_ep_dimension(mesh):  # its ranks are data-parallel ranks of the dense layers
            degrees["dp"] = degrees.get("dp", 1) * degrees["ep"]
    given = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep}
    degrees.update({k: int(v) for k, v in given.items() if v})
    if not degrees:
        return None
    t, p, c = degrees.get("tp", 1), degrees.get("pp", 1), degrees.get("cp", 1)
    d = degrees.get("dp") or max(1, world_size // max(1, t * p * c))
    return ParallelLayout(tp=t, pp=p, dp=d, cp=c, ep=degrees.get("ep", 1))
