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
"""
from __future__ import annotations

from functools import partial

import torch
from torch.nn import functional as F

from . import weight_grad_queue
from .kernel_base import EAGER, TRACED
from .spike_pack import pack, unpack


def autocast_args(device_type: str, *tensors):
    """The tensors as autocast would hand them to F.linear/F.conv2d. A torch.library op
    runs below autocast (the eager autograd.Function runs inside it), so the traced path
    casts for itself; the casts are autograd ops, which turn the gradients back."""
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def _backward(gy, packed, weight, s_shape, s_dtype, need_s, need_w, need_b, launch=EAGER):
    """(dL/ds, dL/dweight, dL/dbias), each None unless needed."""
    gy2 = gy.reshape(-1, gy.shape[-1])
    gs = (gy2 @ weight.to(gy.dtype)).view(s_shape).to(s_dtype) if need_s else None
    gw = gb = None
    if need_w:
        s = unpack(packed, s_shape, gy.dtype, launch)  # transient: only for this product
        gw = (gy2.t() @ s.reshape(-1, s.shape[-1])).to(weight.dtype)
    if need_b:
        gb = gy2.sum(0).to(weight.dtype)
    return gs, gw, gb


def _queued_weight_grads(gy, packed, weight, bias, s_shape, need_w, need_b):
    """_backward's weight and bias gradients, added into their .grad (weight_grad_queue)."""
    gy2 = gy.reshape(-1, gy.shape[-1])
    if need_w:
        s = unpack(packed, s_shape, gy.dtype)
        weight_grad_queue.accumulate_product(weight, gy2.t(), s.reshape(-1, s.shape[-1]))
    if need_b:
        weight_grad_queue.accumulate(bias, gy2.sum(0))


class SpikeLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, weight, bias, bits):
        """bits: pack(s), or None when no weight gradient will be taken."""
        ctx.save_for_backward(bits, weight)
        ctx.s_shape, ctx.s_dtype, ctx.has_bias = s.shape, s.dtype, bias is not None
        ctx.later, ctx.bias = weight_grad_queue.active(), bias
        return F.linear(s, weight, bias)

    @staticmethod
    def backward(ctx, gy):
        packed, weight = ctx.saved_tensors
        need_s, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.has_bias
        if ctx.later is not None and (need_w or need_b):  # dL/ds now, the rest when the queue runs
            ctx.later.append(partial(_queued_weight_grads, gy, packed, weight, ctx.bias, ctx.s_shape,
                                     need_w, need_b))
            need_w = need_b = False
        grads = _backward(gy, packed, weight, ctx.s_shape, ctx.s_dtype, need_s, need_w, need_b)
        return (*grads, None)


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
                 bits: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear over binary spikes s, saving s as bits for the weight gradient: `bits`
    when given (pack(s), made by s's producer; not used while dynamo traces), else packed
    here. Nothing is packed when no weight gradient will be taken."""
    save = weight.requires_grad and torch.is_grad_enabled()
    if not torch.compiler.is_dynamo_compiling():
        if save and bits is None:
            bits = pack(s)
        return SpikeLinearFunction.apply(s, weight, bias, bits if save else None)
    return spike_linear_forward(*autocast_args(s.device.type, s, weight, bias), save)[0]
