"""The quick search (shared explorations, memory first, region twins costed once, dominated
plans dropped as they are costed) gives the same answer as evaluating every offer on its own
and leaving all pruning to the ranking (``recommend(..., exhaustive=True)``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.recommend import BIG, GPUS, OFFERS, RESNET, AnalyticPredictor, hardware_for, offer

from mlflow_gpuopt.catalog import load_catalog
from mlflow_gpuopt.hardware import hardware_for_gpu
from mlflow_gpuopt.perfmodel import Observation, Workload, fit
from mlflow_gpuopt.recommend import SearchSpace, Target, recommend, recommendation_dict

L, H, S = 80, 8192, 4096
PARAMS_70B = 70_553_706_496
LLM_70B = Workload(params=PARAMS_70B, flops_per_sample=6 * PARAMS_70B * S + 12 * L * H * S * S,
                   precision="bf16", name="llama-70b", micro_batch=1, optimizer="AdamW",
                   tokens_per_sample=S, num_layers=L, hidden_size=H, num_heads=64,
                   ffn_hidden_size=28672, mlp="swiglu", vocab_size=128256, attention="sdpa",
                   dropout=0, largest_layer_params=4 * H * H + 3 * H * 28672)


def _catalog_hardware(spec, o):
    return hardware_for_gpu(spec, gpus_per_node=o.gpu_count, offer=o)


def _answer(rec):
    """Everything a user sees of a recommendation except timings and drop counts."""
    doc = recommendation_dict(rec, top=len(rec.candidates))
    for key in ("notes", "dropped", "searched", "predicted", "costed"):
        doc.pop(key, None)

    def plan(c):
        return (c.offer, c.nodes, c.config, c.pricing, c.hours, c.hours_low, c.hours_high,
                c.cost_usd, c.cost_low_usd, c.cost_high_usd, c.p_meets_deadline, c.launch,
                c.notes, c.cost_basis)

    return (doc, [plan(c) for c in rec.candidates], [plan(c) for c in rec.pareto],
            rec.winner and plan(rec.winner), rec.fastest and plan(rec.fastest),
            rec.cheapest and plan(rec.cheapest), rec.explanation, dict(rec.whys))


def _same_answer(run):
    quick, full = run(exhaustive=False), run(exhaustive=True)
    assert quick.candidates, "nothing to compare"
    assert _answer(quick) == _answer(full)
    assert quick.searched == full.searched  # plans considered: the same space
    assert quick.predicted < full.predicted and quick.costed <= full.costed
    doc = recommendation_dict(quick)  # the counts reach --json and recommendation.json
    assert (doc["searched"], doc["predicted"], doc["costed"]) == (
        quick.searched, quick.predicted, quick.costed)
    return quick, full


# Region twins (same instance and prices in two regions) and a second network of a GPU.
_TWINS = [*OFFERS, replace(OFFERS[2], region="eu-west-1"), replace(OFFERS[3], region="us-west-2"),
          offer("gcp", "a3-highgpu-8g", "H100-SXM5-80GB", 8, 88.0, spot=26.0, net_gbps=800)]


@pytest.mark.parametrize("workload,deadline", [(RESNET, 24.0), (RESNET, 2.0), (BIG, 24 * 14.0),
                                               (BIG, None)])
def test_quick_search_equals_exhaustive_on_hand_made_offers(workload, deadline):
    target = Target(total_samples=90 * 1_281_167 if workload is RESNET else 5e7,
                    deadline_hours=deadline, per_rank_batch=workload.micro_batch or 1,
                    global_batch=256 if workload is RESNET else 512)

    def run(exhaustive):
        return recommend(AnalyticPredictor(workload), workload, _TWINS, GPUS, target,
                         hardware_for=hardware_for, exhaustive=exhaustive)

    _same_answer(run)


def test_quick_search_equals_exhaustive_on_the_catalog_for_a_fitted_cnn():
    cat = load_catalog()
    workload = Workload(params=25_557_032, flops_per_sample=3 * 4.1e9 * 2, precision="fp16",
                        name="resnet50", micro_batch=256, optimizer="SGD",
                        optimizer_state_bytes_per_param=4, activation_bytes_per_sample=1.1e8)
    obs = [Observation(gpu="A100-80GB-SXM4", gpu_count=8, throughput_samples_per_s=16621,
                       micro_batch=256, strategy="ddp", precision="fp16")]
    predictor = fit(workload, obs, {"A100-80GB-SXM4": hardware_for_gpu(
        cat.gpus["A100-80GB-SXM4"], gpus_per_node=8)})
    target = Target(total_samples=90 * 1_281_167, deadline_hours=12.0, per_rank_batch=256,
                    global_batch=2048)

    def run(exhaustive):
        return recommend(predictor, workload, cat.offers, cat.gpus, target,
                         hardware_for=_catalog_hardware, space=SearchSpace(max_nodes=8),
                         exhaustive=exhaustive)

    _same_answer(run)


def test_quick_search_equals_exhaustive_for_a_70b_llm_with_compound_layouts():
    cat = load_catalog()
    predictor = fit(LLM_70B, [], {})
    target = Target(total_samples=2e11 / S, deadline_hours=24 * 60.0, global_batch=512)

    def run(exhaustive):
        return recommend(predictor, LLM_70B, cat.offers, cat.gpus, target,
                         hardware_for=_catalog_hardware,
                         space=SearchSpace(providers=("aws", "gcp"), max_nodes=16),
                         exhaustive=exhaustive)

    quick, _ = _same_answer(run)
    # The space has tensor x pipeline x data-parallel layouts, ZeRO-1 and FSDP replicas.
    layouts = {(c.config.strategy, c.config.tp > 1, c.config.pp > 1) for c in quick.candidates}
    assert any(tp and pp for _, tp, pp in layouts) or any(
        s in ("zero1", "fsdp") and (tp or pp) for s, tp, pp in layouts)
