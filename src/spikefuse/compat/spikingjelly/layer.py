"""SpikingJelly's stateless layers with a `step_mode`: the torch layer itself for one step
[N, ...] ('s', the default), and on [T, N, ...] with T folded into the batch ('m', which
batch norm's statistics then cover). Their state dicts are torch's, as SpikingJelly's are."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["Linear", "Flatten", "Conv1d", "Conv2d", "Conv3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
           "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
           "AdaptiveAvgPool2d", "AdaptiveAvgPool3d"]


class _Stepped:
    """The step mode of a torch layer (mixed in before it)."""

    def __init__(self, *args, step_mode="s", **kwargs):
        super().__init__(*args, **kwargs)
        if step_mode not in ("s", "m"):
            raise ValueError(f"step_mode must be 's' or 'm', got {step_mode!r}")
        self.step_mode = step_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step_mode == "s":
            return super().forward(x)
        y = super().forward(x.flatten(0, 1))
        return y.reshape(x.shape[:2] + y.shape[1:])

    def extra_repr(self):
        return super().extra_repr() + f", step_mode={self.step_mode}"


def _stepped(layer: type) -> type:
    return type(layer.__name__, (_Stepped, layer), {"__module__": __name__, "__doc__":
                f"torch.nn.{layer.__name__} with SpikingJelly's step_mode ('s' or 'm', keyword only)."})


Linear, Flatten = _stepped(nn.Linear), _stepped(nn.Flatten)
Conv1d, Conv2d, Conv3d = _stepped(nn.Conv1d), _stepped(nn.Conv2d), _stepped(nn.Conv3d)
BatchNorm1d, BatchNorm2d, BatchNorm3d = _stepped(nn.BatchNorm1d), _stepped(nn.BatchNorm2d), _stepped(nn.BatchNorm3d)
MaxPool1d, MaxPool2d, MaxPool3d = _stepped(nn.MaxPool1d), _stepped(nn.MaxPool2d), _stepped(nn.MaxPool3d)
AvgPool1d, AvgPool2d, AvgPool3d = _stepped(nn.AvgPool1d), _stepped(nn.AvgPool2d), _stepped(nn.AvgPool3d)
AdaptiveAvgPool1d, AdaptiveAvgPool2d = _stepped(nn.AdaptiveAvgPool1d), _stepped(nn.AdaptiveAvgPool2d)
AdaptiveAvgPool3d = _stepped(nn.AdaptiveAvgPool3d)
