"""The global batch of a language model's pre-training, and what binds when no plan meets the
deadline (pure: the analytic predictor of support.recommend)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.recommend import GPUS, OFFERS, AnalyticPredictor, hardware_for

from mlflow_gpuopt.perfmodel.types import Workload
from mlflow_gpuopt.recommend import SearchSpace, Target, recommend
from mlflow_gpuopt.recommend.llm_batch import (
    larger_global_batch,
    pretraining_global_batch,
    tokens_per_step,
)
from mlflow_gpuopt.recommend.shortfall import alternatives, binding_constraint

LLAMA3_8B = Workload(params=8_030_261_248, flops_per_sample=4.74e14, precision="bf16",
                     name="llama3-8b", tokens_per_sample=8192, num_layers=32,
                     hidden_size=4096, micro_batch=1)


@pytest.mark.parametrize("params, tokens", [
    (124e6, 0.5e6), (1.0e9, 1e6), (2.7e9, 1e6), (8e9, 2e6), (13e9, 2e6), (70e9, 3.2e6),
    (405e9, 3.2e6), (1e6, 0.5e6)])
def test_tokens_per_step_follow_gpt3s_table(params, tokens):
    assert tokens_per_step(params)[0] == tokens


def test_sequences_per_step_are_a_power_of_two_near_the_published_tokens():
    # 2 M tokens per step: 244 sequences of 8192 -> 256; 977 of 2048 -> 1024
    assert pretraining_global_batch(LLAMA3_8B).samples == 256
    short = pretraining_global_batch(replace(LLAMA3_8B, tokens_per_sample=2048))
    assert short.samples == 1024 and short.tokens_per_step == 1024 * 2048
    assert "Brown et al. 2020" in short.why and "--global-batch" in short.why
    # a sequence longer than the tokens per step still trains one sequence per step
    assert pretraining_global_batch(replace(LLAMA3_8B, tokens_per_sample=8e6)).samples == 1


def test_no_derived_batch_without_a_sequence_or_for_a_fine_tune():
    assert pretraining_global_batch(replace(LLAMA3_8B, tokens_per_sample=None)) is None
    lora = replace(LLAMA3_8B, trainable_params=4_194_304)
    assert pretraining_global_batch(lora) is None
    assert pretraining_global_batch(replace(LLAMA3_8B, trainable_params=LLAMA3_8B.params))


def test_the_larger_batch_tried_is_the_pretraining_one_else_eight_times():
    assert larger_global_batch(LLAMA3_8B, 8) == 256
    assert larger_global_batch(LLAMA3_8B, 256) == 2048
    assert larger_global_batch(replace(LLAMA3_8B, tokens_per_sample=None), 6) == 48
    assert larger_global_batch(LLAMA3_8B, None) == 256


def _run(target, space=SearchSpace(), **kw):
    return recommend(AnalyticPredictor(LLAMA3_8B), LLAMA3_8B, OFFERS, GPUS, target,
                     hardware_for=hardware_for, space=space, **kw)


def test_a_small_global_batch_binds_and_keep_micro_batch_lifts_it():
    # 100B tokens in 20 h: a global batch of 8 lets at most 8 ranks share a step
    target = Target(total_samples=1e11 / 8192, deadline_hours=20.0, per_rank_batch=1,
                    global_batch=8)
    rec = _run(target)
    assert rec.winner is None and rec.fastest is not None
    assert rec.fastest.hours == min(c.hours for c in rec.candidates)
    assert "what binds: the global batch" in rec.notes[0]
    assert binding_constraint(rec.fastest, target, SearchSpace()).startswith("the global batch")

    def rerun(t, s):
        return _run(t, s, with_scaling=False)

    alts = alternatives(rerun, target, SearchSpace(), max_nodes=16, larger_batch=256)
    flags = [a.flag for a in alts]
    assert flags == ["--keep-micro-batch", "--global-batch 256"]
    by_flag = {a.flag: a for a in alts}
    bigger = by_flag["--global-batch 256"]
    # the larger batch's own search, run here independently, gives the same plan
    direct = _run(replace(target, global_batch=256, global_batch_asked=True))
    assert bigger.plan.hours == pytest.approx((direct.winner or direct.fastest).hours)
    assert bigger.plan.hours < rec.fastest.hours
    assert bigger.meets_deadline is (direct.winner is not None)
    assert "--global-batch 256 gives" in bigger.line()
    assert bigger.as_dict()["nodes"] == bigger.plan.nodes
    # a target counted in steps keeps its batch: only the node flag would be tried
    assert alternatives(rerun, target, SearchSpace(max_nodes=16), max_nodes=16,
                        larger_batch=256, batch_may_change=False) == ()


def test_the_node_limit_binds_where_the_batch_does_not():
    target = Target(total_samples=1e11 / 8192, deadline_hours=1.0, per_rank_batch=1,
                    global_batch=4096)
    space = SearchSpace(max_nodes=1)
    rec = _run(target, space)
    assert rec.winner is None
    why = binding_constraint(rec.fastest, target, space)
    assert why.startswith("the node count") and "--max-nodes" in why
    alts = alternatives(lambda t, s: _run(t, s, with_scaling=False), target, space,
                        max_nodes=16, larger_batch=None)
    more = {a.flag: a for a in alts}["--max-nodes 16"]
    assert more.plan.nodes > 1 and more.plan.hours < rec.fastest.hours
