"""Rank the feasible plans and thin them (pure): order by cost where the deadline is met,
else by the odds of meeting it; list tied plans once; drop plans a cheaper sibling makes
pointless; the cost-vs-time Pareto front and the fastest plan."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from mlflow_gpuopt.recommend.explain import strategy_label
from mlflow_gpuopt.recommend.types import Candidate

#: A plan no more than this much faster than a cheaper sibling is not worth a row.
_SAME_SPEED = 1.05
#: The ``dropped`` reason for plans :func:`collapse_dominated` removes (the report counts it).
DOMINATED_REASON = ("dominated: a cheaper plan on the same provider, GPU and pricing is as "
                    "fast (±5%)")
#: The ``dropped`` reason for plans :func:`drop_exact_ties` removes.
TIE_REASON = ("same time and cost as a listed plan on the same offer (e.g. tf32 where it runs "
              "as fast as fp32)")
_STRATEGY_ORDER = ("single", "ddp", "zero1", "zero2", "fsdp", "zero3", "tp", "pp")


def rank_plans(candidates: Sequence[Candidate], own_precision: str,
               ) -> tuple[tuple[Candidate, ...], tuple[Candidate, ...], Counter[str]]:
    """(ranked plans, Pareto front, plans dropped by reason): one plan per instance and
    configuration (the best ranked), exact ties listed once, dominated plans collapsed (the
    front's plans always stay)."""
    dropped: Counter[str] = Counter()
    best: dict[tuple, Candidate] = {}
    for c in candidates:
        k = _dedupe_key(c)
        if k not in best or _rank_key(c) < _rank_key(best[k]):
            best[k] = c
    ranked = tuple(sorted(best.values(), key=_rank_key))
    ranked, n_ties = drop_exact_ties(ranked, own_precision)
    if n_ties:
        dropped[TIE_REASON] += n_ties
    front = pareto_front(ranked)
    ranked, n_dominated = collapse_dominated(ranked, keep=front)
    if n_dominated:
        dropped[DOMINATED_REASON] += n_dominated
    return ranked, front, dropped


def _rank_key(c: Candidate) -> tuple:
    if c.meets_deadline:
        return (0, c.cost_usd, c.hours)
    return (1, -round(c.p_meets_deadline, 6), c.cost_usd)


def _dedupe_key(c: Candidate) -> tuple:
    cfg = c.config
    return (c.offer.provider, c.offer.instance_type, c.nodes, strategy_label(cfg),
            cfg.micro_batch, cfg.grad_accum, cfg.precision, c.pricing)


def _exact(x: float) -> str:
    """A float as a tie key: equal to 12 significant figures (sums in another order agree)."""
    return f"{x:.12g}"


def drop_exact_ties(ranked: Sequence[Candidate], own_precision: str,
                    ) -> tuple[tuple[Candidate, ...], int]:
    """List plans with identical time, cost and P(deadline) on the same offer, nodes and
    pricing once; returns (kept in order, how many dropped).

    Of the tied plans the one kept is the simplest to run: the script's own precision, then
    the simpler strategy (one GPU, DDP, ZeRO-1, …), no activation checkpointing, the larger
    micro-batch; the order does not depend on the search's order.
    """
    own = (own_precision or "fp32").lower()

    def simplicity(c: Candidate) -> tuple:
        cfg = c.config
        strategy = (_STRATEGY_ORDER.index(cfg.strategy) if cfg.strategy in _STRATEGY_ORDER
                    else len(_STRATEGY_ORDER))
        return ((cfg.precision or own) != own, strategy, cfg.tp * cfg.pp,
                cfg.activation_checkpointing, -(cfg.micro_batch or 0), cfg.precision or "",
                c.offer.region)

    chosen: dict[tuple, Candidate] = {}
    for c in ranked:
        key = (c.offer.provider, c.offer.instance_type, c.nodes, c.pricing, _exact(c.hours),
               _exact(c.cost_usd), _exact(c.p_meets_deadline))
        if key not in chosen or simplicity(c) < simplicity(chosen[key]):
            chosen[key] = c
    keep = {id(c) for c in chosen.values()}
    out = tuple(c for c in ranked if id(c) in keep)
    return out, len(ranked) - len(out)


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
    """The plan with the shortest predicted time (the cheaper of equal ones): what "fastest"
    names has to be the fastest row of the table. :func:`pareto_front` also keeps the
    cheapest plan within 5 % of it, which the model cannot tell apart on time."""
    if not cands:
        return None
    return min(cands, key=lambda c: (c.hours, c.cost_usd))


def _near_fastest(cands: Sequence[Candidate]) -> Candidate | None:
    """The cheapest plan within 5 % of the shortest predicted time: predictions carry tens of
    percent of uncertainty, so a plan 1 % faster for ten times the money buys nothing sure."""
    if not cands:
        return None
    quickest = min(c.hours for c in cands)
    return min((c for c in cands if c.hours <= quickest * _SAME_SPEED),
               key=lambda c: (c.cost_usd, c.hours))


def pareto_front(cands: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """The cost-vs-time frontier, fastest first, thinned so each step buys real speed.

    A plan is on it when no other plan is both faster and cheaper; walking from the
    cheapest, a plan is kept only when it is more than 5 % faster than the last one kept
    (smaller steps are inside the prediction's interval); the cheapest plan within 5 % of
    the shortest time and :func:`fastest_plan` always end it (the one step that may buy
    less). Every plan on it is on the strict frontier.
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
    for end in (_near_fastest(cands), fastest_plan(cands)):
        if end is not None and all(end is not c for c in kept):
            kept.append(end)
    return tuple(sorted(kept, key=lambda c: (c.hours, c.cost_usd)))
