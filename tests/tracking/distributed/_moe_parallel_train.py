"""A small job on a 2-D ``DeviceMesh``, tracked by ``gpuopt.track()``: run by torchrun
(gloo, 4 CPU processes) from ``test_moe_parallel.py``.

``--mode ep``: a (dp 2, ep 2) mesh and a mixture-of-experts layer whose 4 experts are split
over the ``ep`` group (2 per rank). Tokens go to their top-2 experts' ranks and back with
``torch.distributed.all_to_all_single`` over the ``ep`` group (the counts per expert, then the
token rows; backward sends the gradients the same way). The dense weights are all-reduced by
DDP over every rank; the experts' gradients are averaged over the ``dp`` group (the ranks that
hold the same experts) by hand.

``--mode cp``: a (dp 2, cp 2) mesh and one attention layer whose sequence is split over the
``cp`` group: each rank holds half the tokens and all-gathers the keys and values of the
other half (the backward all-reduces their gradients and keeps its slice). The pair of
``cp`` ranks reads the same samples; DDP reduces gradients over every rank.

Prints one JSON line on rank 0 with the figures the test checks against.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

import mlflow_gpuopt as gpuopt

VOCAB, HIDDEN, WIDTH, EXPERTS, TOP_K = 64, 32, 48, 4, 2
BATCH, SEQ = 4, 16


class _AllToAll(torch.autograd.Function):
    """Rows to the ranks of ``group`` by ``send`` counts; the backward sends the gradients
    back by the same counts."""

    @staticmethod
    def forward(ctx, x, recv, send, group):
        ctx.recv, ctx.send, ctx.group = recv, send, group
        out = x.new_empty(sum(recv), x.shape[1])
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty(sum(ctx.send), grad.shape[1])
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None


class Expert(nn.Module):
    """A gated (SwiGLU) MLP, Mixtral's expert."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(HIDDEN, WIDTH, bias=False)
        self.w3 = nn.Linear(HIDDEN, WIDTH, bias=False)
        self.w2 = nn.Linear(WIDTH, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class ExpertParallelMoE(nn.Module):
    """Router over ``EXPERTS`` experts, this rank holding ``EXPERTS / ep`` of them."""

    def __init__(self, group) -> None:
        super().__init__()
        self.group, self.ep = group, dist.get_world_size(group)
        self.num_experts, self.top_k = EXPERTS, TOP_K
        self.local = EXPERTS // self.ep
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(self.local))

    def forward(self, x):  # x: [tokens, hidden]
        weights, chosen = torch.topk(F.softmax(self.gate(x), dim=-1), TOP_K, dim=-1)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        rows = x[order // TOP_K]  # token copies sorted by expert, so by rank
        counts = torch.bincount(flat, minlength=EXPERTS)
        got_counts = torch.empty_like(counts)
        dist.all_to_all_single(got_counts, counts, group=self.group)
        send = counts.view(self.ep, self.local).sum(1).tolist()
        got = got_counts.view(self.ep, self.local)  # [source rank, local expert]
        received = _AllToAll.apply(rows, got.sum(1).tolist(), send, self.group)
        chunks = received.split(got.reshape(-1).tolist())
        done = torch.cat([self.experts[i % self.local](c) for i, c in enumerate(chunks)])
        back = _AllToAll.apply(done, send, got.sum(1).tolist(), self.group)
        out = torch.zeros_like(back).index_copy(0, order, back)
        return (out.view(-1, TOP_K, HIDDEN) * weights.unsqueeze(-1)).sum(1)


class MoeLM(nn.Module):
    def __init__(self, group) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.moe = ExpertParallelMoE(group)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed(ids).reshape(-1, HIDDEN)
        return self.head(x + self.moe(x)).view(*ids.shape, VOCAB)


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence over ``group``; the backward sums the gradients over
    the group and keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.rank, ctx.n = group, dist.get_rank(group), dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(ctx.n)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.n, dim=1)[ctx.rank].contiguous(), None


class ContextParallelLM(nn.Module):
    def __init__(self, group) -> None:
        super().__init__()
        self.group = group
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):  # ids: this rank's slice of the sequence
        x = self.embed(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        k, v = _GatherSeq.apply(k, self.group), _GatherSeq.apply(v, self.group)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.head(x + y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("ep", "cp"), required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--interval", type=float, default=0.2)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", args.mode))
    split, dp_rank = mesh.get_group(args.mode), mesh.get_local_rank("dp")
    torch.manual_seed(0)  # the same initial weights on every rank
    if args.mode == "ep":
        inner = MoeLM(split)
        expert_names = [f"moe.experts.{n}" for n, _ in inner.moe.experts.named_parameters()]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(inner, expert_names)
        torch.manual_seed(1 + mesh.get_local_rank("ep"))  # each rank's own experts
        for p in inner.moe.experts.parameters():
            nn.init.normal_(p, std=0.1)
        seed = dist.get_rank()  # every rank reads its own samples
    else:
        inner = ContextParallelLM(split)
        seed = dp_rank  # the cp pair reads the same samples
    model = DistributedDataParallel(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + seed)
    cp_rank = mesh.get_local_rank("cp") if args.mode == "cp" else 0
    with gpuopt.track(model=model, optimizer=opt, device_mesh=mesh, interval_s=args.interval,
                      warmup_steps=2, name=f"moe-{args.mode}", print_summary=False):
        for _ in range(args.steps):
            ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
            if args.mode == "cp":
                ids = ids.chunk(2, dim=1)[cp_rank]
            logits = model(ids)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1))
            opt.zero_grad()
            loss.backward()
            if args.mode == "ep":  # the ranks holding the same experts average their grads
                for p in inner.moe.experts.parameters():
                    dist.all_reduce(p.grad, group=mesh.get_group("dp"))
                    p.grad /= mesh.size(0)
            opt.step()
    if dist.get_rank() == 0:
        dense = sum(p.numel() for n, p in inner.named_parameters()
                    if not n.startswith("moe.experts."))
        print("FIGURES " + json.dumps({"dense_params": dense, "loss": loss.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
