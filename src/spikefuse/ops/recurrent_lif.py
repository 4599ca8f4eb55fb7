"""Fused recurrent LIF: a LIF whose input also carries its own spikes of the step before,
through a weight W [N, N] (x [T, M, N], M the batch rows):

    h[t] = decay * v[t-1] + x[t] + s[t-1] @ W^T        v[-1] = 0, s[-1] = 0
    s[t] = 1 if h[t] >= threshold else 0, v[t] = reset(h[t], s[t])   (as spikefuse.ops.lif)

Step t needs every neuron's spike of step t-1, so time cannot stay inside one program as in
the LIF kernel (that would need a grid-wide barrier per step). Each step is instead one
launch of a kernel that is a small matmul with the neuron in its epilogue: a program owns
a [BLOCK_M, BLOCK_N] tile of (row, neuron), accumulates s[t-1] @ W^T for it in registers
(W streams from L2: 4 MB at N = 1024 fp32), then charges, fires and resets in place; the
potential v lives in a [M, N] float32 buffer between launches. T launches forward, T
backward: cheap inside a captured step (spikefuse.capture), a few microseconds each
in eager mode, against SpikingJelly's per-step module calls.

Backward walks the steps in reverse, one launch each. With gh[t] = dL/dh[t]:
    dL/ds[t] = grad_s[t] + gh[t+1] @ W      (the spike's next-step input)
    dL/dv[t] = decay * gh[t+1]              (+ dL/dv[T-1] from the final state)
    gh[t]    = through the surrogate and the reset as in the LIF (ops.lif.grad_h)
so each backward launch is again a matmul (gh[t+1] @ W) with the adjoint in its epilogue.
dL/dx = gh, and dL/dW = sum_t gh[t]^T s[t-1]: one GEMM over all T*M rows after the loop.
Saved for backward: h[t] (float32, 4 bytes per neuron-step) and the spikes.

Matmul precision follows torch's: float32 is exact (IEEE FMA, no TF32) unless torch's
float32 matmuls use TF32 (torch.backends.cuda.matmul.allow_tf32, which spikefuse.precision's
fp32 sets), as for nn.Linear. The spikes (0/1) are exact in any precision; W is read as float32.

The step's tile, charge, epilogue and incoming gradients are helpers that the recurrent
ALIF (spikefuse.ops.recurrent_alif) shares.
"""
from __future__ import annotations

import torch

from .double_backward import grads_with_graph
from .launch import cached_launch
from .kernel_base import EAGER, reset_code, TRACED, cdiv, f32, tf32_matmuls
from .recurrent_common import _rlif_backward_step, _tiles, charge, fire_and_store, step_tile, weight_grad
from . import sparse_recurrent_lif
from ..surrogates import SURROGATES
from .triton_or_stub import tl, triton


@cached_launch
@triton.jit
def _rlif_forward_step(
    x_ptr, w_ptr, v_ptr, s_ptr, h_ptr,
    step, decay, threshold, v_reset, M, N, stride_wn, stride_wk,
    RESET: tl.constexpr, FIRST: tl.constexpr, SAVE_H: tl.constexpr, TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Step `step`: h = decay*v + x[t] + s[t-1] @ W^T, then fire and reset (v updated in
    place). x, s and h are the whole [T, M, N] tensors (one buffer each for all launches)."""
    d, threshold, v_reset = f32(decay), f32(threshold), f32(v_reset)
    rows, cols, mask, offs, now = step_tile(step, M, N, BLOCK_M, BLOCK_N)
    h = charge(x_ptr, w_ptr, v_ptr, s_ptr, now, rows, cols, offs, mask, d, M, N, stride_wn, stride_wk,
               FIRST, TF32, BLOCK_M, BLOCK_N, BLOCK_K)
    fire_and_store(h, s_ptr, v_ptr, h_ptr, now, offs, mask, threshold, v_reset, RESET, SAVE_H)


def _forward(x, weight, decay, threshold, reset, v_reset, save, launch=EAGER):
    """spikes like x [T, M, N], v[T-1] [M, N] (float32) and h [T, M, N] (float32, empty
    unless `save`). x contiguous."""
    T, M, N = x.shape
    spikes = torch.empty_like(x)
    v = torch.zeros((M, N), device=x.device, dtype=torch.float32)
    h = torch.empty((T if save else 0, M, N), device=x.device, dtype=torch.float32)
    if x.numel() == 0:
        return spikes, v, h
    BLOCK_M, BLOCK_N, BLOCK_K, warps = _tiles(M, N)
    grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    kernel = launch(_rlif_forward_step)
    unused = launch.unused(x)
    for t in range(T):
        kernel[grid](
            x, weight, v, spikes, h if save else unused, t,
            decay, threshold, v_reset, M, N, weight.stride(0), weight.stride(1),
            RESET=reset_code(reset, "rlif"), FIRST=t == 0, SAVE_H=save, TF32=tf32_matmuls(x),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=warps, enable_fp_fusion=False)
    return spikes, v, h


def _backward(grad_s, grad_vT, h, spikes, weight, decay, threshold, reset, v_reset, detach,
              surrogate, alpha, grad_threshold, launch=EAGER, grad_h=None):
    """(dL/dx like spikes, dL/dW like weight). grad_s, grad_vT or grad_h (of the returned
    potential trace) may be None."""
    T, M, N = spikes.shape
    if grad_s is None:
        grad_s = torch.zeros_like(spikes)
    gs = grad_s.contiguous()
    gvT = grad_vT.contiguous() if grad_vT is not None else None
    gh = torch.empty((T, M, N), device=spikes.device, dtype=torch.float32)
    if spikes.numel() == 0:
        return gh.to(spikes.dtype), torch.zeros_like(weight)
    BLOCK_M, BLOCK_N, BLOCK_K, warps = _tiles(M, N)
    grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    kernel = launch(_rlif_backward_step)
    unused = launch.unused(gs)
    ghx = grad_h.contiguous() if grad_h is not None else None
    for t in reversed(range(T)):
        last = t == T - 1
        kernel[grid](
            gs, weight, h, gvT if gvT is not None else unused, gh, ghx if ghx is not None else unused, t,
            decay, threshold, v_reset, alpha, grad_threshold, M, N, weight.stride(0), weight.stride(1),
            RESET=reset_code(reset, "rlif"), DETACH=detach, SURROGATE=SURROGATES[surrogate], LAST=last,
            HAS_GVT=gvT is not None, TF32=tf32_matmuls(gs), RECURRENT=True, HAS_GHX=ghx is not None,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=warps, enable_fp_fusion=False)
    return gh.to(spikes.dtype), weight_grad(gh, spikes).to(weight.dtype)


def reference_grads(x, weight, grad_s, grad_vT, options, needs, grad_h=None):
    """(dL/dx, dL/dW) for a backward that will itself be differentiated (create_graph=True):
    the forward runs again through spikefuse.reference (float32) and is differentiated
    with create_graph, so second derivatives are its."""
    from .. import reference

    decay, threshold, reset, v_reset, detach, surrogate, alpha, grad_threshold = options
    with torch.enable_grad():
        spikes, h, vT = reference.rlif(x.float(), weight.float(), decay, threshold, reset, v_reset, detach,
                                       surrogate, alpha, True, grad_threshold, True)
        return grads_with_graph((spikes, vT, h), (grad_s, grad_vT, grad_h), (x, weight), needs)


class RLIFFunction(torch.autograd.Function):
    """The eager path (and the captured one). options: (decay, threshold, reset, v_reset,
    detach, surrogate, alpha, grad_threshold); x [T, M, N] contiguous. sparse: the sparse
    path (spikefuse.ops.sparse_recurrent_lif), same results. activity (float64 [2] or None)
    accumulates the active columns per step and the steps x N seen, on the device.
    want_h: also return the pre-reset potential trace h (float32), differentiable."""

    @staticmethod
    def forward(ctx, x, weight, options, sparse, activity, want_h):
        decay, threshold, reset, v_reset = options[:4]
        save = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        ctx.set_materialize_grads(False)
        ctx.sparse = sparse
        if sparse:
            spikes, vT, h, wt, carry, carry_count, active_count = sparse_recurrent_lif.forward(
                x, weight, decay, threshold, reset, v_reset, options[7], save or want_h)
            if activity is not None:
                activity[0] += active_count.sum()
            if save:
                ctx.save_for_backward(x, weight, h, spikes, wt, carry, carry_count)
        else:
            spikes, vT, h = _forward(x, weight, decay, threshold, reset, v_reset, save or want_h)
            if activity is not None:
                activity[0] += spikes.ne(0).any(1).sum()
            if save:
                ctx.save_for_backward(x, weight, h, spikes)
        if activity is not None:
            activity[1] += spikes.shape[0] * spikes.shape[2]
        if save:
            ctx.options = options
        return (spikes, vT, h) if want_h else (spikes, vT)

    @staticmethod
    def backward(ctx, grad_s, grad_vT, grad_h=None):
        x, weight, h, spikes, *lists = ctx.saved_tensors
        nones = (None, None, None, None)
        if grad_s is None and grad_vT is None and grad_h is None:
            return None, None, *nones
        if torch.is_grad_enabled():  # create_graph=True: this backward will be differentiated
            return (*reference_grads(x, weight, grad_s, grad_vT, ctx.options, ctx.needs_input_grad[:2], grad_h),
                    *nones)
        if ctx.sparse:
            gx, gw = sparse_recurrent_lif.backward(grad_s, grad_vT, h, spikes, *lists, weight, *ctx.options,
                                                   grad_h=grad_h)
        else:
            gx, gw = _backward(grad_s, grad_vT, h, spikes, weight, *ctx.options, grad_h=grad_h)
        return (gx if ctx.needs_input_grad[0] else None, gw if ctx.needs_input_grad[1] else None, *nones)


# ---- torch.library registration: what torch.compile sees ----

@torch.library.triton_op("spikefuse::rlif_forward", mutates_args=())
def rlif_forward(x: torch.Tensor, weight: torch.Tensor, decay: float, threshold: float, reset: str,
                 v_reset: float, detach: bool, surrogate: str, alpha: float, grad_threshold: float,
                 save: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Spikes, v[T-1] (float32) and h (float32, empty unless `save`). detach, surrogate,
    alpha and grad_threshold are only used by the backward."""
    return _forward(x.contiguous(), weight, decay, threshold, reset, v_reset, save, launch=TRACED)


@torch.library.triton_op("spikefuse::rlif_backward", mutates_args=())
def rlif_backward(grad_s: torch.Tensor, grad_vT: torch.Tensor | None, h: torch.Tensor,
                  spikes: torch.Tensor, weight: torch.Tensor, decay: float, threshold: float,
                  reset: str, v_reset: float, detach: bool, surrogate: str, alpha: float,
                  grad_threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dW)."""
    return _backward(grad_s, grad_vT, h, spikes, weight, decay, threshold, reset, v_reset, detach,
                     surrogate, alpha, grad_threshold, launch=TRACED)


def _setup_context(ctx, inputs, output):
    x, weight, *options, _save = inputs
    ctx.save_for_backward(x, weight, output[2], output[0])
    ctx.options = tuple(options)


def _backward_rule(ctx, grad_s, grad_vT, _grad_h):
    x, weight, h, spikes = ctx.saved_tensors
    nones = (None,) * 9
    if grad_s is None and grad_vT is None:
        return (None, None, *nones)
    if torch.is_grad_enabled():  # create_graph=True
        return (*reference_grads(x, weight, grad_s, grad_vT, ctx.options, (True, True)), *nones)
    if grad_s is None:
        grad_s = torch.zeros_like(spikes)
    gx, gw = rlif_backward(grad_s, grad_vT, h, spikes, weight, *ctx.options)
    return (gx, gw, *nones)


rlif_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def rlif_fused(x, weight, decay, options, return_state, sparse=False, activity=None, return_potential=False):
    """Entry point for spikefuse.functional.rlif (arguments already checked there): x [T, *, N],
    `options` a spikefuse.neuron_options.NeuronOptions (grad_scope unused: a per-step cut).
    While dynamo traces, the dense op (the same results as the sparse path; functional.rlif
    sends return_potential to the reference there)."""
    shape = x.shape
    x3 = x.reshape(shape[0], -1, shape[-1])
    options = (decay, *options.common(), options.grad_threshold)  # flat: the op's schema order
    h = None
    if not torch.compiler.is_dynamo_compiling():
        out = RLIFFunction.apply(x3.contiguous(), weight, options, sparse, activity, return_potential)
        spikes, vT = out[:2]
        if return_potential:
            h = out[2].to(x.dtype).reshape(shape)
    else:
        save = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        spikes, vT, _ = rlif_forward(x3, weight, *options, save)
    out = [spikes.reshape(shape)]
    if return_potential:
        out.append(h)
    if return_state:
        out.append(vT.reshape(shape[1:]))
    return tuple(out) if len(out) > 1 else out[0]
