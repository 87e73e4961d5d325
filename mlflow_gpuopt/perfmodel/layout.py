"""How a configuration places ranks: tensor-parallel inside a node, then pipeline stages,
then data-parallel replicas outermost (Megatron's order), and the checks that go with it."""

from __future__ import annotations

from dataclasses import dataclass

from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.types import STRATEGIES, Hardware, ParallelConfig

#: Data-parallel flavours; ``tp``/``pp`` mean "model parallel, replicas (if any) use DDP".
DP_STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp")
SHARDED_PARAMS = frozenset({"zero3", "fsdp"})


@dataclass(frozen=True)
class Layout:
    """Degrees of parallelism and which groups cross a node boundary."""

    tp: int
    pp: int
    dp: int
    dp_strategy: str  # one of DP_STRATEGIES
    dp_ranks_per_node: int  # replicas of one model shard that share a node
    dp_spans_nodes: bool
    pp_spans_nodes: bool

    def gpus_total(self) -> int:
        """GPUs in the job: ``tp × pp × dp``."""
        return self.tp * self.pp * self.dp

    def strategy_name(self) -> str:
        """The strategy this layout runs: its data-parallel flavour, or ``tp``/``pp`` when the
        model is split (tensor parallel named first)."""
        if self.tp * self.pp == 1:
            return self.dp_strategy
        return "tp" if self.tp > 1 else "pp"


def resolve_layout(config: ParallelConfig) -> Layout:
    """Degrees for ``config``; ``strategy="tp"`` without ``tp`` uses the whole node, and
    ``strategy="pp"`` without ``pp`` puts one stage on every GPU left after tensor parallel."""
    strategy = config.strategy.lower()
    if strategy not in STRATEGIES:
        raise PerfModelError(
            f"unknown strategy {config.strategy!r}; expected one of {', '.join(STRATEGIES)}")
    g, gpus = config.gpus_per_node, config.gpus
    if g < 1 or config.nodes < 1:
        raise PerfModelError("gpus per node and nodes must be at least 1")
    tp, pp = max(1, config.tp), max(1, config.pp)
    dp_strategy = strategy
    if strategy == "tp":
        tp = tp if tp > 1 else g
        dp_strategy = "ddp"
    elif strategy == "pp":
        pp = pp if pp > 1 else max(1, gpus // tp)
        dp_strategy = "ddp"
    if gpus % (tp * pp):
        raise PerfModelError(
            f"tensor-parallel {tp} x pipeline {pp} = {tp * pp} does not divide {gpus} GPUs")
    dp = gpus // (tp * pp)
    if dp_strategy == "single":
        if gpus != 1:
            raise PerfModelError(f"strategy 'single' runs on 1 GPU, not {gpus}; use ddp")
    elif dp == 1 and dp_strategy == "ddp" and tp * pp == 1:
        dp_strategy = "single"
    per_node_shards = tp * pp
    dp_in_node = max(1, g // per_node_shards) if per_node_shards <= g else 1
    return Layout(tp=tp, pp=pp, dp=dp, dp_strategy=dp_strategy,
                  dp_ranks_per_node=min(dp, dp_in_node),
                  dp_spans_nodes=config.nodes > 1 and dp > dp_in_node,
                  pp_spans_nodes=config.nodes > 1 and tp * pp > g)


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
