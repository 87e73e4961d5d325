"""The advice rules on given measurements (pure): thresholds, what a rule reads and ignores,
and the ranking by saving."""

from __future__ import annotations

import pytest

from mlflow_gpuopt.advice import Finding, NotEvaluated, RunFacts, ranked
from mlflow_gpuopt.advice import rules
from mlflow_gpuopt.catalog import load_gpus


def facts(**kw) -> RunFacts:
    base = dict(run_id="r", device="cpu", device_count=0, precision="fp32", micro_batch=16)
    return RunFacts(**{**base, **kw})


def rule_ids(items):
    return {x.rule for x in items if isinstance(x, Finding)}


@pytest.mark.parametrize("gpu, cpu, found", [
    (20.0, 95.0, True), (20.0, 50.0, False), (90.0, 95.0, False), (49.9, 80.0, True)])
def test_idle_gpu_busy_cpu_thresholds(gpu, cpu, found):
    items = rules.input_pipeline(facts(gpu_utilization_mean_percent=gpu,
                                       cpu_utilization_mean_percent=cpu))
    assert ("gpu_idle_cpu_busy" in rule_ids(items)) is found


def test_input_wait_threshold_and_missing_measurement():
    assert "input_wait" in rule_ids(rules.input_pipeline(facts(input_wait_fraction=0.10)))
    assert "input_wait" not in rule_ids(rules.input_pipeline(facts(input_wait_fraction=0.09)))
    missing = rules.input_pipeline(facts())
    assert any(isinstance(x, NotEvaluated) and x.rule == "input_wait" for x in missing)


def test_gemm_rule_reads_the_layer_dims_not_the_batch():
    # M (batch × sequence) of 10 is the data, not the model: no finding
    assert rules.gemm_shapes(facts(gemm_shapes=((10, 1024, 4096),))) == []
    (f,) = rules.gemm_shapes(facts(gemm_shapes=((512, 768, 50257), (512, 768, 768))))
    assert f.params["unaligned_flops_share"] == pytest.approx(50257 / (50257 + 768))
    assert "50257 -> 50304" in f.fix  # nanoGPT's padded GPT-2 vocabulary
    assert rules.pad_to(1001, 8) == 1008 and rules.pad_to(1024, 64) == 1024
    # a scalar head (a GAN critic's, a regression's) is thinner than a tile: padding 1 -> 64
    # would multiply its work, so it is no finding even where it is a large share
    assert rules.gemm_shapes(facts(gemm_shapes=((16, 8, 32), (16, 32, 1)))) == []
    (f,) = rules.gemm_shapes(facts(gemm_shapes=((16, 8, 36), (16, 36, 1))))
    assert f.params["unaligned_flops_share"] == pytest.approx(1.0) and "1 ->" not in f.fix


def test_precision_rules_follow_the_gpu():
    gpus = load_gpus()
    a100 = gpus["A100-80GB-SXM4"] if "A100-80GB-SXM4" in gpus else next(
        s for n, s in gpus.items() if n.startswith("A100"))
    assert {"precision_amp", "precision_tf32"} <= rule_ids(rules.precision(facts(), a100))
    assert rule_ids(rules.precision(facts(precision="bf16"), a100)) == set()
    (skip,) = rules.precision(facts(), None)
    assert isinstance(skip, NotEvaluated) and "cpu" in skip.reason
    h100 = next(s for n, s in gpus.items() if s.fp8_tflops)
    big = facts(precision="bf16", params=7_000_000_000)
    assert rule_ids(rules.precision(big, h100)) == {"precision_fp8"}
    assert rule_ids(rules.precision(facts(precision="bf16", params=10**8), h100)) == set()


def test_ranked_by_dollars_then_unpriced_by_share():
    def f(rule, usd, share):
        return Finding(rule, rule, (), "fix", "none", share, usd_saved=usd,
                       hours_saved=None if usd is None else usd / 2)

    items = [f("a", 1.0, 0.9), f("b", None, 0.5), f("c", 30.0, 0.1), f("d", None, 0.7),
             NotEvaluated("e", "why")]
    assert [x.rule for x in ranked(items)] == ["c", "a", "d", "b"]
