"""A spiking multilayer perceptron: Linear -> LIF blocks, then a linear readout
averaged over time (the logits are the mean membrane drive of the output layer)."""
from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch
from torch import nn

from ..neuron_options import check_int
from ..nn import LIF
from ..nn.layers import check_time_steps, checked_shape, hidden_layers


class SpikingMLP(nn.Module):
    """Input [T, B, *input_shape] -> logits [B, num_classes].

    Each hidden block is Linear -> LIF; the readout is a Linear layer whose output is
    averaged over the T steps: a non-spiking integrator, so the logits are smooth in
    the weights and cross-entropy trains robustly.
    """

    readout = "mean"  # export reads this: the logits are the time-mean of the last Linear

    def __init__(self, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (256, 256),
                 decay: float = 0.8, threshold: float = 1.0, surrogate: str = "fast_sigmoid",
                 alpha: float | None = None, reset: str = "hard"):
        super().__init__()
        input_shape = checked_shape(input_shape, num_classes)
        sizes = [prod(input_shape), *(check_int("hidden", h) for h in hidden_layers(hidden))]
        layers: list[nn.Module] = [nn.Flatten(start_dim=2)]  # [T, B, ...] -> [T, B, N]
        for n_in, n_out in zip(sizes, sizes[1:]):
            layers += [nn.Linear(n_in, n_out),
                       LIF(decay=decay, threshold=threshold, reset=reset, surrogate=surrogate, alpha=alpha)]
        layers.append(nn.Linear(sizes[-1], num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 3:
            raise ValueError(f"SpikingMLP expects time-major input [T, B, ...], got shape {tuple(x.shape)}")
        return self.layers(x).mean(0)


def build(input_shape, num_classes, time_steps=None, **kwargs) -> SpikingMLP:
    """Registry builder; an MLP does not depend on the number of time steps."""
    check_time_steps(time_steps)
    return SpikingMLP(input_shape, num_classes, **kwargs)
