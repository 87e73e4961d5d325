"""The optimizer step's DRAM traffic: LAMB's trust ratio, global-norm clipping and master
weights (docs/models.md#optimizer-step), and the 16-bit activations of a model cast to 16
bits, with expected bytes counted by hand from what each pass reads and writes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlflow_gpuopt.perfmodel.compute import (
    memory_traffic_bytes_per_sample,
    normalize_mixed_precision,
    optimizer_bytes_per_param,
    optimizer_time_prior_s,
)
from mlflow_gpuopt.perfmodel.layout import resolve_layout
from mlflow_gpuopt.perfmodel.shape import model_shape
from mlflow_gpuopt.perfmodel.step import Calibration, step_terms
from mlflow_gpuopt.perfmodel.types import Hardware, ParallelConfig, Workload
from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict

V100 = Hardware(gpu="V100-SXM2-16GB", memory_bytes=16e9, memory_bandwidth_bytes_per_s=900e9,
                peak_flops_per_s={"fp32": 15.7e12, "fp16": 125e12},
                intra_node_bytes_per_s=150e9, inter_node_bytes_per_s=12.5e9)

ADAM = Workload(params=285_000_000, flops_per_sample=8.6e11, precision="fp32",
                optimizer="Adam", optimizer_state_bytes_per_param=8.0,
                memory_traffic_bytes_per_sample=22e9, amp_traffic_bytes_per_sample=19e9,
                matmul_traffic_bytes_per_sample=6e9, amp_matmul_traffic_bytes_per_sample=5e9)


def test_adam_moves_its_weight_state_and_gradient_once():
    # read w, m, v, g (16) and write w, m, v (12); fp16 under autocast adds the 16-bit copy
    assert optimizer_bytes_per_param(8.0, "fp32", ADAM) == 28.0
    assert optimizer_bytes_per_param(8.0, "fp16", ADAM) == 30.0
    assert optimizer_bytes_per_param(8.0, "fp32") == 28.0


def test_lamb_clipping_and_master_weights_add_their_passes():
    lamb = replace(ADAM, optimizer="JITLamb")
    # pass 1 reads g, m, v, w (16) and writes m, v and the update u (12); the norms read w
    # and u (8); the update reads w and u and writes w (12): 48
    assert optimizer_bytes_per_param(8.0, "fp32", lamb) == 48.0
    assert optimizer_bytes_per_param(8.0, "fp32", replace(ADAM, optimizer="FusedLAMB")) == 48.0
    clipped = replace(lamb, grad_clip=True)
    # the gradient read for the global norm (4), read and written to scale it (8)
    assert optimizer_bytes_per_param(8.0, "fp32", clipped) == 60.0
    o2 = replace(clipped, mixed_precision="master_weights")
    # unscale: 16-bit gradient read (2), fp32 master gradient written (4); the master weight
    # read (4) and written back as the 16-bit weight (2)
    assert optimizer_bytes_per_param(8.0, "fp16", o2) == 72.0
    # fp32 runs keep no 16-bit copy either way
    assert optimizer_bytes_per_param(8.0, "fp32", o2) == 60.0


def test_optimizer_time_is_the_bytes_at_streaming_bandwidth():
    o2 = replace(ADAM, optimizer="LAMB", grad_clip=True, mixed_precision="master_weights")
    expected = 285e6 * 72 / (900e9 * 0.75)  # 30.4 ms on a V100
    assert optimizer_time_prior_s(285e6, 8.0, V100, "fp16", o2) == pytest.approx(expected)
    assert expected == pytest.approx(0.0304, abs=1e-4)


def test_step_charges_the_optimizer_once_per_step_not_per_micro_step():
    o2 = replace(ADAM, optimizer="LAMB", grad_clip=True, mixed_precision="master_weights")
    layout = resolve_layout(ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=2,
                                           grad_accum=1, precision="fp16"))
    shape = model_shape(o2)
    one = step_terms(o2, V100, "fp16", layout, 2, 1, shape, 8.0, Calibration())
    adam = replace(o2, optimizer="Adam", grad_clip=None)  # the same micro-steps
    base = step_terms(adam, V100, "fp16", layout, 2, 1, shape, 8.0, Calibration())
    added = 285e6 * (20 + 12) / (900e9 * 0.75)
    assert one.step_s - base.step_s == pytest.approx(added, rel=1e-6)
    four = step_terms(o2, V100, "fp16", layout, 2, 4, shape, 8.0, Calibration())
    base4 = step_terms(adam, V100, "fp16", layout, 2, 4, shape, 8.0, Calibration())
    assert four.step_s - base4.step_s == pytest.approx(added, rel=1e-6)


def test_master_weights_halve_the_fp32_bytes_instead_of_the_autocast_count():
    assert memory_traffic_bytes_per_sample(ADAM, "fp16") == 19e9  # autocast's measured count
    o2 = replace(ADAM, mixed_precision="master_weights")
    assert memory_traffic_bytes_per_sample(o2, "fp16") == 11e9  # every activation 16-bit
    assert memory_traffic_bytes_per_sample(o2, "fp32") == 22e9


def test_workload_file_reads_the_keys():
    base = {"params": 1000, "flops_per_sample": 1e6, "precision": "fp16"}
    w = workload_from_dict({**base, "optimizer": "LAMB", "grad_clip": True,
                            "mixed_precision": "apex_o2"})
    assert (w.grad_clip, w.mixed_precision) == (True, "master_weights")
    assert normalize_mixed_precision("torch.amp") == "autocast"
    with pytest.raises(WorkloadFileError, match="mixed_precision"):
        workload_from_dict({**base, "mixed_precision": "o5"})
    with pytest.raises(WorkloadFileError, match="grad_clip"):
        workload_from_dict({**base, "grad_clip": "yes"})


def test_prediction_names_the_optimizer_steps_extra_passes():
    from mlflow_gpuopt.perfmodel import fit

    o2 = replace(ADAM, optimizer="LAMB", grad_clip=True, mixed_precision="master_weights")
    config = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=2, precision="fp16")
    said = [n for n in fit(o2, [], {}).predict(config, V100).assumptions
            if n.startswith("optimizer step bytes")]
    assert said == ["optimizer step bytes per parameter beyond Adam's: LAMB's trust ratio +20, "
                    "global-norm gradient clipping +12, fp32 master weights at 16 bits +12"]
    assert not [n for n in fit(ADAM, [], {}).predict(config, V100).assumptions
                if n.startswith("optimizer step bytes")]
    # the prior's step: the same micro-step (both keep master weights), LAMB's 20 and the
    # clipping's 12 bytes a parameter more at the V100's 675 GB/s
    slow = fit(o2, [], {}).predict(config, V100)
    fast = fit(replace(o2, optimizer="Adam", grad_clip=None), [], {}).predict(config, V100)
    assert slow.step_time_s - fast.step_time_s == pytest.approx(285e6 * 32 / 675e9, rel=1e-6)
