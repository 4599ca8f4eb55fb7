"""Fused recurrent ALIF (the LSNN of Bellec et al. 2018 with a recurrent weight W [N, N]):
the adaptive threshold of spikefuse.ops.alif on the recurrent LIF of
spikefuse.ops.recurrent_lif (x [T, M, N], M the batch rows):

    h[t]     = decay * v[t-1] + x[t] + s[t-1] @ W^T     v[-1] = 0, s[-1] = 0
    theta[t] = threshold + beta * a[t-1]                a[-1] = 0
    s[t]     = 1 if h[t] >= theta[t] else 0, v[t] = reset(h[t], s[t], theta[t])   (as ops.alif)
    a[t]     = adapt_decay * a[t-1] + s[t]

Launches as the recurrent LIF's (whose tile, charge, epilogue and incoming-gradient
helpers these kernels share): forward one launch per step, a small matmul with the neuron
in its epilogue, v and a in [M, N] float32 buffers between launches; backward one reverse
launch per step, then one GEMM for dL/dW. The backward carries dL/da in an [M, N] buffer:
    dL/ds[t]     = grad_s[t] + gh[t+1] @ W + dL/da[t]   (a[t] = adapt_decay*a[t-1] + s[t])
    dL/da[t-1]   = adapt_decay * dL/da[t] + beta * dL/dtheta[t]
and dL/dh[t], dL/dtheta[t] through the surrogate and the reset as ops.alif's backward.
Saved for backward: h[t] and a[t-1] (float32, 8 bytes per neuron-step) and the spikes; the
backward recomputes theta from a[t-1] with the forward's operations, so its spikes are the
forward's bit for bit. return_potential hands out the saved h[t]; a loss on it adds its
dL/dh[t] to the reverse step's (as the recurrent LIF's backward).
"""
from __future__ import annotations

import torch

from .alif import adaptive_grads
from .double_backward import grads_with_graph
from .launch import cached_launch
from .kernel_base import EAGER, reset_code, TRACED, cdiv, f32, surrogate_grad, tf32_matmuls
from .recurrent_common import _tiles, charge, fire_and_store, incoming_grads, step_tile, weight_grad
from ..surrogates import SURROGATES
from .triton_or_stub import tl, triton


@cached_launch
@triton.jit
def _ralif_forward_step(
    x_ptr, w_ptr, v_ptr, a_ptr, s_ptr, h_ptr, adapt_ptr,
    step, decay, adapt_decay, beta, threshold, v_reset, M, N, stride_wn, stride_wk,
    RESET: tl.constexpr, FIRST: tl.constexpr, SAVE: tl.constexpr, TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Step `step`: charge, fire at theta = threshold + beta*a[t-1], reset; v and a updated in
    place. SAVE: store h[t] and a[t-1] for the backward."""
    d, ad, beta = f32(decay), f32(adapt_decay), f32(beta)
    threshold, v_reset = f32(threshold), f32(v_reset)
    rows, cols, mask, offs, now = step_tile(step, M, N, BLOCK_M, BLOCK_N)
    h = charge(x_ptr, w_ptr, v_ptr, s_ptr, now, rows, cols, offs, mask, d, M, N, stride_wn, stride_wk,
               FIRST, TF32, BLOCK_M, BLOCK_N, BLOCK_K)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    s = fire_and_store(h, s_ptr, v_ptr, h_ptr, now, offs, mask, threshold + beta * a, v_reset, RESET, SAVE)
    tl.store(a_ptr + offs, ad * a + s, mask=mask)
    if SAVE:
        tl.store(adapt_ptr + now + offs, a, mask=mask)


@cached_launch
@triton.jit
def _ralif_backward_step(
    gs_ptr, w_ptr, h_ptr, adapt_ptr, gvT_ptr, ga_ptr, gh_ptr, ghx_ptr,
    step, decay, adapt_decay, beta, threshold, v_reset, alpha, grad_floor, M, N, stride_wn, stride_wk,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, LAST: tl.constexpr,
    HAS_GVT: tl.constexpr, TF32: tl.constexpr, HAS_GHX: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Reverse step `step`: gh[t] from grad_s[t], gh[t+1], dL/da[t] (the buffer ga, which
    becomes dL/da[t-1]), h[t] and a[t-1]. HAS_GHX: a loss on the returned potential trace
    adds its gradient ghx[t] to gh[t]."""
    d, ad, beta = f32(decay), f32(adapt_decay), f32(beta)
    threshold, v_reset, alpha, grad_floor = f32(threshold), f32(v_reset), f32(alpha), f32(grad_floor)
    rows, cols, mask, offs, now = step_tile(step, M, N, BLOCK_M, BLOCK_N)
    gs, gv = incoming_grads(gs_ptr, gh_ptr, w_ptr, gvT_ptr, now, rows, cols, offs, mask, d, M, N,
                            stride_wn, stride_wk, LAST, HAS_GVT, True, TF32, BLOCK_M, BLOCK_N, BLOCK_K)
    h = tl.load(h_ptr + now + offs, mask=mask, other=0.0)
    theta = threshold + beta * tl.load(adapt_ptr + now + offs, mask=mask, other=0.0)
    ga = tl.load(ga_ptr + offs, mask=mask, other=0.0)
    u = h - theta
    fired = u >= 0.0
    sg = tl.where(h < grad_floor, 0.0, surrogate_grad(u, SURROGATE, alpha))  # NaN h keeps its NaN (as ops.lif)
    gh, gtheta = adaptive_grads(gs + ga, gv, h, theta, fired, sg, v_reset, RESET, DETACH)
    if HAS_GHX:
        gh += tl.load(ghx_ptr + now + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(gh_ptr + now + offs, gh, mask=mask)
    tl.store(ga_ptr + offs, ga * ad + gtheta * beta, mask=mask)


def _forward(x, weight, decay, adapt_decay, beta, threshold, reset, v_reset, save, launch=EAGER):
    """spikes like x [T, M, N], v[T-1] and a[T-1] [M, N] (float32), h and a[t-1] [T, M, N]
    (float32, empty unless `save`). x contiguous."""
    T, M, N = x.shape
    spikes = torch.empty_like(x)
    v = torch.zeros((M, N), device=x.device, dtype=torch.float32)
    a = torch.zeros_like(v)
    h = torch.empty((T if save else 0, M, N), device=x.device, dtype=torch.float32)
    adapt = torch.empty_like(h)
    if x.numel() == 0:
        return spikes, v, a, h, adapt
    BLOCK_M, BLOCK_N, BLOCK_K, warps = _tiles(M, N)
    grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    kernel = launch(_ralif_forward_step)
    unused = launch.unused(x)
    for t in range(T):
        kernel[grid](
            x, weight, v, a, spikes, h if save else unused, adapt if save else unused, t,
            decay, adapt_decay, beta, threshold, v_reset, M, N, weight.stride(0), weight.stride(1),
            RESET=reset_code(reset, "ralif"), FIRST=t == 0, SAVE=save, TF32=tf32_matmuls(x),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=warps, enable_fp_fusion=False)
    return spikes, v, a, h, adapt


def _backward(grad_s, grad_vT, grad_aT, h, adapt, spikes, weight, decay, adapt_decay, beta, threshold,
              reset, v_reset, detach, surrogate, alpha, grad_threshold, launch=EAGER, grad_h=None):
    """(dL/dx like spikes, dL/dW like weight). grad_s, grad_vT, grad_aT or grad_h (of the
    returned potential trace) may be None."""
    T, M, N = spikes.shape
    gs = torch.zeros_like(spikes) if grad_s is None else grad_s.contiguous()
    gvT = grad_vT.contiguous() if grad_vT is not None else None
    # dL/da, updated in place step by step: dL/da[T-1] to start
    ga = torch.zeros((M, N), device=spikes.device, dtype=torch.float32)
    if grad_aT is not None:
        ga.copy_(grad_aT)
    gh = torch.empty((T, M, N), device=spikes.device, dtype=torch.float32)
    if spikes.numel() == 0:
        return gh.to(spikes.dtype), torch.zeros_like(weight)
    BLOCK_M, BLOCK_N, BLOCK_K, warps = _tiles(M, N)
    grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    kernel = launch(_ralif_backward_step)
    unused = launch.unused(gs)
    ghx = grad_h.contiguous() if grad_h is not None else None
    for t in reversed(range(T)):
        kernel[grid](
            gs, weight, h, adapt, gvT if gvT is not None else unused, ga, gh, ghx if ghx is not None else unused, t,
            decay, adapt_decay, beta, threshold, v_reset, alpha, grad_threshold, M, N,
            weight.stride(0), weight.stride(1),
            RESET=reset_code(reset, "ralif"), DETACH=detach, SURROGATE=SURROGATES[surrogate], LAST=t == T - 1,
            HAS_GVT=gvT is not None, TF32=tf32_matmuls(gs), HAS_GHX=ghx is not None,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=warps, enable_fp_fusion=False)
    return gh.to(spikes.dtype), weight_grad(gh, spikes).to(weight.dtype)


def reference_grads(x, weight, grad_s, grad_vT, grad_aT, options, needs, grad_h=None):
    """(dL/dx, dL/dW) for a backward that will itself be differentiated (create_graph=True):
    the forward runs again through spikefuse.reference (float32) with create_graph, so
    second derivatives are its."""
    from .. import reference

    decay, adapt_decay, beta, threshold, reset, v_reset, detach, surrogate, alpha, grad_threshold = options
    with torch.enable_grad():
        spikes, h, (vT, aT) = reference.ralif(x.float(), weight.float(), decay, adapt_decay, beta, threshold,
                                              reset, v_reset, detach, surrogate, alpha, True, grad_threshold, True)
        return grads_with_graph((spikes, vT, aT, h), (grad_s, grad_vT, grad_aT, grad_h), (x, weight), needs)


class RALIFFunction(torch.autograd.Function):
    """The eager path. options: (decay, adapt_decay, beta, threshold, reset, v_reset, detach,
    surrogate, alpha, grad_threshold); x [T, M, N] contiguous. Returns spikes, v[T-1], a[T-1],
    and with want_h the pre-reset potential trace h (float32), differentiable."""

    @staticmethod
    def forward(ctx, x, weight, options, want_h):
        save = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        spikes, vT, aT, h, adapt = _forward(x, weight, *options[:6], save or want_h)
        ctx.set_materialize_grads(False)
        if save:
            ctx.save_for_backward(x, weight, h, adapt, spikes)
            ctx.options = options
        return (spikes, vT, aT, h) if want_h else (spikes, vT, aT)

    @staticmethod
    def backward(ctx, grad_s, grad_vT, grad_aT, grad_h=None):
        x, weight, h, adapt, spikes = ctx.saved_tensors
        if grad_s is None and grad_vT is None and grad_aT is None and grad_h is None:
            return None, None, None, None
        needs = ctx.needs_input_grad[:2]
        if torch.is_grad_enabled():  # create_graph=True: this backward will be differentiated
            return (*reference_grads(x, weight, grad_s, grad_vT, grad_aT, ctx.options, needs, grad_h), None, None)
        gx, gw = _backward(grad_s, grad_vT, grad_aT, h, adapt, spikes, weight, *ctx.options, grad_h=grad_h)
        return gx if needs[0] else None, gw if needs[1] else None, None, None


# ---- torch.library registration: what torch.compile sees ----

@torch.library.triton_op("spikefuse::ralif_forward", mutates_args=())
def ralif_forward(x: torch.Tensor, weight: torch.Tensor, decay: float, adapt_decay: float, beta: float,
                  threshold: float, reset: str, v_reset: float, detach: bool, surrogate: str, alpha: float,
                  grad_threshold: float, save: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Spikes, v[T-1], a[T-1], h and a[t-1] (float32; the last two empty unless `save`).
    detach, surrogate, alpha and grad_threshold are only used by the backward."""
    return _forward(x.contiguous(), weight, decay, adapt_decay, beta, threshold, reset, v_reset, save,
                    launch=TRACED)


@torch.library.triton_op("spikefuse::ralif_backward", mutates_args=())
def ralif_backward(grad_s: torch.Tensor, grad_vT: torch.Tensor | None, grad_aT: torch.Tensor | None,
                   h: torch.Tensor, adapt: torch.Tensor, spikes: torch.Tensor, weight: torch.Tensor,
                   decay: float, adapt_decay: float, beta: float, threshold: float, reset: str,
                   v_reset: float, detach: bool, surrogate: str, alpha: float, grad_threshold: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dW)."""
    return _backward(grad_s, grad_vT, grad_aT, h, adapt, spikes, weight, decay, adapt_decay, beta, threshold,
                     reset, v_reset, detach, surrogate, alpha, grad_threshold, launch=TRACED)


def _setup_context(ctx, inputs, output):
    x, weight, *options, _save = inputs
    spikes, _, _, h, adapt = output
    ctx.save_for_backward(x, weight, h, adapt, spikes)
    ctx.options = tuple(options)


def _backward_rule(ctx, grad_s, grad_vT, grad_aT, _grad_h, _grad_adapt):
    x, weight, h, adapt, spikes = ctx.saved_tensors
    nones = (None,) * 11
    if grad_s is None and grad_vT is None and grad_aT is None:
        return (None, None, *nones)
    if torch.is_grad_enabled():  # create_graph=True
        return (*reference_grads(x, weight, grad_s, grad_vT, grad_aT, ctx.options, (True, True)), *nones)
    if grad_s is None:
        grad_s = torch.zeros_like(spikes)
    return (*ralif_backward(grad_s, grad_vT, grad_aT, h, adapt, spikes, weight, *ctx.options), *nones)


ralif_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def ralif_fused(x, weight, decay, adapt_decay, beta, options, return_state, return_potential=False):
    """Entry point for spikefuse.functional.ralif (arguments already checked there): x [T, *, N],
    `options` a spikefuse.neuron_options.NeuronOptions (grad_scope unused: a per-step cut).
    Returns spikes, then h (x's dtype) if return_potential, then (v[T-1], a[T-1]) if
    return_state. return_potential is eager only (spikefuse.functional sends it to the
    reference while dynamo traces)."""
    shape = x.shape
    x3 = x.reshape(shape[0], -1, shape[-1])
    options = (decay, adapt_decay, beta, *options.common(), options.grad_threshold)  # flat: the op's schema order
    if not torch.compiler.is_dynamo_compiling():
        spikes, vT, aT, *potential = RALIFFunction.apply(x3.contiguous(), weight, options, return_potential)
    else:
        save = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        spikes, vT, aT, _, _ = ralif_forward(x3, weight, *options, save)
    out = [spikes.reshape(shape)]
    if return_potential:
        out.append(potential[0].to(x.dtype).reshape(shape))
    if return_state:
        out.append((vT.reshape(shape[1:]), aT.reshape(shape[1:])))
    return tuple(out) if len(out) > 1 else out[0]
