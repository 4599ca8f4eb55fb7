"""Temporal batch norm: statistics over time and batch together (T*B*H*W per channel).

torch.nn.BatchNorm on the folded view [T*B, C, ...], so running statistics, momentum,
eval mode and state_dict keys are exactly torch's. After
spikefuse.parallel.convert_sync_batchnorm, training statistics also run over every rank
(`sync`), as torch.nn.SyncBatchNorm's do.
"""
from __future__ import annotations

import torch
from torch import nn

from ..neuron_options import check_int, check_number
from .layers import check_input, fold, unfold


def check_batch_norm(num_features, eps, momentum) -> None:
    """A batch norm's host scalars, where they enter (TemporalBatchNorm*d, BNLIF): torch's
    BatchNorm takes a NaN eps or momentum silently (NaN outputs or running statistics), a
    float num_features to its allocator, and refuses eps <= 0 only in training, per forward."""
    check_int("num_features", num_features)
    check_number("eps", eps, low_open=0.0)
    if momentum is not None:  # None: a cumulative average (torch's rule)
        check_number("momentum", momentum, low=0.0, high=1.0)


def step_momentum(bn: nn.modules.batchnorm._BatchNorm) -> float:
    """The running statistics' update factor for this forward, by torch's rule (momentum
    None: a cumulative average); counts the batch. 0.0 when nothing is updated."""
    if not (bn.training and bn.track_running_stats):
        return 0.0
    bn.num_batches_tracked.add_(1)
    return 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum


class _TemporalBatchNorm:
    """Shared forward: fold time into the batch, normalise, unfold."""

    sync = None  # a spikefuse.parallel.sync_bn.RankSync once converted to SyncBN

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None):
        check_batch_norm(num_features, eps, momentum)
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self, x, self._layout, rank=self._ranks, channels=self.num_features)
        y = fold(x)
        if self.sync is not None and self.training:
            y = self.sync.batch_norm(y, self, step_momentum(self))
        else:
            y = super().forward(y)
        return unfold(y, x.shape[0])


class TemporalBatchNorm1d(_TemporalBatchNorm, nn.BatchNorm1d):
    """BatchNorm1d over [T, B, C] or [T, B, C, L] (statistics over T, B and L)."""

    _layout = "[T, B, C] or [T, B, C, L]"
    _ranks = (3, 4)


class TemporalBatchNorm2d(_TemporalBatchNorm, nn.BatchNorm2d):
    """BatchNorm2d over [T, B, C, H, W] (statistics over T, B, H and W)."""

    _layout = "[T, B, C, H, W]"
    _ranks = (5,)
