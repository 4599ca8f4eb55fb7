"""The gradient buckets' all-reduce over GPU peer memory, copied by the GPUs' copy engines.

NCCL's all-reduce runs as kernels that hold SMs while they wait on the peers and move the
data; overlapped with backward's convolutions it slowed them. Here no kernel waits long and
no SM moves data between GPUs (PyTorch's low-contention collectives do the same):

    rows = [world + 1, total] in peer memory      # row r < world: rank r's gradients, every
    out = rows[world]                             # bucket; the last row: the averages
    bucket b, on a side stream:
        (b == 0) barrier                          # every rank has read last step's rows
        cat(gradients) -> rows[rank, b]           # this rank's row
        barrier                                   # every rank's row b is written
      a bucket of SHARE_BYTES or more, in shares: share s of every row is averaged by rank s
        rows[p, b, mine] <- rank p's rows[p, b, mine]   # copy-engine pulls of this rank's share
        out[b, mine] = mean(rows[:world, b, mine])      # rows added in rank order
        barrier                                   # every share averaged
        out[b, s] <- rank s's out[b, s]           # copy-engine pulls of the other shares
      a smaller one whole (on the step's tail a barrier costs more than the averaging saves):
        rows[p, b] <- rank p's rows[p, b]; out[b] = mean(rows[:world, b])

Averaging in shares leaves each GPU 1/world of the averaging, which runs on SMs next to
backward's kernels. Every element's mean is the same sum in the same order wherever it is
computed, so every rank gets the same bits (on 2 ranks, (a + b) / 2: NCCL's average). Each
.grad then views `out`, which peers read their shares from: no copy of this rank's own share
(an averaged share kept in a row of its own cost a local copy, 26 MB a step for CIFAR-medium
on 2 GPUs). The barriers are symmetric memory's (a release at system scope before
the signal), so a pull reads what was written before it; the first bucket's barrier keeps a
rank from overwriting its row while a peer may still be pulling from it.
"""
from __future__ import annotations

import torch

from ..ops.mean_rows import mean_rows
from . import peer_memory

SHARE_BYTES = 2**20


def buffer_bytes(elements: int, world: int) -> int:
    """The GPU memory PeerBuckets holds for `elements` gradient elements over `world` ranks:
    every rank's row and the averages, float32 (NCCL's all-reduce holds none of it)."""
    return (world + 1) * elements * 4


class PeerBuckets:
    """The float32 buckets `sizes` (elements each, in launch order), all-reduced through peer
    memory. A collective to build: every rank of `group` at the same point, outside a CUDA
    graph capture."""

    def __init__(self, sizes: list[int], device: torch.device, group, rank: int, world: int):
        self.rank, self.world = rank, world
        total = sum(sizes)
        self.rows, self.handle = peer_memory.mapped(
            (world + 1, total), torch.float32, device, group, purpose="GradientReducer",
            fallback="GradientReducer(..., transport='nccl') all-reduces the gradients through NCCL instead")
        self.theirs = {p: self.handle.get_buffer(p, (world + 1, total), torch.float32)
                       for p in range(world) if p != rank}
        self.out = self.rows[world]  # the averaged gradients
        start, self.buckets = 0, []
        for size in sizes:
            self.buckets.append(self._plan(slice(start, start + size), size * 4 >= SHARE_BYTES))
            start += size
        self.stream = torch.cuda.Stream(device)
        self.held = []  # the gradients read on the side stream, kept until finish() joins it

    def _plan(self, span: slice, in_shares: bool) -> dict:
        """A bucket's views: this rank's row, the copies before and after the averaging."""
        rank, n = self.rank, span.stop - span.start
        world = self.world
        if not in_shares:
            return {"mine": self.rows[rank, span], "out": self.out[span], "rows": self.rows[:world, span],
                    "pull": [(self.rows[p, span], theirs[p, span]) for p, theirs in self.theirs.items()]}
        cuts = [span.start + k * n // world for k in range(world + 1)]
        share = [slice(a, b) for a, b in zip(cuts, cuts[1:])]
        own = share[rank]
        return {"mine": self.rows[rank, span], "out": self.out[span], "rows": self.rows[:world, own],
                "pull": [(self.rows[p, own], theirs[p, own]) for p, theirs in self.theirs.items()],
                "averaged": self.out[own],
                "gather": [(self.out[share[p]], theirs[world, share[p]]) for p, theirs in self.theirs.items()]}

    def launch(self, b: int, params: list[torch.Tensor]) -> None:
        """Start bucket b's all-reduce of `params`' gradients; each .grad becomes its view of
        the mean (complete once finish() has joined the side stream)."""
        plan = self.buckets[b]
        grads = [p.grad for p in params]
        self.stream.wait_stream(torch.cuda.current_stream(self.out.device))
        with torch.cuda.stream(self.stream):
            if b == 0:
                self.handle.barrier(channel=0)
            torch.cat([_flat(g, p) for g, p in zip(grads, params)], out=plan["mine"])
            self.handle.barrier(channel=0)
            for local, remote in plan["pull"]:
                local.copy_(remote)  # same-device copy of mapped memory: cudaMemcpyAsync, a copy engine
            if "gather" not in plan:
                mean_rows(plan["rows"], plan["out"])
            else:
                mean_rows(plan["rows"], plan["averaged"])  # over this rank's own share of its row
                self.handle.barrier(channel=0)
                for local, remote in plan["gather"]:
                    local.copy_(remote)
        self.held.extend(grads)
        out = plan["out"]
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
