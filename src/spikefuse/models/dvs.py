"""A conv net for DVS128 Gesture (after Fang et al.'s PLIF network, with LIF neurons).

Input: event frames [T, B, 2, H, W] (128x128, or downsampled e.g. to 32x32). Blocks of
conv3x3(128)-BN-LIF-maxpool2 until the map is 4x4 (5 blocks at 128, 3 at 32), then
FC 512-BN-LIF and a linear readout of the spike rates, 11 classes. Max pooling keeps
spikes binary, so every conv after the first saves its input as bits.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..nn.layers import check_input, check_time_steps, checked_shape, fold, name_layers, per_step, scaled, unfold
from ..nn.spiking_layers import ConvBNLIF, LinearBNLIF

LIF_DEFAULTS = dict(decay=0.5, threshold=1.0, reset="hard", surrogate="atan")


class DVSGestureNet(nn.Module):
    def __init__(self, input_shape=(2, 128, 128), num_classes: int = 11, channels: int = 128,
                 hidden: int = 512, width: float = 1.0, fused: bool = True,
                 backend: str = "auto", **lif):
        super().__init__()
        lif = {**LIF_DEFAULTS, **lif}
        self.input_shape, self.fused = checked_shape(input_shape, num_classes), fused
        c_in, h, w = self.input_shape
        if h != w or h < 8 or h & (h - 1):
            raise ValueError(f"input_shape: expected square maps of a power-of-two size >= 8, got {input_shape}")
        c = scaled(channels, width, "channels")
        n_blocks = int(math.log2(h // 4))
        self.features = nn.ModuleList(
            ConvBNLIF(c_in if i == 0 else c, c, 3, 1, fused=fused, spike_input=i > 0,
                      backend=backend, **lif) for i in range(n_blocks))
        self.pool = nn.MaxPool2d(2)
        hidden = scaled(hidden, width)
        self.fc = LinearBNLIF(c * 16, hidden, fused=fused, backend=backend, **lif)
        self.readout = nn.Linear(hidden, num_classes)
        name_layers(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self, x, f"[T, B, *{list(self.input_shape)}]", rank=5)
        s = x
        for block in self.features:
            s = block(s)
            s = unfold(self.pool(fold(s)), s.shape[0]) if self.fused else per_step(self.pool, s)
        return self.readout(self.fc(s.flatten(2)).mean(0))


def build(input_shape=(2, 128, 128), num_classes=11, time_steps=None, **kwargs) -> DVSGestureNet:
    """Registry builder; the network does not depend on the number of time steps."""
    check_time_steps(time_steps)
    return DVSGestureNet(input_shape, num_classes, **kwargs)
