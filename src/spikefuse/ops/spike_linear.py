"""Linear over binary spikes whose input is saved for backward as bits (spike_pack).

Forward is F.linear; the spikes s [*, in_features] are packed in their logical order
(1 bit each) for the weight gradient, which unpacks them transiently in backward. The
input gradient needs only the weight.

Two autograd paths, one backward: eager runs SpikeLinearFunction (a plain
autograd.Function: far less Python per call than a torch.library op, see ops/lif.py) and
can take the bits a fused BN+LIF attached to s; while dynamo traces, the torch.library ops
spike_linear_forward/_backward run instead (triton_ops: single nodes to dynamo, which
inductor decomposes into the matmuls and its own launches of the pack kernels), and they
pack for themselves (fake tensors carry no attached bits).

A backward with create_graph (second derivatives) computes from the unpacked bits plus a
one-element graph edge to s (GraphEdge), so it equals nn.Linear's; under torch.compile
PyTorch refuses a double backward itself.
"""
from __future__ import annotations

import math
from functools import partial

import torch
from torch.nn import functional as F

from . import padded_rows, weight_grad_queue
from .kernel_base import EAGER, TRACED, tf32_matmuls
from .spike_pack import pack, unpack, unpack_transposed, use_triton


def autocast_args(device_type: str, *tensors):
    """The tensors as autocast would hand them to F.linear/F.conv2d. A torch.library op
    runs below autocast (the eager autograd.Function runs inside it), so the traced path
    casts for itself; the casts are autograd ops, which turn the gradients back."""
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


class GraphEdge(torch.autograd.Function):
    """A zero tensor shaped like s that holds s's place in the autograd graph, not its memory
    (one element, expanded). A backward run with create_graph adds it to the unpacked bits,
    so the weight gradient, a product with s, is differentiable w.r.t. s as torch's own
    layer's is: the bits alone carry no graph, and that term of a second derivative was lost."""

    @staticmethod
    def forward(ctx, s):
        ctx.set_materialize_grads(False)  # a first-order backward sends it nothing: no zeros
        return s.new_zeros(()).expand(s.shape)

    @staticmethod
    def backward(ctx, g):
        return g


def graph_edge(s: torch.Tensor, save: bool) -> torch.Tensor | None:
    """GraphEdge(s) when s's bits are saved and s has a graph to hand a gradient to."""
    return GraphEdge.apply(s) if save and s.requires_grad else None


def spikes_with_graph(packed, edge, shape, dtype) -> torch.Tensor:
    """The saved spikes for a backward with create_graph: the bits (exact, s is binary), plus
    the edge to s's graph. Used as torch's layer uses its saved input."""
    s = unpack(packed, shape, edge.dtype if edge is not None else dtype)
    return (s if edge is None else s + edge).to(dtype)


ALIGN = 8  # output features padded to a multiple of this (16 bytes in fp16/bf16, 32 in fp32)
PAD_OFF_CUDA = False  # tests set it to run the padded path on the CPU


def output_padding(weight: torch.Tensor, s: torch.Tensor) -> int:
    """Zero rows to add to weight [OUT, IN] so that OUT, the leading dimension of the output
    and of its gradient, is a multiple of ALIGN. cuBLAS runs a leading dimension that is not
    a multiple of 16 bytes on its align-1 kernels: the IPU networks' 1470-wide layer took
    0.92-1.03 ms per product at batch 256 on an H100, against 0.30 ms for the aligned
    1472-wide one (issue 34). Unless the layer hands on the padded output (padded_rows), the
    padding costs a copy of the output and of its gradient."""
    return -weight.shape[0] % ALIGN if s.is_cuda or PAD_OFF_CUDA else 0


def _pad_rows(t, pad):
    """t [OUT, ...] with `pad` zero rows below (None stays None)."""
    return None if t is None else F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad))


def _padded_weight(weight, in_width, out_pad):
    """weight [OUT, IN] with zero columns up to the input's width (a padded input,
    padded_rows) and out_pad zero rows."""
    in_pad = in_width - weight.shape[1]
    return F.pad(weight, (0, in_pad, 0, out_pad)) if in_pad or out_pad else weight


def linear_forward(s, weight, bias, padded_output=False):
    """F.linear(s, weight, bias), through an aligned product where output_padding says so:
    with `padded_output` the whole aligned output (its extra columns zero), else a copy of its
    first OUT columns. s may be wider than weight's IN: a padded input, whose extra columns
    are zero (padded_rows)."""
    pad = output_padding(weight, s)
    y = F.linear(s, _padded_weight(weight, s.shape[-1], pad), _pad_rows(bias, pad))
    return y if not pad or padded_output else y[..., :weight.shape[0]].contiguous()


def _backward(gy, packed, weight, s_shape, s_dtype, need_s, need_w, need_b, launch=EAGER, s=None):
    """(dL/ds, dL/dweight, dL/dbias), each None unless needed. s: the spikes with their graph
    (spikes_with_graph) under create_graph, else None (unpacked here, no graph). gy may be
    the padded output's gradient, s_shape a padded input's shape (linear_forward)."""
    gy2 = gy.reshape(-1, gy.shape[-1])
    gyp, w = _aligned(gy2, weight, s_shape[-1])
    gs = (gyp @ w.to(gy.dtype)).view(s_shape).to(s_dtype) if need_s else None
    gw = gb = None
    if need_w:  # the spikes unpacked transiently, only for this product
        s2 = saved_spikes(packed, s_shape, gy.dtype, launch) if s is None else s.reshape(-1, s.shape[-1])
        gw = (gyp.t() @ s2)[:weight.shape[0], :weight.shape[1]].to(weight.dtype)
    if need_b:
        gb = gy2[:, :weight.shape[0]].sum(0).to(weight.dtype)
    return gs, gw, gb


def saved_spikes(packed, s_shape, dtype, launch=EAGER) -> torch.Tensor:
    """The saved spikes as the weight gradient's operand s [M, IN] (M: all leading dims).
    Where the product runs on TF32 (and on the CPU under the interpreter, for the tests), a
    view of s^T unpacked contiguous (unpack_transposed): gy^T @ s then reads s along its sum,
    as Hopper's TF32 instructions read operands. Measured on an H200, M x 2048 x 2048: 79 and
    354 us at M = 2048 and 16384 against 107 and 595 us from s itself. Not in bf16 (47 against
    47 us: 16-bit operands are read either way) nor in strict float32 (405 against 362 us)."""
    rows, cols = math.prod(s_shape[:-1]), s_shape[-1]
    if dtype == torch.float32 and use_triton(packed) and (not packed.is_cuda or tf32_matmuls(packed)):
        return unpack_transposed(packed, rows, cols, dtype, launch).t()
    return unpack(packed, s_shape, dtype, launch).reshape(rows, cols)


def _aligned(gy2, weight, in_width):
    """(gy2, weight) with output_padding's zero columns / rows (none to add to the gradient of
    a padded output) and zero columns up to in_width: the backward's products aligned."""
    pad = output_padding(weight, gy2)
    rows = weight.shape[0] + pad
    gyp = gy2 if gy2.shape[1] == rows else F.pad(gy2, (0, rows - gy2.shape[1]))
    return gyp, _padded_weight(weight, in_width, pad)


def _queued_weight_grads(gy, packed, weight, bias, s_shape, need_w, need_b):
    """_backward's weight and bias gradients, added into their .grad (weight_grad_queue)."""
    out, inp = weight.shape
    gy2 = gy.reshape(-1, gy.shape[-1])[:, :out]  # (a padded output's or input's extra columns cut)
    if need_w:
        weight_grad_queue.accumulate_product(weight, gy2.t(), saved_spikes(packed, s_shape, gy.dtype)[:, :inp])
    if need_b:
        weight_grad_queue.accumulate(bias, gy2.sum(0))


class SpikeLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, weight, bias, bits, edge, padded_output):
        """bits: pack(s), or None when no weight gradient will be taken; edge: graph_edge(s);
        padded_output: linear_forward's."""
        ctx.save_for_backward(bits, weight, edge)
        ctx.s_shape, ctx.s_dtype, ctx.has_bias = s.shape, s.dtype, bias is not None
        ctx.later, ctx.bias = weight_grad_queue.active(), bias
        return linear_forward(s, weight, bias, padded_output)

    @staticmethod
    def backward(ctx, gy):
        packed, weight, edge = ctx.saved_tensors
        need_s, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.has_bias
        s = None
        if torch.is_grad_enabled():  # create_graph: differentiable products, nothing queued
            s = spikes_with_graph(packed, edge, ctx.s_shape, gy.dtype) if need_w else None
        elif ctx.later is not None and (need_w or need_b):  # dL/ds now, the rest when the queue runs
            ctx.later.append(partial(_queued_weight_grads, gy, packed, weight, ctx.bias, ctx.s_shape,
                                     need_w, need_b))
            need_w = need_b = False
        grads = _backward(gy, packed, weight, ctx.s_shape, ctx.s_dtype, need_s, need_w, need_b, s=s)
        return (*grads, None, None, None)


# ---- torch.library registration: what torch.compile sees (an op with autograd that
# inductor decomposes; see spikefuse.ops.lif) ----

@torch.library.triton_op("spikefuse::spike_linear_forward", mutates_args=())
def spike_linear_forward(s: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """F.linear(s, weight, bias), and pack(s) (empty unless `save`)."""
    bits = pack(s, TRACED) if save else s.new_empty(0, dtype=torch.uint8)
    return F.linear(s, weight, bias), bits


@torch.library.triton_op("spikefuse::spike_linear_backward", mutates_args=())
def spike_linear_backward(gy: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
                          s_shape: list[int], s_dtype: torch.dtype, need_s: bool, need_w: bool,
                          need_b: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/ds, dL/dweight, dL/dbias (each empty unless needed)."""
    gs, gw, gb = _backward(gy, packed, weight, s_shape, s_dtype, need_s, need_w, need_b, TRACED)
    # an op may not return None: empty tensors
    return (gs if need_s else gy.new_empty(0, dtype=s_dtype), gw if need_w else weight.new_empty(0),
            gb if need_b else weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    s, weight, bias, _ = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.s_shape, ctx.s_dtype, ctx.has_bias = list(s.shape), s.dtype, bias is not None


def _backward_rule(ctx, gy, _grad_bits):
    packed, weight = ctx.saved_tensors
    need_s, need_w, need_b = ctx.needs_input_grad[:3]
    need_b = need_b and ctx.has_bias
    gs, gw, gb = spike_linear_backward(gy, packed, weight, ctx.s_shape, ctx.s_dtype,
                                       need_s, need_w, need_b)
    return (gs if need_s else None, gw if need_w else None, gb if need_b else None, None)


spike_linear_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def spike_linear(s: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 bits: torch.Tensor | None = None, padded_output: bool = False) -> torch.Tensor:
    """F.linear over binary spikes s, saving s as bits for the weight gradient: `bits`
    when given (pack(s), made by s's producer; not used while dynamo traces), else packed
    here. Nothing is packed when no weight gradient will be taken.

    Where output_padding pads the product (CUDA, out_features % 8 != 0), `padded_output`
    returns the view of the aligned output's first out_features columns with the buffer
    attached (padded_rows), not a contiguous copy. s may itself be such a buffer (wider than
    in_features, its extra columns zero): the product then reads it whole, aligned."""
    save = weight.requires_grad and torch.is_grad_enabled()
    if not torch.compiler.is_dynamo_compiling():
        if save and bits is None:
            bits = pack(s)
        y = SpikeLinearFunction.apply(s, weight, bias, bits if save else None, graph_edge(s, save),
                                      padded_output)
        if y.shape[-1] == weight.shape[0]:
            return y
        return padded_rows.attach(y[..., :weight.shape[0]], y)
    return spike_linear_forward(*autocast_args(s.device.type, s, weight, bias), save)[0]
