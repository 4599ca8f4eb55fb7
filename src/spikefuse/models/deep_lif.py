"""deep-lif: a deep stack of Linear + LIF layers (8 x 2048 by default), the network the
temporal pipeline (spikefuse.parallel.pipeline) is benchmarked on.

All layers sit flat in `self.layers` (Flatten, Linear, LIF, SpikingLinear, LIF, ...,
SpikingLinear readout), the form the pipeline cuts into stages and `spikefuse export`
reads; the logits are the readout's output averaged over the T steps (readout="mean").
Hidden weights are U(+-4/sqrt(fan_in)), no biases: with decay 0.9 and threshold 1 this
keeps every layer firing at ~13% for inputs at 20% (PyTorch's default init, 1/sqrt(fan_in),
goes silent by the second layer), so the deep stack trains from the start.
"""
from __future__ import annotations

import math
from math import prod

import torch
from torch import nn

from ..neuron_options import check_int
from ..nn import LIF
from ..nn.layers import check_frames, check_time_steps, checked_shape, name_layers, scaled
from ..nn.spiking_layers import SpikingLinear

DEPTH, HIDDEN = 8, 2048
INPUT_SHAPE, NUM_CLASSES = (HIDDEN,), 10
LIF_DEFAULTS = dict(decay=0.9, threshold=1.0, reset="hard", surrogate="fast_sigmoid")
INIT_GAIN = 4.0


class DeepLIF(nn.Module):
    """[T, B, *input_shape] -> logits [B, num_classes] through `depth` Linear+LIF layers.

    hidden: units per layer; width scales it (tests, quick runs); backend picks the LIF
    implementation; **lif overrides LIF_DEFAULTS (decay, threshold, reset, surrogate, ...).
    """

    readout = "mean"  # export and the pipeline's loss read this: logits = time-mean of the last Linear

    def __init__(self, input_shape=INPUT_SHAPE, num_classes: int = NUM_CLASSES, depth: int = DEPTH,
                 hidden: int = HIDDEN, width: float = 1.0, backend: str = "auto", **lif):
        super().__init__()
        self.input_shape = checked_shape(input_shape, num_classes)
        depth = check_int("depth", depth)
        self.hidden = scaled(hidden, width)
        lif = {**LIF_DEFAULTS, **lif, "backend": backend}
        layers: list[nn.Module] = [nn.Flatten(start_dim=2)]  # [T, B, ...] -> [T, B, N]
        n_in = prod(self.input_shape)
        for i in range(depth):  # the first layer reads the raw input, the others spikes (saved as bits)
            layers += [(nn.Linear if i == 0 else SpikingLinear)(n_in, self.hidden, bias=False), LIF(**lif)]
            n_in = self.hidden
        layers.append(SpikingLinear(n_in, num_classes))
        self.layers = nn.Sequential(*layers)
        self.reset_parameters()
        name_layers(self)

    @torch.no_grad()
    def reset_parameters(self):
        for m in self.layers[:-1]:
            if isinstance(m, nn.Linear):
                bound = INIT_GAIN / math.sqrt(m.in_features)
                m.weight.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_frames(self, x, self.input_shape)
        return self.layers(x).mean(0)

    def extra_repr(self):
        return f"input_shape={self.input_shape}, depth={(len(self.layers) - 2) // 2}, hidden={self.hidden}"


def build(input_shape=INPUT_SHAPE, num_classes=NUM_CLASSES, time_steps=None, **kwargs) -> DeepLIF:
    """Registry builder; the network does not depend on T."""
    check_time_steps(time_steps)
    return DeepLIF(input_shape, num_classes, **kwargs)


__all__ = ["DeepLIF", "build", "DEPTH", "HIDDEN", "LIF_DEFAULTS"]
