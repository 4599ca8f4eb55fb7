"""Temporal SyncBN: batch-norm statistics over time, batch and every rank of a process group.

Under data parallel each rank holds a slice of the global batch. Converted BN layers
normalise with the statistics of the whole global batch, so N processes compute what one
process computes on the combined batch (torch.nn.SyncBatchNorm's semantics, time included):

    model = spikefuse.parallel.convert_sync_batchnorm(model)   # in place, before DDP wraps it

Forward, one all-reduce per layer: float64 per-channel [count*mean, count*(var + mean^2)]
and the count, made from each rank's float32 (mean, var). Summed in float64,
var = E[x^2] - mean^2 loses nothing that matters (~1e-16 * (mean/std)^2 relative).
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

SYNCABLE = (TemporalBatchNorm1d, TemporalBatchNorm2d, BNLIF)

__all__ = ["convert_sync_batchnorm", "RankSync", "SYNCABLE"]


def convert_sync_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """Make every temporal BN layer of `module` (spikefuse.nn TemporalBatchNorm1d/2d and
    BNLIF, both backends) take its training statistics over all ranks of `process_group`
    (None: the default group). In place (parameters, buffers and state_dict keys are
    untouched); returns `module`. Mirrors torch.nn.SyncBatchNorm.convert_sync_batchnorm,
    which would fold time wrongly for these layers; plain torch BatchNorm layers are left
    to torch's converter."""
    # a module without .modules() raised AttributeError; any other object as the group was kept
    # and failed at the first training forward's all-reduce
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"process_group: expected a torch.distributed process group or None, got {process_group!r}")
    sync = RankSync(process_group)
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
    """Where a converted BN layer reduces: a process group (None: the default group)."""

    def __init__(self, group=None):
        self.group = group

    def __deepcopy__(self, memo):  # a process group is a handle: copies of a model share it
        return self

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

    def fused(self) -> "FusedSync":
        """The fused BN+LIF op's hook for one forward call (it keeps that call's count)."""
        return FusedSync(self.group)


class FusedSync:
    """spikefuse.ops.bn_lif's SyncBN hook: statistics and Eq. 8's gradient means over every
    rank. One per forward call: the backward needs that call's global count."""

    def __init__(self, group):
        self.group, self.total = group, None

    def statistics(self, x, weight, bias, running_mean, running_var, use_batch, momentum, eps):
        """As ops.bn_lif._statistics (stats [mean, invstd, a, b]), over every rank."""
        from ..ops.bn_lif import _statistics

        # this rank's moments from the statistics kernels: with eps = 0, invstd = 1/sqrt(var)
        # (IEEE-rounded), so var comes back to within a few float32 ulps
        local = _statistics(x, None, None, None, None, True, 0.0, 0.0)
        mean, var, self.total = global_moments(local[0], local[1].double().pow(-2),
                                               x.numel() // x.shape[2], self.group)
        update_running(running_mean, running_var, mean, var, self.total, momentum)
        # the global moments in the running statistics' place: the kernels then write the stats
        return _statistics(x, weight, bias, mean.float(), var.float(), False, 0.0, eps)

    def gradient_sums(self, sums: torch.Tensor, count: int) -> torch.Tensor:
        """[sum dL/dy, sum dL/dy*xhat] over every rank, scaled by count / global count so
        that the kernel's division by this rank's count gives the global means."""
        total = sums.clone()
        dist.all_reduce(total, group=self.group)
        return total * (count / self.total)
