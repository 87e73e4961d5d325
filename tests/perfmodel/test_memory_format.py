"""The memory format of a convolutional network (``Workload.memory_format``): tensor-core
convolutions on NCHW (``contiguous``) tensors pay NCHW <-> NHWC transposes of their
activations, at the memory bandwidth (docs/models.md#convolutions-and-memory-format); FP32 on
SIMT units and ``channels_last`` pay none. Expected seconds are worked out here from the
bandwidth and the bytes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from mlflow_gpuopt.cli import gpuopt
from mlflow_gpuopt.perfmodel import compute
from mlflow_gpuopt.perfmodel import fit
from mlflow_gpuopt.perfmodel.types import Hardware, Observation, ParallelConfig, Workload
from mlflow_gpuopt.workload_files import WorkloadFileError, workload_from_dict

A100 = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2039e9,
                peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                                  "bf16": 312e12},
                intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9)
V100 = Hardware(gpu="V100-SXM2-16GB", memory_bytes=16e9, memory_bandwidth_bytes_per_s=900e9,
                peak_flops_per_s={"fp32": 15.7e12, "fp16": 125e12},
                intra_node_bytes_per_s=150e9, inter_node_bytes_per_s=50e9)
#: A ResNet-50-sized network whose profile measured 110 MB of activations per image at fp16.
NET = Workload(params=25_557_032, flops_per_sample=24.6e9, precision="fp16",
               activation_bytes_per_sample=110e6, memory_format="contiguous")


def test_tf32_on_ampere_in_nchw_moves_six_times_the_activations_at_the_bandwidth():
    # TF32 activations are 4 bytes: 220 MB a sample; three cuDNN calls per convolution, two
    # operands each, read + written: 6 x 220 MB = 1.32 GB at 75 % of 2,039 GB/s
    expected_s = 6 * 220e6 / (0.75 * 2039e9)
    assert compute.transpose_time_s(NET, A100, "tf32") == pytest.approx(expected_s, rel=1e-12)
    # fp16 on the same tensor cores: 2-byte activations, half the bytes
    assert compute.transpose_time_s(NET, A100, "fp16") == pytest.approx(expected_s / 2)
    # Volta's tensor cores take fp16: 6 x 110 MB at 75 % of 900 GB/s
    assert compute.transpose_time_s(NET, V100, "fp16") == pytest.approx(
        6 * 110e6 / (0.75 * 900e9), rel=1e-12)


@pytest.mark.parametrize("workload, hardware, precision", [
    (NET, V100, "fp32"),  # V100 FP32: SIMT units, NCHW as it is
    (NET, V100, "tf32"),  # no TF32 on Volta: runs at the FP32 rate, SIMT
    (NET, A100, "fp32"),  # TF32 off on an A100: SIMT
    (replace(NET, memory_format="channels_last"), A100, "tf32"),  # the tensor cores' layout
    (replace(NET, memory_format=None), A100, "tf32"),  # no convolutions stated
])
def test_no_transposes_off_tensor_cores_in_channels_last_or_without_convolutions(
        workload, hardware, precision):
    assert compute.transpose_time_s(workload, hardware, precision) == 0.0
    assert compute.per_sample_time_prior_s(workload, hardware, precision) == pytest.approx(
        compute.per_sample_time_prior_s(replace(workload, memory_format="channels_last"),
                                         hardware, precision), rel=1e-12)


def test_the_roofline_adds_the_transposes_and_predict_names_their_class():
    last = replace(NET, memory_format="channels_last")
    added = (compute.per_sample_time_prior_s(NET, A100, "tf32")
             - compute.per_sample_time_prior_s(last, A100, "tf32"))
    assert added == pytest.approx(6 * 220e6 / (0.75 * 2039e9), rel=1e-9)
    classes = compute.operator_class_times_s(NET, A100, "tf32", 256)
    assert classes["transposes"] == pytest.approx(256 * added, rel=1e-9)
    assert compute.operator_class_times_s(last, A100, "tf32", 256)["transposes"] == 0.0

    # Measured on a V100 in fp32, carried to an A100 in TF32: the transposes are new there
    obs = [Observation(gpu=V100.gpu, gpu_count=1, throughput_samples_per_s=367.0,
                       micro_batch=112, strategy="single", precision="fp32")]
    hw = {V100.gpu: V100}
    config = ParallelConfig(gpus_per_node=1, strategy="single", micro_batch=256,
                            precision="tf32")
    nchw, nhwc = fit(NET, obs, hw), fit(last, obs, hw)
    rows = {r["class"]: r for r in nchw.transfer_classes(config, A100)}
    assert rows["transposes"]["source_s"] == 0.0 and rows["transposes"]["target_s"] > 0
    assert "transposes" not in {r["class"] for r in nhwc.transfer_classes(config, A100)}
    slow = nchw.predict(config, A100)
    fast = nhwc.predict(config, A100)
    # the A100's micro-step is longer by exactly the transposes at the carried calibration
    assert 256 / slow.throughput_samples_per_s - 256 / fast.throughput_samples_per_s == \
        pytest.approx(rows["transposes"]["target_s"], rel=1e-6)
    note = [a for a in slow.assumptions if "by operator class" in a]
    assert note and "transposes" in note[0]


def test_workload_file_reads_the_spellings_and_refuses_others(tmp_path):
    doc = {"params": 25_557_032, "flops_per_sample": 24.6e9, "precision": "fp16"}
    for spelling, expected in (("NCHW", "contiguous"), ("contiguous_format", "contiguous"),
                               ("channels_first", "contiguous"), ("nhwc", "channels_last"),
                               ("torch.channels_last", "channels_last")):
        assert workload_from_dict({**doc, "memory_format": spelling}).memory_format == expected
    assert workload_from_dict(doc).memory_format is None
    with pytest.raises(WorkloadFileError, match="memory_format"):
        workload_from_dict({**doc, "memory_format": "nchw16c"})

    path = tmp_path / "workload.json"
    path.write_text(json.dumps({**doc, "memory_format": "sideways"}))
    r = CliRunner().invoke(gpuopt, ["predict", "--workload", str(path), "--gpu",
                                    "A100-80GB-SXM4", "--gpus", "1"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "memory_format" in lines[0]
    assert "Traceback" not in r.output


#: A WaveGlow-sized 1-D convolutional network tracked in fp32: 1.86 GB of stored activations
#: and 1.82 GB of channels-first convolution operands per sample (every Conv1d's input and
#: output), no ``memory_format`` (no Conv2d layers).
CONV1D = Workload(params=268_294_760, flops_per_sample=1.568e12, precision="fp32",
                  activation_bytes_per_sample=1.86e9, nchw_conv_bytes_per_sample=1.82e9)


def test_measured_channels_first_convolution_operands_set_the_transposes():
    # TF32 on the A100's tensor cores: 6 x the measured 1.82 GB (fp32, as measured) at 75 %
    # of 2,039 GB/s; not the stored activations, and without any memory_format
    tf32_s = 6 * 1.82e9 / (0.75 * 2039e9)
    assert compute.transpose_time_s(CONV1D, A100, "tf32") == pytest.approx(tf32_s, rel=1e-12)
    # fp16: 2-byte operands, half the bytes; on the V100's fp16 tensor cores too
    assert compute.transpose_time_s(CONV1D, A100, "fp16") == pytest.approx(tf32_s / 2)
    assert compute.transpose_time_s(CONV1D, V100, "fp16") == pytest.approx(
        6 * 0.91e9 / (0.75 * 900e9), rel=1e-12)
    # FP32 on SIMT units: none
    assert compute.transpose_time_s(CONV1D, V100, "fp32") == 0.0
    assert compute.operator_class_times_s(CONV1D, A100, "tf32", 4)["transposes"] == \
        pytest.approx(4 * tf32_s, rel=1e-9)


def test_a_measured_zero_overrides_the_memory_format():
    # every convolution ran channels-last (or there are none): nothing to transpose, even
    # where the file also says contiguous
    none = replace(NET, nchw_conv_bytes_per_sample=0.0)
    assert compute.transpose_time_s(none, A100, "tf32") == 0.0
    # measured on a channels-last network's NCHW stem: the measured bytes, not zero
    stem = replace(NET, memory_format="channels_last", nchw_conv_bytes_per_sample=3e6)
    assert compute.transpose_time_s(stem, A100, "fp16") == pytest.approx(
        6 * 3e6 / (0.75 * 2039e9), rel=1e-12)
    assert workload_from_dict({"params": 1, "flops_per_sample": 1.0, "precision": "fp32",
                               "nchw_conv_bytes_per_sample": 5e6}
                              ).nchw_conv_bytes_per_sample == 5e6
