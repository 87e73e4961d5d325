"""Group-limited routing, simulated against the model's count (docs/models.md#mixture-of-experts).

Megatron-core's group-limited top-k as DeepSeek-V3's router runs it (``group_limited_topk``:
sigmoid scores, each group ranked by the sum of its top ``k/g`` scores, the best ``g``
groups kept, the top ``k`` experts inside them), over the forced balance's random logits
(standard normal, ``apply_random_logits``), against ``moe.distinct_groups``: the expected
number of blocks of consecutive experts (nodes, ranks) a token's experts fall in, with and
without the limit. Run: ``PYTHONPATH=.. python moe_group_routing.py [--tokens N]``.
"""

from __future__ import annotations

import argparse

import numpy as np

from mlflow_gpuopt.perfmodel import moe


def simulate(experts: int, k: int, groups: int, per_token: int, blocks: tuple[int, ...],
             tokens: int, seed: int = 0) -> dict[int, float]:
    """Mean distinct blocks a token reaches, per block count, over ``tokens`` random tokens."""
    rng = np.random.default_rng(seed)
    scores = 1.0 / (1.0 + np.exp(-rng.standard_normal((tokens, experts))))
    per_group = experts // groups
    ranked = np.sort(scores.reshape(tokens, groups, per_group), axis=-1)
    group_score = ranked[:, :, -(k // per_token):].sum(axis=-1)
    chosen = np.argsort(-group_score, axis=1)[:, :per_token]
    keep = np.zeros((tokens, groups), dtype=bool)
    np.put_along_axis(keep, chosen, True, axis=1)
    masked = np.where(np.repeat(keep, per_group, axis=1), scores, -1.0)
    picked = np.argsort(-masked, axis=1)[:, :k]
    out = {}
    for b in blocks:
        block = np.sort(picked // (experts // b), axis=1)
        out[b] = float(np.mean(1 + np.sum(np.diff(block, axis=1) != 0, axis=1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000)
    args = ap.parse_args()
    experts, k, groups, per_token = 256, 8, 8, 4  # DeepSeek-V3's config.json
    blocks = (8, 16, 64)
    sim = simulate(experts, k, groups, per_token, blocks, args.tokens)
    print(f"DeepSeek-V3 routing ({experts} experts, top-{k}, {per_token} of {groups} groups), "
          f"{args.tokens} tokens of random logits")
    for b in blocks:
        print(f"  {b:3d} blocks of {experts // b:3d} experts: simulated {sim[b]:.2f}, "
              f"model {moe.distinct_groups(experts, k, b, 'random', groups, per_token):.2f}, "
              f"without the limit {moe.distinct_groups(experts, k, b):.2f}")


if __name__ == "__main__":
    main()
