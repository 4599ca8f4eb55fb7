"""A feed-forward network for the Spiking Heidelberg Digits: 700 -> hidden BN-LIF -> 20.

Input: binned events [T, B, 700] (counts, so the first layer does not assume binary
input); the logits are a linear readout of the last hidden layer's spike rates.
"""
from __future__ import annotations

from math import prod

import torch
from torch import nn

from ..nn.layers import check_input, check_time_steps, checked_shape, hidden_layers, name_layers, scaled
from ..nn.spiking_layers import LinearBNLIF

LIF_DEFAULTS = dict(decay=0.9, threshold=0.5, reset="hard", surrogate="fast_sigmoid")


class SHDNet(nn.Module):
    def __init__(self, input_shape=(700,), num_classes: int = 20, hidden=(256,),
                 width: float = 1.0, fused: bool = True, backend: str = "auto", **lif):
        super().__init__()
        lif = {**LIF_DEFAULTS, **lif}
        self.input_shape = checked_shape(input_shape, num_classes)
        sizes = [prod(self.input_shape), *(scaled(h, width) for h in hidden_layers(hidden))]
        self.hidden = nn.ModuleList(
            LinearBNLIF(a, b, fused=fused, spike_input=i > 0, backend=backend, **lif)
            for i, (a, b) in enumerate(zip(sizes, sizes[1:])))
        self.readout = nn.Linear(sizes[-1], num_classes)
        name_layers(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self, x, f"[T, B, *{list(self.input_shape)}]", rank=2 + len(self.input_shape))
        s = x.flatten(2)
        for layer in self.hidden:
            s = layer(s)
        return self.readout(s.mean(0))


def build(input_shape=(700,), num_classes=20, time_steps=None, **kwargs) -> SHDNet:
    """Registry builder; the network does not depend on the number of time steps."""
    check_time_steps(time_steps)
    return SHDNet(input_shape, num_classes, **kwargs)
