"""Context parallelism: each sample's sequence split over ``cp`` ranks, the key/value
exchange it costs and the buffers it holds (docs/models.md#context-parallelism).

A rank keeps ``seq/cp`` tokens of every sample: its activations and all its FLOPs (attention
and the rest) are ``1/cp`` of a whole sample's. Causal attention is balanced the way Megatron
and torchtitan do it (the sequence cut into ``2·cp`` chunks, rank ``i`` taking chunks ``i``
and ``2·cp − 1 − i``: zig-zag / head-tail), so every rank has the same attention work.

Attention needs every earlier token's keys and values. Per layer and micro-step a rank
receives, in the forward, the other ranks' K and V:
``2 × b × seq × (kv_heads/tp) × head_dim × element bytes × (cp − 1)/cp``; the backward moves
that again and the same volume of their gradients (``EXCHANGE_VOLUME`` = 3 × the forward's).

- ``ring`` (point-to-point, Megatron's ``cp_comm_type = p2p``, ring attention): ``cp − 1``
  steps, each passing one chunk to the next rank while attention runs on the chunk in hand;
  a step is exposed only by what its transfer takes beyond its chunk's attention.
- ``allgather``: the other ranks' K and V gathered at once, their gradients reduce-scattered
  in the backward (torchtitan's default rotate method, PyTorch's ``_AllGatherRotater``): the
  collective runs under the rank's own chunk's attention only (PyTorch issues it before the
  first, local, sub-attention), and what that does not cover is exposed.

Inside a node the exchange runs on NVLink-class links; a group that crosses nodes is bound by
its hop over the network (each GPU its NIC share).
"""

from __future__ import annotations

from mlflow_gpuopt.perfmodel import comm
from mlflow_gpuopt.perfmodel.compute import (
    attention_efficiency,
    attention_flops_share,
    matmul_efficiency,
)
from mlflow_gpuopt.perfmodel.errors import PerfModelError
from mlflow_gpuopt.perfmodel.layout import Layout
from mlflow_gpuopt.perfmodel.precision import peak_flops_per_s
from mlflow_gpuopt.perfmodel.types import Hardware, Workload

EXCHANGES = ("ring", "allgather")
_ALIASES = {"ring": "ring", "p2p": "ring", "ring_attention": "ring", "ring-attention": "ring",
            "allgather": "allgather", "all_gather": "allgather", "all-gather": "allgather",
            "all_to_all": "allgather", "alltoall": "allgather", "a2a": "allgather"}
#: Bytes exchanged per layer per micro-step over the forward's: the forward's K and V, and in
#: the backward K and V again with their gradients (Megatron's and PyTorch's ring backward
#: pass K, V and dK, dV around the ring; the all-gather variant gathers again and
#: reduce-scatters the gradients).
EXCHANGE_VOLUME = 3.0
#: The backward's share of attention's work (twice the forward's: FORWARD_SHARE = 1/3).
BACKWARD_TO_FORWARD = 2.0
#: K/V chunks (one rank's ``seq/cp`` tokens, K and V) a ring holds beyond its own at the peak
#: of the backward: the chunk in hand and the one arriving, for K/V and for dK/dV.
RING_BUFFER_CHUNKS = 4
#: Smallest divisor of the sequence a degree needs: the load-balanced chunking cuts it into
#: ``2·cp`` chunks (Megatron requires ``seq_len % (2·cp) == 0``).
CHUNKS_PER_RANK = 2


def normalize_exchange(name: str | None) -> str:
    """``ring`` or ``allgather`` from ``ring``, ``p2p``, ``allgather``, ``all-gather``...
    (None: ring)."""
    if name is None or not str(name).strip():
        return "ring"
    key = str(name).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"unknown cp_exchange {name!r}; expected ring (p2p) or allgather")
    return _ALIASES[key]


def check_context(workload: Workload, layout: Layout) -> None:
    """One line when ``layout``'s context-parallel degree does not fit the workload."""
    cp = layout.cp
    if cp <= 1:
        return
    if not (workload.tokens_per_sample and workload.num_layers and workload.hidden_size):
        raise PerfModelError(f"context parallel cp{cp} needs tokens_per_sample, num_layers and "
                             "hidden_size (the sequence it splits and the keys and values it "
                             "exchanges)")
    if (workload.attention or "").strip().lower() in ("eager", "math"):
        raise PerfModelError(f"context parallel cp{cp} needs a fused attention kernel (SDPA / "
                             "flash): ring attention runs it chunk by chunk")
    seq = int(workload.tokens_per_sample)
    if seq % (CHUNKS_PER_RANK * cp):
        raise PerfModelError(f"context parallel cp{cp}: the sequence of {seq} tokens does not "
                             f"split into {CHUNKS_PER_RANK * cp} equal chunks (the load-balanced "
                             "causal split)")


def kv_width(workload: Workload) -> float:
    """Elements per token of K (and of V): key/value heads × head width
    (``hidden × kv_heads / heads``; heads default to hidden / 128)."""
    h = float(workload.hidden_size or 0)
    heads = workload.num_heads or max(1, round(h / 128))
    kv = workload.num_kv_heads or heads
    return h * min(1.0, kv / heads)


def kv_chunk_bytes(workload: Workload, micro_batch: float, seq_len: float, act_bytes: float,
                   tp: int, cp: int) -> float:
    """K and V of one rank's share of the micro-batch: ``2 × b × (seq/cp) × kv width / tp ×
    element bytes`` (tensor parallel splits the key/value heads)."""
    return 2.0 * micro_batch * seq_len / cp * kv_width(workload) / max(1, tp) * act_bytes


def exchange_bytes_per_layer(workload: Workload, micro_batch: float, seq_len: float,
                             act_bytes: float, tp: int, cp: int) -> float:
    """Bytes one GPU receives in one layer's forward: the other ``cp − 1`` ranks' K and V,
    ``2 × b × seq × kv width / tp × bytes × (cp − 1)/cp``."""
    if cp <= 1:
        return 0.0
    return kv_chunk_bytes(workload, micro_batch, seq_len, act_bytes, tp, cp) * (cp - 1)


def _link(layout: Layout, hardware: Hardware) -> tuple[float, float]:
    """(bandwidth, latency) of the context-parallel group's slowest hop."""
    if layout.cp_spans_nodes:
        return (comm.nic_bytes_per_s_per_gpu(hardware) * comm.BUS_EFFICIENCY,
                comm.INTER_NODE_LATENCY_S)
    return (hardware.intra_node_bytes_per_s * comm.intra_bus_efficiency(hardware),
            comm.INTRA_NODE_LATENCY_S)


def attention_s_per_sample(workload: Workload, hardware: Hardware, precision: str) -> float:
    """Seconds of attention's score products (forward + backward) for one whole sample on one
    GPU, uncalibrated: :func:`.compute.attention_flops_share` of the FLOPs at the fused
    kernel's efficiency (the linear layers' where there is no figure), at the 16-bit peak."""
    share = attention_flops_share(workload)
    if share <= 0:
        return 0.0
    p = "bf16" if precision == "fp8" else precision
    eff = attention_efficiency(workload, hardware, precision) or matmul_efficiency(hardware, p)[0]
    return share * workload.flops_per_sample / (peak_flops_per_s(hardware.peak_flops_per_s, p)
                                                * eff)


def exchange_s(workload: Workload, layout: Layout, hardware: Hardware, precision: str,
               micro_batch: float, seq_len: float, act_bytes: float,
               compute_scale: float = 1.0, comm_scale: float = 1.0) -> tuple[float, float]:
    """(seconds the exchange takes, seconds of it on the critical path) for one micro-step of
    this pipeline stage's layers on one GPU (module docstring)."""
    cp = layout.cp
    if cp <= 1:
        return 0.0, 0.0
    layers = max(1, int(workload.num_layers or 1) // layout.pp)
    bw, lat = _link(layout, hardware)
    fwd_bytes = exchange_bytes_per_layer(workload, micro_batch, seq_len, act_bytes, layout.tp,
                                         cp)
    # attention of one chunk pair on this GPU (the rank's 1/cp of the sample, in cp steps)
    attn_fwd = (compute_scale * attention_s_per_sample(workload, hardware, precision)
                * micro_batch / (layout.tp * cp) / float(workload.num_layers or 1)
                / (1.0 + BACKWARD_TO_FORWARD) / cp)
    attn_bwd = BACKWARD_TO_FORWARD * attn_fwd
    if normalize_exchange(workload.cp_exchange) == "allgather":
        # ring all-gather of K, V; the backward gathers again and reduce-scatters dK, dV;
        # each under the local chunk's attention only
        g_fwd = comm_scale * (fwd_bytes / bw + (cp - 1) * lat)
        g_bwd = (EXCHANGE_VOLUME - 1.0) * g_fwd
        total = layers * (g_fwd + g_bwd)
        exposed = layers * (max(0.0, g_fwd - attn_fwd) + max(0.0, g_bwd - attn_bwd))
        return total, exposed
    chunk = fwd_bytes / (cp - 1)
    x_fwd = comm_scale * (chunk / bw + lat)
    x_bwd = comm_scale * ((EXCHANGE_VOLUME - 1.0) * chunk / bw + lat)
    total = layers * (cp - 1) * (x_fwd + x_bwd)
    exposed = layers * (cp - 1) * (max(0.0, x_fwd - attn_fwd) + max(0.0, x_bwd - attn_bwd))
    return total, exposed


def buffer_bytes(workload: Workload, layout: Layout, micro_batch: float,
                 act_bytes: float) -> float:
    """K/V buffers one layer's exchange holds at the peak of its backward: a ring
    ``RING_BUFFER_CHUNKS`` chunks; the all-gather the gathered K, V and their gradients
    (``2 × cp`` chunks)."""
    cp = layout.cp
    if cp <= 1 or not workload.tokens_per_sample or not workload.hidden_size:
        return 0.0
    chunk = kv_chunk_bytes(workload, micro_batch, float(workload.tokens_per_sample), act_bytes,
                           layout.tp, cp)
    if normalize_exchange(workload.cp_exchange) == "allgather":
        return 2.0 * cp * chunk
    return RING_BUFFER_CHUNKS * chunk


def notes(workload: Workload, layout: Layout, total_step_s: float,
          exposed_step_s: float) -> tuple[str, ...]:
    """The context-parallel split and exchange a prediction counted, in words."""
    if layout.cp <= 1:
        return ()
    how = normalize_exchange(workload.cp_exchange)
    where = "across nodes" if layout.cp_spans_nodes else "inside a node"
    if how == "ring":
        exchange = (f"ring exchange of keys and values {total_step_s * 1e3:.3g} ms per step, "
                    f"{exposed_step_s * 1e3:.3g} ms of it not hidden by attention")
    else:
        exchange = (f"all-gather of keys and values {total_step_s * 1e3:.3g} ms per step, "
                    f"{exposed_step_s * 1e3:.3g} ms of it not hidden by the local chunk's "
                    "attention")
    return (f"context parallel cp{layout.cp}: each sample's sequence split {layout.cp} ways "
            f"(causal attention load-balanced, 2·cp chunks), activations and FLOPs per GPU "
            f"÷ {layout.cp}; {exchange}, {where}",)
