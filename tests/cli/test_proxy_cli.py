"""``predict`` / ``recommend`` planning a bigger model from a proxy: files, a tracked CPU run
of the tiny GPT example, and the flags' bad combinations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt

REPO = Path(__file__).resolve().parents[2]


def gpt(layers: int, hidden: int, seq: int = 2048, vocab: int = 50304) -> dict:
    """A GPT-shaped workload file as a model card gives it (12·L·h² + embeddings; 6·N·T +
    attention)."""
    params = 12 * layers * hidden**2 + vocab * hidden
    return {"name": f"gpt-{layers}x{hidden}", "params": params,
            "flops_per_sample": (6.0 * params + 12.0 * layers * hidden * seq) * seq,
            "precision": "bf16", "tokens_per_sample": seq, "num_layers": layers,
            "hidden_size": hidden, "num_heads": hidden // 128, "vocab_size": vocab,
            "mlp": "gelu", "attention": "sdpa", "dropout": 0.0, "micro_batch": 4,
            "optimizer": "adamw"}


ONE_GPU = ["--gpu", "H100-SXM5-80GB", "--gpus", "1", "--strategy", "single",
           "--micro-batch", "4", "--json"]


def _invoke(*args):
    return CliRunner().invoke(gpuopt, list(args))


def _predict(*args) -> dict:
    r = _invoke("predict", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture
def proxy_files(tmp_path):
    """(big.json, small.json, small.csv): the small model measured 1.5x faster than its prior
    on one H100."""
    big, small, obs = tmp_path / "big.json", tmp_path / "small.json", tmp_path / "small.csv"
    big.write_text(json.dumps(gpt(24, 4096)))
    small.write_text(json.dumps(gpt(16, 2048)))
    prior = _predict("--workload", str(small), *ONE_GPU)["throughput_samples_per_s"]
    obs.write_text("gpu,gpu_count,micro_batch,throughput_samples_per_s,strategy\n"
                   f"H100-SXM5-80GB,1,4,{prior * 1.5!r},single\n")
    return str(big), str(small), str(obs)


def test_predict_carries_the_proxys_efficiency(proxy_files):
    big, small, obs = proxy_files
    got = _predict("--workload", big, "--proxy-workload", small, "--observations", obs,
                   *ONE_GPU)
    alone = _predict("--workload", big, *ONE_GPU)
    # one GPU: every term is compute scaled by the fitted factor (within the prior's pull)
    assert got["throughput_samples_per_s"] == pytest.approx(
        1.5 * alone["throughput_samples_per_s"], rel=1e-3)
    assert any(a.startswith("transferred from proxy gpt-16x2048") and small in a
               for a in got["assumptions"])
    assert got["basis"] == "measured"
    assert got["memory"] == alone["memory"]  # the target's own shape decides it
    assert got["high"] / got["low"] < alone["high"] / alone["low"]  # narrower than the prior


def test_recommend_plans_the_bigger_model_from_files(proxy_files):
    big, small, obs = proxy_files
    r = _invoke("recommend", "--workload", big, "--proxy-workload", small, "--observations",
                obs, "--tokens", "2B", "--deadline", "30d", "--global-batch", "64",
                "--provider", "aws", "--top", "3", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["candidates"] and doc["batch_policy"]["global_batch"] == 64
    assert doc["notes"][0].startswith("transferred from proxy gpt-16x2048")
    assert any(a.startswith("transferred from proxy") for a in doc["model_assumptions"])


def test_the_target_may_be_a_hugging_face_config(proxy_files, tmp_path):
    _, small, obs = proxy_files
    config = tmp_path / "config.json"  # Meta-Llama-3-8B's shape keys on the Hugging Face Hub
    config.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
        "tie_word_embeddings": False}))
    got = _predict("--workload", str(config), "--seq-len", "2048", "--proxy-workload", small,
                   "--observations", obs, "--gpu", "H100-SXM5-80GB", "--gpus", "8",
                   "--strategy", "fsdp", "--micro-batch", "2", "--json")
    assert any("Hugging Face config.json (llama)" in a for a in got["assumptions"])
    assert any(a.startswith("transferred from proxy gpt-16x2048") for a in got["assumptions"])


@pytest.mark.parametrize("cmd, extra, message", [
    ("predict", ["--proxy-workload", "{small}"], "--proxy-workload needs --observations"),
    ("predict", ["--run-id", "abc", "--proxy-workload", "{small}", "--observations", "{obs}"],
     "not both"),
    ("recommend", ["--proxy-workload", "{small}"], "--proxy-workload needs --observations"),
    ("recommend", ["--run-id", "abc", "--observations", "{obs}"], "not both"),
])
def test_bad_proxy_flags_are_one_line(proxy_files, cmd, extra, message):
    big, small, obs = proxy_files
    args = [a.format(small=small, obs=obs) for a in extra]
    tail = (["--gpu", "H100", "--gpus", "1"] if cmd == "predict"
            else ["--tokens", "1B", "--deadline", "1d"])
    r = _invoke(cmd, "--workload", big, *args, *tail)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def cpu_proxy(tiny_gpt_run, tmp_path_factory):
    """A tracked CPU run of examples/train_tiny_gpt.py in a temp sqlite store:
    (tracking URI, run id, its kernels per micro-step, its params)."""
    uri = tiny_gpt_run.store_in(tmp_path_factory.mktemp("proxy"))
    import mlflow

    client = mlflow.MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("gpuopt-examples").experiment_id])[0]
    params = run.data.params
    return (uri, run.info.run_id, float(params["gpuopt.kernels_per_micro_step"]),
            float(params["gpuopt.params"]))


@pytest.mark.slow
def test_cpu_proxy_run_plans_a_1b_gpt(cpu_proxy, tmp_path, monkeypatch):
    uri, run_id, kernels, proxy_params = cpu_proxy
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    target = tmp_path / "gpt1b.json"
    target.write_text(json.dumps(gpt(24, 2048)))  # GPT-3 XL shape: 1.31B parameters
    got = _predict("--run-id", run_id, "--workload", str(target), "--gpu", "H100",
                   "--gpus", "8", "--strategy", "fsdp", "--micro-batch", "8", "--json")
    assert got["basis"] == "prior"  # a CPU says nothing about a GPU's speed
    assert any("CPU only, so only its kernels per layer carry" in a and run_id in a
               for a in got["assumptions"])
    # the tiny GPT declares no architecture: its layers are the shape estimate from its params
    layers = max(1, round((proxy_params / (12.0 * 100.0**2)) ** (1 / 3)))
    assert any(f"kernels per micro-step {kernels / layers * 24:,.0f}" in a
               for a in got["assumptions"])
    # on one GPU the proxy's counted dispatch (10 us a kernel) replaces the architecture's
    # default count (docs/models.md#defaults: 100 per decoder layer + 40): the steps differ by
    # exactly that
    one = ["--gpu", "H100", "--gpus", "1", "--strategy", "single", "--micro-batch", "8",
           "--json"]
    moved = _predict("--run-id", run_id, "--workload", str(target), *one)
    alone = _predict("--workload", str(target), *one)
    dispatch_s = kernels / layers * 24 * 10e-6
    default_s = (100 * 24 + 40) * 10e-6
    assert moved["step_time_s"] - alone["step_time_s"] == pytest.approx(dispatch_s - default_s,
                                                                       rel=1e-6)
    r = _invoke("recommend", "--run-id", run_id, "--workload", str(target), "--tokens", "20B",
                "--deadline", "30d", "--top", "3", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["candidates"] and doc["source_run_ids"] == [run_id]
    # the tiny proxy's 16 x 64-token batch is not the 1.3B's: its pre-training batch is derived
    assert doc["batch_policy"]["mode"] == "derived"
    assert doc["notes"][0].startswith("transferred from proxy tiny-gpt")
    assert doc.get("mlflow_run_id")  # logged, nested under the proxy run
    assert "advice" not in doc  # the proxy script's findings are not priced on the 1B plan
