"""recommend searches expert parallelism for a mixture of experts: the ep shapes it
enumerates, and the plan it picks for a Mixtral-8x7B-shaped config.json through the CLI."""

from __future__ import annotations

import json

from click.testing import CliRunner
from support.recommend import OFFERS

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel.layout import expert_degree
from mlflow_gpuopt.recommend.search import _expert_shapes, _shapes

MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
           "num_experts_per_tok": 2, "vocab_size": 32000, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}


def _eight_gpu_offer():
    return next(o for o in OFFERS if o.gpu_count == 8)


def test_ep_shapes_divide_the_data_parallel_degree_and_the_experts():
    offer = _eight_gpu_offer()
    dense = _shapes(offer, 1)
    assert not any(expert_degree(s) > 1 for s, _, _ in dense)
    # spelled as --strategy and track() spell them: the degree before the flavour
    eight = {s for s, tp, pp in _shapes(offer, 1, num_experts=8) if expert_degree(s) > 1}
    assert eight == {f"ep{ep}x{dp}" for dp in ("ddp", "zero1", "zero2", "fsdp")
                     for ep in (2, 4, 8)}
    six = {s for s, _, _ in _shapes(offer, 1, num_experts=6) if expert_degree(s) > 1}
    assert six == {f"ep2x{dp}" for dp in ("ddp", "zero1", "zero2", "fsdp")}
    # two nodes: dp 16, but 8 experts cap ep at 8
    two = {s for s, _, _ in _shapes(offer, 2, num_experts=8) if expert_degree(s) > 1}
    assert "ep8xfsdp" in two and "ep16xfsdp" not in two


def test_ep_shapes_fold_over_tensor_parallel_ranks_with_the_experts_unsplit():
    """Compound tp x dp shapes: ep up to dp under Megatron's default (the experts split over
    tp as well), up to tp x dp where the experts' tensor parallel asked is 1."""
    base = [("zero1", 2, 1), ("fsdp", 4, 2)]
    plain = set(_expert_shapes(base, 16, 64))
    assert plain == {("ep2xzero1", 2, 1), ("ep4xzero1", 2, 1), ("ep8xzero1", 2, 1),
                     ("ep2xfsdp", 4, 2)}
    folded = set(_expert_shapes(base, 16, 64, expert_tp=1))
    assert folded == plain | {("ep16xzero1", 2, 1), ("ep4xfsdp", 4, 2), ("ep8xfsdp", 4, 2)}
    # the experts split 2 ways under tp4: a group of up to 4 x 2 / 2 = 4 ranks
    assert set(_expert_shapes(base, 16, 64, expert_tp=2)) == plain | {("ep4xfsdp", 4, 2)}


def test_mixtral_is_recommended_with_expert_parallelism(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    # One node: the experts' all-to-alls stay on NVLink. Across nodes a tp8 x pp4 pipeline of
    # 128 micro-batches on A100 nodes (each GPU sending 1/8 of a stage boundary) is cheaper.
    r = CliRunner().invoke(gpuopt, ["recommend", "--workload", str(path), "--seq-len", "4096",
                                    "--tokens", "10B", "--deadline", "30d", "--max-nodes", "1",
                                    "--global-batch", "256", "--provider", "aws", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    strategies = [c["strategy"] for c in out["candidates"]]
    assert any(expert_degree(s) > 1 for s in strategies), strategies
    win = out["winner"]
    assert expert_degree(win["strategy"]) > 1
    assert f"expert parallel {expert_degree(win['strategy'])}" in win["launch"]
    # the all-to-all in the winner's breakdown and its explanation, the active-parameter
    # FLOPs in the notes
    assert 0 < win["alltoall_s"] <= win["exposed_comm_fraction"] * win["step_time_s"] + 1e-9
    where = next(line for line in out["explanation"] if line.startswith("Where the time"))
    assert "the experts' all-to-all" in where
    assert any("12.9 B active parameters" in n and "46.7 B" in n for n in out["notes"])
    dense = [c for c in out["candidates"] if expert_degree(c["strategy"]) == 1]
    assert all(c["alltoall_s"] == 0 for c in dense)


def test_recommend_plans_with_the_a2a_overlap_asked(tmp_path):
    """--moe-a2a-overlap reaches recommend's plans: inside one NVLink node Mixtral's
    all-to-all is small against the quarter more time the overlap's paired GEMMs take, so the
    plans asked to run it move to layouts where it costs least (fewer paired micro-batches,
    or a plain pipeline, where Megatron cannot run it); a bad word is one line and exit 2."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    base = ["recommend", "--workload", str(path), "--seq-len", "4096", "--tokens", "10B",
            "--deadline", "30d", "--max-nodes", "1", "--global-batch", "256",
            "--provider", "aws", "--json"]
    plain = CliRunner().invoke(gpuopt, base)
    over = CliRunner().invoke(gpuopt, base + ["--moe-a2a-overlap", "1f1b"])
    assert plain.exit_code == 0 and over.exit_code == 0, (plain.output, over.output)

    def best_ep(out):
        plans = [c for c in json.loads(out)["candidates"] if expert_degree(c["strategy"]) > 1]
        return {(c["instance_type"], c["strategy"], c["micro_batch"]): c for c in plans}

    a, b = best_ep(plain.output), best_ep(over.output)
    assert a and b
    # the overlap asked is charged: no plan is predicted faster with it than the best
    # plan of its instance type without it
    for (instance, _, _), c in b.items():
        fastest = min(p["step_time_s"] / p["global_batch"] for k, p in a.items()
                      if k[0] == instance)
        assert c["step_time_s"] / c["global_batch"] >= fastest * (1 - 1e-9), (c, a)
    assert set(a) != set(b)
    # the plans that run it say so, in the JSON and in the launch line
    for c in json.loads(over.output)["candidates"]:
        assert ("--overlap-moe-expert-parallel-comm" in c["launch"]) is c["a2a_overlap"]
    assert not any(c["a2a_overlap"] for c in json.loads(plain.output)["candidates"])
    # auto: on only where it pays, which inside one node it never does for Mixtral
    auto = CliRunner().invoke(gpuopt, base + ["--moe-a2a-overlap", "auto"])
    assert auto.exit_code == 0, auto.output
    plans = json.loads(auto.output)["candidates"]
    assert not any(c["a2a_overlap"] for c in plans)
    assert [(c["strategy"], c["step_time_s"]) for c in plans] == [
        (c["strategy"], c["step_time_s"]) for c in json.loads(plain.output)["candidates"]]
    bad = CliRunner().invoke(gpuopt, base + ["--moe-a2a-overlap", "dualpipe"])
    assert bad.exit_code == 2 and "unknown moe_a2a_overlap" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_launch_line_says_the_overlap_where_the_plan_runs_it():
    from dataclasses import replace

    from support.recommend import GPUS, RESNET, AnalyticPredictor, hardware_for

    from mlflow_gpuopt.recommend import Target, recommend
    from mlflow_gpuopt.recommend.explain import launch_line

    rec = recommend(AnalyticPredictor(RESNET), RESNET, OFFERS, GPUS,
                    Target(1e6, deadline_hours=None, per_rank_batch=4),
                    hardware_for=hardware_for)
    c = rec.candidates[0]
    assert "--overlap-moe-expert-parallel-comm" not in launch_line(c)
    on = replace(c, prediction=replace(c.prediction, a2a_overlap=True))
    assert "the 1F1B all-to-all overlap on (Megatron --overlap-moe-expert-parallel-comm" in \
        launch_line(on)
