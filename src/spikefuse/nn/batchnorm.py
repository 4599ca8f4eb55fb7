"""Temporal batch norm: statistics over time and batch together (T*B*H*W per channel).

torch.nn.BatchNorm on the folded view [T*B, C, ...], so running statistics, momentum,
eval mode and state_dict keys are exactly torch's. After
spikefuse.parallel.convert_sync_batchnorm, training statistics also run over every rank
(`sync`), as torch.nn.SyncBatchNorm's do.
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import check_input, fold, unfold


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
