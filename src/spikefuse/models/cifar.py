"""The CIFAR-10 networks of Liang et al. (Table I): small, medium and large.

Every conv/FC output goes through BN and LIF (decay 0.25, threshold 0.25, rectangular
surrogate of width 1 and height 1, hard reset to 0). There is no pooling: as in the
authors' code, the last 3x3 conv of each stage has stride 2 (32 -> 16 -> 8 -> 4). The
input is direct: the image is repeated at every time step (the fused form convolves it
once). The last FC layer reads the spike rates (the time-mean of the 512FC spikes).
"""
from __future__ import annotations

import torch
from torch import nn

from ..neuron_options import check_int
from ..nn.layers import check_input, checked_shape, name_layers, scaled
from ..nn.spiking_layers import ConvBNLIF, LinearBNLIF

TABLE_I = {  # (output channels, stride) of the 3x3 convs
    "small": [(128, 2), (256, 2), (512, 2)],
    "medium": [(128, 1), (128, 1), (128, 2), (256, 1), (256, 2), (512, 1), (512, 2)],
    "large": [(128, 1), (128, 1), (128, 2), (256, 1), (256, 1), (256, 2),
              (512, 1), (512, 1), (512, 2)],
}
FC = (1024, 512)
LIANG_LIF = dict(decay=0.25, threshold=0.25, reset="hard", surrogate="rectangular", alpha=1.0)




class CifarNet(nn.Module):
    """Input: images [B, C, H, W] (repeated over `time_steps`) or frames [T, B, C, H, W];
    output: logits [B, num_classes]. fused=False builds the per-step baseline."""

    def __init__(self, size: str = "medium", input_shape=(3, 32, 32), num_classes: int = 10,
                 time_steps: int = 10, width: float = 1.0, fused: bool = True,
                 backend: str = "auto", **lif):
        super().__init__()
        if size not in TABLE_I:
            raise ValueError(f"size: unknown {size!r}; expected one of {list(TABLE_I)}")
        lif = {**LIANG_LIF, **lif}
        # time_steps: how often a static image is repeated (int() truncated 2.5, and took "3")
        self.input_shape, self.time_steps = checked_shape(input_shape, num_classes), check_int("time_steps", time_steps)
        c, h, w = self.input_shape
        blocks = []
        for i, (channels, stride) in enumerate(TABLE_I[size]):
            out = scaled(channels, width)
            blocks.append(ConvBNLIF(c, out, 3, stride, fused=fused, spike_input=i > 0,
                                    backend=backend, **lif))
            c, h, w = out, (h - 1) // stride + 1, (w - 1) // stride + 1
        self.features = nn.ModuleList(blocks)
        sizes = [c * h * w, *(scaled(f, width) for f in FC)]
        self.classifier = nn.ModuleList(
            LinearBNLIF(a, b, fused=fused, backend=backend, **lif) for a, b in zip(sizes, sizes[1:]))
        self.readout = nn.Linear(sizes[-1], num_classes)
        name_layers(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self, x, f"[B, *{list(self.input_shape)}] or [T, B, ...]", rank=(4, 5))
        if x.dim() == 4:
            s = self.features[0](x, time_steps=self.time_steps)
        else:
            s = self.features[0](x)
        for block in self.features[1:]:
            s = block(s)
        s = s.flatten(2)  # logical (C, H, W) order, as the vanilla form: copies channels-last spikes
        for block in self.classifier:
            s = block(s)
        return self.readout(s.mean(0))


def builder(size):
    def build(input_shape=(3, 32, 32), num_classes=10, time_steps=10, **kwargs) -> CifarNet:
        return CifarNet(size, input_shape, num_classes, 10 if time_steps is None else time_steps, **kwargs)
    build.__doc__ = f"Registry builder for the {size} network of Liang et al. Table I."
    build.static_images = True  # takes [B, C, H, W] images and repeats them over time (direct encoding)
    return build


build_small, build_medium, build_large = builder("small"), builder("medium"), builder("large")
