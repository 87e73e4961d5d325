"""Wall time, cost and P(meets deadline) of one plan, from its predicted throughput.

Wall time = compute (``perfmodel.time_to_train``: whole steps × step time) + start-up,
stretched by spot preemptions (each one costs a restart and, on average, half a checkpoint
interval of lost work) and by Colab's session cap (a job longer than a session restarts
from a checkpoint). Cost rounds each node's billed time up to the provider's increment and
minimum. Throughput is log-normal (the prediction's ``log_sigma``), which turns a deadline
into a probability.

Colab is billed in compute units (CU), not hours (:func:`compute_unit_cost`):

* pay-as-you-go (no monthly fee in the catalog row) is sold in packs of
  :data:`COMPUTE_UNITS_PER_PACK` CU at the row's $/CU (100 CU for $9.99, the smallest
  purchase), so a job costs whole packs: ceil(CU used ÷ 100) × $9.99, and a 10-minute job
  pays $9.99, not the cents its CUs are worth. Its ``pricing`` is ``on_demand`` (the contract's
  values are on_demand | spot | subscription);
* Pro / Pro+ (``subscription_usd_per_month`` set) cost the monthly fee for every month the
  job spans, which includes ``compute_units_per_month`` CU; CUs beyond those are bought in
  the same packs. A short job on Pro+ therefore costs the whole $49.99. Its ``pricing`` is
  ``subscription``.
"""

from __future__ import annotations

import math

from mlflow_gpuopt.catalog.schema import Offer
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.time_to_train import time_to_train
from mlflow_gpuopt.perfmodel.types import ParallelConfig, Prediction
from mlflow_gpuopt.recommend.explain import preemption_text, sig
from mlflow_gpuopt.recommend.types import Candidate, Costing, Target

#: Below this the deadline is treated as impossible (avoids log of tiny numbers).
_EPS_HOURS = 1e-9
#: Average hours in a month (365.25 × 24 / 12): how often a subscription's fee recurs.
HOURS_PER_MONTH = 730.5
#: Colab sells compute units in packs of 100 (100 CU for $9.99, TechCrunch 2022-09-29, as
#: the Colab rows' ``source`` cites; the row's ``usd_per_compute_unit`` is the pack price ÷
#: 100): the smallest purchase, and extra CU on Pro/Pro+ come in the same packs.
COMPUTE_UNITS_PER_PACK = 100


def normal_cdf(z: float) -> float:
    """Standard normal CDF."""
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def billed_hours(wall_hours: float, offer: Offer) -> float:
    """Hours one node is billed for ``wall_hours`` of use (increment and minimum applied)."""
    seconds = wall_hours * 3600.0
    inc = max(1, offer.billing_increment_s)
    billed = math.ceil(seconds / inc - 1e-9) * inc
    return max(billed, offer.billing_minimum_s) / 3600.0


def _usd_per_compute_unit(offer: Offer) -> float:
    if offer.usd_per_compute_unit:
        return offer.usd_per_compute_unit
    cu_h = offer.compute_units_per_hour
    return offer.price_per_hour_usd / cu_h if cu_h else 1.0


def compute_units_used(wall_hours: float, offer: Offer) -> float:
    """Compute units a Colab job of ``wall_hours`` burns (billed time × CU per hour)."""
    cu_h = offer.compute_units_per_hour or offer.price_per_hour_usd / _usd_per_compute_unit(offer)
    return billed_hours(wall_hours, offer) * cu_h


def _packs(cu: float) -> int:
    """Packs of :data:`COMPUTE_UNITS_PER_PACK` CU that buy ``cu`` (none for none)."""
    return max(0, math.ceil(cu / COMPUTE_UNITS_PER_PACK - 1e-9))


def compute_unit_cost(wall_hours: float, offer: Offer) -> tuple[float, str]:
    """($, how it was computed) for a Colab job of ``wall_hours`` on ``offer``.

    Pay-as-you-go: whole packs of 100 CU at the pack price (at least one). Subscription: one
    monthly fee per month the job spans (its CUs included), plus whole packs for any
    further CUs.
    """
    cu = compute_units_used(wall_hours, offer)
    rate = _usd_per_compute_unit(offer)
    pack_usd = COMPUTE_UNITS_PER_PACK * rate
    fee = offer.subscription_usd_per_month
    if not fee:
        packs = max(1, _packs(cu))
        return packs * pack_usd, (
            f"pay-as-you-go: job uses ~{sig(cu)} CU, bought as {packs} pack"
            f"{'s' if packs > 1 else ''} of {COMPUTE_UNITS_PER_PACK} CU × ${pack_usd:,.2f} "
            f"(Colab's smallest purchase; ~{sig(packs * COMPUTE_UNITS_PER_PACK - cu)} CU "
            "left over)")
    months = max(1, math.ceil(wall_hours / HOURS_PER_MONTH - 1e-9))
    included = months * (offer.compute_units_per_month or 0.0)
    extra = max(0.0, cu - included)
    packs = _packs(extra)
    text = (f"subscription: {months} month{'s' if months > 1 else ''} × ${fee:,.2f} "
            f"({included:,.0f} CU included), job uses ~{sig(cu)} CU")
    if packs:
        text += (f", {extra:,.0f} more CU bought as {packs} pack{'s' if packs > 1 else ''} "
                 f"of {COMPUTE_UNITS_PER_PACK} CU × ${pack_usd:,.2f}")
    return months * fee + packs * pack_usd, text


class _WallModel:
    """Maps compute hours to wall hours for one offer/pricing, and back (for deadlines)."""

    def __init__(self, offer: Offer, nodes: int, pricing: str, target: Target,
                 costing: Costing) -> None:
        self.startup = costing.startup_hours.get(offer.provider, costing.default_startup_hours)
        # a restart pays a new start-up and loses, on average, half a checkpoint interval
        self.lost_work = target.checkpoint_interval_hours / 2
        self.lost_per_restart = self.startup + self.lost_work
        self.stretch = 1.0
        if pricing == "spot":
            load = nodes * costing.spot_preemptions_per_node_hour * self.lost_per_restart
            # renewal argument: a fraction `load` of wall time goes to restarts and lost work
            self.stretch = 1.0 / (1.0 - load) if load < 0.9 else math.inf
        self.cap = offer.max_session_hours

    def sessions(self, compute_hours: float) -> int:
        if not self.cap:
            return 1
        n = 1
        for _ in range(3):  # fixed point: restarts lengthen the job, which may need another
            wall = compute_hours + n * self.startup + (n - 1) * self.lost_work
            n = max(1, math.ceil(wall / self.cap - 1e-9))
        return n

    def wall(self, compute_hours: float) -> float:
        n = self.sessions(compute_hours)
        return compute_hours * self.stretch + n * self.startup + (n - 1) * self.lost_work

    def max_compute_for(self, deadline_hours: float) -> float:
        """Most compute hours that still finish by ``deadline_hours`` (<= 0: impossible)."""
        if not self.cap:
            return (deadline_hours - self.startup) / self.stretch
        n = max(1, math.ceil(deadline_hours / self.cap - 1e-9))
        return deadline_hours - n * self.startup - (n - 1) * self.lost_work


def money_rate(usd: float) -> str:
    """'$32.77' or '$0.196' (three significant figures below a dollar)."""
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.3g}"


def price_per_hour(offer: Offer, nodes: int, pricing: str) -> float:
    """$ per hour for the whole job at ``pricing`` (``spot`` uses the spot price)."""
    if pricing == "spot":
        if offer.spot_price_per_hour_usd is None:
            raise ValueError(f"{offer.instance_type} has no spot price")
        return offer.spot_price_per_hour_usd * nodes
    return offer.price_per_hour_usd * nodes


def evaluate(offer: Offer, nodes: int, config: ParallelConfig, prediction: Prediction,
             pricing: str, target: Target, costing: Costing, *, launch: str = "",
             notes: tuple[str, ...] = ()) -> Candidate | None:
    """Time, cost and P(meets deadline) of one plan; ``None`` if it can never finish."""
    thr = prediction.throughput_samples_per_s
    if not thr > 0:
        return None
    model = _WallModel(offer, nodes, pricing, target, costing)
    if not math.isfinite(model.stretch):
        return None
    sigma = prediction.log_sigma
    if pricing == "spot":
        sigma = math.hypot(sigma, costing.spot_extra_log_sigma)
    try:  # whole optimizer steps (a partly filled last step takes a full step's time)
        steps = time_to_train(prediction, samples=target.total_samples)
    except PerfModelError:
        return None
    c_med = steps.hours
    c_slow = (steps.hours_high if math.isfinite(steps.hours_high)
              else c_med * math.exp(2 * sigma))
    hours = model.wall(c_med)
    hours_low = model.wall(min(steps.hours_low, c_med))
    hours_high = model.wall(max(c_slow, c_med))
    c_mean = c_med * math.exp(sigma * sigma / 2)  # E[1/X] for a log-normal X
    rate = price_per_hour(offer, nodes, pricing)

    cu_billed = offer.pricing == "compute_units"

    def cost(wall_hours: float) -> float:
        if cu_billed:
            return compute_unit_cost(wall_hours, offer)[0] * nodes
        return billed_hours(wall_hours, offer) * rate

    if target.deadline_hours is None:
        p_meets = 1.0
    else:
        c_max = model.max_compute_for(target.deadline_hours)
        if c_max <= _EPS_HOURS:
            p_meets = 0.0
        elif sigma <= 0:
            p_meets = 1.0 if c_med <= c_max else 0.0
        else:
            p_meets = normal_cdf((math.log(c_max) - math.log(c_med)) / sigma)
    sessions = model.sessions(c_med)
    extra_notes = list(notes)
    if sessions > 1:
        restart_h = (sessions - 1) * model.lost_per_restart
        extra_notes.append(
            f"needs {sessions} sessions under the {offer.max_session_hours:g} h session cap: "
            f"resume from a checkpoint each time (~{restart_h:.1f} h of restarts and lost "
            f"work counted in the time and cost)")
    if pricing == "spot":
        expected = nodes * costing.spot_preemptions_per_node_hour * hours
        extra_notes.append(
            f"spot: {preemption_text(expected)}; checkpoint every "
            f"{target.checkpoint_interval_hours * 60:.0f} min (each preemption costs a "
            f"restart and ~{model.lost_work * 60:.0f} min of lost work, counted)")
    if cu_billed:
        pricing = "subscription" if offer.subscription_usd_per_month else "on_demand"
        cost_basis = compute_unit_cost(model.wall(c_mean), offer)[1]
    else:
        billed = billed_hours(model.wall(c_mean), offer)
        cost_basis = f"{money_rate(rate)}/h × {billed:,.2f} h (expected billed time)"
    return Candidate(
        offer=offer, nodes=nodes, config=config, prediction=prediction,
        pricing=pricing, cost_basis=cost_basis,
        price_per_hour_usd=rate, hours=hours, hours_low=min(hours_low, hours),
        hours_high=max(hours_high, hours), cost_usd=cost(model.wall(c_mean)),
        cost_low_usd=min(cost(hours_low), cost(hours)), cost_high_usd=max(cost(hours_high),
                                                                          cost(hours)),
        p_meets_deadline=p_meets, meets_deadline=p_meets >= target.confidence,
        startup_hours=model.startup * sessions,
        overhead_hours=hours - c_med - model.startup * sessions,
        sessions=sessions, notes=tuple(extra_notes), launch=launch,
    )
