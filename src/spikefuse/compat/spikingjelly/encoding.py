"""SpikingJelly's `PoissonEncoder`: the same spikes for the same random state."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["PoissonEncoder"]


class PoissonEncoder(nn.Module):
    """x in [0, 1] -> spikes of x's shape and dtype, each 1 with probability x (drawn as
    SpikingJelly draws: `torch.rand_like(x) <= x`, so one seed gives both libraries' spikes)."""

    def __init__(self, step_mode="s"):
        super().__init__()
        self.step_mode = step_mode  # a stateless draw: one step or [T, N, ...] alike

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.rand_like(x).le(x).to(x)
