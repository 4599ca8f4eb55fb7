"""Temporal batch norm: statistics over time and batch together (T*B*H*W per channel).

torch.nn.BatchNorm on the folded view [T*B, C, ...], so running statistics, momentum,
eval mode and state_dict keys are exactly torch's.
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import check_input, fold, unfold


class TemporalBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d over [T, B, C] or [T, B, C, L] (statistics over T, B and L)."""

    _layout = "[T, B, C] or [T, B, C, L]"
    _ranks = (3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self, x, self._layout, rank=self._ranks, channels=self.num_features)
        return unfold(super().forward(fold(x)), x.shape[0])


class TemporalBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d over [T, B, C, H, W] (statistics over T, B, H and W)."""

    _layout = "[T, B, C, H, W]"
    _ranks = (5,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self, x, self._layout, rank=self._ranks, channels=self.num_features)
        return unfold(super().forward(fold(x)), x.shape[0])
