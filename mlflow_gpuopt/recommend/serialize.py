"""A recommendation as plain JSON-ready dicts (the ``recommend --json`` contract).

Keys of each candidate are a stable contract (``docs/metrics.md``): rank, provider,
instance_type, gpu, nodes, gpus, strategy, micro_batch, grad_accum, precision, pricing,
throughput_samples_per_s, predicted_hours, predicted_hours_low, predicted_hours_high,
predicted_cost_usd, cost_low_usd, cost_high_usd, p_meets_deadline, meets_deadline, why,
launch. A few more are added.
"""

from __future__ import annotations

from typing import Any

from mlflow_gpuopt.perfmodel.layout import context_degree
from mlflow_gpuopt.recommend.explain import global_batch, strategy_label
from mlflow_gpuopt.recommend.types import Candidate, Recommendation, Target

CANDIDATE_KEYS = (
    "rank", "provider", "instance_type", "gpu", "nodes", "gpus", "strategy", "micro_batch",
    "grad_accum", "precision", "pricing", "throughput_samples_per_s", "predicted_hours",
    "predicted_hours_low", "predicted_hours_high", "predicted_cost_usd", "cost_low_usd",
    "cost_high_usd", "p_meets_deadline", "meets_deadline", "why", "launch",
)


def target_dict(t: Target) -> dict[str, Any]:
    """The target as JSON."""
    return {"total_samples": t.total_samples, "deadline_hours": t.deadline_hours,
            "confidence": t.confidence, "per_rank_batch": t.per_rank_batch,
            "description": t.description,
            "checkpoint_interval_hours": t.checkpoint_interval_hours}


def batch_policy_dict(t: Target) -> dict[str, Any]:
    """``{"global_batch", "mode", "per_rank_batch"}``: what every plan did with the batch.

    ``mode`` is ``kept`` (the measured global batch), ``set`` (the user's), ``derived``
    (chosen for LLM pre-training, ``why`` says how) or ``per-gpu``
    (each GPU keeps ``per_rank_batch``; ``global_batch`` is then None, as it differs per
    plan: see each candidate's ``global_batch``).
    """
    out = {"global_batch": t.global_batch, "mode": t.batch_mode,
           "per_rank_batch": t.per_rank_batch if t.global_batch is None else None}
    if t.batch_mode == "derived":
        out["why"] = t.global_batch_why
    return out


def candidate_dict(c: Candidate, rank: int | None, why: str = "") -> dict[str, Any]:
    """One candidate as JSON (contract keys first, then extras)."""
    cfg = c.config
    return {
        "rank": rank, "provider": c.offer.provider, "instance_type": c.offer.instance_type,
        "gpu": c.offer.gpu, "nodes": c.nodes, "gpus": c.gpus, "strategy": cfg.strategy,
        "micro_batch": cfg.micro_batch, "grad_accum": cfg.grad_accum,
        "precision": cfg.precision, "pricing": c.pricing,
        "throughput_samples_per_s": round(c.throughput_samples_per_s, 6),
        "predicted_hours": round(c.hours, 6), "predicted_hours_low": round(c.hours_low, 6),
        "predicted_hours_high": round(c.hours_high, 6),
        "predicted_cost_usd": round(c.cost_usd, 4), "cost_low_usd": round(c.cost_low_usd, 4),
        "cost_high_usd": round(c.cost_high_usd, 4),
        "p_meets_deadline": round(c.p_meets_deadline, 6), "meets_deadline": c.meets_deadline,
        "why": why, "launch": c.launch,
        # extras
        "region": c.offer.region, "gpus_per_node": cfg.gpus_per_node,
        "strategy_label": strategy_label(cfg), "tp": cfg.tp, "pp": cfg.pp,
        "cp": context_degree(cfg.strategy),
        "global_batch": global_batch(cfg),
        "activation_checkpointing": cfg.activation_checkpointing,
        "price_per_hour_usd": round(c.price_per_hour_usd, 4),
        "usd_per_million_samples": round(c.usd_per_million_samples, 6),
        "memory_per_gpu_bytes": c.prediction.memory.total_bytes,
        # what a job launched as this plan is checked against (``gpuopt accuracy``)
        "throughput_low_samples_per_s": round(c.prediction.low, 6),
        "throughput_high_samples_per_s": round(c.prediction.high, 6),
        "step_time_s": c.prediction.step_time_s,
        "exposed_comm_fraction": (c.prediction.exposed_comm_s / c.prediction.step_time_s
                                  if c.prediction.step_time_s > 0 else 0.0),
        # expert parallelism's dispatch and combine per optimizer step (0 without ep)
        "alltoall_s": c.prediction.alltoall_s,
        # whether the plan runs the 1F1B all-to-all overlap (--moe-a2a-overlap 1f1b, or auto
        # where it pays)
        "a2a_overlap": c.prediction.a2a_overlap,
        "memory_capacity_bytes": c.prediction.memory_capacity_bytes,
        "memory_usable_bytes": c.prediction.memory_usable_bytes,
        "p_fits": (round(c.prediction.p_fits, 6) if c.prediction.p_fits is not None
                   else None),
        "startup_hours": round(c.startup_hours, 6), "overhead_hours": round(c.overhead_hours, 6),
        "sessions": c.sessions, "extrapolated": c.prediction.extrapolated,
        "prediction_basis": c.prediction.basis,
        "notes": list(c.notes), "cost_basis": c.cost_basis,
    }


def recommendation_dict(rec: Recommendation, top: int = 20) -> dict[str, Any]:
    """``{"target", "candidates", "pareto", ...}``: the top ``top`` ranked and the frontier."""
    rank_of = {id(c): i + 1 for i, c in enumerate(rec.candidates)}
    cands = [candidate_dict(c, i + 1, rec.whys.get(i, ""))
             for i, c in enumerate(rec.candidates[:top])]
    pareto = [candidate_dict(c, rank_of.get(id(c)), rec.whys.get(rank_of.get(id(c), 0) - 1, ""))
              for c in rec.pareto]

    def small(c: Candidate | None) -> dict[str, Any] | None:
        if c is None:
            return None
        r = rank_of.get(id(c))
        return candidate_dict(c, r, rec.whys.get((r or 0) - 1, ""))

    return {
        "target": target_dict(rec.target), "batch_policy": batch_policy_dict(rec.target),
        "candidates": cands, "pareto": pareto,
        "meets_deadline": rec.winner is not None,
        "winner": small(rec.winner), "fastest": small(rec.fastest),
        "cheapest": small(rec.cheapest), "explanation": list(rec.explanation),
        "notes": list(rec.notes), "dropped": dict(rec.dropped), "searched": rec.searched,
        "memory_headroom": rec.memory_headroom,
        "predicted": rec.predicted, "costed": rec.costed, "feasible": len(rec.candidates),
        "scaling": [{"gpu": p.gpu, "gpus": p.gpus,
                     "throughput_samples_per_s": p.throughput_samples_per_s,
                     "low": p.low, "high": p.high, "provider": p.provider,
                     "family": p.family, "instance_type": p.instance_type,
                     "nodes": p.nodes} for p in rec.scaling],
    }
