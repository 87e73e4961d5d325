"""Hand-made GPUs, offers and an analytic predictor for testing the recommender's logic.

The predictor follows the design's anchor equations (compute from peak FLOPs × efficiency,
ring all-reduce, DeepSpeed memory formulas) in a few lines, so the tests can reason about
what must and must not be recommended without depending on the fitted model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mlflow_gpuopt.catalog.schema import GpuSpec, Offer
from mlflow_gpuopt.perfmodel.types import (
    Hardware,
    MemoryBreakdown,
    ParallelConfig,
    Prediction,
    Workload,
)

GPUS = {
    "V100-SXM2-16GB": GpuSpec("V100-SXM2-16GB", 16, 900, 15.7, None, 125, None, None, 300, 3,
                              300, "test"),
    "A100-80GB-SXM4": GpuSpec("A100-80GB-SXM4", 80, 2039, 19.5, 156, 312, 312, None, 600, 4,
                              400, "test"),
    "H100-SXM5-80GB": GpuSpec("H100-SXM5-80GB", 80, 3350, 67, 494.7, 989.4, 989.4, 1978.9,
                              900, 5, 700, "test"),
}


def offer(provider: str, instance: str, gpu: str, count: int, price: float, *,
          spot: float | None = None, region: str = "us-east-1", link: str = "nvswitch",
          link_gbs: float = 300.0, net_gbps: float = 400.0, max_nodes: int = 16,
          **kw) -> Offer:
    base = dict(
        provider=provider, instance_type=instance, region=region, gpu=gpu, gpu_count=count,
        gpu_memory_gb=GPUS[gpu].memory_gb, vcpus=12 * count, memory_gb=96.0 * count,
        price_per_hour_usd=price, spot_price_per_hour_usd=spot, billing_increment_s=1,
        billing_minimum_s=60, intra_node_link=link, intra_node_gb_per_s=link_gbs,
        inter_node_gbps=net_gbps, inter_node_rdma=net_gbps >= 100, max_nodes=max_nodes,
        pricing="on_demand", compute_units_per_hour=None, usd_per_compute_unit=None,
        max_session_hours=None, gpu_guaranteed=True, as_of="2025-09-01", source="test")
    base.update(kw)
    return Offer(**base)


OFFERS = [
    offer("aws", "p3.2xlarge", "V100-SXM2-16GB", 1, 3.06, spot=0.92, link="none",
          link_gbs=0, net_gbps=10, max_nodes=8),
    offer("aws", "p3.16xlarge", "V100-SXM2-16GB", 8, 24.48, spot=7.3, link="nvlink",
          link_gbs=150, net_gbps=25),
    offer("aws", "p4de.24xlarge", "A100-80GB-SXM4", 8, 27.45, spot=8.65),
    offer("aws", "p5.48xlarge", "H100-SXM5-80GB", 8, 55.04, spot=17.6, net_gbps=3200),
    offer("lambda", "gpu_1x_a100_sxm4", "A100-80GB-SXM4", 1, 1.79, link="none", link_gbs=0,
          net_gbps=0, max_nodes=1),
    offer("colab", "colab-pro-a100", "A100-80GB-SXM4", 1, 1.18, link="none", link_gbs=0,
          net_gbps=0, max_nodes=1, pricing="compute_units", compute_units_per_hour=11.77,
          usd_per_compute_unit=0.1, max_session_hours=24.0, gpu_guaranteed=False,
          billing_minimum_s=0),
]


def hardware_for(spec: GpuSpec, off: Offer) -> Hardware:
    peaks = {p: spec.peak_tflops(p) * 1e12 for p in ("fp32", "tf32", "fp16", "bf16", "fp8")}
    return Hardware(gpu=spec.name, memory_bytes=spec.memory_gb * 1e9,
                    memory_bandwidth_bytes_per_s=spec.memory_bandwidth_gb_per_s * 1e9,
                    peak_flops_per_s=peaks,
                    intra_node_bytes_per_s=max(off.intra_node_gb_per_s, 16) * 1e9,
                    inter_node_bytes_per_s=off.inter_node_gbps / 8 * 1e9,
                    gpus_per_node=off.gpu_count)


@dataclass
class AnalyticPredictor:
    """Roofline-free toy of the real model: enough structure to rank plans sensibly."""

    workload: Workload
    efficiency: float = 0.4
    log_sigma: float = 0.1
    measured_gpu: str = "A100-80GB-SXM4"
    calls: int = 0

    def _memory(self, cfg: ParallelConfig, hw: Hardware, mb: int) -> MemoryBreakdown:
        psi = self.workload.params / (cfg.tp * cfg.pp)
        n = max(1, cfg.gpus // (cfg.tp * cfg.pp))
        k = self.workload.optimizer_state_bytes_per_param or 12
        s = cfg.strategy
        w, g, o = 2 * psi, 2 * psi, k * psi
        if s == "zero1":
            o /= n
        elif s == "zero2":
            o, g = o / n, g / n
        elif s in ("fsdp", "zero3"):
            w, g, o = w / n, g / n, o / n
        act = (self.workload.activation_bytes_per_sample or 1e6) * mb / (cfg.tp * cfg.pp)
        if cfg.activation_checkpointing:
            act /= 8
        return MemoryBreakdown(w, g, o, act, 1.5e9)

    def max_micro_batch(self, cfg: ParallelConfig, hw: Hardware) -> int:
        fixed = self._memory(cfg, hw, 0).total_bytes
        per = self._memory(cfg, hw, 1).total_bytes - fixed
        free = hw.memory_bytes - fixed
        return max(0, int(free // per)) if per > 0 else 0

    def predict(self, cfg: ParallelConfig, hw: Hardware) -> Prediction:
        self.calls += 1
        mb = cfg.micro_batch or self.workload.micro_batch or 1
        prec = cfg.precision or self.workload.precision
        per_gpu_flops = hw.peak_flops_per_s[prec] * self.efficiency
        t_grad = 0.002 + mb * self.workload.flops_per_sample / per_gpu_flops / (cfg.tp * cfg.pp)
        n = cfg.gpus
        dp = max(1, n // (cfg.tp * cfg.pp))
        bw = hw.intra_node_bytes_per_s if cfg.nodes == 1 else min(
            hw.intra_node_bytes_per_s, hw.inter_node_bytes_per_s / hw.gpus_per_node)
        factor = {"fsdp": 3.0, "zero3": 3.0}.get(cfg.strategy, 2.0)
        comm = 0.0 if dp == 1 else factor * (dp - 1) / dp * 2 * self.workload.params / (
            cfg.tp * cfg.pp) / bw
        t_sync = max(t_grad, comm)
        step = (cfg.grad_accum - 1) * t_grad + t_sync
        bubble = 0.0
        if cfg.pp > 1:
            bubble = step * (cfg.pp - 1) / (cfg.grad_accum + cfg.pp - 1)
            step += bubble
        samples = mb * cfg.grad_accum * dp
        thr = samples / step
        mem = self._memory(cfg, hw, mb)
        sigma = self.log_sigma * (1.0 if hw.gpu == self.measured_gpu else 2.0)
        return Prediction(
            gpu=hw.gpu, config=cfg, throughput_samples_per_s=thr, low=thr * 0.85,
            high=thr * 1.15, log_sigma=sigma, step_time_s=step,
            compute_s=cfg.grad_accum * t_grad, exposed_comm_s=t_sync - t_grad,
            bubble_s=bubble, memory=mem, memory_capacity_bytes=hw.memory_bytes,
            fits=mem.total_bytes <= hw.memory_bytes,
            max_micro_batch=self.max_micro_batch(cfg, hw), samples_per_step=samples,
            extrapolated=hw.gpu != self.measured_gpu)


RESNET = Workload(params=25_557_032, flops_per_sample=3 * 8.2e9, precision="fp16",
                  name="resnet50", micro_batch=256, activation_bytes_per_sample=1.1e8)
BIG = Workload(params=7_000_000_000, flops_per_sample=6 * 7e9 * 2048, precision="bf16",
               name="llm-7b", micro_batch=4, activation_bytes_per_sample=2e9,
               tokens_per_sample=2048)
BIG_FP16 = replace(BIG, precision="fp16", name="llm-7b-fp16")
