"""The observations CSV's ``power_limit_w``: a run measured under a board power limit ran at
the clock that limit leaves, (limit / TDP)^(1/3) of full (dynamic power ∝ f·V², V ∝ f), so
the fit reads its efficiency against that clock and a prediction at full power is faster by
at most the clock's ratio. Bad values exit 2 with one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel.types import Observation
from mlflow_gpuopt.workload_files import observations_to_csv, parse_observations_csv

# Llama 2 7B from its card (as tests/cli/test_predict_defaults.py).
CARD = {"name": "llama2_7b", "params": 6738415616, "flops_per_sample": 89398720856064.0,
        "precision": "bf16", "optimizer": "AdamW", "micro_batch": 2, "tokens_per_sample": 2048,
        "num_layers": 32, "hidden_size": 4096, "num_heads": 32, "ffn_hidden_size": 11008,
        "mlp": "swiglu", "vocab_size": 32000, "attention": "sdpa", "dropout": 0}
MEASURED = 12.0  # samples/s of the whole 8-GPU job (~3,070 tokens/s per GPU)
HEADER = "gpu,gpu_count,micro_batch,throughput_samples_per_s,strategy,precision"
ROW = f"NVIDIA H100 80GB HBM3,8,2,{MEASURED},fsdp,bf16"
CLOCK_350 = (350 / 700) ** (1 / 3)  # H100 SXM5: 700 W TDP (pricing/gpus.csv)


def _predict(tmp_path, csv_text, *extra, gpu="NVIDIA H100 80GB HBM3"):
    wl, obs = tmp_path / "w.json", tmp_path / "obs.csv"
    wl.write_text(json.dumps(CARD))
    obs.write_text(csv_text)
    return CliRunner().invoke(gpuopt, ["predict", "--workload", str(wl), "--observations",
                                       str(obs), "--gpu", gpu, "--gpus", "8", "--strategy",
                                       "fsdp", "--micro-batch", "2", "--json", *extra])


def _throughput(tmp_path, csv_text, *extra, **kw):
    r = _predict(tmp_path, csv_text, *extra, **kw)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["throughput_samples_per_s"]


def test_a_power_limited_run_predicts_full_power_faster_by_at_most_the_clock(tmp_path):
    limited = f"{HEADER},power_limit_w\n{ROW},350\n"
    plain = f"{HEADER}\n{ROW}\n"
    # The measured configuration under its own limit comes back as measured.
    assert _throughput(tmp_path, limited, "--power-limit-w", "350") == pytest.approx(
        MEASURED, rel=0.03)
    # At full power: faster than measured, by no more than the clock gained.
    full = _throughput(tmp_path, limited)
    assert MEASURED * 1.02 < full <= MEASURED / CLOCK_350 * 1.001
    # Without the column the run is read as at TDP: its measured speed is the full-power one.
    assert _throughput(tmp_path, plain) == pytest.approx(MEASURED, rel=0.03)


def test_the_row_limit_and_the_flag_do_not_compound(tmp_path):
    limited = f"{HEADER},power_limit_w\n{ROW},350\n"
    plain = f"{HEADER}\n{ROW}\n"
    # --power-limit-w caps the runs on the target's GPU type that say no limit of their own;
    # a row that says the same limit gives the same answer (not the limit applied twice).
    assert _throughput(tmp_path, limited, "--power-limit-w", "350") == pytest.approx(
        _throughput(tmp_path, plain, "--power-limit-w", "350"), rel=1e-9)
    # A row's own limit wins over the flag's for that run.
    at_500 = _throughput(tmp_path, f"{HEADER},power_limit_w\n{ROW},500\n", "--power-limit-w",
                         "350")
    assert at_500 < _throughput(tmp_path, limited, "--power-limit-w", "350")


def test_the_limit_carries_to_another_gpu_type(tmp_path):
    limited = f"{HEADER},power_limit_w\n{ROW},350\n"
    plain = f"{HEADER}\n{ROW}\n"
    a100 = dict(gpu="NVIDIA A100-SXM4-80GB")
    ratio = _throughput(tmp_path, limited, **a100) / _throughput(tmp_path, plain, **a100)
    # The H100 run's efficiency read against a slower clock is higher: A100 comes out faster,
    # by about the clock ratio (the fit's prior pulls the efficiency a little toward the
    # generation's, which moves it a percent or two; twice the limit would be 1 / clock²).
    assert 1 / CLOCK_350 * 0.95 < ratio <= 1 / CLOCK_350 * 1.03


@pytest.mark.parametrize("value", ["0", "-300", "abc", "1e9", "nan"])
def test_a_bad_power_limit_is_one_line_and_exit_2(tmp_path, value):
    r = _predict(tmp_path, f"{HEADER},power_limit_w\n{ROW},{value}\n")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "power_limit_w" in lines[0] and "row 2" in lines[0]
    assert "Traceback" not in r.output


def test_observations_csv_round_trips_the_power_limit():
    obs = [Observation(gpu="H100-SXM5-80GB", gpu_count=8, throughput_samples_per_s=12.5,
                       micro_batch=2, strategy="fsdp", precision="bf16", power_limit_w=500.0),
           Observation(gpu="A100-80GB-SXM4", gpu_count=1, throughput_samples_per_s=1.5,
                       micro_batch=2, strategy="single", precision="bf16")]
    assert parse_observations_csv(observations_to_csv(obs)) == obs
