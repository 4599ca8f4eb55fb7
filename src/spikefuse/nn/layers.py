"""Time-folded layers: a stateless module runs once over all T steps folded into the batch.

[T, B, ...] -> [T*B, ...] -> module -> [T, B, ...]: one launch per layer instead of T.
`per_step` is the unfused baseline (a Python loop over T); `Dropout` can share one mask
across time steps. Shape errors name the layer: `name_layers(model)` gives every
submodule its qualified name for those messages.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..neuron_options import MAX_INT, check_int, check_number


def layer_name(module: nn.Module) -> str:
    return getattr(module, "_layer_name", None) or type(module).__name__


def name_layers(model: nn.Module) -> nn.Module:
    """Label each submodule with its qualified name (used in shape-error messages)."""
    root = type(model).__name__
    for name, module in model.named_modules():
        module._layer_name = f"{root}.{name}" if name else root
    return model


def check_input(module: nn.Module, x: torch.Tensor, layout: str, rank=None, channels=None, dim=2):
    """Raise ValueError naming the layer unless x has `rank` dims and `channels` at `dim`."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{layer_name(module)}: expected a tensor {layout}, got {type(x).__name__}")
    ranks = rank if isinstance(rank, tuple) else (rank,)
    if rank is not None and x.dim() not in ranks:
        raise ValueError(f"{layer_name(module)}: expected input {layout} ({' or '.join(map(str, ranks))} dims), "
                         f"got shape {tuple(x.shape)}")
    needed = dim + 1 if dim >= 0 else -dim
    if channels is not None and (x.dim() < needed or x.shape[dim] != channels):
        what = "features" if dim == -1 else "channels"
        raise ValueError(f"{layer_name(module)}: expected input {layout} with {channels} {what} "
                         f"at dim {dim}, got shape {tuple(x.shape)}")


def checked_shape(input_shape, num_classes) -> tuple[int, ...]:
    """A model's input_shape as a tuple of ints, each and num_classes an int in [1, MAX_INT]
    (check_int: ValueError, or ArgumentError for 2.5 or NaN, which int() truncated or raised
    on deep in torch). Every model of spikefuse.models checks them here."""
    if isinstance(input_shape, (str, bytes)) or not hasattr(input_shape, "__iter__") or not len(input_shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive sizes, got {input_shape!r}")
    for size in input_shape:
        check_int("input_shape", size)
    check_int("num_classes", num_classes)
    return tuple(int(s) for s in input_shape)


def hidden_layers(hidden) -> tuple:
    """A model's hidden layer sizes as given: a non-empty tuple or list (each size is checked by
    check_int or scaled). A bare int is refused by name, not taken as one layer: where the
    default has two layers (256, 256), hidden=512 could mean one layer or two of 512 (it
    raised "'int' object is not iterable"); an empty list would build no spiking layer."""
    if not isinstance(hidden, (tuple, list)) or not hidden:
        raise ValueError(f"hidden must list at least one layer size, like (256,), got {hidden!r}")
    return tuple(hidden)


def check_time_steps(time_steps) -> int | None:
    """A model builder's time_steps: None (the builder's default) or an int >= 1 (check_int),
    checked also where the network does not depend on T, so every builder takes the same values."""
    return None if time_steps is None else check_int("time_steps", time_steps)


MAX_UNITS = MAX_INT  # units or channels of one layer: far past any that fits in memory


def scaled(size: int, width, name: str = "hidden") -> int:
    """A layer of `size` units (or channels) scaled by a model's `width`: max(1, round(size *
    width)). ValueError naming width for one that is not a finite number > 0, or that makes
    the layer wider than MAX_UNITS (a width of 1e30 used to end in an overflow deep in torch);
    `size`, a caller's argument, is checked as `name` (check_int)."""
    size = check_int(name, size)
    ok = isinstance(width, (int, float)) and not isinstance(width, bool) and 0 < width < math.inf
    if not ok or width > 1e300:  # past float range: the message below could not format it
        raise ValueError(f"width: expected a finite number > 0 (the scale of the model's layer widths), got {width!r}")
    units = size * width
    if units > MAX_UNITS:
        raise ValueError(f"width: {width!r} makes a layer of {size} units {units:.3g} wide, past the "
                         f"{MAX_UNITS} a layer can have")
    return max(1, round(units))


def check_frames(module: nn.Module, x: torch.Tensor, input_shape) -> None:
    """Raise ValueError naming the layer unless x is [T, B, *input_shape] or, flattened,
    [T, B, prod(input_shape)] (what the dense networks of spikefuse.models read)."""
    shape = list(input_shape)
    n = 1
    for size in shape:
        n *= size
    layout = f"[T, B, {', '.join(map(str, shape))}]" + (f" or [T, B, {n}]" if len(shape) > 1 else "")
    check_input(module, x, layout, rank=tuple(sorted({3, 2 + len(shape)})))
    if list(x.shape[2:]) not in (shape, [n]):
        raise ValueError(f"{layer_name(module)}: expected input {layout}, got shape {tuple(x.shape)}")


def _expected_channels(module):
    """(channels, dim) a wrapped layer reads from its unfolded [T, B, ...] input, if known."""
    if isinstance(module, nn.modules.conv._ConvNd):
        return module.in_channels, 2
    if isinstance(module, nn.Linear):
        return module.in_features, -1
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return module.num_features, 2
    return None, 2


def fold(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(0, 1)


def unfold(y: torch.Tensor, T: int) -> torch.Tensor:
    return y.unflatten(0, (T, y.shape[0] // T))


class TimeFolded(nn.Module):
    """Wrap a stateless module (Linear, Conv2d, pooling, dropout...) to take [T, B, ...]."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels, dim = _expected_channels(self.module)
        check_input(self, x, "[T, B, ...]", rank=tuple(range(3, 9)))
        check_input(self, x, "[T, B, ...]", channels=channels, dim=dim)
        return unfold(self.module(fold(x)), x.shape[0])


def per_step(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The unfused baseline: `module` applied to each time step in a Python loop."""
    return torch.stack([module(x[t]) for t in range(x.shape[0])])


class Dropout(nn.Module):
    """Dropout on [T, B, ...]; with shared_across_time=True one mask per sample is drawn
    and reused at every step, so a dropped neuron stays silent for the whole sequence."""

    def __init__(self, p: float = 0.5, shared_across_time: bool = True):
        super().__init__()
        # p = 1 would divide the kept (no) values by 0; a string failed in a comparison
        self.p, self.shared_across_time = check_number("p", p, low=0.0, high_open=1.0), shared_across_time

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if not self.shared_across_time:
            return nn.functional.dropout(x, self.p, True)
        check_input(self, x, "[T, B, ...]", rank=tuple(range(2, 9)))
        mask = torch.empty((1, *x.shape[1:]), device=x.device, dtype=x.dtype).bernoulli_(1 - self.p)
        return x * mask.div_(1 - self.p)

    def extra_repr(self):
        return f"p={self.p}, shared_across_time={self.shared_across_time}"
