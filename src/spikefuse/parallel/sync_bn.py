"""Temporal SyncBN: batch-norm statistics over time, batch and every rank of a process group.

Under data parallel each rank holds a slice of the global batch. Converted BN layers
normalise with the statistics of the whole global batch, so N processes compute what one
process computes on the combined batch (torch.nn.SyncBatchNorm's semantics, time included):

    model = spikefuse.parallel.convert_sync_batchnorm(model)   # in place, before DDP wraps it

Forward, one all-reduce per layer. The fused BN+LIF op exchanges every rank's float32
(mean, var, count) rows and merges them by Chan's formula (spikefuse.ops.bn_exchange: three
launches around the all-reduce), through GPU peer memory where it works (RankSync). The
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

import os
import warnings

import torch
import torch.distributed as dist
from torch import nn

from ..nn.batchnorm import TemporalBatchNorm1d, TemporalBatchNorm2d
from ..nn.bn_lif import BNLIF
from ..ops.bn_exchange import combine_moments, pack_moments

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

    transport: how the fused BN+LIF op's small all-reduces travel (the reference path's
    float64 ones always take torch.distributed's):
    - "nccl": torch.distributed.all_reduce on the group's backend (NCCL, or gloo on CPUs);
    - "symmetric": PyTorch's one-shot all-reduce over GPU peer memory
      (torch.ops.symm_mem.one_shot_all_reduce_copy): each rank reads the others' buffers
      straight over NVLink, no NCCL ring (~9 us against NCCL's ~12 us per exchange inside a
      CUDA graph, ~13 against ~40 us eagerly, on 2 H100s;
      benchmarks/results/multi-gpu-2026-11-27/symm-probe-2gpu-h100.json);
    - "auto": "symmetric" where it works (float32 CUDA tensors on an NCCL group whose ranks
      all run on this host, GPUs with peer access to each other, a torch with the op; see
      symmetric_unavailable), else "nccl". Every rank decides alike.
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

    def exchange(self, tensor: torch.Tensor, site) -> torch.Tensor:
        """A new tensor: `tensor` (float32, left as it is) summed over the ranks. site: a
        hashable naming the call site (a layer's forward or backward)."""
        if self._symmetric is None:
            self._symmetric = self._symmetric_works(tensor)
        if not self._symmetric:
            total = tensor.clone()
            dist.all_reduce(total, group=self.group)
            return total
        key = (site, tensor.shape)
        if key not in self._buffers:  # a collective: every rank reaches the same sites in the same order
            self._buffers[key] = [self._peer_buffers(tensor), 0]
        # The one-shot all-reduce copies into this rank's buffer, waits until every rank has,
        # then reads them all; it does not wait for the others' reads to end. So a site takes
        # its two buffers in turn: a rank writes one again only after the barrier of the
        # exchange in between, which no rank reaches before its reads of the one before end.
        # (Inside a CUDA graph a site's choice is fixed; the step's other exchanges, at least
        # the same layer's backward, separate its replays.)
        entry = self._buffers[key]
        buffer = entry[0][entry[1]]
        entry[1] ^= 1
        return torch.ops.symm_mem.one_shot_all_reduce_copy(buffer, tensor, "sum", self._group_name())

    def _peer_buffers(self, tensor: torch.Tensor) -> list:
        from torch.distributed import _symmetric_memory as symm

        try:
            buffers = [symm.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device) for _ in range(2)]
            for b in buffers:
                symm.rendezvous(b, self._group_name())
        except Exception as e:  # every rank fails alike here (same host, same torch)
            raise RuntimeError(f"SyncBN could not set up its peer-memory exchange ({type(e).__name__}: "
                               f"{(str(e).splitlines() or [''])[0][:200]}); convert_sync_batchnorm(..., "
                               "transport='nccl') sends the statistics through NCCL instead") from e
        return buffers

    def place(self) -> tuple[int, int]:
        """(this rank, ranks) in the group; asked once (each ask costs host time in an eager step)."""
        if self._place is None:
            self._place = (dist.get_rank(self.group), dist.get_world_size(self.group))
        return self._place

    def _group_name(self) -> str:
        return (self.group if self.group is not None else dist.group.WORLD).group_name

    def _symmetric_works(self, tensor: torch.Tensor) -> bool:
        if self.transport == "nccl":
            return False
        why_not = symmetric_unavailable(tensor, self.group)
        if why_not and self.transport == "symmetric":
            raise RuntimeError(f"transport='symmetric': {why_not}")
        if not why_not:
            with warnings.catch_warnings():  # deprecated where every group has it (torch >= 2.11)
                warnings.simplefilter("ignore")
                from torch.distributed import _symmetric_memory as symm

                if hasattr(symm, "enable_symm_mem_for_group"):
                    symm.enable_symm_mem_for_group(self._group_name())
        return not why_not


def symmetric_unavailable(tensor: torch.Tensor, group) -> str:
    """Why the peer-memory all-reduce cannot serve `tensor` on `group` ('' where it can).
    Decided from facts every rank of one host shares."""
    if not tensor.is_cuda or tensor.dtype != torch.float32:
        return "it takes float32 CUDA tensors"
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy"):
        return f"this torch ({torch.__version__}) has no torch.ops.symm_mem.one_shot_all_reduce_copy"
    if dist.get_backend(group) != "nccl":
        return f"the process group's backend is {dist.get_backend(group)}, not nccl"
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is None or int(local) != dist.get_world_size():
        return "it needs every rank on this host (LOCAL_WORLD_SIZE == WORLD_SIZE, as torchrun sets on one host)"
    gpus = range(min(int(local), torch.cuda.device_count()))  # rank r on GPU r, as init_data_parallel places them
    if any(a != b and not torch.cuda.can_device_access_peer(a, b) for a in gpus for b in gpus):
        return "the GPUs cannot all reach each other's memory (no peer access between some pair)"
    return ""


class FusedSync:
    """spikefuse.ops.bn_lif's SyncBN hook: statistics and Eq. 8's gradient means over every
    rank. One per forward call: the backward needs that call's global count."""

    def __init__(self, ranks: RankSync, site):
        self.ranks, self.site, self.scale = ranks, site, None

    def statistics(self, x, weight, bias, running_mean, running_var, use_batch, momentum, eps):
        """As ops.bn_lif._statistics (stats [mean, invstd, a, b]), over every rank: this
        rank's moments packed, summed over the ranks, combined (spikefuse.ops.bn_exchange)."""
        payload = pack_moments(x, *self.ranks.place())
        summed = self.ranks.exchange(payload, (id(self.site), "forward"))
        stats, self.scale = combine_moments(summed, x.numel() // x.shape[2], weight, bias,
                                            running_mean, running_var, momentum, eps)
        return stats

    def gradient_sums(self, sums: torch.Tensor, count: int) -> torch.Tensor:
        """[sum dL/dy, sum dL/dy*xhat] over every rank, scaled by count / global count so
        that the kernel's division by this rank's count gives the global means (count is
        the forward's, whose scale this holds)."""
        return self.ranks.exchange(sums.contiguous(), (id(self.site), "backward")).mul_(self.scale)
