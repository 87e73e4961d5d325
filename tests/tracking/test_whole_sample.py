"""A context-parallel rank's profile scaled to a whole sample (``workload_profile.whole_sample``):
figures made by hand for a rank holding half of each sample's sequence."""

from __future__ import annotations

import dataclasses

from mlflow_gpuopt.tracking.workload_profile import WorkloadProfile, whole_sample

RANK = WorkloadProfile(
    name="m", params=1000, trainable_params=1000, flops_per_sample=6e6, precision="bf16",
    micro_batch=2, grad_accum=1, optimizer="AdamW", optimizer_state_bytes_per_param=8.0,
    activation_bytes_per_sample=4e5, activation_saved_bytes_per_sample=3e5,
    tokens_per_sample=512, largest_layer_params=100, kernels_per_micro_step=40.0,
    recompute_flops_per_sample=0.0)


def test_a_rank_of_cp4_describes_four_times_its_slice():
    w = whole_sample(RANK, 4, rank_tokens=512)
    assert (w.tokens_per_sample, w.flops_per_sample) == (2048, 2.4e7)
    assert (w.activation_bytes_per_sample, w.activation_saved_bytes_per_sample) == (1.6e6, 1.2e6)
    assert w.recompute_flops_per_sample == 0.0
    # the channels-first convolutions' operands grow with the slice like the activations
    conv = whole_sample(dataclasses.replace(RANK, nchw_conv_bytes_per_sample=5e4), 4, 512)
    assert conv.nchw_conv_bytes_per_sample == 2e5
    assert (w.sequence_split, w.rank_tokens_per_sample, w.rank_flops_per_sample) == (4, 512, 6e6)
    # per micro-step and per parameter figures are the rank's own: not scaled
    assert (w.micro_batch, w.kernels_per_micro_step, w.params) == (2, 40.0, 1000)


def test_tokens_the_user_gave_are_kept_and_unknowns_stay_unknown():
    given = dataclasses.replace(RANK, tokens_per_sample=4096)
    w = whole_sample(given, 2, rank_tokens=512, tokens_given=True)
    assert (w.tokens_per_sample, w.rank_tokens_per_sample, w.flops_per_sample) == (4096, 512,
                                                                                   1.2e7)
    bare = dataclasses.replace(RANK, flops_per_sample=None, tokens_per_sample=None,
                               activation_bytes_per_sample=None)
    w = whole_sample(bare, 2, rank_tokens=None)
    assert (w.tokens_per_sample, w.flops_per_sample, w.activation_bytes_per_sample) == (
        None, None, None)
    assert w.nchw_conv_bytes_per_sample is None
    assert w.rank_flops_per_sample is None and w.sequence_split == 2
