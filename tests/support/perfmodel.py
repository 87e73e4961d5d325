"""Two hand-made GPUs for the scaling-model tests: round datasheet-like figures, so the
expected terms can be computed by hand."""

from __future__ import annotations

from mlflow_gpuopt.perfmodel import Hardware

A100 = Hardware(gpu="A100-80GB-SXM4", memory_bytes=80e9, memory_bandwidth_bytes_per_s=2000e9,
                peak_flops_per_s={"fp32": 20e12, "tf32": 160e12, "fp16": 320e12,
                                  "bf16": 320e12},
                intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=50e9, gpus_per_node=8)
V100 = Hardware(gpu="V100-SXM2-16GB", memory_bytes=16e9, memory_bandwidth_bytes_per_s=900e9,
                peak_flops_per_s={"fp32": 15.7e12, "fp16": 125e12},
                intra_node_bytes_per_s=150e9, inter_node_bytes_per_s=12.5e9, gpus_per_node=8)
