"""Temporal SyncBN: batch-norm statistics over time, batch and every rank of a process group.

Under data parallel each rank holds a slice of the global batch. Converted BN layers
normalise with the statistics of the whole global batch, so N processes compute what one
process computes on the combined batch (torch.nn.SyncBatchNorm's semantics, time included):

    model = spikefuse.parallel.convert_sync_batchnorm(model)   # in place, before DDP wraps it

Forward, one all-reduce per layer. The fused BN+LIF op exchanges every rank's float32
(mean, var, count) rows and merges them by Chan's formula (spikefuse.ops.bn_exchange: three
launches around the all-reduce; through GPU peer memory where it works, one launch in all:
spikefuse.ops.bn_peer_exchange, RankSync). The
reference path (and TemporalBatchNorm1d/2d) sums float64 per-channel
[count*mean, count*(var + mean^2), count]: in float64, var = E[x^2] - mean^2 loses nothing
that matters (~1e-16 * (mean/std)^2 relative).
Backward, fused BN+LIF: one all-reduce of the per-channel [sum dL/dy, sum dL/dy*xhat] that
Eq. 8's means need; the reference path gets the same from autograd, through an all-reduce
whose gradient is the all-reduce of the gradient. Weight and bias gradients stay this
rank's: DDP averages them like every other gradient.

As torch.nn.SyncBatchNorm, only training synchronises; eval uses the running statistics,
which every rank updates with the same global statistics, so they stay equal everywhere.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..nn.batchnorm import TemporalBatchNorm1d, TemporalBatchNorm2d
from ..nn.bn_lif import BNLIF
from ..ops.bn_exchange import combine_moments, pack_moments
from ..ops.bn_peer_exchange import buffer_size, exchange_moments, exchange_sums
from . import peer_memory

SYNCABLE = (TemporalBatchNorm1d, TemporalBatchNorm2d, BNLIF)

__all__ = ["convert_sync_batchnorm", "RankSync", "SYNCABLE"]


def convert_sync_batchnorm(module: nn.Module, process_group=None, *, transport: str = "auto") -> nn.Module:
    """Make every temporal BN layer of `module` (spikefuse.nn TemporalBatchNorm1d/2d and
    BNLIF, both backends) take its training statistics over all ranks of `process_group`
    (None: the default group). In place (parameters, buffers and state_dict keys are
    untouched); returns `module`. Mirrors torch.nn.SyncBatchNorm.convert_sync_batchnorm,
    which would fold time wrongly for these layers; plain torch BatchNorm layers are left
    to torch's converter. transport: how the fused layers' statistics travel, see RankSync."""
    # a module without .modules() raised AttributeError; any other object as the group was kept
    # and failed at the first training forward's all-reduce
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"process_group: expected a torch.distributed process group or None, got {process_group!r}")
    sync = RankSync(process_group, transport)
    for layer in module.modules():
        if isinstance(layer, SYNCABLE):
            layer.sync = sync
    return module


class _AllReduceSum(torch.autograd.Function):
    """Sum over the ranks; its gradient is the sum of the ranks' gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def global_moments(mean, var, count: int, group, differentiable: bool = False):
    """Per-channel (mean, biased variance, total count) over every rank, from this rank's
    float32 mean and variance over `count` values each: one all-reduce."""
    mean, var = mean.double(), var.double()
    local = torch.cat([mean * count, (var + mean * mean) * count, mean.new_full((1,), count)])
    if differentiable:
        sums = _AllReduceSum.apply(local, group)
    else:
        sums = local
        dist.all_reduce(sums, group=group)
    C, total = mean.numel(), sums[-1]
    mean = sums[:C] / total
    return mean, (sums[C:2 * C] / total - mean * mean).clamp_min(0), total


@torch.no_grad()
def update_running(running_mean, running_var, mean, var, total, momentum: float) -> None:
    """torch.nn.BatchNorm's update, with the unbiased variance over all `total` values."""
    if running_mean is None or momentum == 0.0:
        return
    unbiased = var * (total / (total - 1).clamp_min(1))
    running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
    running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)


class RankSync:
    """Where a converted BN layer reduces: a process group (None: the default group), and how.

    transport: how the fused BN+LIF op's exchanges travel (the reference path's float64
    all-reduces always take torch.distributed's):
    - "nccl": bn_exchange's kernels around torch.distributed.all_reduce on the group's
      backend (NCCL, or gloo on CPUs);
    - "symmetric": one kernel per exchange over GPU peer memory
      (spikefuse.ops.bn_peer_exchange), each rank's buffers mapped by every other through
      PyTorch's symmetric memory;
    - "auto": "symmetric" where it works (CUDA tensors on an NCCL group whose ranks
      all run on this host, GPUs with peer access to each other, a torch with symmetric
      memory; see peer_memory.symmetric_unavailable), else "nccl". Every rank decides alike.
    """

    TRANSPORTS = ("auto", "nccl", "symmetric")

    def __init__(self, group=None, transport: str = "auto"):
        if transport not in self.TRANSPORTS:
            raise ValueError(f"transport: expected one of {', '.join(self.TRANSPORTS)}, got {transport!r}")
        self.group, self.transport = group, transport
        self._symmetric = None  # decided at the first exchange
        self._place = None  # (rank, world size) in the group, asked at the first exchange
        self._buffers = {}  # exchange site -> [two peer-memory buffers, the next one's index]

    def __deepcopy__(self, memo):  # a process group is a handle: copies of a model share it
        return self

    @property
    def transport_in_use(self) -> str | None:
        """"symmetric" or "nccl" once the first exchange has decided; None before."""
        return None if self._symmetric is None else "symmetric" if self._symmetric else "nccl"

    def batch_norm(self, x: torch.Tensor, bn: nn.modules.batchnorm._BatchNorm, momentum: float) -> torch.Tensor:
        """Training-mode batch norm of x [N, C, *] (time folded into N) with statistics over
        every rank's x, differentiable; updates bn's running statistics."""
        shape = (1, -1) + (1,) * (x.dim() - 2)
        xf = x.float()
        var, mean = torch.var_mean(xf, dim=[0, *range(2, x.dim())], correction=0)
        mean, var, total = global_moments(mean, var, x.numel() // x.shape[1], self.group, differentiable=True)
        update_running(bn.running_mean, bn.running_var, mean.detach(), var.detach(), total, momentum)
        y = (xf - mean.float().view(shape)) * torch.rsqrt(var.float() + bn.eps).view(shape)
        if bn.weight is not None:
            y = y * bn.weight.view(shape)
        if bn.bias is not None:
            y = y + bn.bias.view(shape)
        return y.to(x.dtype)

    def fused(self, site) -> "FusedSync":
        """The fused BN+LIF op's hook for one forward call of layer `site` (it keeps that
        call's scale for the backward; the layer's exchanges get peer-memory buffers of
        their own)."""
        return FusedSync(self, site)

    def peer_memory(self, tensor: torch.Tensor) -> bool:
        """Whether the exchanges travel through peer memory (decided at the first exchange)."""
        if self._symmetric is None:
            self._symmetric = self._symmetric_works(tensor)
        return self._symmetric

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """A new tensor: `tensor` summed over the ranks by torch.distributed."""
        total = tensor.clone()
        dist.all_reduce(total, group=self.group)
        return total

    def peer_buffers(self, site, rows: int, channels: int, device) -> torch.Tensor:
        """The ranks' addresses of this rank's next buffer for exchange site `site` (a hashable
        naming a layer's forward or backward): [world, rows] 64-bit words, then counters
        (bn_peer_exchange.buffer_size). Each site has two, used in turn: a rank writes one
        again only after the exchange in between, which no rank reaches before it finished
        reading the one before (inside a CUDA graph a site's choice is fixed; the step's other
        exchanges, at least the same layer's backward, separate its replays)."""
        key = (site, rows, channels)
        if key not in self._buffers:  # a collective: every rank reaches the same sites in the same order
            self._buffers[key] = [[self._peer_buffer(rows, channels, device) for _ in range(2)], 0]
        entry = self._buffers[key]
        buffers, turn = entry
        entry[1] = turn ^ 1
        return buffers[turn][1]

    def _peer_buffer(self, rows: int, channels: int, device) -> tuple:
        """(this rank's buffer, the ranks' addresses of theirs as an int64 tensor on `device`)."""
        world = self.place()[1]
        buffer, handle = peer_memory.mapped(
            buffer_size(rows, channels, world)[0], torch.float32, device, self.group, purpose="SyncBN",
            fallback="convert_sync_batchnorm(..., transport='nccl') sends the statistics through NCCL instead")
        offset = buffer.data_ptr() - handle.buffer_ptrs[handle.rank]  # the tensor within its allocation
        addresses = torch.tensor([p + offset for p in handle.buffer_ptrs], dtype=torch.int64, device=device)
        return (buffer, handle), addresses

    def place(self) -> tuple[int, int]:
        """(this rank, ranks) in the group; asked once (each ask costs host time in an eager step)."""
        if self._place is None:
            self._place = (dist.get_rank(self.group), dist.get_world_size(self.group))
        return self._place

    def _symmetric_works(self, tensor: torch.Tensor) -> bool:
        if self.transport == "nccl":
            return False
        why_not = peer_memory.symmetric_unavailable(tensor, self.group)
        if why_not and self.transport == "symmetric":
            raise RuntimeError(f"transport='symmetric': {why_not}")
        if not why_not:
            peer_memory.enable(self.group)
        return not why_not


class FusedSync:
    """spikefuse.ops.bn_lif's SyncBN hook: statistics and Eq. 8's gradient means over every
    rank. One per forward call: the backward needs that call's global count."""

    def __init__(self, ranks: RankSync, site):
        self.ranks, self.site, self.scale = ranks, site, None

    def statistics(self, x, weight, bias, running_mean, running_var, use_batch, momentum, eps):
        """As ops.bn_lif._statistics (stats [mean, invstd, a, b]), over every rank: this
        rank's moments, summed over the ranks, combined (spikefuse.ops.bn_exchange; in one
        kernel over peer memory, spikefuse.ops.bn_peer_exchange)."""
        rank, world = self.ranks.place()
        C = x.shape[2]
        if self.ranks.peer_memory(x):
            buffers = self.ranks.peer_buffers((id(self.site), "forward"), 2 * C + 1, C, x.device)
            stats, self.scale = exchange_moments(x, rank, world, buffers, weight, bias, running_mean, running_var,
                                                 momentum, eps)
            return stats
        summed = self.ranks.all_reduce(pack_moments(x, rank, world))
        stats, self.scale = combine_moments(summed, x.numel() // C, weight, bias, running_mean, running_var,
                                            momentum, eps)
        return stats

    def gradient_sums(self, sums: torch.Tensor, count: int) -> torch.Tensor:
        """[sum dL/dy, sum dL/dy*xhat] over every rank, scaled by count / global count so
        that the kernel's division by this rank's count gives the global means (count is
        the forward's, whose scale this holds)."""
        if self.ranks.peer_memory(sums):
            rank, world = self.ranks.place()
            C = sums.shape[1]
            buffers = self.ranks.peer_buffers((id(self.site), "backward"), 2 * C, C, sums.device)
            return exchange_sums(sums, self.scale, rank, world, buffers)
        return self.ranks.all_reduce(sums.contiguous()).mul_(self.scale)
