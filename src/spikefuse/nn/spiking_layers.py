"""Linear and Conv2d whose input spikes are saved for backward as bits, and the
conv/linear -> BN -> LIF blocks the models are built from.

A spike input is only needed in backward for the weight gradient; autograd would keep it
as a float tensor (4 bytes per spike in float32). Here it is packed to 1 bit
(spikefuse.ops.spike_pack) and unpacked on the fly in backward, so no float copy of the
spikes outlives the forward. The input must be binary: nonzero values count as 1, checked
only with SPIKEFUSE_DEBUG=1. Spikes from a fused BN+LIF come with their bits already
packed by its kernel (spike_pack.attached_bits); a conv or linear layer over them saves those.

Layout: the fused blocks keep conv weights and activations channels-last (NHWC in memory),
so cuDNN convolves without converting to and from NCHW; the bits are packed in memory
order and unpacked into the same layout for the weight gradient.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn import functional as F

from ..ops.spike_pack import attached_bits, pack, unpack
from .batchnorm import TemporalBatchNorm1d, TemporalBatchNorm2d
from .bn_lif import BNLIF
from .layers import check_input, fold, unfold
from .neurons import LIF


class _SpikeLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, weight, bias, bits):
        """bits: pack(s) when its producer made them already, else None."""
        packed = (bits if bits is not None else pack(s)) if weight.requires_grad else None
        ctx.save_for_backward(packed, weight)
        ctx.s_shape, ctx.s_dtype, ctx.has_bias = s.shape, s.dtype, bias is not None
        return F.linear(s, weight, bias)

    @staticmethod
    def backward(ctx, gy):
        packed, weight = ctx.saved_tensors
        need_s, need_w, need_b = ctx.needs_input_grad[:3]
        gy2 = gy.reshape(-1, gy.shape[-1])
        gs = (gy2 @ weight.to(gy.dtype)).view(ctx.s_shape).to(ctx.s_dtype) if need_s else None
        gw = gb = None
        if need_w:
            s = unpack(packed, ctx.s_shape, gy.dtype)  # transient: only for this product
            gw = (gy2.t() @ s.reshape(-1, s.shape[-1])).to(weight.dtype)
        if need_b and ctx.has_bias:
            gb = gy2.sum(0).to(weight.dtype)
        return gs, gw, gb, None


def _producer_bits(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """Bits a fused BN+LIF attached to spikes s, if x (what the layer reads) is s's memory
    in s's order; never while torch.compile traces (fake tensors have no memory, no bits)."""
    if torch.compiler.is_dynamo_compiling() or x.data_ptr() != s.data_ptr():
        return None
    return attached_bits(s)


def _memory_order(s):
    """s [N, C, H, W] as a view whose logical order is its memory order (NHWC for a
    channels-last s), and the permutation that gives s back."""
    if not s.is_contiguous() and s.is_contiguous(memory_format=torch.channels_last):
        return s.permute(0, 2, 3, 1), (0, 3, 1, 2)
    return s, (0, 1, 2, 3)


class _SpikeConv2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, weight, bias, stride, padding, dilation, groups, bits):
        """bits: pack(s in memory order) when its producer made them already, else None."""
        packed = None
        if weight.requires_grad:
            in_memory_order, ctx.restore = _memory_order(s)
            packed = bits if bits is not None else pack(in_memory_order)
            ctx.packed_shape = in_memory_order.shape
        ctx.save_for_backward(packed, weight)
        ctx.s_shape, ctx.s_dtype = s.shape, s.dtype
        ctx.conv = (stride, padding, dilation, groups)
        ctx.bias_sizes = None if bias is None else [bias.shape[0]]
        return F.conv2d(s, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, gy):
        packed, weight = ctx.saved_tensors
        need_s, need_w, need_b = ctx.needs_input_grad[:3]
        stride, padding, dilation, groups = ctx.conv
        w = weight.to(gy.dtype)
        if need_w:  # transient, in the forward's layout: only for this call
            s = unpack(packed, ctx.packed_shape, gy.dtype).permute(ctx.restore)
        else:  # the input gradient needs only the input's shape
            s = gy.new_empty(1).expand(ctx.s_shape)
        on_cpu_strided = gy.device.type == "cpu" and need_w and any(step != 1 for step in stride)
        with without_onednn() if on_cpu_strided else contextlib.nullcontext():
            gs, gw, gb = torch.ops.aten.convolution_backward(
                gy, s, w, ctx.bias_sizes, list(stride), list(padding), list(dilation),
                False, [0, 0], groups, [need_s, need_w, need_b and ctx.bias_sizes is not None])
        return (gs.to(ctx.s_dtype) if gs is not None else None,
                gw.to(weight.dtype) if gw is not None else None,
                gb.to(weight.dtype) if gb is not None else None, None, None, None, None, None)


@contextlib.contextmanager
def without_onednn():
    """PyTorch's own CPU convolutions instead of oneDNN's, whose weight gradient of strided
    convs is wrong now and then (PyTorch 2.13: ~1 call in 10 for 1x1 stride 2) and crashes
    on one thread. (torch.backends.mkldnn.flags would also reset TF32 flags, with a warning.)"""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


class SpikingLinear(nn.Linear):
    """nn.Linear over binary spikes [T, B, ..., in_features], input saved as bits."""

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        check_input(self, s, "[T, B, ..., in_features]", rank=tuple(range(3, 9)),
                    channels=self.in_features, dim=-1)
        x = s if s.is_contiguous() else s.contiguous()  # pack's order is the memory order
        return _SpikeLinear.apply(x, self.weight, self.bias, _producer_bits(s, x))


class SpikingConv2d(nn.Conv2d):
    """nn.Conv2d over binary spikes [T, B, C, H, W], time folded, input saved as bits.
    A channels-last weight gets its input channels-last too (no copy when it already is)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.padding, str) or self.padding_mode != "zeros":
            raise ValueError(f"{type(self).__name__} supports integer zero padding only, "
                             f"got padding={self.padding!r}, padding_mode={self.padding_mode!r}")

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        check_input(self, s, "[T, B, C, H, W]", rank=5, channels=self.in_channels)
        x = _like_weight(fold(s), self.weight)
        y = _SpikeConv2d.apply(x, self.weight, self.bias, self.stride, self.padding,
                               self.dilation, self.groups, _producer_bits(s, x))
        return unfold(y, s.shape[0])


def _like_weight(x, weight):
    """x [N, C, H, W] channels-last when the conv weight is (what cuDNN runs as NHWC)."""
    if weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous():
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
        if self.spike_input:
            y = self._spiking(x)
        else:
            y = unfold(self._dense(fold(x)), x.shape[0])
        return self.bn(y, residual)

    def _check(self, x, static):
        layout, rank, channels, dim = self._layout(static)
        check_input(self, x, layout, rank=rank)
        check_input(self, x, layout, channels=channels, dim=dim)


class ConvBNLIF(_BNLIFBlock):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 padding: int | None = None, fused: bool = True, spike_input: bool = True,
                 backend: str = "auto", **lif):
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
           "LinearBNLIF", "channels_last_conv"]
