"""`predict` on a Mixtral-8x7B-shaped config.json with expert parallelism: the all-to-all
in the JSON breakdown, the active-parameter FLOPs in the assumptions, bad ep degrees as one
line and exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt

MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
           "num_experts_per_tok": 2, "vocab_size": 32000, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}


@pytest.fixture()
def config(tmp_path):
    path = tmp_path / "mixtral" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(MIXTRAL))
    return str(path)


def _predict(config, strategy, *extra):
    return CliRunner().invoke(gpuopt, ["predict", "--workload", config, "--seq-len", "4096",
                                       "--gpu", "H100", "--gpus", "8", "--strategy", strategy,
                                       "--micro-batch", "1", *extra])


def test_ep8_shows_the_alltoall_and_the_active_flops(config):
    r = _predict(config, "ep8xfsdp", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    t = out["time_breakdown"]
    # 4 all-to-alls × 32 layers of 4096 tokens × 4096 × top-2 × 2 bytes × 7/8 over NVLink
    # (450 GB/s at 0.75 bus efficiency): ~22 ms, within the exposed communication
    one = 5e-6 + 4096 * 4096 * 2 * 2 * 7 / 8 / (450e9 * 0.75)
    assert t["alltoall_s"] == pytest.approx(4 * 32 * one, rel=0.01)
    assert 0 < t["alltoall_s"] <= t["exposed_comm_s"]
    words = " ".join(out["assumptions"])
    assert "12.9 B active parameters" in words and "46.7 B" in words
    assert "expert parallel ep8" in words and "all-to-alls" in words
    dense = json.loads(_predict(config, "fsdp", "--json").output)
    assert dense["time_breakdown"]["alltoall_s"] == 0


def test_ep8_text_output_names_the_alltoall(config):
    r = _predict(config, "ep8xfsdp")
    assert r.exit_code == 0, r.output
    assert "expert parallel ep8" in r.output and "inside a node" in r.output


@pytest.mark.parametrize("strategy, words", [
    ("ep3xfsdp", "must divide tp1 x the data-parallel degree 8"),
    ("tp4xep4xfsdp", "must divide tp4 x the data-parallel degree 2 (an expert group wider"),
    ("tp4xep16xfsdp", "must divide tp4 x the data-parallel degree 2 (the expert-parallel"),
    ("ep", "ep needs a number"),
])
def test_bad_ep_is_one_line_and_exit_2(config, strategy, words):
    r = _predict(config, strategy)
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_ep_on_a_dense_model_is_one_line(tmp_path):
    dense = {k: v for k, v in MIXTRAL.items() if "expert" not in k}
    dense.update(model_type="mistral", architectures=["MistralForCausalLM"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dense))
    r = _predict(str(path), "ep8xfsdp")
    assert r.exit_code == 2 and "mixture-of-experts workload" in r.output


def test_the_dispatcher_flags_reach_predict_and_recommend(config):
    flex = json.loads(_predict(config, "ep8xfsdp", "--json", "--moe-dispatcher", "deepep")
                      .output)
    words = " ".join(flex["assumptions"])
    assert "flex dispatcher (random routing)" in words and "dispatches and combines" in words
    r = CliRunner().invoke(gpuopt, ["recommend", "--workload", config, "--seq-len", "4096",
                                    "--tokens", "1B", "--moe-routing", "zigzag"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == ("Error: --moe-routing: unknown moe_routing 'zigzag'; expected "
                                "random or round_robin")


def test_the_attention_kernel_flag_reaches_the_workload(config):
    """``--attention-kernel te`` times attention at FlashAttention-3's 61 % of H100's peak
    (the assumption names it), the default at FlashAttention-2's 35 %: faster; a bad word is
    one line and exit 2."""
    default = json.loads(_predict(config, "ep8xfsdp", "--json").output)
    te = json.loads(_predict(config, "ep8xfsdp", "--json", "--attention-kernel", "te").output)
    words = " ".join(te["assumptions"])
    assert "attention (fa3" in words and "at 61% of" in words
    assert "attention (fa2" in " ".join(default["assumptions"]) and "at 35% of" in " ".join(
        default["assumptions"])
    assert te["throughput_samples_per_s"] > default["throughput_samples_per_s"]
    r = _predict(config, "ep8xfsdp", "--attention-kernel", "flash9")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip() == ("Error: --attention-kernel: unknown attention_kernel 'flash9'; "
                                "expected fa2, fa3, te, cudnn or sdpa")


def test_recommend_keeps_the_experts_tensor_parallel_it_was_given(config):
    """``recommend --expert-tensor-parallel 2`` plans only layouts whose tp it divides (the
    experts split within the tensor-parallel group); without the flag tp-1 plans win, so the
    filter is what removes them."""
    def plans(*extra):
        r = CliRunner().invoke(gpuopt, ["recommend", "--workload", config, "--seq-len", "4096",
                                        "--tokens", "1B", "--deadline", "1000h", "--json",
                                        *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["candidates"]

    free, etp2 = plans(), plans("--expert-tensor-parallel", "2")
    assert any(c["tp"] % 2 for c in free)
    assert etp2 and all(c["tp"] % 2 == 0 for c in etp2)


@pytest.mark.parametrize("doc, words", [
    ({**MIXTRAL, "sliding_window": 128, "layer_types": ["sliding_attention"] * 3},
     "'layer_types' must list one attention type per layer (32)"),
    ({**MIXTRAL, "sliding_window": -4}, "'sliding_window' must be a whole number"),
])
def test_a_bad_sliding_window_in_a_config_is_one_line_and_exit_2(tmp_path, doc, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    r = _predict(str(path), "ep8xfsdp")
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("extra, words", [
    ({"sliding_window_layers": 40}, "'sliding_window_layers' (40) must be at most 'num_layers'"),
    ({"sliding_window_layers": 8, "sliding_window": None}, "needs 'sliding_window'"),
])
def test_a_bad_window_in_a_workload_file_is_one_line_and_exit_2(tmp_path, extra, words):
    doc = {"params": 7e9, "flops_per_sample": 1.7e14, "precision": "bf16",
           "tokens_per_sample": 4096, "num_layers": 32, "hidden_size": 4096, "num_heads": 32,
           "sliding_window": 1024, **extra}
    path = tmp_path / "workload.json"
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu", "H100",
                                    "--gpus", "8", "--strategy", "fsdp", "--micro-batch", "1"])
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


def test_a_windowed_workload_files_attention_share_counts_its_band_and_zero_layers_none(
        tmp_path):
    from mlflow_gpuopt.perfmodel.compute import attention_flops_share
    from mlflow_gpuopt.workload_files import read_workload

    base = {"params": 7e9, "flops_per_sample": 2.0e16, "precision": "bf16",
            "tokens_per_sample": 32768, "num_layers": 32, "hidden_size": 4096,
            "num_heads": 32}
    shares = {}
    for name, extra in (("full", {}), ("none", {"sliding_window": 1024,
                                                "sliding_window_layers": 0}),
                        ("half", {"sliding_window": 1024, "sliding_window_layers": 16})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**base, **extra}))
        shares[name] = attention_flops_share(read_workload(str(path)).workload)
    assert shares["none"] == shares["full"] < 0.5  # below the cap
    # 16 of 32 layers at 2 x 1024 of 32768 keys: 17/32 of the square
    assert shares["half"] == pytest.approx(shares["full"] * (16 + 16 * 2048 / 32768) / 32)


def test_ep_folded_over_tensor_parallel_ranks(config):
    """tp2 × ep8 on 8 GPUs (4 replicas): the expert group takes the tensor-parallel pairs too
    when the experts are not split over them (Megatron's MoE parallel folding, as
    Megatron-Bridge's Qwen3-235B H100 preset tp2 × ep32 over 16 replicas): each rank
    dispatches its 2,048 tokens (sequence parallel) to the 7 other ranks of the node; the
    default (experts split over tp) has no room for ep8 and says how to fold."""
    r = _predict(config, "tp2xep8xfsdp", "--expert-tensor-parallel", "1", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    one = 5e-6 + 2048 * 4096 * 2 * 2 * 7 / 8 / (450e9 * 0.75)
    assert out["time_breakdown"]["alltoall_s"] == pytest.approx(4 * 32 * one, rel=0.01)
    # each rank holds one expert whole and a quarter of the rest's share (tp2 x fsdp4):
    # more weights than ep8 x fsdp8's 1/8 of the dense part, fewer than tp2 x fsdp's
    tp_only = json.loads(_predict(config, "tp2xfsdp", "--json").output)
    assert out["memory"]["weights_bytes"] < tp_only["memory"]["weights_bytes"]
    r = _predict(config, "tp2xep8xfsdp")
    assert r.exit_code == 2 and "--expert-tensor-parallel 1" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_a2a_overlap_flag_and_workload_key_agree(config, tmp_path):
    """--moe-a2a-overlap 1f1b and the workload's moe_a2a_overlap (Megatron-core's spelling)
    give the same prediction; over 8 micro-batches inside one NVLink node Mixtral's small
    all-to-all costs less than the paired GEMMs' lost efficiency, so the overlap adds seconds
    and the notes say to plan without it (one micro-batch alone has nothing to pair with)."""
    accum = ("--grad-accum", "8", "--json")
    plain = _predict(config, "ep8xfsdp", *accum)
    assert plain.exit_code == 0, plain.output
    flag = _predict(config, "ep8xfsdp", "--moe-a2a-overlap", "1f1b", *accum)
    assert flag.exit_code == 0, flag.output
    # the same model as a workload.json, Megatron-core's boolean flag in it
    from mlflow_gpuopt.hf_config import workload_doc

    doc, _ = workload_doc(MIXTRAL, 4096, name="mixtral")
    doc["overlap_moe_expert_parallel_comm"] = True
    path = tmp_path / "workload.json"
    path.write_text(json.dumps(doc))
    key = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu", "H100",
                                      "--gpus", "8", "--strategy", "ep8xfsdp",
                                      "--micro-batch", "1", *accum])
    assert key.exit_code == 0, key.output
    a, b, c = (json.loads(r.output) for r in (plain, flag, key))
    assert b["throughput_samples_per_s"] == pytest.approx(c["throughput_samples_per_s"])
    assert b["time_breakdown"]["alltoall_s"] > a["time_breakdown"]["alltoall_s"] > 0
    assert b["throughput_samples_per_s"] < a["throughput_samples_per_s"]
    assert any("1F1B overlap" in n for n in b["assumptions"])
    assert any("costs more here than it hides" in n for n in b["assumptions"])
    assert b["a2a_overlap"] is True and a["a2a_overlap"] is False
    assert not any("costs more here" in n for n in a["assumptions"])
    single = json.loads(_predict(config, "ep8xfsdp", "--moe-a2a-overlap", "1f1b",
                                 "--json").output)
    alone = json.loads(_predict(config, "ep8xfsdp", "--json").output)
    assert single["time_breakdown"]["alltoall_s"] == pytest.approx(
        alone["time_breakdown"]["alltoall_s"])


def test_a2a_overlap_auto_plans_without_it_where_it_would_cost(config, tmp_path):
    """--moe-a2a-overlap auto: inside one node the overlap would cost more than Mixtral's
    all-to-all, so the plan is the one without it, and says so; on a pipeline without
    virtual stages (which Megatron refuses 1f1b on) auto is no error; a measured run cannot
    be auto (one line, exit 2)."""
    accum = ("--grad-accum", "8", "--json")
    none = json.loads(_predict(config, "ep8xfsdp", *accum).output)
    auto = _predict(config, "ep8xfsdp", "--moe-a2a-overlap", "auto", *accum)
    assert auto.exit_code == 0, auto.output
    a = json.loads(auto.output)
    assert a["throughput_samples_per_s"] == pytest.approx(none["throughput_samples_per_s"])
    assert any("auto, left off" in n for n in a["assumptions"])
    assert a["a2a_overlap"] is False and none["a2a_overlap"] is False
    piped = _predict(config, "pp2xep4xzero1", "--moe-a2a-overlap", "auto", *accum)
    assert piped.exit_code == 0, piped.output
    csv = tmp_path / "obs.csv"
    csv.write_text("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,"
                   "precision,grad_accum,moe_a2a_overlap\n"
                   "H100,8,1,1,4.0,ep8xfsdp,bf16,8,auto\n")
    bad = _predict(config, "ep8xfsdp", "--observations", str(csv))
    assert bad.exit_code == 2, bad.output
    assert "a measured run ran the 1F1B overlap or did not" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


@pytest.mark.parametrize("extra, words", [
    (("--moe-a2a-overlap", "dualpipe"), "unknown moe_a2a_overlap"),
    (("--moe-a2a-overlap", "1f1b"), "needs the interleaved schedule"),
])
def test_a2a_overlap_bad_word_or_layout_is_one_line(config, extra, words):
    r = _predict(config, "pp2xep4xzero1", *extra)
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_observations_carry_the_measured_runs_overlap(config, tmp_path):
    """A run measured with the overlap is read with it: planning the same layout with it
    predicts about the measurement, without it faster (inside one node the overlap's paired
    GEMMs lose more than its small all-to-all hides)."""
    csv = tmp_path / "obs.csv"
    csv.write_text("gpu,gpu_count,nodes,micro_batch,throughput_samples_per_s,strategy,"
                   "precision,grad_accum,moe_a2a_overlap\n"
                   "H100,8,1,1,4.0,ep8xfsdp,bf16,8,1f1b\n")
    same = _predict(config, "ep8xfsdp", "--observations", str(csv), "--grad-accum", "8",
                    "--moe-a2a-overlap", "1f1b", "--json")
    assert same.exit_code == 0, same.output
    off = _predict(config, "ep8xfsdp", "--observations", str(csv), "--grad-accum", "8",
                   "--json")
    assert off.exit_code == 0, off.output
    s, o = json.loads(same.output), json.loads(off.output)
    assert s["throughput_samples_per_s"] == pytest.approx(4.0, rel=0.02)
    assert o["throughput_samples_per_s"] > s["throughput_samples_per_s"]
    csv.write_text(csv.read_text().replace(",1f1b", ",sometimes"))
    bad = _predict(config, "ep8xfsdp", "--observations", str(csv))
    assert bad.exit_code == 2 and "moe_a2a_overlap" in bad.output
