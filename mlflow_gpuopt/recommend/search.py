"""Enumerate plans, keep the feasible ones, rank them and pick the Pareto set.

A plan is offer × node count × strategy × micro-batch/accumulation × precision × pricing.
The search is pruned so the whole catalog takes well under half a second:

* strategies are tried from the least memory-hungry-to-communicate up (DDP, ZeRO-1, ZeRO-2,
  FSDP); once one fits the whole per-GPU batch without accumulation, the later ones could
  only add communication, so they are skipped; tensor/pipeline parallelism is tried only for
  large models or when no data-parallel strategy fits;
* the global batch (samples per optimizer step) is kept: each plan's data-parallel ranks
  split it, and the micro-batch is the largest divisor of a rank's share that fits in memory
  (asked once per shape with ``max_micro_batch``), with accumulation making up the rest
  (``Target.global_batch``; with it unset, each GPU keeps the measured per-GPU batch
  instead); activation checkpointing is tried only when not even a micro-batch of one fits;
* node counts double (1, 2, 4, …) and stop once doubling gains less than 5 % throughput;
* large models (``LARGE_MODEL_PARAMS``) whose transformer shape (layers, hidden size,
  sequence) is known also get compound layouts: tensor parallel inside a
  node (2, 4, 8) × pipeline stages (powers of two, at most one per layer) × data-parallel
  replicas with ZeRO-1 (Megatron's distributed optimizer) or FSDP;
* long sequences (``CP_MIN_SEQ_LEN`` tokens or more) also get each ZeRO-1 and FSDP shape
  (plain and compound) with context parallelism (``cp4xfsdp``): every power-of-two ``cp``
  from 2 that divides the data-parallel degree (and splits the sequence into ``2·cp``
  chunks), in increasing order until one fits without recomputation (a larger one only adds
  exchange), tried whatever fitted before it;
* mixtures of experts (``num_experts`` of 2 or more) also get each data-parallel shape with
  expert parallelism (``ep8xfsdp``): every power-of-two ``ep`` from 2 that divides the
  data-parallel degree (``tp × dp`` where the experts' tensor parallel asked is below
  ``tp``: the expert group folded over tensor-parallel ranks too) and the experts, tried
  whatever fitted before it (the experts it shards and the all-to-all it costs are what the
  search weighs).

What makes it quick (the answer is the same as evaluating every offer on its own, which
``recommend(..., exhaustive=True)`` does and the tests compare against):

* offers with the same GPU, node size, links and network share one exploration (shapes,
  memory fit, step-time prediction); each offer then takes the node counts its provider
  allows (a prefix of the shared exploration) and is only costed;
* memory is checked before any step time is predicted (``max_micro_batch``; shapes with no
  fitting micro-batch are never predicted), and the answer is kept per GPU memory size, so
  two networks of the same GPU ask once;
* offers that differ only by region (same instance, prices, billing) are costed once: the
  ranking keeps one plan per instance and configuration, the first in catalog order;
* a plan slower and dearer than one already costed on the same provider, GPU and pricing
  (and no more likely to meet the deadline) is dropped as soon as it is costed: the ranking
  would collapse it anyway, and it can be on neither the Pareto front nor the fastest plan;
  where even its bare compute time at the offer's rate is slower and dearer than a costed
  plan that meets the deadline, it is not costed at all.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from mlflow_gpuopt.catalog.schema import FAST_INTRA_NODE_LINKS, GpuSpec, Offer
from mlflow_gpuopt.perfmodel.activations import normalize_recompute
from mlflow_gpuopt.perfmodel.layout import (
    context_degree,
    expert_degree,
    with_degree,
    without_degree,
)
from mlflow_gpuopt.perfmodel.precision import normalize_precision
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Prediction, Workload
from mlflow_gpuopt.recommend.batching import largest_divisor_at_most
from mlflow_gpuopt.recommend.chart_points import scaling_points
from mlflow_gpuopt.recommend.cost import evaluate, price_per_hour
from mlflow_gpuopt.recommend.explain import (
    batch_note,
    explain_winner,
    hours_text,
    launch_line,
    money,
    one_line_why,
    strategy_label,
)
from mlflow_gpuopt.recommend.offers import (
    DATA_PARALLEL_LADDER,
    allowed_precisions,
    filter_offers,
)
from mlflow_gpuopt.recommend.ranking import (
    DOMINATED_REASON,
    fastest_plan,
    rank_plans,
)
from mlflow_gpuopt.recommend.shortfall import binding_constraint
from mlflow_gpuopt.recommend.types import (
    Candidate,
    Costing,
    HardwareFor,
    Predictor,
    Recommendation,
    SearchSpace,
    Target,
)

#: Models at least this big also get tensor/pipeline-parallel plans.
LARGE_MODEL_PARAMS = 1_000_000_000
#: Shortest sequence (tokens) context parallelism is searched for: below it a GPU's share of
#: the sequence is too short for the exchange to hide under attention, and the activations
#: that make it pay are small (Megatron-Bridge and torchtitan run cp from 16k-32k tokens).
CP_MIN_SEQ_LEN = 16384
_CONTEXT_PARALLEL_FLAVOURS = ("zero1", "fsdp")
_MIN_NODE_GAIN = 1.05
#: The ``dropped`` reason for shapes whose data-parallel ranks cannot share the global batch.
UNEVEN_BATCH_REASON = "the global batch does not split evenly over the data-parallel ranks"


def _node_counts(gpus_per_node: int, limit: int, max_gpus: int | None) -> list[int]:
    """1, 2, 4, … nodes up to ``limit``, with at most ``max_gpus`` GPUs in all."""
    counts, n = [], 1
    while n <= max(1, limit):
        if max_gpus is None or n * gpus_per_node <= max_gpus:
            counts.append(n)
        n *= 2
    return counts


def _pricings(offer: Offer, space: SearchSpace) -> list[str]:
    if offer.pricing == "compute_units":
        return [] if space.spot is True else ["on_demand"]
    out = []
    if space.spot is not True:
        out.append("on_demand")
    if space.spot is not False and offer.spot_price_per_hour_usd is not None:
        out.append("spot")
    return out


def _shapes(offer: Offer, nodes: int, *, compound: bool = False,
            num_layers: int | None = None, num_experts: int | None = None,
            seq_len: float | None = None, expert_tp: int | None = None
            ) -> list[tuple[str, int, int]]:
    """(strategy, tp, pp) for a job of ``nodes`` × ``offer.gpu_count`` GPUs; with
    ``compound``, also tensor × pipeline × data-parallel layouts (module docstring)."""
    per_node = offer.gpu_count
    total = per_node * nodes
    if total == 1:
        return [("single", 1, 1)]
    shapes = [(s, 1, 1) for s in DATA_PARALLEL_LADDER]
    fast_link = offer.intra_node_link in FAST_INTRA_NODE_LINKS
    if per_node in (2, 4, 8) and fast_link:
        shapes.append(("tp", per_node, 1))
        if nodes > 1:
            shapes.append(("tp", per_node, nodes))
    if nodes > 1:
        shapes.append(("pp", 1, nodes))
    elif per_node > 1:
        shapes.append(("pp", 1, per_node))
    if compound:
        shapes += _compound_shapes(per_node, total, fast_link, num_layers, set(shapes))
    if num_experts and num_experts > 1:
        shapes += _expert_shapes(shapes, total, num_experts, expert_tp)
    if seq_len and seq_len >= CP_MIN_SEQ_LEN:
        shapes += _context_shapes(shapes, total, int(seq_len))
    return shapes


def _context_shapes(shapes: list[tuple[str, int, int]], total: int, seq_len: int
                    ) -> list[tuple[str, int, int]]:
    """Each ZeRO-1 and FSDP shape (the flavours of the compound layouts; DDP and ZeRO-2 keep
    more per GPU and move no less) again with ``cpN``: powers of two from 2 dividing its
    data-parallel degree, with the sequence splitting into ``2·N`` chunks (the load-balanced
    causal split)."""
    out = []
    for strategy, tp, pp in shapes:
        if strategy not in _CONTEXT_PARALLEL_FLAVOURS:
            continue
        dp = total // (tp * pp)
        cp = 2
        while cp <= dp:
            if dp % cp == 0 and seq_len % (2 * cp) == 0:
                out.append((with_degree(strategy, "cp", cp), tp, pp))
            cp *= 2
    return out


def _expert_shapes(shapes: list[tuple[str, int, int]], total: int, num_experts: int,
                   expert_tp: int | None = None) -> list[tuple[str, int, int]]:
    """Each data-parallel shape again with ``epN``: powers of two from 2 dividing the
    experts and the ranks of a pipeline stage the expert group may take, the data-parallel
    ones (Megatron's default, the experts' tensor parallel ``etp`` = ``tp``) or, with
    ``expert_tp`` below ``tp``, ``tp × dp / etp`` of them (MoE parallel folding: the expert
    group spans tensor-parallel ranks too, as Megatron-Bridge's Qwen3-235B H100 preset's
    tp2 × ep32 over 16 replicas)."""
    out = []
    for strategy, tp, pp in shapes:
        if strategy not in DATA_PARALLEL_LADDER:
            continue
        dp = total // (tp * pp)
        etp = math.gcd(expert_tp, tp) if expert_tp else tp
        ranks = tp * dp // etp
        ep = 2
        while ep <= ranks:
            if ranks % ep == 0 and num_experts % ep == 0:
                out.append((with_degree(strategy, "ep", ep), tp, pp))
            ep *= 2
    return out


def _compound_shapes(per_node: int, total: int, fast_link: bool, num_layers: int | None,
                     seen: set[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """tp (inside a node, over fast links) × pp (powers of two, at most one stage per layer)
    × data-parallel replicas: DDP replicas (named ``tp``/``pp`` as the plain shapes are),
    ZeRO-1 and FSDP where there is more than one replica (FSDP only where it fits a larger
    micro-batch than ZeRO-1: :meth:`_Search.explore`)."""
    tps = [1] + ([t for t in (2, 4, 8) if t <= per_node and per_node % t == 0]
                 if fast_link else [])
    out = []
    for tp in tps:
        pp = 1
        while tp * pp <= total:
            if (tp, pp) != (1, 1) and total % (tp * pp) == 0 and (
                    not num_layers or pp <= num_layers):
                # ZeRO-1 shards only the optimizer: never slower than DDP replicas, so
                # those are searched only where there is a single replica.
                flavours = (["zero1", "fsdp"] if total // (tp * pp) > 1
                            else ["tp" if tp > 1 else "pp"])
                for flavour in flavours:
                    shape = (flavour, tp, pp)
                    if shape not in seen:
                        seen.add(shape)
                        out.append(shape)
            pp *= 2
    return out


@dataclass
class _Step:
    """One (precision, node count) of a shared exploration: the shapes that fit, predicted,
    and what was dropped or predicted on the way (replayed for every offer that uses it)."""

    precision: str
    nodes: int
    fitted: list[tuple[ParallelConfig, Prediction]] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    searched: int = 0


#: Smallest model offered FP8: the threshold of ``advise``'s FP8 rule
#: (``advice.rules.FP8_MIN_PARAMS``; below it non-GEMM work and FP8's casts dominate).
FP8_MIN_PARAMS = 1_000_000_000
#: A plan this long on a GPU type or precision no run measured is marked as a risk.
UNTESTED_RISK_HOURS = 24.0
#: How a script makes each precision switch a plan may need.
_PRECISION_RECIPES = {
    "fp8": "FP8 linear layers (torchao float8 convert_to_float8_training, or Transformer "
           "Engine's te.Linear under fp8_autocast), the advise finding precision_fp8",
    "tf32": "TF32 matmuls (torch.backends.cuda.matmul.allow_tf32 = True, "
            "torch.backends.cudnn.allow_tf32 = True)",
    "bf16": "autocast to bfloat16 (torch.autocast(dtype=torch.bfloat16); no GradScaler)",
}


def script_changes(workload: Workload, config: ParallelConfig) -> tuple[str, ...]:
    """What the training script must change to run ``config``, in words (empty: nothing)."""
    own = normalize_precision(workload.precision)
    out = []
    if config.precision and normalize_precision(config.precision) != own:
        new = normalize_precision(config.precision)
        out.append(f"script change: precision {own} -> {new}: "
                   + _PRECISION_RECIPES.get(new, new))
    mode = normalize_recompute(config.recompute_mode(workload.recompute))
    if mode != normalize_recompute(workload.recompute):
        out.append(f"script change: activation recomputation {mode} "
                   "(torch.utils.checkpoint around each block), to fit the memory")
    return tuple(out)


def untested_risk(c: Candidate, own_precision: str) -> str | None:
    """A risk note for a long plan (``UNTESTED_RISK_HOURS``) on a GPU type, vendor or
    precision no run measured (a plan on priors alone already says so in the explanation:
    it is marked where it also switches precision or vendor)."""
    p = c.prediction
    if p.basis == "measured" or c.hours < UNTESTED_RISK_HOURS:
        return None
    amd = c.offer.gpu.upper().startswith("MI")
    switched = normalize_precision(c.config.precision or own_precision) != own_precision
    if p.basis == "prior" and not (amd or switched):
        return None
    what = [f"{c.offer.gpu} (AMD, ROCm)" if amd else c.offer.gpu]
    if switched:
        what.append(f"{c.config.precision} (the script runs {own_precision})")
    return (f"risk: no run was measured on {' in '.join(what)} and the job runs "
            f"{c.hours:,.0f} h; a short tracked run there first checks speed and memory")


def within_headroom(pred: Prediction, headroom: float) -> bool:
    """Whether ``pred``'s median peak leaves ``headroom`` of the GPU's usable memory free."""
    usable = pred.memory_usable_bytes or pred.memory_capacity_bytes
    return pred.memory.total_bytes <= (1.0 - headroom) * usable * (1 + 1e-9)


def _node_limit(offer: Offer, space: SearchSpace) -> int:
    return min(space.max_nodes, offer.max_nodes if offer.inter_node_gbps > 0 else 1)


def _hardware_key(offer: Offer) -> tuple:
    """What the model's view of an offer (:class:`Hardware`) and its shapes depend on."""
    return (offer.gpu, offer.gpu_count, offer.intra_node_link, offer.intra_node_gb_per_s,
            offer.inter_node_gbps, offer.inter_node_rdma)


def _costing_key(offer: Offer) -> tuple:
    """Offers equal in everything but the region yield the same plans (the ranking keeps the
    first in catalog order)."""
    return dataclasses.astuple(dataclasses.replace(offer, region=""))


class _Search:
    def __init__(self, predictor: Predictor, workload: Workload, target: Target,
                 space: SearchSpace, costing: Costing, *, exhaustive: bool = False) -> None:
        self.predictor, self.workload, self.target = predictor, workload, target
        self.space, self.costing = space, costing
        self.exhaustive = exhaustive
        self.dropped: Counter[str] = Counter()
        self.searched = 0  # plans considered (every offer's own exploration, as if alone)
        self.predicted = 0  # step-time predictions made
        self.costed = 0  # plans costed
        self.candidates: list[Candidate] = []
        self._mb_cache: dict[tuple, int] = {}
        #: (provider, GPU, pricing) -> [(hours, cost, meets)] of plans costed so far
        self._frontier: dict[tuple, list[tuple[float, float, bool]]] = {}

    def _predict(self, config: ParallelConfig, hw: Hardware, step: _Step) -> Prediction | None:
        step.searched += 1
        self.predicted += 1
        try:
            return self.predictor.predict(config, hw)
        except (ValueError, ArithmeticError):  # PerfModelError is a ValueError
            step.dropped["the model cannot predict this shape"] += 1
            return None

    def _max_micro_batch(self, config: ParallelConfig, hw: Hardware) -> int:
        """The predictor's ``max_micro_batch``, asked once per GPU memory and shape (memory
        does not depend on links, networks or prices)."""
        key = (hw.gpu, hw.memory_bytes, hw.gpus_per_node, config)
        m = None if self.exhaustive else self._mb_cache.get(key)
        if m is None:
            try:
                m = int(self.predictor.max_micro_batch(config, hw))
            except (ValueError, ArithmeticError):
                m = 0
            self._mb_cache[key] = m
        return m

    def _fit_config(self, per_node: int, nodes: int, strategy: str, tp: int, pp: int,
                    precision: str, hw: Hardware, step: _Step, *, must_beat_mb: int = 0,
                    ) -> tuple[ParallelConfig, Prediction] | None:
        """Largest micro-batch that fits for this shape, predicted; ``None`` if none fits.

        With ``must_beat_mb``, a shape whose micro-batch is no larger is skipped: a later
        rung of the memory ladder only helps if it lets a bigger micro-batch fit.
        """
        # context-parallel ranks share their samples: the replicas are GPUs / (tp·pp·cp)
        batch = self.target.rank_batch(per_node * nodes // (tp * pp * context_degree(strategy)))
        if batch is None:
            step.dropped[UNEVEN_BATCH_REASON] += 1
            return None
        # the micro-batch is sized to leave the headroom free (the usable memory is
        # proportional to the stated one, so a smaller card is the same as the headroom)
        planned = replace(hw, memory_bytes=hw.memory_bytes * (1.0 - self.space.memory_headroom))
        for ac in (False, True):
            base = ParallelConfig(gpus_per_node=per_node, nodes=nodes, strategy=strategy,
                                  micro_batch=1, grad_accum=batch, precision=precision,
                                  activation_checkpointing=ac, tp=tp, pp=pp)
            m_max = self._max_micro_batch(base, planned)
            if m_max < 1:
                continue
            mb = largest_divisor_at_most(batch, m_max)
            if mb <= must_beat_mb:
                step.dropped["dominated (same micro-batch, more communication)"] += 1
                return None
            config = replace(base, micro_batch=mb, grad_accum=batch // mb)
            pred = self._predict(config, hw, step)
            if pred is None:
                return None
            if pred.fits and within_headroom(pred, self.space.memory_headroom):
                return config, pred
        step.dropped["does not fit in GPU memory"] += 1  # with the headroom (memory_note)
        return None

    def precisions(self, spec: GpuSpec) -> tuple[str, ...]:
        """The precisions searched on ``spec``: those allowed, less any no faster than the
        script's own."""
        w = self.workload
        allowed = allowed_precisions(
            w.precision, spec, linear_layers=bool(w.hidden_size and w.tokens_per_sample
                                                  and w.params >= FP8_MIN_PARAMS))
        if not allowed:
            return ()
        own = allowed[0]
        return tuple(p for p in allowed
                     if p == own or spec.peak_tflops(p) > spec.peak_tflops(own))

    def explore(self, offer: Offer, spec: GpuSpec, hw: Hardware, node_limit: int,
                ) -> list[list[_Step]]:
        """For each precision, the node counts tried in order (doubling, stopping once a
        doubling gains less than 5 % throughput), up to ``node_limit`` nodes; only the
        offer's node size and links matter, so every offer of the same hardware shares it."""
        large = self.workload.params >= LARGE_MODEL_PARAMS
        w = self.workload
        # Pipeline stages need the layer count, tensor parallel's all-reduces the hidden size
        # and sequence: without them the model's terms for those layouts are guesses.
        compound = large and bool(w.num_layers and w.hidden_size and w.tokens_per_sample)
        # expert parallelism needs the all-to-all's volume: layers and hidden size
        ep_experts = w.num_experts if (w.num_experts or 0) > 1 and w.num_layers \
            and w.hidden_size and w.tokens_per_sample else None
        # context parallelism: the sequence it splits and the keys and values it exchanges
        cp_seq = w.tokens_per_sample if w.num_layers and w.hidden_size else None
        out = []
        for precision in self.precisions(spec):
            steps: list[_Step] = []
            best_prev = 0.0
            for nodes in _node_counts(offer.gpu_count, node_limit, self.space.max_gpus):
                step = _Step(precision, nodes)
                steps.append(step)
                best_here = 0.0
                data_parallel_fit_full_batch = False
                any_dp_fit = False
                best_mb = 0
                model_best_mb: dict[tuple[int, int], int] = {}
                # shapes that fit without recomputation: a larger cp only adds exchange
                fit_plain: set[tuple[str, int, int]] = set()
                for strategy, tp, pp in _shapes(offer, nodes, compound=compound,
                                                num_layers=self.workload.num_layers,
                                                num_experts=ep_experts, seq_len=cp_seq,
                                                expert_tp=w.expert_tensor_parallel):
                    if tp % self.space.tp_multiple:
                        continue  # the experts' tensor parallel asked for does not divide tp
                    ladder = strategy in DATA_PARALLEL_LADDER and tp * pp == 1
                    # epN / cpN layouts are searched for their own degree
                    experts = expert_degree(strategy) > 1 or context_degree(strategy) > 1
                    base = without_degree(strategy, "cp")
                    if base != strategy and (base, tp, pp) in fit_plain:
                        continue
                    if ladder and data_parallel_fit_full_batch:
                        continue
                    if not (ladder or experts) and strategy != "single" \
                            and not (large or not any_dp_fit):
                        continue
                    if ladder:
                        must_beat = best_mb
                    elif strategy == "fsdp":  # compound: only where ZeRO-1 fit less
                        must_beat = model_best_mb.get((tp, pp), 0)
                    else:
                        must_beat = 0
                    fitted = self._fit_config(offer.gpu_count, nodes, strategy, tp, pp,
                                              precision, hw, step, must_beat_mb=must_beat)
                    if fitted is None:
                        continue
                    config, pred = fitted
                    if not config.activation_checkpointing:
                        fit_plain.add((base, tp, pp))
                    if ladder or strategy == "single":
                        any_dp_fit = True
                        best_mb = max(best_mb, config.micro_batch or 0)
                        data_parallel_fit_full_batch = config.grad_accum == 1
                    elif strategy == "zero1":
                        model_best_mb[(tp, pp)] = config.micro_batch or 0
                    best_here = max(best_here, pred.throughput_samples_per_s)
                    step.fitted.append((config, pred))
                if best_prev and best_here < best_prev * _MIN_NODE_GAIN:
                    break  # doubling the nodes no longer pays
                best_prev = max(best_prev, best_here)
            out.append(steps)
        return out

    def offer(self, offer: Offer, spec: GpuSpec, hw: Hardware,
              explored: list[list[_Step]] | None = None, *, cost: bool = True) -> None:
        """Cost ``offer``'s plans: from ``explored`` (a shared exploration of the same
        hardware, with at least this offer's node counts) or from its own. ``cost=False``
        (an offer equal to one costed already but for its region) only counts them."""
        if not self.precisions(spec):
            self.dropped[f"{spec.name} lacks {self.workload.precision}"] += 1
            return
        pricings = _pricings(offer, self.space)
        if not pricings:
            self.dropped["no price for the asked pricing"] += 1
            return
        limit = _node_limit(offer, self.space)
        if explored is None:
            explored = self.explore(offer, spec, hw, limit)
        for steps in explored:
            for step in steps:
                if step.nodes > limit:
                    break
                self.searched += step.searched
                self.dropped.update(step.dropped)
                if not cost:
                    continue
                for config, pred in step.fitted:
                    self._add(offer, step.nodes, config, pred, pricings)

    def _dominated(self, cand: Candidate) -> bool:
        """True when a plan costed before on the same provider, GPU and pricing is no slower,
        cheaper, and meets the deadline whenever ``cand`` does: the ranking's collapse would
        drop ``cand`` (:func:`collapse_dominated`), and it cannot be on the Pareto front."""
        seen = self._frontier.setdefault(
            (cand.offer.provider, cand.offer.gpu, cand.pricing), [])
        for hours, cost, meets in seen:
            if (hours <= cand.hours and cost < cand.cost_usd * (1 - 1e-9)
                    and (meets or not cand.meets_deadline)):
                return True
        seen.append((cand.hours, cand.cost_usd, cand.meets_deadline))
        return False

    def _surely_dominated(self, offer: Offer, nodes: int, pred: Prediction,
                          pricing: str) -> bool:
        """True when a plan already costed on the same provider, GPU and pricing meets the
        deadline and is no slower and cheaper than this one can possibly be: its compute
        alone (whole steps at the predicted step time, no start-up, restarts or billing
        rounding, all of which only add) at the offer's rate. Saves costing it; the ranking
        would collapse it (:meth:`_dominated`)."""
        if offer.pricing == "compute_units" or not pred.samples_per_step > 0:
            return False
        seen = self._frontier.get((offer.provider, offer.gpu, pricing))
        if not seen:
            return False
        steps = max(0.0, self.target.total_samples / pred.samples_per_step - 1e-9)
        hours = steps * pred.step_time_s / 3600.0 * (1 - 1e-12)
        cost = hours * price_per_hour(offer, nodes, pricing)
        return any(meets and h <= hours and c < cost * (1 - 1e-9) for h, c, meets in seen)

    def _add(self, offer: Offer, nodes: int, config: ParallelConfig, pred: Prediction,
             pricings: Sequence[str]) -> None:
        notes = list(script_changes(self.workload, config))
        if not offer.gpu_guaranteed:
            notes.append(f"{offer.provider} does not guarantee the {offer.gpu}: it assigns "
                         "whatever GPU is free, and a slower one stretches the time")
        for pricing in pricings:
            if not self.exhaustive and self._surely_dominated(offer, nodes, pred, pricing):
                self.dropped[DOMINATED_REASON] += 1
                continue
            self.costed += 1
            cand = evaluate(offer, nodes, config, pred, pricing, self.target, self.costing,
                            notes=tuple(notes))
            if cand is None:
                self.dropped["cannot finish (throughput or preemptions)"] += 1
                continue
            risk = untested_risk(cand, normalize_precision(self.workload.precision))
            if risk:
                cand = replace(cand, notes=(*cand.notes, risk))
            if not self.exhaustive and self._dominated(cand):
                self.dropped[DOMINATED_REASON] += 1
                continue
            self.candidates.append(cand)


def memory_note(headroom: float) -> str:
    """The memory policy every plan was held to, in words."""
    return (f"memory: every plan leaves at least {headroom:.0%} of each GPU's usable memory "
            "free at its predicted peak and fits with probability >= 50 % "
            "(--memory-headroom)")


def _single_gpu_efficiency(predictor: Predictor, c: Candidate, hw: Hardware) -> float | None:
    if c.gpus == 1:
        return 1.0
    cfg = ParallelConfig(gpus_per_node=1, nodes=1, strategy="single",
                         micro_batch=c.config.micro_batch, grad_accum=c.config.grad_accum,
                         precision=c.config.precision,
                         activation_checkpointing=c.config.activation_checkpointing)
    try:
        one = predictor.predict(cfg, hw)
    except (ValueError, ArithmeticError):
        return None
    if not one.fits or one.throughput_samples_per_s <= 0:
        return None
    return c.throughput_samples_per_s / (c.gpus * one.throughput_samples_per_s)


def recommend(predictor: Predictor, workload: Workload, offers: Iterable[Offer],
              gpus: Mapping[str, GpuSpec], target: Target, *, hardware_for: HardwareFor,
              space: SearchSpace = SearchSpace(), costing: Costing = Costing(),
              with_scaling: bool = True, exhaustive: bool = False) -> Recommendation:
    """Search every allowed offer and return the ranked plans, Pareto set and explanation.

    ``exhaustive`` evaluates every offer on its own, costs every plan and leaves all pruning
    to the ranking (slow; the tests check the quick search gives the same answer).

    Raises :class:`NoOffersError` when the search space selects no offer at all.
    """
    started = time.perf_counter()
    chosen = filter_offers(offers, space, gpus)
    search = _Search(predictor, workload, target, space, costing, exhaustive=exhaustive)
    hw_cache: dict[tuple, Hardware] = {}
    # Offers of the same hardware share one exploration, as deep as the deepest of them.
    limits: dict[tuple, int] = {}
    for offer in chosen:
        key = _hardware_key(offer)
        limits[key] = max(limits.get(key, 1), _node_limit(offer, space))
    explored: dict[tuple, list[list[_Step]]] = {}
    costed: set[tuple] = set()
    for offer in chosen:
        spec = gpus.get(offer.gpu)
        if spec is None:
            search.dropped[f"no GPU spec for {offer.gpu}"] += 1
            continue
        key = _hardware_key(offer)
        hw = hw_cache.get(key)
        if hw is None:
            hw = hw_cache[key] = hardware_for(spec, offer)
        if exhaustive:
            search.offer(offer, spec, hw)
            continue
        if key not in explored:
            explored[key] = search.explore(offer, spec, hw, limits[key])
        twin = _costing_key(offer) in costed
        costed.add(_costing_key(offer))
        search.offer(offer, spec, hw, explored[key], cost=not twin)
    search.candidates = [replace(c, launch=launch_line(c)) for c in search.candidates]

    ranked, front, dropped = rank_plans(search.candidates, workload.precision)
    search.dropped.update(dropped)
    winner = ranked[0] if ranked and ranked[0].meets_deadline else None
    fastest = fastest_plan(ranked)
    cheapest = min(ranked, key=lambda c: (c.cost_usd, c.hours), default=None)
    whys = {i: one_line_why(c, ranked[0], i + 1, target)
            for i, c in enumerate(ranked[:200])}
    notes: list[str] = []
    explanation: tuple[str, ...] = ()
    if not ranked:
        notes.append("no plan fits: every offer was dropped ("
                     + "; ".join(f"{r}: {n}" for r, n in search.dropped.most_common()) + ")")
    elif winner is None:
        notes.append(
            f"no plan meets the {hours_text(target.deadline_hours)} deadline with "
            f"{target.confidence:.0%} confidence; fastest: {hours_text(fastest.hours)} for "
            f"{money(fastest.cost_usd)} ({fastest.offer.provider} {fastest.offer.instance_type} "
            f"× {fastest.nodes}); cheapest: {money(cheapest.cost_usd)} in "
            f"{hours_text(cheapest.hours)} "
            f"({cheapest.offer.provider} {cheapest.offer.instance_type} × {cheapest.nodes}); "
            f"what binds: {binding_constraint(fastest, target, space)}")
    if winner is not None:
        runner_up = next((c for c in ranked[1:] if (c.offer.instance_type, c.nodes,
                                                    strategy_label(c.config), c.pricing)
                          != (winner.offer.instance_type, winner.nodes,
                              strategy_label(winner.config), winner.pricing)), None)
        eff: dict[int, float | None] = {}
        for c in (winner, runner_up):
            if c is not None:
                spec = gpus[c.offer.gpu]
                eff[id(c)] = _single_gpu_efficiency(predictor, c, hardware_for(spec, c.offer))
        explanation = explain_winner(winner, runner_up, target, eff)
    scaling = (scaling_points(predictor, workload, chosen, gpus, hardware_for,
                              space.max_gpus or 64, target.global_batch)
               if with_scaling else ())
    notes.append(batch_note(target))
    notes.append(memory_note(space.memory_headroom))
    notes.append(f"searched {search.searched} plans over {len(chosen)} offers in "
                 f"{time.perf_counter() - started:.2f} s")
    return Recommendation(
        target=target, candidates=ranked, pareto=front, winner=winner,
        fastest=fastest, cheapest=cheapest, explanation=explanation, whys=whys,
        dropped=dict(search.dropped), searched=search.searched, notes=tuple(notes),
        predicted=search.predicted, costed=search.costed,
        scaling=scaling, memory_headroom=space.memory_headroom,
    )
