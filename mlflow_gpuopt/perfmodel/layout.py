"""How a configuration places ranks: tensor-parallel inside a node, then pipeline stages,
then data-parallel replicas outermost (Megatron's order), and the checks that go with it."""

from __future__ import annotations

import functools

import re
from dataclasses import dataclass

from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.types import STRATEGIES, Hardware, ParallelConfig

#: Data-parallel flavours; ``tp``/``pp`` mean "model parallel, replicas (if any) use DDP".
DP_STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp")
SHARDED_PARAMS = frozenset({"zero3", "fsdp"})
_PART = re.compile(r"^(tp|pp|vp|dp|ep|cp)(\d*)$")
_SEPARATORS = re.compile(r"[x×+,*]")
#: Largest degree a strategy part may give: the largest training jobs run on ~1e5 GPUs and
#: no model has 1e6 layers (``validation.BOUNDS``' GPU-count bound).
MAX_DEGREE = 1_000_000


def short(text: str, limit: int = 24) -> str:
    """``text`` cut to ``limit`` characters, so a 5000-digit degree is not a 5000-character
    error line."""
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def parse_layout(text: str) -> tuple[str, int, int, int, int]:
    """``(strategy, tp, pp, vp, dp)`` from a strategy string as ``--strategy`` takes it:
    ``ddp``, ``zero2``, ``tp``, ``tp4``, ``pp2``, ``tp2xpp2``, ``tp8xpp12xddp``,
    ``tp2xfsdp``, ``pp4xvp2`` (parts joined by ``x``, ``×``, ``+``, ``*`` or ``,``).

    ``strategy`` is one of :data:`STRATEGIES` (``tp``/``pp`` when only model-parallel
    degrees are given: their replicas use DDP). A degree of 0 (``tp`` or ``pp`` without a
    number) means "fill the node" / "fill the job"; absent degrees are 1. ``vp`` is the number
    of virtual stages of an interleaved pipeline schedule; ``dp`` with a number is the
    data-parallel degree the layout must come to (0 when not given; with context parallel,
    the replicas: GPUs ÷ (tp × pp × cp)). An ``epN`` part (expert parallelism,
    :func:`expert_degree`) and a ``cpN`` part (context parallelism, :func:`context_degree`)
    are accepted and left out of the tuple.
    """
    return _parse(text)[:5]


def expert_degree(text: str) -> int:
    """The expert-parallel degree ``epN`` of a strategy string (``ep8xfsdp``,
    ``tp2xep8xfsdp``); 1 when it has none (docs/models.md#mixture-of-experts)."""
    return _parse(text)[5]


def context_degree(text: str) -> int:
    """The context-parallel degree ``cpN`` of a strategy string (``cp4xfsdp``,
    ``tp2xcp4xfsdp``); 1 when it has none (docs/models.md#context-parallelism)."""
    return _parse(text)[6]


@functools.lru_cache(maxsize=256)  # pure; the recommender asks thousands of times
def _parse(text: str) -> tuple[str, int, int, int, int, int, int]:
    parts = [p for p in _SEPARATORS.split(str(text).strip().lower()) if p]
    if not parts:
        raise PerfModelError(f"empty strategy {text!r}; use one of {', '.join(DP_STRATEGIES)}, "
                             "tp, pp or e.g. tp2xpp2xddp")
    dp_name, tp, pp, vp, dp, ep, cp = None, 1, 1, 1, 0, 1, 1
    seen: dict[str, str] = {}  # kind of part -> the part, so none is given twice
    for part in parts:
        m = None if part in DP_STRATEGIES else _PART.match(part)
        if part not in DP_STRATEGIES and not m:
            raise PerfModelError(
                f"unknown strategy {text!r}; use one of {', '.join(DP_STRATEGIES)}, tp, pp, "
                "or a combination such as tp2xpp2xddp (vpN: interleaved virtual stages, "
                "epN: expert parallel, cpN: context parallel)")
        kind_name = {"tp": "tensor-parallel", "pp": "pipeline", "vp": "virtual-stage",
                     "ep": "expert-parallel", "cp": "context-parallel"}.get(
            m.group(1) if m else "", "data-parallel")
        if kind_name in seen:
            raise PerfModelError(
                f"strategy {text!r} gives the {kind_name} part twice ({seen[kind_name]} and "
                f"{part}); give each of data-parallel, tp, pp, vp, ep and cp at most once")
        seen[kind_name] = part
        if m is None:
            dp_name = part
            continue
        kind, digits = m.group(1), m.group(2)
        degree = (MAX_DEGREE + 1 if len(digits) > len(str(MAX_DEGREE))
                  else int(digits) if digits else 0)
        if degree > MAX_DEGREE:
            raise PerfModelError(f"strategy {short(text)!r}: {kind}{short(digits)} is more "
                                 f"than any job has (at most {MAX_DEGREE:,} GPUs or layers)")
        if kind == "dp":
            dp_name, dp = dp_name or "ddp", degree
        elif kind == "tp":
            tp = degree
        elif kind == "pp":
            pp = degree
        elif kind == "ep":
            if degree < 1:
                raise PerfModelError(f"strategy {text!r}: ep needs a number of expert-parallel "
                                     "ranks (ep8)")
            ep = degree
        elif kind == "cp":
            if degree < 1:
                raise PerfModelError(f"strategy {text!r}: cp needs a number of context-parallel "
                                     "ranks (cp4)")
            cp = degree
        else:
            if degree < 1:
                raise PerfModelError(f"strategy {text!r}: vp needs a number of virtual stages")
            vp = degree
    if dp_name is None:
        dp_name = "tp" if tp != 1 and pp == 1 else ("pp" if pp != 1 else "ddp")
    return dp_name, tp, pp, vp, dp, ep, cp


#: The order ``--strategy`` and ``gpuopt.strategy`` spell a layout in (``tp2xpp2xcp4xep2xfsdp``):
#: model-parallel degrees, then context and expert parallel, then the data-parallel part.
_SPELLING_ORDER = {"tp": 0, "pp": 1, "vp": 2, "cp": 3, "ep": 4, "dp": 5}


def with_degree(strategy: str, kind: str, degree: int) -> str:
    """``strategy`` with an ``{kind}{degree}`` part put where the spelling order has it
    (``with_degree("fsdp", "cp", 4)`` is ``cp4xfsdp``, ``with_degree("tp2xfsdp", "ep", 8)``
    is ``tp2xep8xfsdp``); the one spelling tracking, ``--strategy`` and ``recommend`` share."""
    rank = _SPELLING_ORDER[kind]
    parts = [p for p in _SEPARATORS.split(strategy) if p]
    at = next((i for i, p in enumerate(parts)
               if _SPELLING_ORDER.get(_PART.match(p).group(1) if _PART.match(p) else "", 6)
               > rank), len(parts))
    return "x".join(parts[:at] + [f"{kind}{degree}"] + parts[at:])


def without_degree(strategy: str, kind: str) -> str:
    """``strategy`` less its ``{kind}N`` part (``without_degree("cp4xfsdp", "cp")`` is
    ``fsdp``)."""
    return "x".join(p for p in _SEPARATORS.split(strategy)
                    if p and not re.fullmatch(rf"{kind}\d+", p))


def is_strategy(text: str) -> bool:
    """True when :func:`parse_layout` accepts ``text``."""
    try:
        parse_layout(text)
    except PerfModelError:
        return False
    return True


@dataclass(frozen=True)
class Layout:
    """Degrees of parallelism and which groups cross a node boundary."""

    tp: int
    pp: int
    #: ranks holding the same weight shard, which reduce gradients together: the
    #: data-parallel replicas × the context-parallel degree (Megatron's dp×cp group)
    dp: int
    dp_strategy: str  # one of DP_STRATEGIES
    dp_ranks_per_node: int  # replicas of one model shard that share a node
    dp_spans_nodes: bool
    pp_spans_nodes: bool
    vp: int = 1  # virtual stages per pipeline stage (interleaved schedule)
    #: expert-parallel degree: each MoE layer's experts split over ``ep`` ranks of one
    #: pipeline stage (Megatron's expert-model-parallel group): data-parallel ranks, and
    #: tensor-parallel ones too where the experts' own tensor-parallel degree is below ``tp``
    #: (MoE parallel folding, :func:`.moe.check_experts`); divides ``tp × dp``
    ep: int = 1
    ep_spans_nodes: bool = False  # the expert-parallel group crosses a node boundary
    #: context-parallel degree: each sample's sequence split over ``cp`` ranks of the
    #: ``dp`` group, which hold the same weights (docs/models.md#context-parallelism)
    cp: int = 1
    cp_spans_nodes: bool = False  # the context-parallel group crosses a node boundary
    #: ranks of one expert-parallel group that share a node: the group's ranks sit next to
    #: the tensor-parallel ones, inside the pipeline stages (Megatron-core's rank order
    #: ``tp-cp-ep-dp-pp``, ``initialize_model_parallel``; torchtitan's mesh ``pp`` outermost,
    #: ``ep`` carved from ``dp_shard`` next to ``tp``), so ``min(ep, gpus per node / tp)``
    ep_ranks_per_node: int = 1

    @property
    def replicas(self) -> int:
        """Data-parallel replicas, each taking its own samples: ``dp ÷ cp``."""
        return self.dp // self.cp

    def gpus_total(self) -> int:
        """GPUs in the job: ``tp × pp × dp``."""
        return self.tp * self.pp * self.dp

    def strategy_name(self) -> str:
        """The strategy this layout runs: its data-parallel flavour, or ``tp``/``pp`` when the
        model is split (tensor parallel named first)."""
        if self.tp * self.pp == 1:
            return self.dp_strategy
        return "tp" if self.tp > 1 else "pp"


@functools.lru_cache(maxsize=4096)  # pure; the recommender asks thousands of times
def resolve_layout(config: ParallelConfig) -> Layout:
    """Degrees for ``config``; ``config.strategy`` may be a compound layout string
    (:func:`parse_layout`), whose degrees apply where ``config.tp``/``pp`` are left at 1.
    ``tp`` without a degree uses the whole node, and ``pp`` without one puts one stage on every
    GPU left after tensor parallel."""
    name, tp_s, pp_s, vp_s, dp_s, ep, cp = _parse(config.strategy)
    if name not in STRATEGIES:
        raise PerfModelError(
            f"unknown strategy {config.strategy!r}; expected one of {', '.join(STRATEGIES)}")
    g, gpus = config.gpus_per_node, config.gpus
    if g < 1 or config.nodes < 1:
        raise PerfModelError("gpus per node and nodes must be at least 1")
    tp = config.tp if config.tp > 1 else tp_s
    pp = config.pp if config.pp > 1 else pp_s
    vp = config.virtual_stages if config.virtual_stages > 1 else vp_s
    if name == "tp" and tp == 1:
        tp = 0
    if name == "pp" and pp == 1:
        pp = 0
    dp_strategy = "ddp" if name in ("tp", "pp") else name
    tp = tp if tp >= 1 else g
    pp = pp if pp >= 1 else max(1, gpus // tp)
    if vp > 1 and pp < 2:
        raise PerfModelError(f"{vp} virtual stages need a pipeline (pp of 2 or more)")
    if gpus % (tp * pp):
        raise PerfModelError(
            f"tensor-parallel {tp} x pipeline {pp} = {tp * pp} does not divide {gpus} GPUs")
    dp = gpus // (tp * pp)
    if dp % cp:
        raise PerfModelError(f"context-parallel cp{cp} x tensor-parallel {tp} x pipeline {pp} "
                             f"does not divide {gpus} GPUs")
    if dp_s and dp_s * cp != dp:
        raise PerfModelError(f"strategy {config.strategy!r}: dp{dp_s} x tp{tp} x pp{pp}"
                             + (f" x cp{cp}" if cp > 1 else "")
                             + f" is not the {gpus} GPUs of the job")
    if dp_strategy == "single":
        if gpus != 1:
            raise PerfModelError(f"strategy 'single' runs on 1 GPU, not {gpus}; use ddp")
    elif dp == 1 and dp_strategy == "ddp" and tp * pp == 1:
        dp_strategy = "single"
    if (tp * dp) % ep:
        raise PerfModelError(f"strategy {config.strategy!r}: expert-parallel ep{ep} must divide "
                             f"tp{tp} x the data-parallel degree {dp} (the expert-parallel "
                             "ranks are tensor- and data-parallel ranks, as in Megatron)")
    per_node_shards = tp * pp
    dp_in_node = max(1, g // per_node_shards) if per_node_shards <= g else 1
    return Layout(tp=tp, pp=pp, dp=dp, dp_strategy=dp_strategy,
                  dp_ranks_per_node=min(dp, dp_in_node),
                  dp_spans_nodes=config.nodes > 1 and dp > dp_in_node,
                  pp_spans_nodes=config.nodes > 1 and tp * pp > g, vp=vp, ep=ep,
                  ep_spans_nodes=config.nodes > 1 and ep * tp > g,
                  ep_ranks_per_node=max(1, min(ep, g // tp)), cp=cp,
                  cp_spans_nodes=config.nodes > 1 and cp * tp > g)  # tp-cp-ep-dp-pp


def validate_config(config: ParallelConfig, hardware: Hardware) -> None:
    """Raise :class:`PerfModelError` when ``config`` cannot run on ``hardware``.

    Checks: known strategy; GPUs per node no more than the machine has; tensor parallel no
    wider than a node (its all-reduces need NVLink-class links); ``tp × pp`` dividing the GPU
    count; positive micro-batch and accumulation.
    """
    if config.tp > config.gpus_per_node:
        raise PerfModelError(
            f"tensor-parallel degree {config.tp} is larger than a node "
            f"({config.gpus_per_node} GPUs); keep tp inside one node")
    layout = resolve_layout(config)
    if config.gpus_per_node > hardware.gpus_per_node:
        raise PerfModelError(
            f"{config.gpus_per_node} GPUs per node asked, but a {hardware.gpu} node has "
            f"{hardware.gpus_per_node}; use more nodes")
    if layout.tp > config.gpus_per_node:
        raise PerfModelError(
            f"tensor-parallel degree {layout.tp} is larger than a node "
            f"({config.gpus_per_node} GPUs); keep tp inside one node")
    if config.gpus_per_node % layout.tp:
        raise PerfModelError(
            f"tensor-parallel degree {layout.tp} does not divide {config.gpus_per_node} GPUs "
            "per node")
    if config.micro_batch is not None and config.micro_batch < 1:
        raise PerfModelError(f"micro-batch must be at least 1, got {config.micro_batch}")
    if config.grad_accum < 1:
        raise PerfModelError(f"gradient accumulation must be at least 1, got {config.grad_accum}")
