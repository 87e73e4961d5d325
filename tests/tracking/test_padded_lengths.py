"""The padded lengths of a tracked run's steps (``sequence_bins`` in profile.json,
tracking/padded_lengths.py): real CPU training under track() into a sqlite store with
batches padded to their own longest sequence, the profile's bins against the histogram
counted by hand here, and ``predict --run-id`` of the run against the share-weighted formula
worked out by hand from the profile (docs/models.md#padded-lengths-sequence_bins)."""

from __future__ import annotations

import json
from dataclasses import replace

import mlflow
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
import transformers
from click.testing import CliRunner
from support.tracking import logged, params_and_profile

import mlflow_gpuopt as gpuopt
from mlflow_gpuopt import contract
from mlflow_gpuopt.cli import gpuopt as gpuopt_cli
from mlflow_gpuopt.mlflow_io.runs import load_run_inputs
from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel.memory import memory_per_gpu
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig
from mlflow_gpuopt.tracking.padded_lengths import observed_bins
from mlflow_gpuopt.workload_files import workload_from_dict

OPTS = {"interval_s": 0.1, "print_summary": False, "warmup_steps": 1, "profile_step": 1}
VOCAB, LAYERS, WIDTH = 128, 3, 32
A100 = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2039e9,
                peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                                  "bf16": 312e12},
                intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9)
#: (samples, padded length) of each step: the profiled step (index 1) is one of the shortest
STEPS = ((4, 24), (2, 8), (4, 16), (2, 8), (3, 32), (4, 16), (4, 24), (2, 8))
#: counted by hand from STEPS: samples at each padded length, of 25
HISTOGRAM = {8: 2 + 2 + 2, 16: 4 + 4, 24: 4 + 4, 32: 3}
MEAN = (8 * 6 + 16 * 8 + 24 * 8 + 32 * 3) / 25  # 18.56 tokens


def tiny_gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=2, vocab_size=VOCAB, n_positions=64,
        bos_token_id=0, eos_token_id=0))


def padded_batch(samples: int, longest: int, gen: torch.Generator):
    """A batch as ``DataCollatorWithPadding`` makes it: sequences of random lengths, the
    longest ``longest``, right-padded to it, with their attention mask."""
    lengths = torch.randint(1, longest + 1, (samples,), generator=gen)
    lengths[0] = longest
    ids = torch.randint(1, VOCAB, (samples, longest), generator=gen)
    mask = (torch.arange(longest)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


def train(steps) -> str:
    """AdamW steps of next-token loss over ``steps`` ((samples, padded length), ...); the
    run id."""
    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    with gpuopt.track(model=model, optimizer=opt, **OPTS) as t:
        for samples, longest in steps:
            ids, mask = padded_batch(samples, longest, gen)
            labels = ids.masked_fill(mask == 0, -100)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    return t.run_id


def test_the_profile_logs_the_observed_padded_lengths_and_their_shares(tracking_uri):
    rid = train(STEPS)
    params, profile = params_and_profile(rid)
    assert profile["sequence_bins"] == [
        [t, pytest.approx(n / 25, rel=1e-12)] for t, n in sorted(HISTOGRAM.items())]
    # the per-sample figures are the profiled step's, at its own length
    assert profile["tokens_per_sample"] == STEPS[1][1] == 8
    assert params[contract.PARAM_TOKENS_PER_SAMPLE] == "8"
    _, metrics = logged(rid)
    assert metrics[contract.SUMMARY_MEAN_PADDED_TOKENS] == pytest.approx(MEAN, rel=1e-12)


def test_one_padded_length_logs_no_bins(tracking_uri):
    rid = train(((4, 16),) * 5)
    _, profile = params_and_profile(rid)
    assert profile["sequence_bins"] is None and profile["tokens_per_sample"] == 16
    _, metrics = logged(rid)
    assert contract.SUMMARY_MEAN_PADDED_TOKENS not in metrics


def at(base, s: float):
    """The profile's workload (figures at its reference length ``S0``) as one sample padded
    to ``s`` costs, written out here: FLOPs c1·s + 12·L·h·s² through the reference (the
    linear layers with the tokens, QKᵀ and AV with their square), bytes by the activation
    formula's ratio between the lengths."""
    s0 = base.tokens_per_sample
    quadratic = 12.0 * LAYERS * WIDTH * s0 * s0  # attention's FLOPs at S0
    linear = base.flops_per_sample - quadratic
    flops = linear * s / s0 + quadratic * (s / s0) ** 2
    ratio = (compute.formula_activation_bytes_per_sample(replace(base, tokens_per_sample=s),
                                                         base.precision)
             / compute.formula_activation_bytes_per_sample(base, base.precision))
    return replace(
        base, tokens_per_sample=float(s), flops_per_sample=flops,
        activation_bytes_per_sample=base.activation_bytes_per_sample * ratio,
        memory_traffic_bytes_per_sample=base.memory_traffic_bytes_per_sample * ratio,
        matmul_traffic_bytes_per_sample=base.matmul_traffic_bytes_per_sample * ratio,
        amp_traffic_bytes_per_sample=base.amp_traffic_bytes_per_sample * ratio,
        amp_matmul_traffic_bytes_per_sample=base.amp_matmul_traffic_bytes_per_sample * ratio,
        recompute_flops_per_sample=(base.recompute_flops_per_sample or 0.0) * flops
        / base.flops_per_sample)


def test_predict_runs_at_the_observed_mix_and_plans_memory_for_the_longest(tracking_uri):
    rid = train(STEPS)
    workload = load_run_inputs([rid], client=mlflow.MlflowClient()).workload
    _, profile = params_and_profile(rid)
    base = workload_from_dict({k: v for k, v in profile.items() if k != "sequence_bins"})
    assert base.tokens_per_sample == 8 and base.num_layers == LAYERS
    shares = {t: n / 25 for t, n in HISTOGRAM.items()}
    assert workload.tokens_per_sample == 32  # the longest observed
    assert [t for t, _ in workload.sequence_bins] == sorted(shares)
    for precision in ("fp32", "bf16"):
        expected = sum(w * compute.per_sample_time_prior_s(at(base, t), A100, precision)
                       for t, w in shares.items())
        assert compute.per_sample_time_prior_s(workload, A100, precision) == pytest.approx(
            expected, rel=1e-9)
        assert expected < compute.per_sample_time_prior_s(at(base, 32), A100, precision)
    config = ParallelConfig(gpus_per_node=1, micro_batch=8)
    longest = memory_per_gpu(at(base, 32), config)
    assert memory_per_gpu(workload, config) == longest
    assert longest.activations_bytes > memory_per_gpu(base, config).activations_bytes

    r = CliRunner().invoke(gpuopt_cli, ["predict", "--run-id", rid, "--gpu", "A100-80GB-SXM4",
                                        "--gpus", "1", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    note = [n for n in out["assumptions"] if n.startswith("sequence bins:")]
    assert note and "4 padded lengths of 8-32 tokens, mean 19" in note[0], out["assumptions"]
    assert out["tokens_per_s"] == pytest.approx(out["throughput_samples_per_s"] * MEAN,
                                                rel=1e-9)


def test_the_profile_read_as_a_workload_file_is_planned_at_its_longest_bin(tracking_uri,
                                                                           tmp_path):
    rid = train(STEPS)
    _, profile = params_and_profile(rid)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))  # with its hardware: a tracked profile
    r = CliRunner().invoke(gpuopt_cli, ["predict", "--workload", str(path), "--gpu",
                                        "A100-80GB-SXM4", "--gpus", "1", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert any("4 padded lengths of 8-32 tokens, mean 19 (tokens_per_sample 32)" in n
               for n in out["assumptions"]), out["assumptions"]
    # a workload file states the longest as tokens_per_sample: a longer bin is refused
    bare = {k: v for k, v in profile.items() if k != "hardware"}
    path.write_text(json.dumps(bare))
    r = CliRunner().invoke(gpuopt_cli, ["predict", "--workload", str(path), "--gpu",
                                        "A100-80GB-SXM4", "--gpus", "1"])
    assert r.exit_code == 2 and "at most 'tokens_per_sample' (8)" in r.output


class TimeMajorLM(nn.Module):
    """An LSTM language model over (sequence, batch) token ids (``batch_first`` False)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.rnn = nn.LSTM(16, 16)
        self.out = nn.Linear(16, VOCAB)

    def forward(self, ids):
        return self.out(self.rnn(self.embed(ids))[0])


def test_time_major_batches_are_binned_by_their_first_dimension(tracking_uri):
    torch.manual_seed(0)
    model = TimeMajorLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = ((3, 10), (3, 20), (5, 10), (3, 20))  # (batch, sequence)
    with gpuopt.track(model, opt, **OPTS) as t:
        for batch, seq in steps:
            ids = torch.randint(0, VOCAB, (seq + 1, batch))
            logits = model(ids[:-1])
            F.cross_entropy(logits.reshape(-1, VOCAB), ids[1:].reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
    _, profile = params_and_profile(t.run_id)
    assert profile["sequence_bins"] == [[10, pytest.approx(8 / 14)],
                                        [20, pytest.approx(6 / 14)]]


def test_many_lengths_are_rounded_up_to_the_smallest_multiple_that_fits():
    # 1..40 tokens, one sample each: multiples of 8 give 5 bins of 8 samples
    assert observed_bins({t: 1 for t in range(1, 41)}) == tuple(
        (t, 8 / 40) for t in (8, 16, 24, 32, 40))
    # 1..37: the longest stays its own length (it sets memory), not 40
    assert observed_bins({t: 1 for t in range(1, 38)}) == (
        (8, 8 / 37), (16, 8 / 37), (24, 8 / 37), (32, 8 / 37), (37, 5 / 37))
    # multiples of 8 up to 512 (LDDL's padding): 64 lengths, 16 bins of 32 tokens
    bins = observed_bins({t: 1 for t in range(8, 513, 8)})
    assert [t for t, _ in bins] == list(range(32, 513, 32))
    assert [w for _, w in bins] == pytest.approx([4 / 64] * 16)
    assert observed_bins({64: 3}) is None and observed_bins({}) is None
    assert observed_bins({16: 1, 64: 3}) == ((16, 0.25), (64, 0.75))


def test_a_context_parallel_ranks_slices_are_binned_as_whole_samples():
    """Rank 0 of a cp-2 group sees half of each sample's tokens: its lengths are doubled, as
    ``whole_sample`` doubles its ``tokens_per_sample``. The step clock is driven by its own
    hooks on real forwards."""
    import logging

    from mlflow_gpuopt.tracking._warn import WarnOnce
    from mlflow_gpuopt.tracking.config import TrackConfig
    from mlflow_gpuopt.tracking.profile_log import ProfileLog
    from mlflow_gpuopt.tracking.profiler import WorkloadProfiler
    from mlflow_gpuopt.tracking.run_log import RunLog
    from mlflow_gpuopt.tracking.steps import StepClock
    from mlflow_gpuopt.tracking.workload_profile import WorkloadProfile

    model = nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB))
    clock = StepClock(profiler=WorkloadProfiler(model, None), profile_step=-1)
    for batch, half in ((2, 64), (2, 128), (4, 64)):
        ids = torch.randint(0, VOCAB, (batch, half))
        clock.on_forward_pre(model, (ids,), {})
        clock.on_backward()
        clock.mark()
    warn = WarnOnce(logging.getLogger("test"))
    log = ProfileLog(model, TrackConfig(), RunLog(warn), warn)
    log.context_parallel = 2
    log.profile = WorkloadProfile(name="m", params=1, trainable_params=1, flops_per_sample=1.0,
                                  precision="fp32", micro_batch=2, grad_accum=1,
                                  optimizer=None, optimizer_state_bytes_per_param=None,
                                  activation_bytes_per_sample=None,
                                  activation_saved_bytes_per_sample=None,
                                  tokens_per_sample=128, largest_layer_params=None)
    log._logged = True  # its params were logged with the profile
    log.finish(clock)
    assert log.profile.sequence_bins == ((128, 6 / 8), (256, 2 / 8))
    assert log.mean_padded_tokens(clock) == pytest.approx((128 * 6 + 256 * 2) / 8)
