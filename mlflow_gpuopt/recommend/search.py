"""Enumerate plans, keep the feasible ones, rank them and pick the Pareto set.

A plan is offer × node count × strategy × micro-batch/accumulation × precision × pricing.
The search is pruned so the whole catalog takes well under half a second:

* strategies are tried from the least memory-hungry-to-communicate up (DDP, ZeRO-1, ZeRO-2,
  FSDP); once one fits the whole per-GPU batch without accumulation, the later ones could
  only add communication, so they are skipped; tensor/pipeline parallelism is tried only for
  large models or when no data-parallel strategy fits;
* the micro-batch is the largest divisor of the per-GPU batch that fits in memory (asked
  once per shape with ``max_micro_batch``), with accumulation making up the rest, so the
  training script's batch per GPU is unchanged; activation checkpointing is tried only when
  not even a micro-batch of one fits;
* node counts double (1, 2, 4, …) and stop once doubling gains less than 5 % throughput.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from mlflow_gpuopt.catalog.catalog import Catalog
from mlflow_gpuopt.catalog.schema import GpuSpec, Offer
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Prediction, Workload
from mlflow_gpuopt.recommend.cost import evaluate
from mlflow_gpuopt.recommend.explain import (
    explain_winner,
    hours_text,
    launch_line,
    money,
    one_line_why,
    strategy_label,
)
from mlflow_gpuopt.recommend.types import (
    Candidate,
    Costing,
    HardwareFor,
    Predictor,
    Recommendation,
    ScalingPoint,
    SearchSpace,
    Target,
)

_DATA_PARALLEL_LADDER = ("ddp", "zero1", "zero2", "fsdp")
#: Models at least this big also get tensor/pipeline-parallel plans.
LARGE_MODEL_PARAMS = 1_000_000_000
_MIN_NODE_GAIN = 1.05
#: A plan no more than this much faster than a cheaper sibling is not worth a row.
_SAME_SPEED = 1.05
#: The ``dropped`` reason for plans :func:`collapse_dominated` removes (the report counts it).
DOMINATED_REASON = ("dominated: a cheaper plan on the same provider, GPU and pricing is as "
                    "fast (±5%)")
_SCALING_GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)


class NoOffersError(ValueError):
    """No catalog offer matches the providers / region / spot choice asked for."""


def allowed_precisions(workload_precision: str, spec: GpuSpec) -> tuple[str, ...]:
    """Precisions a plan on ``spec`` may use without changing what the script computes.

    fp32 scripts may also run with TF32 matmuls (where the GPU has TF32); fp16 autocast
    may become bf16 (no loss scaling needed); bf16 needs bf16 hardware; fp8 needs fp8.
    """
    p = (workload_precision or "fp32").lower()
    if p == "fp32":
        return ("fp32", "tf32") if spec.tf32_tflops else ("fp32",)
    if p == "tf32":
        return ("tf32",) if spec.tf32_tflops else ("fp32",)
    if p == "fp16":
        return ("fp16", "bf16") if spec.bf16_tflops else ("fp16",)
    if p == "bf16":
        return ("bf16",) if spec.bf16_tflops else ()
    if p == "fp8":
        return ("fp8",) if spec.fp8_tflops else ()
    return (p,)


def filter_offers(offers: Iterable[Offer], space: SearchSpace,
                  gpus: Mapping[str, GpuSpec] | None = None) -> list[Offer]:
    """Offers allowed by providers / region / spot / GPUs per instance (see
    :meth:`Catalog.query`), cheapest $/GPU-h first; raises :class:`NoOffersError` if none, or
    if no offer is in the region asked (region-independent offers alone do not make a region
    real)."""
    catalog = Catalog(tuple(offers), gpus or {})
    region = space.region.lower() if space.region else None
    if region and not any(o.region.lower() == region for o in catalog.offers):
        raise NoOffersError(f"no catalog offers in region {space.region}")
    try:
        out = catalog.query(provider=space.providers or None, region=space.region,
                            spot=space.spot, max_gpu_count=space.max_gpus)
    except ValueError as exc:  # an unknown provider
        raise NoOffersError(str(exc)) from None
    if not out:
        asked = []
        if space.providers:
            asked.append("provider " + "/".join(space.providers))
        if space.region:
            asked.append(f"region {space.region}")
        if space.spot:
            asked.append("spot")
        if space.max_gpus is not None:
            asked.append(f"at most {space.max_gpus} GPUs")
        raise NoOffersError(f"no catalog offers for {', '.join(asked) or 'this search'}")
    return out


def _node_counts(offer: Offer, space: SearchSpace) -> list[int]:
    limit = min(space.max_nodes, offer.max_nodes if offer.inter_node_gbps > 0 else 1)
    counts, n = [], 1
    while n <= max(1, limit):
        if space.max_gpus is None or n * offer.gpu_count <= space.max_gpus:
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


def _largest_divisor_at_most(n: int, cap: int) -> int:
    """Largest divisor of ``n`` that is at most ``cap`` (1 when ``cap`` < 1).

    Divisors come in pairs ``(i, n // i)`` with ``i <= √n``, so this looks at √n numbers
    rather than scanning down from ``cap`` (a per-GPU batch of 1e7 is 3,163 steps, not 1e7).
    """
    if cap >= n:
        return n
    best = 1
    i = 1
    while i * i <= n:
        if n % i == 0:
            if i <= cap:
                best = max(best, i)
            if n // i <= cap:
                return max(best, n // i)  # the pair partners shrink as i grows
        i += 1
    return best


def _shapes(offer: Offer, nodes: int) -> list[tuple[str, int, int]]:
    """(strategy, tp, pp) for a job of ``nodes`` × ``offer.gpu_count`` GPUs."""
    per_node = offer.gpu_count
    total = per_node * nodes
    if total == 1:
        return [("single", 1, 1)]
    shapes = [(s, 1, 1) for s in _DATA_PARALLEL_LADDER]
    fast_link = offer.intra_node_link in ("nvswitch", "nvlink")
    if per_node in (2, 4, 8) and fast_link:
        shapes.append(("tp", per_node, 1))
        if nodes > 1:
            shapes.append(("tp", per_node, nodes))
    if nodes > 1:
        shapes.append(("pp", 1, nodes))
    elif per_node > 1:
        shapes.append(("pp", 1, per_node))
    return shapes


class _Search:
    def __init__(self, predictor: Predictor, workload: Workload, target: Target,
                 space: SearchSpace, costing: Costing) -> None:
        self.predictor, self.workload, self.target = predictor, workload, target
        self.space, self.costing = space, costing
        self.dropped: Counter[str] = Counter()
        self.searched = 0
        self.candidates: list[Candidate] = []

    def _predict(self, config: ParallelConfig, hw: Hardware) -> Prediction | None:
        self.searched += 1
        try:
            return self.predictor.predict(config, hw)
        except (ValueError, ArithmeticError):  # PerfModelError is a ValueError
            self.dropped["the model cannot predict this shape"] += 1
            return None

    def _fit_config(self, offer: Offer, nodes: int, strategy: str, tp: int, pp: int,
                    precision: str, hw: Hardware, *, must_beat_mb: int = 0,
                    ) -> tuple[ParallelConfig, Prediction] | None:
        """Largest micro-batch that fits for this shape, predicted; ``None`` if none fits.

        With ``must_beat_mb``, a shape whose micro-batch is no larger is skipped: a later
        rung of the memory ladder only helps if it lets a bigger micro-batch fit.
        """
        batch = max(1, self.target.per_rank_batch)
        for ac in (False, True):
            base = ParallelConfig(gpus_per_node=offer.gpu_count, nodes=nodes, strategy=strategy,
                                  micro_batch=1, grad_accum=batch, precision=precision,
                                  activation_checkpointing=ac, tp=tp, pp=pp)
            try:
                m_max = int(self.predictor.max_micro_batch(base, hw))
            except (ValueError, ArithmeticError):
                m_max = 0
            if m_max < 1:
                continue
            mb = _largest_divisor_at_most(batch, m_max)
            if mb <= must_beat_mb:
                self.dropped["dominated (same micro-batch, more communication)"] += 1
                return None
            config = replace(base, micro_batch=mb, grad_accum=batch // mb)
            pred = self._predict(config, hw)
            if pred is None:
                return None
            if pred.fits:
                return config, pred
        self.dropped["does not fit in GPU memory"] += 1
        return None

    def offer(self, offer: Offer, spec: GpuSpec, hw: Hardware) -> None:
        precisions = allowed_precisions(self.workload.precision, spec)
        if not precisions:
            self.dropped[f"{spec.name} lacks {self.workload.precision}"] += 1
            return
        pricings = _pricings(offer, self.space)
        if not pricings:
            self.dropped["no price for the asked pricing"] += 1
            return
        large = self.workload.params >= LARGE_MODEL_PARAMS
        own = precisions[0]
        for precision in precisions:
            if precision != own and spec.peak_tflops(precision) <= spec.peak_tflops(own):
                continue  # same speed as the script's own precision: no reason to change it
            best_prev = 0.0
            for nodes in _node_counts(offer, self.space):
                best_here = 0.0
                data_parallel_fit_full_batch = False
                any_dp_fit = False
                best_mb = 0
                for strategy, tp, pp in _shapes(offer, nodes):
                    if strategy in _DATA_PARALLEL_LADDER and data_parallel_fit_full_batch:
                        continue
                    if strategy in ("tp", "pp") and not (large or not any_dp_fit):
                        continue
                    ladder = strategy in _DATA_PARALLEL_LADDER
                    fitted = self._fit_config(offer, nodes, strategy, tp, pp, precision, hw,
                                              must_beat_mb=best_mb if ladder else 0)
                    if fitted is None:
                        continue
                    config, pred = fitted
                    if ladder or strategy == "single":
                        any_dp_fit = True
                        best_mb = max(best_mb, config.micro_batch or 0)
                        data_parallel_fit_full_batch = config.grad_accum == 1
                    best_here = max(best_here, pred.throughput_samples_per_s)
                    self._add(offer, nodes, config, pred, pricings)
                if best_prev and best_here < best_prev * _MIN_NODE_GAIN:
                    break  # doubling the nodes no longer pays
                best_prev = max(best_prev, best_here)

    def _add(self, offer: Offer, nodes: int, config: ParallelConfig, pred: Prediction,
             pricings: Sequence[str]) -> None:
        notes = []
        if not offer.gpu_guaranteed:
            notes.append(f"{offer.provider} does not guarantee the {offer.gpu}: it assigns "
                         "whatever GPU is free, and a slower one stretches the time")
        for pricing in pricings:
            cand = evaluate(offer, nodes, config, pred, pricing, self.target, self.costing,
                            notes=tuple(notes))
            if cand is None:
                self.dropped["cannot finish (throughput or preemptions)"] += 1
                continue
            self.candidates.append(replace(cand, launch=launch_line(cand)))


def _rank_key(c: Candidate) -> tuple:
    if c.meets_deadline:
        return (0, c.cost_usd, c.hours)
    return (1, -round(c.p_meets_deadline, 6), c.cost_usd)


def _dedupe_key(c: Candidate) -> tuple:
    cfg = c.config
    return (c.offer.provider, c.offer.instance_type, c.nodes, strategy_label(cfg),
            cfg.micro_batch, cfg.grad_accum, cfg.precision, c.pricing)


def collapse_dominated(ranked: Sequence[Candidate],
                       keep: Sequence[Candidate] = ()) -> tuple[tuple[Candidate, ...], int]:
    """Drop plans a cheaper sibling makes pointless; returns (kept in order, how many dropped).

    A plan B is dropped when another plan A on the same provider, GPU type and pricing costs
    less, is at most 5 % slower (well inside the prediction's interval), and meets the
    deadline whenever B does: e.g. DDP where ZeRO-1 is faster on the same nodes, a bigger
    host of the same GPU, or twice the nodes for 2 % more speed. Plans in ``keep`` (the
    Pareto set) are never dropped, so the fastest and the cheapest always stay.
    """
    kept_ids = {id(c) for c in keep}
    groups: dict[tuple, list[Candidate]] = {}
    for c in ranked:
        groups.setdefault((c.offer.provider, c.offer.gpu, c.pricing), []).append(c)
    out, dropped = [], 0
    for b in ranked:
        if id(b) not in kept_ids and any(
                a is not b and a.cost_usd < b.cost_usd * (1 - 1e-9)
                and a.hours <= b.hours * _SAME_SPEED
                and (a.meets_deadline or not b.meets_deadline)
                for a in groups[(b.offer.provider, b.offer.gpu, b.pricing)]):
            dropped += 1
            continue
        out.append(b)
    return tuple(out), dropped


def fastest_plan(cands: Sequence[Candidate]) -> Candidate | None:
    """The cheapest plan within 5 % of the shortest predicted time.

    Predictions carry tens of percent of uncertainty, so a plan 1 % faster for ten times the
    money is not "the fastest option" a person wants to see; the cheapest of the plans the
    model cannot tell apart on time is.
    """
    if not cands:
        return None
    quickest = min(c.hours for c in cands)
    return min((c for c in cands if c.hours <= quickest * _SAME_SPEED),
               key=lambda c: (c.cost_usd, c.hours))


def pareto_front(cands: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """The cost-vs-time frontier, fastest first, thinned so each step buys real speed.

    A plan is on it when no other plan is both faster and cheaper; walking from the
    cheapest, a plan is kept only when it is more than 5 % faster than the last one kept
    (smaller steps are inside the prediction's interval), and :func:`fastest_plan` always
    ends it. Every plan on it is on the strict frontier.
    """
    strict: list[Candidate] = []
    best_cost = math.inf
    for c in sorted(cands, key=lambda c: (c.hours, c.cost_usd)):
        if c.cost_usd < best_cost - 1e-9:
            strict.append(c)
            best_cost = c.cost_usd
    if not strict:
        return ()
    kept = [strict[-1]]  # the cheapest
    for c in reversed(strict[:-1]):
        if c.hours * _SAME_SPEED < kept[-1].hours:
            kept.append(c)
    fastest = fastest_plan(cands)
    if fastest is not None and all(fastest is not c for c in kept):
        kept.append(fastest)
    return tuple(sorted(kept, key=lambda c: (c.hours, c.cost_usd)))


def _scaling_point(predictor: Predictor, hw: Hardware, per_node: int, nodes: int,
                   batch: int, precision: str) -> Prediction | None:
    """The first data-parallel shape that fits (DDP, then ZeRO-1/2, FSDP; activation
    checkpointing last), with the per-GPU batch split so it fits in memory."""
    n = per_node * nodes
    for ac in (False, True):
        for strategy in (("single",) if n == 1 else _DATA_PARALLEL_LADDER):
            base = ParallelConfig(gpus_per_node=per_node, nodes=nodes, strategy=strategy,
                                  micro_batch=1, grad_accum=batch, precision=precision,
                                  activation_checkpointing=ac)
            try:
                m_max = int(predictor.max_micro_batch(base, hw))
                if m_max < 1:
                    continue
                mb = _largest_divisor_at_most(batch, m_max)
                p = predictor.predict(replace(base, micro_batch=mb, grad_accum=batch // mb), hw)
            except (ValueError, ArithmeticError):
                continue
            if p.fits:
                return p
    return None


def scaling_points(predictor: Predictor, workload: Workload, offers: Sequence[Offer],
                   gpus: Mapping[str, GpuSpec], hardware_for: HardwareFor,
                   max_gpus: int = 64) -> tuple[ScalingPoint, ...]:
    """Predicted throughput vs GPU count per GPU type: data parallel at the workload's
    per-GPU batch, with the least-sharded strategy that fits (so a model too big for DDP
    still gets a curve)."""
    best_offer: dict[str, Offer] = {}
    for o in offers:
        prev = best_offer.get(o.gpu)
        rank = (o.gpu_count, o.inter_node_gbps, o.intra_node_gb_per_s)
        if prev is None or rank > (prev.gpu_count, prev.inter_node_gbps, prev.intra_node_gb_per_s):
            best_offer[o.gpu] = o
    batch = max(1, (workload.micro_batch or 1) * (workload.grad_accum or 1))
    points = []
    for gpu, o in sorted(best_offer.items()):
        spec = gpus.get(gpu)
        if spec is None:
            continue
        precs = allowed_precisions(workload.precision, spec)
        if not precs:
            continue
        hw = hardware_for(spec, o)
        for n in _SCALING_GPU_COUNTS:
            if n > max_gpus:
                break
            per_node = min(n, o.gpu_count)
            if n % per_node:
                continue
            nodes = n // per_node
            if nodes > 1 and (o.inter_node_gbps <= 0 or nodes > o.max_nodes):
                break
            p = _scaling_point(predictor, hw, per_node, nodes, batch, precs[-1])
            if p is None:
                continue
            points.append(ScalingPoint(gpu=gpu, gpus=n,
                                       throughput_samples_per_s=p.throughput_samples_per_s,
                                       low=p.low, high=p.high))
    return tuple(points)


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
              with_scaling: bool = True) -> Recommendation:
    """Search every allowed offer and return the ranked plans, Pareto set and explanation.

    Raises :class:`NoOffersError` when the search space selects no offer at all.
    """
    started = time.perf_counter()
    chosen = filter_offers(offers, space, gpus)
    search = _Search(predictor, workload, target, space, costing)
    hw_cache: dict[tuple, Hardware] = {}
    for offer in chosen:
        spec = gpus.get(offer.gpu)
        if spec is None:
            search.dropped[f"no GPU spec for {offer.gpu}"] += 1
            continue
        key = (offer.gpu, offer.gpu_count, offer.intra_node_link, offer.intra_node_gb_per_s,
               offer.inter_node_gbps, offer.inter_node_rdma)
        hw = hw_cache.get(key)
        if hw is None:
            hw = hw_cache[key] = hardware_for(spec, offer)
        search.offer(offer, spec, hw)

    best: dict[tuple, Candidate] = {}
    for c in search.candidates:
        k = _dedupe_key(c)
        if k not in best or _rank_key(c) < _rank_key(best[k]):
            best[k] = c
    ranked = tuple(sorted(best.values(), key=_rank_key))
    front = pareto_front(ranked)
    ranked, n_dominated = collapse_dominated(ranked, keep=front)
    if n_dominated:
        search.dropped[DOMINATED_REASON] += n_dominated
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
            f"({cheapest.offer.provider} {cheapest.offer.instance_type} × {cheapest.nodes})")
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
                              space.max_gpus or 64) if with_scaling else ())
    notes.append(f"searched {search.searched} plans over {len(chosen)} offers in "
                 f"{time.perf_counter() - started:.2f} s")
    return Recommendation(
        target=target, candidates=ranked, pareto=front, winner=winner,
        fastest=fastest, cheapest=cheapest, explanation=explanation, whys=whys,
        dropped=dict(search.dropped), searched=search.searched, notes=tuple(notes),
        scaling=scaling,
    )
