"""The gradient buckets' all-reduce over GPU peer memory, copied by the GPUs' copy engines.

NCCL's all-reduce runs as kernels that hold SMs while they wait on the peers and move the
data; overlapped with backward's convolutions it slowed them. Here no kernel waits long and
no SM moves data between GPUs (PyTorch's low-contention collectives do the same):

    rows = [world, total] in peer memory        # row r: rank r's gradients, every bucket
    bucket b, on a side stream:
        (b == 0) barrier                        # every rank has read last step's rows
        cat(gradients) -> rows[rank, b]         # this rank's row
        barrier                                 # every rank's row b is written
        rows[p, b] <- rank p's rows[p, b]       # a copy-engine pull from each peer
        out[b] = mean(rows[:, b])               # rows added in rank order: the same on every rank

Each .grad then views `out`. The barriers are symmetric memory's (a release at system scope
before the signal), so a pull reads a row after it was written; the first bucket's barrier
keeps a rank from overwriting its row while a peer may still be pulling it.
"""
from __future__ import annotations

import torch

from ..ops.mean_rows import mean_rows
from . import peer_memory


class PeerBuckets:
    """The float32 buckets `sizes` (elements each, in launch order), all-reduced through peer
    memory. A collective to build: every rank of `group` at the same point, outside a CUDA
    graph capture."""

    def __init__(self, sizes: list[int], device: torch.device, group, rank: int, world: int):
        self.rank, self.world = rank, world
        total = sum(sizes)
        self.rows, self.handle = peer_memory.mapped(
            (world, total), torch.float32, device, group, purpose="GradientReducer",
            fallback="GradientReducer(..., transport='nccl') all-reduces the gradients through NCCL instead")
        peers = [p for p in range(world) if p != rank]
        theirs = {p: self.handle.get_buffer(p, (world, total), torch.float32) for p in peers}
        edges = [0]
        for size in sizes:
            edges.append(edges[-1] + size)
        self.slices = [slice(a, b) for a, b in zip(edges, edges[1:])]
        # per bucket: (this rank's row, [(local row p, rank p's own row p)], the bucket's rows)
        self.parts = [(self.rows[rank, s], [(self.rows[p, s], theirs[p][p, s]) for p in peers], self.rows[:, s])
                      for s in self.slices]
        self.out = torch.empty(total, device=device)  # the averaged gradients
        self.stream = torch.cuda.Stream(device)
        self.held = []  # the gradients read on the side stream, kept until finish() joins it

    def launch(self, b: int, params: list[torch.Tensor]) -> None:
        """Start bucket b's all-reduce of `params`' gradients; each .grad becomes its view of
        the mean (complete once finish() has joined the side stream)."""
        mine, pulls, rows = self.parts[b]
        grads = [p.grad for p in params]
        self.stream.wait_stream(torch.cuda.current_stream(self.out.device))
        with torch.cuda.stream(self.stream):
            if b == 0:
                self.handle.barrier(channel=0)
            torch.cat([_flat(g, p) for g, p in zip(grads, params)], out=mine)
            self.handle.barrier(channel=0)
            for local, remote in pulls:
                local.copy_(remote)  # same-device copy of mapped memory: cudaMemcpyAsync, a copy engine
            out = self.out[self.slices[b]]
            mean_rows(rows, out)
        self.held.extend(grads)
        offset = out.storage_offset()
        for p in params:  # each gradient in its parameter's layout (the fused optimizers want it)
            p.grad = out.as_strided(p.shape, p.stride(), offset)
            offset += p.numel()

    def finish(self) -> None:
        """The current stream waits for every launched bucket."""
        torch.cuda.current_stream(self.out.device).wait_stream(self.stream)
        self.held = []


def servable(params: list[torch.Tensor]) -> bool:
    """Whether peer buckets can carry these parameters' gradients: float32, each parameter
    dense in memory (contiguous in some order of its dimensions, as channels-last is)."""
    return all(p.dtype == torch.float32 and p.layout == torch.strided and _dense(p) for p in params)


def _dense(p: torch.Tensor) -> bool:
    order = sorted(range(p.dim()), key=lambda d: (p.stride(d), p.size(d)), reverse=True)
    return p.permute(order).is_contiguous()


def _flat(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`grad`'s values in `param`'s memory order, one dimension (a view where the layouts agree)."""
    if grad.stride() != param.stride():
        grad = torch.empty_like(param).copy_(grad)  # empty_like keeps a dense parameter's strides
    return grad.as_strided((grad.numel(),), (1,))
