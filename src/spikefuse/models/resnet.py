"""Spiking ResNet-18/34 (the temporal-fusion paper's networks; blocks as tdBN's Spiking ResNet).

BasicBlock: s -> conv3x3-BN-LIF -> conv3x3-BN -(+ shortcut)-> LIF, where the shortcut is
the input spikes or conv1x1-BN when the shape changes. The sum feeds the LIF directly, so
the fused form passes the shortcut as BNLIF's `residual` and keeps BN+add+LIF one op.
Stem: 3x3 conv for inputs up to 64 pixels (CIFAR), else 7x7/2 conv and 3x3/2 max pooling
(max of spikes is a spike, so the next conv still saves its input as bits). Head: spike
rates averaged over time and space, then a linear layer.
"""
from __future__ import annotations

import torch
from torch import nn

from ..nn.batchnorm import TemporalBatchNorm2d
from ..neuron_options import check_int
from ..nn.layers import check_input, checked_shape, fold, name_layers, per_step, scaled, unfold
from ..nn.spiking_layers import ConvBNLIF, channels_last_conv, spiking_conv2d

DEPTHS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}
LIF_DEFAULTS = dict(decay=0.5, threshold=0.5, reset="hard", surrogate="rectangular", alpha=1.0)


class ConvBN(nn.Module):
    """conv1x1 (strided) -> temporal BN on spikes: the projection shortcut."""

    def __init__(self, in_channels, out_channels, stride, fused):
        super().__init__()
        conv = nn.Conv2d(in_channels, out_channels, 1, stride, bias=False)
        self.layer = channels_last_conv(conv) if fused else conv
        self.bn = TemporalBatchNorm2d(out_channels)
        self.fused = fused

    def forward(self, s):
        return self.bn(spiking_conv2d(self.layer, s) if self.fused else per_step(self.layer, s))


class BasicBlock(nn.Module):
    def __init__(self, in_channels, out_channels, stride, fused, backend, lif):
        super().__init__()
        self.conv1 = ConvBNLIF(in_channels, out_channels, 3, stride, fused=fused, backend=backend, **lif)
        self.conv2 = ConvBNLIF(out_channels, out_channels, 3, 1, fused=fused, backend=backend, **lif)
        self.shortcut = (ConvBN(in_channels, out_channels, stride, fused)
                         if stride != 1 or in_channels != out_channels else None)

    def forward(self, s):
        residual = s if self.shortcut is None else self.shortcut(s)
        return self.conv2(self.conv1(s), residual=residual)


class SpikingResNet(nn.Module):
    """Input: images [B, C, H, W] (repeated over `time_steps`) or frames [T, B, C, H, W]."""

    def __init__(self, depth: int = 18, input_shape=(3, 32, 32), num_classes: int = 10,
                 time_steps: int = 4, width: float = 1.0, fused: bool = True,
                 backend: str = "auto", **lif):
        super().__init__()
        if depth not in DEPTHS:
            raise ValueError(f"depth: expected one of {list(DEPTHS)}, got {depth}")
        lif = {**LIF_DEFAULTS, **lif}
        self.input_shape, self.fused = checked_shape(input_shape, num_classes), fused
        self.time_steps = check_int("time_steps", time_steps)  # how often a static image is repeated
        widths = [scaled(c, width) for c in (64, 128, 256, 512)]
        small = max(self.input_shape[1:]) <= 64
        self.stem = ConvBNLIF(self.input_shape[0], widths[0], 3 if small else 7, 1 if small else 2,
                              fused=fused, spike_input=False, backend=backend, **lif)
        self.pool = nn.Identity() if small else nn.MaxPool2d(3, 2, 1)
        blocks, c = [], widths[0]
        for stage, (n, out) in enumerate(zip(DEPTHS[depth], widths)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(c, out, stride, fused, backend, lif))
                c = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, num_classes)
        name_layers(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self, x, f"[B, *{list(self.input_shape)}] or [T, B, ...]", rank=(4, 5))
        s = self.stem(x, time_steps=self.time_steps) if x.dim() == 4 else self.stem(x)
        s = unfold(self.pool(fold(s)), s.shape[0]) if self.fused else per_step(self.pool, s)
        s = self.blocks(s)
        return self.fc(s.mean(dim=(0, 3, 4)))


def build_resnet18(input_shape=(3, 32, 32), num_classes=10, time_steps=4, **kwargs):
    return SpikingResNet(18, input_shape, num_classes, 4 if time_steps is None else time_steps, **kwargs)


def build_resnet34(input_shape=(3, 32, 32), num_classes=10, time_steps=4, **kwargs):
    return SpikingResNet(34, input_shape, num_classes, 4 if time_steps is None else time_steps, **kwargs)


build_resnet18.static_images = build_resnet34.static_images = True  # [B, C, H, W], repeated over time
