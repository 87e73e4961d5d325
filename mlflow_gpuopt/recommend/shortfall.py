"""When no plan meets the deadline: which constraint binds, and what the flags that lift it
(``--global-batch``, ``--keep-micro-batch``, ``--max-nodes``) would give.

Pure: the search to rerun is passed in (:data:`Rerun`), so this module never reaches for the
catalog or the model itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from mlflow_gpuopt.recommend.explain import data_parallel_ranks, hours_text, money
from mlflow_gpuopt.recommend.types import Candidate, Recommendation, SearchSpace, Target

#: Runs the same search for another target or search space (no scaling chart needed).
Rerun = Callable[[Target, SearchSpace], Recommendation]


def binding_constraint(fastest: Candidate, target: Target, space: SearchSpace) -> str:
    """What stops the fastest plan from going faster, in words: the global batch (its
    data-parallel ranks cannot double and still split it), the node or GPU limit, or
    scaling itself (doubling the nodes stopped paying, under 5 % faster)."""
    dp = data_parallel_ranks(fastest.config)
    g = target.global_batch
    if g is not None and (g // dp <= 1 or g % (2 * dp)):
        return (f"the global batch: {g:,} samples per step over the fastest plan's {dp} "
                f"data-parallel rank{'s' if dp > 1 else ''} ({g // dp:,} each) cannot be "
                "split over twice the ranks")
    offer_cap = fastest.offer.max_nodes if fastest.offer.inter_node_gbps > 0 else 1
    cap = min(space.max_nodes, offer_cap)
    if 2 * fastest.nodes > cap:
        who = ("--max-nodes" if space.max_nodes < offer_cap
               else f"the largest {fastest.offer.instance_type} cluster")
        return f"the node count: the fastest plan uses {fastest.nodes} of {cap} ({who})"
    if space.max_gpus and 2 * fastest.gpus > space.max_gpus:
        return f"--max-gpus {space.max_gpus}: the fastest plan uses {fastest.gpus} GPUs"
    return ("scaling: doubling the fastest plan's nodes gains under 5 % (communication and "
            "per-step latency outgrow the compute each GPU saves)")


@dataclass(frozen=True)
class Alternative:
    """What one flag would give: the cheapest plan meeting the deadline with it, else its
    fastest plan (``None``: nothing fits with it either)."""

    flag: str
    meets_deadline: bool
    plan: Candidate | None

    def as_dict(self) -> dict:
        """JSON: the flag, whether it meets the deadline, and the plan's hours, cost, shape."""
        p = self.plan
        return {"flag": self.flag, "meets_deadline": self.meets_deadline,
                "predicted_hours": p.hours if p else None,
                "predicted_cost_usd": p.cost_usd if p else None,
                "provider": p.offer.provider if p else None,
                "instance_type": p.offer.instance_type if p else None,
                "nodes": p.nodes if p else None, "gpus": p.gpus if p else None}

    def line(self) -> str:
        """``--keep-micro-batch gives 41 h for $12,345 (aws p5.48xlarge × 8), meeting it``."""
        if self.plan is None:
            return f"{self.flag}: no plan fits either"
        p = self.plan
        what = "meeting the deadline" if self.meets_deadline else "still late (its fastest)"
        return (f"{self.flag} gives {hours_text(p.hours)} for {money(p.cost_usd)} "
                f"({p.offer.provider} {p.offer.instance_type} × {p.nodes}), {what}")


def alternatives(rerun: Rerun, target: Target, space: SearchSpace, *, max_nodes: int,
                 larger_batch: int | None, batch_may_change: bool = True
                 ) -> tuple[Alternative, ...]:
    """The searches a user would try next, each rerun once: ``--keep-micro-batch`` (each GPU
    keeps its batch), ``--global-batch larger_batch`` and, where ``space`` limits them, the
    catalog's ``max_nodes`` without a GPU cap. ``batch_may_change`` False (a target counted
    in optimizer steps, whose samples depend on the batch) leaves the batch ones out."""
    tries: list[tuple[str, Target, SearchSpace]] = []
    if batch_may_change and target.global_batch is not None:
        tries.append(("--keep-micro-batch", replace(target, global_batch=None,
                                                    global_batch_asked=False,
                                                    global_batch_why=""), space))
        if larger_batch and larger_batch > target.global_batch:
            tries.append((f"--global-batch {larger_batch}",
                          replace(target, global_batch=larger_batch, global_batch_asked=True,
                                  global_batch_why=""), space))
    if space.max_nodes < max_nodes or space.max_gpus:
        tries.append((f"--max-nodes {max_nodes}" + (" without --max-gpus" if space.max_gpus
                                                    else ""),
                      target, replace(space, max_nodes=max_nodes, max_gpus=None)))
    out = []
    for flag, t, s in tries:
        rec = rerun(t, s)
        plan = rec.winner or rec.fastest
        out.append(Alternative(flag=flag, meets_deadline=rec.winner is not None, plan=plan))
    return tuple(out)
