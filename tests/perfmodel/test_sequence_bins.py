"""Batches padded to their own longest sequence (``Workload.sequence_bins``,
docs/models.md#padded-lengths-sequence_bins): the per-sample time is the share-weighted mean
of the per-sample time at each padded length, memory stays that of the longest. Expected
values are built here from workloads written out at each length (FLOPs 6·N·s + 12·L·h·s²),
not through the module's rescaling."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.compute import at_length
from mlflow_gpuopt.perfmodel.sequence_bins import mean_padded_tokens
from mlflow_gpuopt.perfmodel.types import Hardware, Workload
from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict, workload_to_dict

A100 = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2039e9,
                peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                                  "bf16": 312e12},
                intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9)
N, L, H, S = 336_000_000, 24, 1024, 512  # BERT-large at 512 tokens


def flops(s: float) -> float:
    return 6.0 * N * s + 12.0 * L * H * s * s


def bert(s: float, **extra) -> Workload:
    return Workload(params=N, flops_per_sample=flops(s), precision="fp16",
                    tokens_per_sample=float(s), num_layers=L, hidden_size=H, num_heads=16,
                    ffn_hidden_size=4096, vocab_size=30522, mlp="gelu", attention="eager",
                    dropout=0.1, **extra)


BINS = ((64.0, 0.2), (256.0, 0.3), (512.0, 0.5))


def test_a_shorter_length_costs_its_own_flops_and_traffic():
    short = at_length(bert(S), 256)
    assert short.flops_per_sample == pytest.approx(flops(256), rel=1e-12)
    assert short.tokens_per_sample == 256
    assert compute.memory_traffic_bytes_per_sample(short, "fp16") == pytest.approx(
        compute.memory_traffic_bytes_per_sample(bert(256), "fp16"), rel=1e-12)
    # without an architecture: FLOPs and measured bytes grow with the tokens
    flat = Workload(params=N, flops_per_sample=8e11, precision="fp16", tokens_per_sample=512.0,
                    memory_traffic_bytes_per_sample=4e9)
    quarter = at_length(flat, 128)
    assert quarter.flops_per_sample == pytest.approx(2e11, rel=1e-12)
    assert quarter.memory_traffic_bytes_per_sample == pytest.approx(1e9, rel=1e-12)


def test_per_sample_time_is_the_share_weighted_mean_over_the_lengths():
    binned = bert(S, sequence_bins=BINS)
    expected = sum(share * compute.per_sample_time_prior_s(bert(s), A100, "fp16")
                   for s, share in BINS)
    assert compute.per_sample_time_prior_s(binned, A100, "fp16") == pytest.approx(
        expected, rel=1e-12)
    # shorter batches make it faster than padding everything to 512, slower than at the mean
    assert expected < compute.per_sample_time_prior_s(bert(S), A100, "fp16")
    assert mean_padded_tokens(binned) == pytest.approx(64 * 0.2 + 256 * 0.3 + 512 * 0.5)
    classes = compute.operator_class_times_s(binned, A100, "fp16", 32)
    parts = [compute.operator_class_times_s(bert(s), A100, "fp16", 32) for s, _ in BINS]
    for key in classes:
        assert classes[key] == pytest.approx(
            sum(share * p[key] for (_, share), p in zip(BINS, parts, strict=True)),
            rel=1e-12, abs=1e-15)
    one = bert(S, sequence_bins=((512.0, 1.0),))
    assert compute.per_sample_time_prior_s(one, A100, "fp16") == pytest.approx(
        compute.per_sample_time_prior_s(bert(S), A100, "fp16"), rel=1e-12)


def doc(**extra) -> dict:
    d = workload_to_dict(bert(S))
    d.update(extra)
    return d


def test_workload_file_reads_shares_or_counts_and_refuses_bad_bins():
    shares = workload_from_dict(doc(sequence_bins={"512": 0.5, "64": 0.2, "256": 0.3}))
    assert shares.sequence_bins == BINS
    counts = workload_from_dict(doc(sequence_bins=[[64, 20], [256, 30], [512, 50]]))
    assert [t for t, _ in counts.sequence_bins] == [t for t, _ in BINS]
    assert [w for _, w in counts.sequence_bins] == pytest.approx([w for _, w in BINS])
    assert workload_from_dict(workload_to_dict(shares)) == shares
    for bad, words in (({"600": 1.0}, "at most 'tokens_per_sample'"),
                       ({"0": 1.0}, "above 0"), ({"64": -0.5}, ">= 0"),
                       ({"64": 0, "128": 0}, "must not all be 0"), ([64, 0.5], "object"),
                       ("64:1", "object"), ({}, "1 to 4096"), ({"x": 1}, "number")):
        with pytest.raises(WorkloadFileError, match="sequence_bins") as err:
            workload_from_dict(doc(sequence_bins=bad), "w.json")
        assert words in str(err.value) and "\n" not in str(err.value)
    no_length = doc(sequence_bins={"64": 1.0})
    no_length.pop("tokens_per_sample")
    with pytest.raises(WorkloadFileError, match="needs 'tokens_per_sample'"):
        workload_from_dict(no_length)


def predict(path, *extra) -> dict:
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                    "A100-80GB-SXM4", "--gpus", "1", "--micro-batch", "32",
                                    "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_predict_runs_faster_on_binned_batches_with_the_longest_batch_in_memory(tmp_path):
    full, binned = tmp_path / "full.json", tmp_path / "binned.json"
    full.write_text(json.dumps(doc()))
    binned.write_text(json.dumps(doc(sequence_bins={"64": 0.2, "256": 0.3, "512": 0.5})))
    a, b = predict(full), predict(binned)
    assert b["memory_per_gpu_bytes"] == a["memory_per_gpu_bytes"]
    assert b["max_micro_batch"] == a["max_micro_batch"]
    # the per-sample share of the step shrinks as the weighted mean over the lengths does
    ratio = (sum(share * compute.per_sample_time_prior_s(bert(s), A100, "fp16")
                 for s, share in BINS) / compute.per_sample_time_prior_s(bert(S), A100, "fp16"))
    assert 1.0 / ratio > b["throughput_samples_per_s"] / a["throughput_samples_per_s"] > 1.3
    # tokens that run: the mean padded length (64·0.2 + 256·0.3 + 512·0.5 = 345.6)
    assert b["tokens_per_s"] == pytest.approx(b["throughput_samples_per_s"] * 345.6, rel=1e-9)
    assert a["tokens_per_s"] == pytest.approx(a["throughput_samples_per_s"] * 512, rel=1e-9)
    note = [n for n in b["assumptions"] if n.startswith("sequence bins:")]
    assert note and "mean 346" in note[0] and "64-512" in note[0]
    assert not [n for n in a["assumptions"] if n.startswith("sequence bins:")]

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc(sequence_bins={"1024": 1.0})))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(bad), "--gpu",
                                    "A100-80GB-SXM4", "--gpus", "1"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "sequence_bins" in lines[0]
    assert "Traceback" not in r.output
