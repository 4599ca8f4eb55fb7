"""Fused adaptive-threshold LIF (ALIF / LSNN, Bellec et al. 2018): one Triton launch over
all T steps forward, one reverse-time launch backward.

    h[t]     = decay * v[t-1] + x[t]                    v[-1] = v0 (default 0)
    theta[t] = threshold + beta * a[t-1]                a[-1] = a0 (default 0; adaptation)
    s[t]     = 1 if h[t] >= theta[t] else 0
    v[t]     = v_reset (hard) / h - theta[t] (soft) / h (none) where s[t] = 1, else h[t]
    a[t]     = adapt_decay * a[t-1] + s[t]
Backward: ds/dh = sg(h - theta) and ds/da[t-1] = -beta * sg (the threshold is a function
of a). `detach_reset` cuts the reset of v from s (as for the LIF); the adaptation update
a[t] = adapt_decay*a[t-1] + s[t] always keeps s's surrogate gradient. The adjoints carried
past step 0 are the initial state's gradients: dL/dv0 = decay * dL/dh[0] and
dL/da0 = adapt_decay * dL/da[0] + beta * dL/dtheta[0] (written only when asked for).

Layout and launches as spikefuse.ops.lif (same BLOCK/K rules, same helpers): each program
owns BLOCK neurons, keeps v and a in registers for the whole sequence and walks time in
chunks of K steps, prefetching the next chunk.

Saved for backward: the input x (which the caller usually holds anyway) and (v, a) at the
start of every chunk: 8/K bytes per neuron-step (K = 16 for float32: 0.5 byte, against 8
bytes for storing v and a at every step). The backward kernel walks the chunks in reverse,
recomputes h, theta (and so the spikes) forward from the chunk's checkpoint into registers
(bit-identical to the forward: same operations, no FMA contraction), then runs the adjoint
recurrence for (v, a) backward through them.

torch.compile sees two torch.library triton_ops (spikefuse::alif_forward and
spikefuse::alif_backward) whose bodies launch these kernels: the compiled graph runs the
fused kernels, not the reference.
"""
from __future__ import annotations

import torch

from .kernel_base import (EAGER, reset_code, cdiv, chunk_registers, f32, kernel_arg, load_chunk,  # noqa: F401
                          load_earlier_chunks, load_or_zeros, program_neurons, reset_partials, reset_potential,
                          row, spike_adjoint, spike_value, state_buffer, store_chunk, store_outputs, surrogate_grad,
                          time_major)
from .launch import cached_launch
from .neuron_op import TwoStateNeuron, register
from ..surrogates import SURROGATES

from .triton_or_stub import tl, triton  # noqa: F401


@triton.jit
def adaptive_grads(gs, gv, h, theta, fired, sg, v_reset, RESET: tl.constexpr, DETACH: tl.constexpr):
    """(dL/dh[t], dL/dtheta[t]) from all of dL/ds[t] and dL/dv[t], u = h - theta: through the
    surrogate and the reset, whose soft form v = h - theta*s also reads theta directly
    (a gradient detach_reset keeps: it detaches s, not theta)."""
    direct, through_spike = reset_partials(h, fired, theta, v_reset, RESET, DETACH)
    gu = spike_adjoint(gs, gv, through_spike, RESET, DETACH) * sg  # dL/du
    if RESET == 1:  # dv/dtheta = -s: NaN where the spike is (the reference's gv * -NaN)
        return gu + gv * direct, -gv * spike_value(h - theta, fired) - gu
    else:  # no path from v to theta (not even 0 * a NaN dL/dv)
        return gu + gv * direct, -gu


@triton.jit
def alif_forward_chunk(X, v, a, d, ad, beta, t0, T, threshold, v_reset,
                       RESET: tl.constexpr, TAIL: tl.constexpr, STORE_H: tl.constexpr):
    """Run K steps from state (v, a) over chunk X: (spikes [K, BLOCK] float32, pre-reset
    potentials h [K, BLOCK] float32 (zeros unless STORE_H), v, a after).
    TAIL: the chunk crosses T, and the state must stop at step T-1."""
    K: tl.constexpr = X.shape[0]
    k, Xf, S, H = chunk_registers(X)
    for j in tl.static_range(K):
        sel = (k == j)[:, None]
        h = d * v + row(Xf, sel)
        theta = threshold + beta * a
        u = h - theta
        fired = u >= 0.0
        s = spike_value(u, fired)
        v_next = reset_potential(h, fired, theta, v_reset, RESET)
        a_next = ad * a + s
        if TAIL:
            v = tl.where(t0 + j < T, v_next, v)
            a = tl.where(t0 + j < T, a_next, a)
        else:
            v = v_next
            a = a_next
        S = tl.where(sel, s[None, :], S)
        if STORE_H:
            H = tl.where(sel, h[None, :], H)
    return S, H, v, a


@cached_launch
@triton.jit
def _alif_forward_kernel(
    x_ptr, s_ptr, ckpt_ptr, v0_ptr, a0_ptr, vT_ptr, aT_ptr, h_ptr,
    decay, adapt_decay, beta, threshold, v_reset, T, N,
    RESET: tl.constexpr, HAS_V0: tl.constexpr, HAS_A0: tl.constexpr, SAVE_CKPT: tl.constexpr,
    STORE_STATE: tl.constexpr, STORE_H: tl.constexpr,
    BLOCK: tl.constexpr, K: tl.constexpr, EVEN_N: tl.constexpr,
):
    d, ad, beta = f32(decay), f32(adapt_decay), f32(beta)
    threshold, v_reset = f32(threshold), f32(v_reset)
    n = program_neurons(BLOCK)
    n_mask = n < N
    v = load_or_zeros(v0_ptr, n, n_mask, BLOCK, HAS_V0)
    a = load_or_zeros(a0_ptr, n, n_mask, BLOCK, HAS_A0)
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    full = T // K
    a_ckpt_ptr = ckpt_ptr + tl.cast(tl.cdiv(T, K), tl.int64) * N  # ckpt is [2, chunks, N]
    X = load_chunk(x_ptr, 0, offs, k, n_mask, T, N, EVEN_N)
    for c in range(0, full):
        t0 = c * K
        X_next = load_chunk(x_ptr, t0 + K, offs, k, n_mask, T, N, EVEN_N)  # prefetch
        if SAVE_CKPT:
            tl.store(ckpt_ptr + tl.cast(c, tl.int64) * N + n, v, mask=n_mask)
            tl.store(a_ckpt_ptr + tl.cast(c, tl.int64) * N + n, a, mask=n_mask)
        S, H, v, a = alif_forward_chunk(X, v, a, d, ad, beta, t0, T, threshold, v_reset, RESET, False,
                                        STORE_H)
        store_outputs(s_ptr, h_ptr, t0, offs, k, n_mask, T, N, S, H, EVEN_N, STORE_H)
        X = X_next
    if full * K < T:  # the last, partial chunk
        if SAVE_CKPT:
            tl.store(ckpt_ptr + tl.cast(full, tl.int64) * N + n, v, mask=n_mask)
            tl.store(a_ckpt_ptr + tl.cast(full, tl.int64) * N + n, a, mask=n_mask)
        S, H, v, a = alif_forward_chunk(X, v, a, d, ad, beta, full * K, T, threshold, v_reset, RESET, True,
                                        STORE_H)
        store_outputs(s_ptr, h_ptr, full * K, offs, k, n_mask, T, N, S, H, EVEN_N, STORE_H)
    if STORE_STATE:
        tl.store(vT_ptr + n, v, mask=n_mask)
        tl.store(aT_ptr + n, a, mask=n_mask)


@triton.jit
def alif_backward_chunk(X, GS, v, a, gv, ga, d, ad, beta, t0, T, threshold, v_reset, alpha,
                        RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr,
                        TAIL: tl.constexpr, GH, HAS_GH: tl.constexpr):
    """Recompute the chunk forward from its checkpoint (v, a) (h[t] and theta[t] into
    registers), then run the adjoint recurrence backward through it: (dL/dx chunk,
    dL/dv, dL/da at the chunk's start).
    HAS_GH: GH is the chunk of dL/dh from a loss on the returned potential, added to dL/dh[t]."""
    K: tl.constexpr = X.shape[0]
    k, Xf, H, TH = chunk_registers(X)
    for j in tl.static_range(K):
        sel = (k == j)[:, None]
        h = d * v + row(Xf, sel)
        theta = threshold + beta * a
        u = h - theta
        fired = u >= 0.0
        H = tl.where(sel, h[None, :], H)
        TH = tl.where(sel, theta[None, :], TH)
        v = reset_potential(h, fired, theta, v_reset, RESET)
        a = ad * a + spike_value(u, fired)
    GSf = GS.to(tl.float32)
    GX = tl.zeros(X.shape, tl.float32)
    for jj in tl.static_range(K):
        j = K - 1 - jj
        sel = (k == j)[:, None]
        h = row(H, sel)
        theta = row(TH, sel)
        u = h - theta
        fired = u >= 0.0
        sg = surrogate_grad(u, SURROGATE, alpha)
        # dL/ds[t] = external + through a[t] (= adapt_decay*a[t-1] + s[t]) + through the reset
        gh, gth = adaptive_grads(row(GSf, sel) + ga, gv, h, theta, fired, sg, v_reset, RESET, DETACH)
        if HAS_GH:
            gh += row(GH.to(tl.float32), sel)
        if TAIL:  # steps past T carry no gradient
            valid = t0 + j < T
            gh = tl.where(valid, gh, 0.0)
            gv = tl.where(valid, gh * d, gv)
            ga = tl.where(valid, ga * ad + gth * beta, ga)
        else:
            gv = gh * d
            ga = ga * ad + gth * beta
        GX = tl.where(sel, gh[None, :], GX)
    return GX, gv, ga


@cached_launch
@triton.jit
def _alif_backward_kernel(
    gs_ptr, x_ptr, ckpt_ptr, gvT_ptr, gaT_ptr, gx_ptr, gh_ptr, gv0_ptr, ga0_ptr,
    decay, adapt_decay, beta, threshold, v_reset, alpha, T, N,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr,
    HAS_GVT: tl.constexpr, HAS_GAT: tl.constexpr, HAS_GH: tl.constexpr,
    NEED_GV0: tl.constexpr, NEED_GA0: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr, EVEN_N: tl.constexpr,
):
    d, ad, beta = f32(decay), f32(adapt_decay), f32(beta)
    threshold, v_reset, alpha = f32(threshold), f32(v_reset), f32(alpha)
    n = program_neurons(BLOCK)
    n_mask = n < N
    # dL/dv[T-1], dL/da[T-1] when the final state was used downstream
    gv = load_or_zeros(gvT_ptr, n, n_mask, BLOCK, HAS_GVT)
    ga = load_or_zeros(gaT_ptr, n, n_mask, BLOCK, HAS_GAT)
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    full = T // K
    last = tl.cdiv(T, K) - 1
    a_ckpt_ptr = ckpt_ptr + tl.cast(last + 1, tl.int64) * N
    X = load_chunk(x_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GS = load_chunk(gs_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GH = GS  # stands in (unread) unless HAS_GH
    if HAS_GH:
        GH = load_chunk(gh_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    v = tl.load(ckpt_ptr + tl.cast(last, tl.int64) * N + n, mask=n_mask, other=0.0)
    a = tl.load(a_ckpt_ptr + tl.cast(last, tl.int64) * N + n, mask=n_mask, other=0.0)
    if full * K < T:  # the partial chunk first
        prev = tl.cast(tl.maximum(last - 1, 0), tl.int64) * N + n
        X_prev, GS_prev, GH_prev = load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, (last - 1) * K, offs, n_mask, N, EVEN_N,
                                                           HAS_GH)
        v_prev = tl.load(ckpt_ptr + prev, mask=n_mask, other=0.0)
        a_prev = tl.load(a_ckpt_ptr + prev, mask=n_mask, other=0.0)
        GX, gv, ga = alif_backward_chunk(X, GS, v, a, gv, ga, d, ad, beta, last * K, T, threshold,
                                         v_reset, alpha, RESET, DETACH, SURROGATE, True, GH, HAS_GH)
        store_chunk(gx_ptr, last * K, offs, k, n_mask, T, N, GX, EVEN_N)
        X, GS, GH, v, a = X_prev, GS_prev, GH_prev, v_prev, a_prev
    for i in range(0, full):
        c = full - 1 - i
        t0 = c * K
        # prefetch the chunk before (nothing is read when c == 0)
        prev = tl.cast(tl.maximum(c - 1, 0), tl.int64) * N + n
        X_prev, GS_prev, GH_prev = load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, t0 - K, offs, n_mask, N, EVEN_N,
                                                           HAS_GH)
        v_prev = tl.load(ckpt_ptr + prev, mask=n_mask, other=0.0)
        a_prev = tl.load(a_ckpt_ptr + prev, mask=n_mask, other=0.0)
        GX, gv, ga = alif_backward_chunk(X, GS, v, a, gv, ga, d, ad, beta, t0, T, threshold,
                                         v_reset, alpha, RESET, DETACH, SURROGATE, False, GH, HAS_GH)
        store_chunk(gx_ptr, t0, offs, k, n_mask, T, N, GX, EVEN_N)
        X, GS, GH, v, a = X_prev, GS_prev, GH_prev, v_prev, a_prev
    if NEED_GV0:  # past step 0, gv and ga are dL/dv[-1] = dL/dv0 and dL/da[-1] = dL/da0
        tl.store(gv0_ptr + n, gv, mask=n_mask)
    if NEED_GA0:
        tl.store(ga0_ptr + n, ga, mask=n_mask)


def _forward(x, v0, a0, decay, adapt_decay, beta, threshold, reset, v_reset, save, want_state=True,
             launch=EAGER, want_h=False):
    """spikes like x, v[T-1] and a[T-1] (float32, None unless `want_state`), the contiguous
    x, the checkpoints [2, ceil(T/K), N] (v then a; empty unless `save`) and the pre-reset
    potential trace h (x's dtype; None unless `want_h`). v0, a0: the initial state (shaped
    like x[0]) or None for zeros."""
    x, T, N, BLOCK, K, warps = time_major(x)
    spikes = torch.empty_like(x)
    vT = state_buffer(x, want_state)
    aT = state_buffer(x, want_state)
    ckpt = torch.empty((2, cdiv(T, K) if save else 0, N), device=x.device, dtype=torch.float32)
    h = torch.empty_like(x) if want_h else None
    if N > 0:
        unused = launch.unused(x)
        launch(_alif_forward_kernel)[(cdiv(N, BLOCK),)](
            x, spikes, ckpt, kernel_arg(v0, unused), kernel_arg(a0, unused), kernel_arg(vT, unused),
            kernel_arg(aT, unused), kernel_arg(h, unused),
            decay, adapt_decay, beta, threshold, v_reset, T, N,
            RESET=reset_code(reset, "alif"), HAS_V0=v0 is not None, HAS_A0=a0 is not None, SAVE_CKPT=save,
            STORE_STATE=want_state, STORE_H=want_h,
            BLOCK=BLOCK, K=K, EVEN_N=N % BLOCK == 0, num_warps=warps, enable_fp_fusion=False)
    return spikes, vT, aT, x, ckpt, h


def _backward(grad_s, grad_vT, grad_aT, x, ckpt, decay, adapt_decay, beta, threshold, reset,
              v_reset, detach, surrogate, alpha, need_gv0=False, need_ga0=False, launch=EAGER, grad_h=None):
    """(dL/dx like x, dL/dv0, dL/da0 (float32, shaped like x[0]; None unless needed)). x is
    the contiguous input saved by _forward; grad_s may be None (only the final state was
    used), grad_vT / grad_aT None when the state was not used, grad_h None or dL/dh for the
    returned potential trace (added to the recurrence's dL/dh)."""
    x, T, N, BLOCK, K, warps = time_major(x)
    gs = torch.zeros_like(x) if grad_s is None else grad_s.contiguous()
    grad_x = torch.empty_like(x)
    gv0 = state_buffer(x, need_gv0)
    ga0 = state_buffer(x, need_ga0)
    if N > 0:
        unused = launch.unused(gs)
        launch(_alif_backward_kernel)[(cdiv(N, BLOCK),)](
            gs, x, ckpt, kernel_arg(grad_vT, unused), kernel_arg(grad_aT, unused), grad_x,
            kernel_arg(grad_h, unused), kernel_arg(gv0, unused), kernel_arg(ga0, unused),
            decay, adapt_decay, beta, threshold, v_reset, alpha, T, N,
            RESET=reset_code(reset, "alif"), DETACH=detach, SURROGATE=SURROGATES[surrogate],
            HAS_GVT=grad_vT is not None, HAS_GAT=grad_aT is not None, HAS_GH=grad_h is not None,
            NEED_GV0=need_gv0, NEED_GA0=need_ga0,
            BLOCK=BLOCK, K=K, EVEN_N=N % BLOCK == 0, num_warps=warps, enable_fp_fusion=False)
    return grad_x, gv0, ga0


alif_fused = register(TwoStateNeuron("alif", state=("v", "a"), params=("decay", "adapt_decay", "beta"),
                                    forward=_forward, backward=_backward))
