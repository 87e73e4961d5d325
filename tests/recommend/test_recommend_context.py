"""recommend searches context parallelism for long sequences: the cp shapes it enumerates,
and, through the CLI, a 128k-token Llama-3-8B planned with cp whose memory fits where the
same plan without cp does not."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.recommend import OFFERS

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel.layout import context_degree, without_degree
from mlflow_gpuopt.perfmodel.types import ParallelConfig
from mlflow_gpuopt.recommend.explain import data_parallel_ranks, strategy_label
from mlflow_gpuopt.recommend.search import CP_MIN_SEQ_LEN, _shapes

# Meta-Llama-3-8B's config.json (the keys its shape depends on)
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _eight_gpu_offer():
    return next(o for o in OFFERS if o.gpu_count == 8)


def test_cp_shapes_for_long_sequences_only():
    offer = _eight_gpu_offer()
    def cp_shapes(nodes, seq_len):
        return {s for s, _, _ in _shapes(offer, nodes, seq_len=seq_len) if context_degree(s) > 1}

    assert not cp_shapes(1, CP_MIN_SEQ_LEN // 2)
    # spelled as --strategy and track() spell them: the degree before the flavour
    assert cp_shapes(1, 131072) == {f"cp{cp}x{dp}" for dp in ("zero1", "fsdp") for cp in (2, 4, 8)}
    # a sequence that does not cut into 2·cp equal chunks gets no such degree
    assert cp_shapes(1, CP_MIN_SEQ_LEN + 4) == {"cp2xzero1", "cp2xfsdp"}
    assert "cp16xfsdp" in cp_shapes(2, 131072)


def test_labels_and_ranks_spell_cp():
    cfg = ParallelConfig(gpus_per_node=8, nodes=4, strategy="cp8xzero1", tp=4)
    assert data_parallel_ranks(cfg) == 1  # 32 GPUs / (tp4 x cp8)
    assert strategy_label(cfg) == "tp4+cp8+zero1"
    assert strategy_label(ParallelConfig(gpus_per_node=8, nodes=8, strategy="cp4xfsdp", tp=2)
                          ) == "tp2+cp4+dp8+fsdp"
    assert strategy_label(ParallelConfig(gpus_per_node=8, strategy="cp4xfsdp")) == "cp4xfsdp"


def _cli(*args):
    r = CliRunner().invoke(gpuopt, list(args))
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_128k_llama_gets_cp_plans_that_fit_where_the_same_without_cp_does_not(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    out = _cli("recommend", "--workload", str(path), "--seq-len", "131072", "--tokens", "10B",
               "--provider", "aws", "--no-log", "--json")
    winner = out["winner"]
    assert winner["cp"] > 1 and context_degree(winner["strategy"]) == winner["cp"], winner
    assert f"context parallel {winner['cp']}" in winner["launch"]
    text = CliRunner().invoke(gpuopt, ["recommend", "--workload", str(path), "--seq-len",
                                       "131072", "--tokens", "10B", "--provider", "aws",
                                       "--no-log", "--top", "3"]).output
    assert f", context parallel {winner['cp']} [" in text, text
    cp_plans = [c for c in out["candidates"] if c["cp"] > 1]
    assert cp_plans
    for plan in cp_plans[:3]:
        flavour = without_degree(plan["strategy"], "cp")
        common = ["predict", "--workload", str(path), "--seq-len", "131072",
                  "--gpu", plan["gpu"], "--gpus", str(plan["gpus"]), "--nodes",
                  str(plan["nodes"]), "--micro-batch", str(plan["micro_batch"]),
                  "--grad-accum", str(plan["grad_accum"]), "--precision", plan["precision"],
                  "--instance-type", plan["instance_type"], "--json"]
        if plan["activation_checkpointing"]:
            common.append("--activation-checkpointing")
        model = [f"tp{plan['tp']}"] if plan["tp"] > 1 else []
        model += [f"pp{plan['pp']}"] if plan["pp"] > 1 else []
        with_cp = _cli(*common, "--strategy", "x".join(model + [flavour, f"cp{plan['cp']}"]))
        without = _cli(*common, "--strategy", "x".join(model + [flavour]))
        assert with_cp["fits"], plan
        assert with_cp["memory_per_gpu_bytes"] == plan["memory_per_gpu_bytes"]
        assert not without["fits"], plan
        # the sequence split cp ways: the activations per GPU a cp-th of the plan without it
        assert with_cp["memory"]["activations_bytes"] * plan["cp"] == pytest.approx(
            without["memory"]["activations_bytes"], rel=1e-9)
        assert with_cp["memory"]["cp_buffers_bytes"] > 0
        assert "cp_exchange_s" in with_cp["time_breakdown"]
