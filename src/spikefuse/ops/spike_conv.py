"""Conv2d over binary spikes whose input is saved for backward as bits (spike_pack).

Forward is F.conv2d; the spikes s [N, C, H, W] are packed in memory order (NHWC for a
channels-last s: no copy) for the weight gradient, which unpacks them transiently into
the same layout. The input gradient needs only the weight and s's shape.

Two autograd paths, one backward: eager runs SpikeConv2dFunction (a plain
autograd.Function: far less Python per call than a torch.library op, see ops/lif.py) and
can take the bits a fused BN+LIF attached to s; while dynamo traces, the torch.library ops
spike_conv2d_forward/_backward run instead (triton_ops: single nodes to dynamo, which
inductor decomposes into the convolutions and its own launches of the pack kernels). They
pack for themselves (fake tensors carry no attached bits) in the layout named by their
`channels_last` argument, decided once at trace time, so forward and backward agree
whatever strides the compiled graph hands them; their gradients come out in the layouts
the `channels_last` argument and the weight name.
"""
from __future__ import annotations

import contextlib

import torch
from torch.nn import functional as F

from . import half_grad
from .kernel_base import EAGER, TRACED
from .spike_linear import autocast_args, graph_edge, spikes_with_graph
from .spike_pack import pack, unpack

_NHWC, _FROM_NHWC = (0, 2, 3, 1), (0, 3, 1, 2)


def is_channels_last(t: torch.Tensor) -> bool:
    return not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def memory_order(s: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """s as the view packed: NHWC for channels-last spikes (their memory order), else s."""
    return s.permute(_NHWC) if channels_last else s


def _format(channels_last: bool) -> torch.memory_format:
    return torch.channels_last if channels_last else torch.contiguous_format


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


def _backward(gy, packed, weight, s_shape, s_dtype, channels_last, has_bias, conv,
              need_s, need_w, need_b, launch=EAGER, graph=False, edge=None):
    """(dL/ds, dL/dweight, dL/dbias), each None unless needed; conv = (stride, padding,
    dilation, groups). graph (create_graph, eager only): the weight gradient is
    differentiable w.r.t. s too, through `edge` (spike_linear.GraphEdge). The weight
    gradient runs in fp16 when gy comes with an fp16 twin (ops/half_grad)."""
    gw = (None if launch.traced else
          _twin_weight_grad(gy, need_w and not graph, packed, weight, s_shape, channels_last, conv, launch))
    w = weight.to(gy.dtype)
    if need_w and gw is None:  # both gradients in one call; the spikes transient, in the forward's layout
        if graph:
            n, c, h, wd = s_shape
            edge = memory_order(edge, channels_last) if edge is not None else None
            s = spikes_with_graph(packed, edge, (n, h, wd, c) if channels_last else (n, c, h, wd), gy.dtype)
            s = s.permute(_FROM_NHWC) if channels_last else s
        else:
            s = _spikes(packed, s_shape, channels_last, gy.dtype, launch)
        stride, padding, dilation, groups = conv
        on_cpu_strided = gy.device.type == "cpu" and any(step != 1 for step in stride)
        with without_onednn() if on_cpu_strided else contextlib.nullcontext():
            gs, gw, gb = torch.ops.aten.convolution_backward(
                gy, s, w, [weight.shape[0]] if has_bias else None, list(stride), list(padding),
                list(dilation), False, [0, 0], groups, [need_s, True, need_b and has_bias])
    else:
        gs = _input_grad(gy, w, s_shape, conv) if need_s else None
        gb = gy.sum((0, 2, 3)) if need_b and has_bias else None
    return (gs.to(s_dtype) if gs is not None else None,
            gw.to(weight.dtype) if gw is not None else None,
            gb.to(weight.dtype) if gb is not None else None)


def _input_grad(gy, w, s_shape, conv):
    """dL/ds alone: the transposed convolution of gy (cuDNN's input-gradient kernels). Not
    convolution_backward with a stand-in for s, which it would copy out to s's full size."""
    stride, padding, dilation, groups = conv
    kernel = w.shape[2:]
    output_padding = [s_shape[2 + i] - ((gy.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
                                        + dilation[i] * (kernel[i] - 1) + 1) for i in range(2)]
    return F.conv_transpose2d(gy, w, None, stride, padding, output_padding, groups, dilation)


def _spikes(packed, s_shape, channels_last, dtype, launch):
    """The saved spikes unpacked into `dtype`, in the forward's layout (transient)."""
    n, c, h, wd = s_shape
    if channels_last:
        return unpack(packed, (n, h, wd, c), dtype, launch).permute(_FROM_NHWC)
    return unpack(packed, (n, c, h, wd), dtype, launch)


def _twin_weight_grad(gy, wanted, packed, weight, s_shape, channels_last, conv, launch):
    """dL/dweight from gy's fp16 twin (ops/half_grad) and the spikes in fp16 (exact), fp32 sums
    in cuDNN, the twin's per-channel scales taken off exactly (powers of two); float32. None
    when no twin came with gy or the gradient is not `wanted`. The twin is taken either way (none
    outlives this backward) and freed on return, before dL/ds is allocated."""
    twin = half_grad.take(gy)
    if twin is None or not wanted:
        return None
    stride, padding, dilation, groups = conv
    s = _spikes(packed, s_shape, channels_last, torch.float16, launch)
    shape_only = torch.empty_like(weight, dtype=torch.float16)  # the weight's shape and layout: never read
    _, gw, _ = torch.ops.aten.convolution_backward(
        half_grad.half_view(twin, gy), s, shape_only, None, list(stride), list(padding), list(dilation), False,
        [0, 0], groups, [False, True, False])
    return gw.float() / twin.scale.view(-1, *[1] * (gw.dim() - 1))


class SpikeConv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, weight, bias, stride, padding, dilation, groups, bits, edge):
        """bits: pack(memory_order(s)), or None when no weight gradient will be taken;
        edge: graph_edge(s)."""
        ctx.save_for_backward(bits, weight, edge)
        ctx.s_shape, ctx.s_dtype, ctx.channels_last = s.shape, s.dtype, is_channels_last(s)
        ctx.has_bias, ctx.conv = bias is not None, (stride, padding, dilation, groups)
        return F.conv2d(s, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, gy):
        packed, weight, edge = ctx.saved_tensors
        grads = _backward(gy, packed, weight, ctx.s_shape, ctx.s_dtype, ctx.channels_last,
                          ctx.has_bias, ctx.conv, *ctx.needs_input_grad[:3],
                          graph=torch.is_grad_enabled(), edge=edge)
        return (*grads, None, None, None, None, None, None)


# ---- torch.library registration: what torch.compile sees (an op with autograd that
# inductor decomposes; see spikefuse.ops.lif) ----

@torch.library.triton_op("spikefuse::spike_conv2d_forward", mutates_args=())
def spike_conv2d_forward(s: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         stride: list[int], padding: list[int], dilation: list[int], groups: int,
                         channels_last: bool, save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """F.conv2d(s, ...), and pack(memory_order(s, channels_last)) (empty unless `save`)."""
    bits = pack(memory_order(s, channels_last), TRACED) if save else s.new_empty(0, dtype=torch.uint8)
    return F.conv2d(s, weight, bias, stride, padding, dilation, groups), bits


@torch.library.triton_op("spikefuse::spike_conv2d_backward", mutates_args=())
def spike_conv2d_backward(gy: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
                          s_shape: list[int], s_dtype: torch.dtype, channels_last: bool,
                          stride: list[int], padding: list[int], dilation: list[int],
                          groups: int, need_s: bool, need_w: bool, need_b: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/ds (in the layout `channels_last` names), dL/dweight (in the weight's layout),
    dL/dbias; each empty unless needed."""
    # a bias gradient is asked for only when there is a bias
    gs, gw, gb = _backward(gy, packed, weight, s_shape, s_dtype, channels_last, need_b,
                           (stride, padding, dilation, groups), need_s, need_w, need_b, TRACED)
    # in the layouts named by the arguments; empty, not None, when not needed
    return (gs.contiguous(memory_format=_format(channels_last)) if need_s else gy.new_empty(0, dtype=s_dtype),
            gw.contiguous(memory_format=_format(is_channels_last(weight))) if need_w else weight.new_empty(0),
            gb if need_b else weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    s, weight, bias, stride, padding, dilation, groups, channels_last, _ = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.s_shape, ctx.s_dtype, ctx.channels_last = list(s.shape), s.dtype, channels_last
    ctx.has_bias, ctx.conv = bias is not None, (stride, padding, dilation, groups)


def _backward_rule(ctx, gy, _grad_bits):
    packed, weight = ctx.saved_tensors
    need_s, need_w, need_b = ctx.needs_input_grad[:3]
    need_b = need_b and ctx.has_bias
    gs, gw, gb = spike_conv2d_backward(gy, packed, weight, ctx.s_shape, ctx.s_dtype,
                                       ctx.channels_last, *ctx.conv, need_s, need_w, need_b)
    return (gs if need_s else None, gw if need_w else None, gb if need_b else None) + (None,) * 6


spike_conv2d_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def spike_conv2d(s: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride,
                 padding, dilation, groups: int, bits: torch.Tensor | None = None) -> torch.Tensor:
    """F.conv2d over binary spikes s [N, C, H, W], saving s as bits for the weight gradient:
    `bits` when given (pack(memory_order(s)), made by s's producer; not used while dynamo
    traces), else packed here. Nothing is packed when no weight gradient will be taken."""
    save = weight.requires_grad and torch.is_grad_enabled()
    if not torch.compiler.is_dynamo_compiling():
        if save and bits is None:
            bits = pack(memory_order(s, is_channels_last(s)))
        return SpikeConv2dFunction.apply(s, weight, bias, stride, padding, dilation, groups,
                                         bits if save else None, graph_edge(s, save))
    s, weight, bias = autocast_args(s.device.type, s, weight, bias)
    return spike_conv2d_forward(s, weight, bias, list(stride), list(padding), list(dilation),
                                groups, is_channels_last(s), save)[0]
