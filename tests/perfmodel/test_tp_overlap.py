"""Tensor-parallel communication overlap (``comm.tp_exposed_s``, the workload's
``tp_comm_overlap``): without it every byte waits on the critical path; with it the first of
``tp`` chunks stays exposed, what compute cannot cover adds, and the hidden part costs the
GEMMs the SM share the communication kernels hold."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel.comm import TP_OVERLAP_SM_SHARE, tp_exposed_s


def test_no_overlap_exposes_all_of_it():
    assert tp_exposed_s(2.0, 10.0, 8, None) == 2.0
    assert tp_exposed_s(2.0, 10.0, 8, False) == 2.0
    assert tp_exposed_s(2.0, 10.0, 1, True) == 2.0


def test_overlap_under_long_compute_leaves_one_chunk_and_the_sm_share():
    hidden = 2.0 * 7 / 8
    assert tp_exposed_s(2.0, 10.0, 8, True) == pytest.approx(
        2.0 / 8 + TP_OVERLAP_SM_SHARE * hidden)


def test_overlap_cannot_hide_more_than_the_compute():
    # 3 s of communication next to 1 s of GEMMs: 2 s stay exposed, plus the SM share of 1 s
    assert tp_exposed_s(3.0, 1.0, 4, True) == pytest.approx(2.0 + TP_OVERLAP_SM_SHARE * 1.0)


# Llama 3 70B from its card, tensor-parallel 8 on one 8 × H100 node.
CARD = {"name": "llama3_70b", "params": 70553706496, "flops_per_sample": 6 * 70.55e9 * 8192,
        "precision": "bf16", "optimizer": "AdamW", "micro_batch": 1, "tokens_per_sample": 8192,
        "num_layers": 80, "hidden_size": 8192, "num_heads": 64, "num_kv_heads": 8,
        "ffn_hidden_size": 28672, "mlp": "swiglu", "vocab_size": 128256, "attention": "sdpa",
        "dropout": 0, "recompute": "full"}


def _predict(tmp_path, doc):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    return CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                       "NVIDIA H100 80GB HBM3", "--gpus", "8", "--strategy",
                                       "tp8", "--micro-batch", "1", "--json"])


def test_overlap_in_the_workload_file_speeds_a_tensor_parallel_job(tmp_path):
    plain = _predict(tmp_path, CARD)
    overlapped = _predict(tmp_path, {**CARD, "tp_comm_overlap": True})
    assert plain.exit_code == 0 and overlapped.exit_code == 0, plain.output + overlapped.output
    a, b = json.loads(plain.stdout), json.loads(overlapped.stdout)
    comm_plain = a["time_breakdown"]["exposed_comm_s"]
    comm_over = b["time_breakdown"]["exposed_comm_s"]
    # compute-bound layers: the overlap leaves 1/8 of the collectives plus the SM share
    assert comm_over == pytest.approx(comm_plain * (1 / 8 + TP_OVERLAP_SM_SHARE * 7 / 8),
                                      rel=0.02)
    assert b["step_time_s"] == pytest.approx(a["step_time_s"] - comm_plain + comm_over,
                                             rel=1e-6)


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_tp_comm_overlap_must_be_true_or_false(tmp_path, value):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({**CARD, "tp_comm_overlap": value}))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu", "H100",
                                    "--gpus", "8", "--strategy", "tp8"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "tp_comm_overlap" in lines[0] and "Traceback" not in r.output
