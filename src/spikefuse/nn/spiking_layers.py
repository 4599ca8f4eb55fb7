"""Linear and Conv2d whose input spikes are saved for backward as bits, and the
conv/linear -> BN -> LIF blocks the models are built from.

A spike input is only needed in backward for the weight gradient; autograd would keep it
as a float tensor (4 bytes per spike in float32). Here it is packed to 1 bit
(spikefuse.ops.spike_pack) and unpacked on the fly in backward, so no float copy of the
spikes outlives the forward. The input must be binary: nonzero values count as 1, checked
only with SPIKEFUSE_DEBUG=1. Spikes from a fused BN+LIF come with their bits already
packed by its kernel (spike_pack.attached_bits); a conv or linear layer over them saves those.
The ops themselves live in spikefuse.ops.spike_linear and spikefuse.ops.spike_conv.

Layout: the fused blocks keep conv weights and activations channels-last (NHWC in memory),
so cuDNN convolves without converting to and from NCHW; the bits are packed in memory
order and unpacked into the same layout for the weight gradient.
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops.spike_conv import is_channels_last, memory_order, spike_conv2d, without_onednn
from ..ops.spike_linear import spike_linear
from ..ops.padded_rows import padded_full
from ..ops.spike_pack import attached_bits, pack
from .batchnorm import TemporalBatchNorm1d, TemporalBatchNorm2d
from .bn_lif import BNLIF
from ..neuron_options import check_int
from .layers import check_input, fold, unfold
from .neurons import LIF


def _saved_bits(s: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, channels_last=False):
    """What the weight gradient will read of x (the layer's input, made from spikes s): the
    bits a fused BN+LIF attached to s if x is s's memory in s's order, else x packed now in
    memory order. None when no weight gradient will be taken, and while torch.compile
    traces (fake tensors have no memory, no bits: the traced op packs for itself)."""
    if torch.compiler.is_dynamo_compiling() or not (weight.requires_grad and torch.is_grad_enabled()):
        return None
    bits = attached_bits(s) if x.data_ptr() == s.data_ptr() else None
    return bits if bits is not None else pack(memory_order(x, channels_last))


def check_linear(in_features, out_features) -> None:
    """The sizes of a linear layer, ints in [1, MAX_INT] (check_int): torch's own constructor
    took 2.5 or 2**70 to its allocator (a TypeError naming empty()) and a bool as a size."""
    check_int("in_features", in_features)
    check_int("out_features", out_features)


def check_conv(in_channels, out_channels, kernel_size, stride, padding, dilation=1, groups=1) -> None:
    """A convolution's sizes, each an int (or a pair of ints for the spatial ones): checked here
    because nn.Conv2d takes a NaN, negative or string stride and padding without a word (they
    failed at the first forward) and sends a float size to its allocator."""
    check_int("in_channels", in_channels)
    check_int("out_channels", out_channels)
    check_int("groups", groups)
    for name, value, low in (("kernel_size", kernel_size, 1), ("stride", stride, 1), ("padding", padding, 0),
                             ("dilation", dilation, 1)):
        for v in value if isinstance(value, (tuple, list)) and len(value) == 2 else (value,):
            check_int(name, v, low=low)


class SpikingLinear(nn.Linear):
    """nn.Linear over binary spikes [T, B, ..., in_features], input saved as bits.

    padded_output: on CUDA, where out_features % 8 != 0, return the view of an aligned
    buffer's first out_features columns (its extra columns zero) instead of a contiguous copy
    (spikefuse.ops.padded_rows): a fused LIF after it, and the SpikingLinear after that, run on
    the aligned buffer, with no copies and aligned products. For a layer whose consumer is a
    LIF. What any other consumer sees: a view whose last dimension cannot be merged with the
    others, and which autograd will not let be modified in place (the LIF's spikes likewise)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 padded_output: bool = False):
        check_linear(in_features, out_features)
        super().__init__(in_features, out_features, bias, device, dtype)
        self.padded_output = bool(padded_output)

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        check_input(self, s, "[T, B, ..., in_features]", rank=tuple(range(3, 9)),
                    channels=self.in_features, dim=-1)
        full = padded_full(s)
        if full is not None:  # an aligned buffer behind s, its extra columns zero: read whole
            s = full
        x = s if s.is_contiguous() else s.contiguous()  # pack's order is the memory order
        return spike_linear(x, self.weight, self.bias, _saved_bits(s, x, self.weight),
                            getattr(self, "padded_output", False))  # (spiking_linear: a plain nn.Linear's)

    def extra_repr(self):
        return super().extra_repr() + (", padded_output=True" if self.padded_output else "")


class SpikingConv2d(nn.Conv2d):
    """nn.Conv2d over binary spikes [T, B, C, H, W], time folded, input saved as bits.
    A channels-last weight gets its input channels-last too (no copy when it already is)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None):
        if isinstance(padding, str) or padding_mode != "zeros":
            raise ValueError(f"{type(self).__name__} supports integer zero padding only, "
                             f"got padding={padding!r}, padding_mode={padding_mode!r}")
        check_conv(in_channels, out_channels, kernel_size, stride, padding, dilation, groups)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        check_input(self, s, "[T, B, C, H, W]", rank=5, channels=self.in_channels)
        x = _like_weight(fold(s), self.weight)
        bits = _saved_bits(s, x, self.weight, is_channels_last(x))
        y = spike_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                         self.groups, bits)
        return unfold(y, s.shape[0])


def _like_weight(x, weight):
    """x [N, C, H, W] channels-last when the conv weight is (what cuDNN runs as NHWC)."""
    if is_channels_last(weight):
        return x.contiguous(memory_format=torch.channels_last)
    return x


def channels_last_conv(conv: nn.Conv2d) -> nn.Conv2d:
    """conv with its weight stored channels-last (values, state_dict keys unchanged)."""
    return conv.to(memory_format=torch.channels_last)


def spiking_conv2d(conv: nn.Conv2d, s: torch.Tensor) -> torch.Tensor:
    """`conv` applied to binary spikes [T, B, C, H, W] like SpikingConv2d (parameters of a
    plain nn.Conv2d, so a model can switch dataflow without renaming its state_dict)."""
    return SpikingConv2d.forward(conv, s)


def spiking_linear(linear: nn.Linear, s: torch.Tensor) -> torch.Tensor:
    return SpikingLinear.forward(linear, s)


class _BNLIFBlock(nn.Module):
    """layer -> temporal BN -> LIF. fused: the layer runs once over [T*B, ...] (saving
    binary input spikes as bits) and BN+LIF is one op (BNLIF); vanilla (fused=False): the
    papers' baseline, a per-step loop over T, torch batch norm and the reference LIF.
    Both forms have the same state_dict keys (layer.*, bn.*)."""

    half_twin = False  # whether the spiking layer's weight gradient takes the BN's fp16 twin of dL/dy

    def __init__(self, layer, bn_cls, channels, fused, spike_input, backend, lif):
        super().__init__()
        self.layer, self.fused, self.spike_input = layer, bool(fused), bool(spike_input)
        if self.fused:
            self.bn = BNLIF(channels, backend=backend, **lif)
        else:
            self.bn = bn_cls(channels)
            self.lif = LIF(backend="reference", **lif)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                time_steps: int | None = None) -> torch.Tensor:
        """x [T, B, ...]; or a static input [B, ...] with time_steps (direct encoding: the
        fused form computes the layer once and reuses it at every step)."""
        static = time_steps is not None
        self._check(x, static)
        if not self.fused:
            steps = [x] * time_steps if static else list(x)
            y = self.bn(torch.stack([self.layer(xt) for xt in steps]))
            return self.lif(y if residual is None else y + residual)
        if static:  # the layer runs once; BN+LIF reads its output at every step
            return self.bn(self._dense(x), residual, time_steps=time_steps)
        if self.spike_input:  # a conv's weight gradient reads an fp16 twin of dL/dy (ops/half_grad)
            half_twin = self.half_twin and self.layer.weight.requires_grad
            return self.bn(self._spiking(x), residual, half_twin=half_twin)
        return self.bn(unfold(self._dense(fold(x)), x.shape[0]), residual)

    def _check(self, x, static):
        layout, rank, channels, dim = self._layout(static)
        check_input(self, x, layout, rank=rank)
        check_input(self, x, layout, channels=channels, dim=dim)


class ConvBNLIF(_BNLIFBlock):
    half_twin = True  # fp32 with TF32 on CUDA: weight gradients on fp16 tensor cores (False: on TF32)

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 padding: int | None = None, fused: bool = True, spike_input: bool = True,
                 backend: str = "auto", **lif):
        check_conv(in_channels, out_channels, kernel_size, stride, 0 if padding is None else padding)
        conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride,
                         kernel_size // 2 if padding is None else padding, bias=False)
        super().__init__(channels_last_conv(conv) if fused else conv, TemporalBatchNorm2d,
                         out_channels, fused, spike_input, backend, lif)

    def _spiking(self, s):
        return spiking_conv2d(self.layer, s)

    def _dense(self, x):  # a non-spike input (an image, event counts) [N, C, H, W]
        return self.layer(_like_weight(x, self.layer.weight))

    def _layout(self, static):
        return ("[B, C, H, W]", 4, self.layer.in_channels, 1) if static else \
               ("[T, B, C, H, W]", 5, self.layer.in_channels, 2)


class LinearBNLIF(_BNLIFBlock):
    def __init__(self, in_features: int, out_features: int, fused: bool = True,
                 spike_input: bool = True, backend: str = "auto", **lif):
        check_linear(in_features, out_features)
        linear = nn.Linear(in_features, out_features, bias=False)
        super().__init__(linear, TemporalBatchNorm1d, out_features, fused, spike_input, backend, lif)

    def _spiking(self, s):
        return spiking_linear(self.layer, s)

    def _dense(self, x):
        return self.layer(x)

    def _layout(self, static):
        return ("[B, F]", 2, self.layer.in_features, -1) if static else \
               ("[T, B, F]", 3, self.layer.in_features, -1)


__all__ = ["SpikingLinear", "SpikingConv2d", "spiking_conv2d", "spiking_linear", "ConvBNLIF",
           "LinearBNLIF", "channels_last_conv", "without_onednn"]
