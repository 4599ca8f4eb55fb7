"""Fused current-based synaptic LIF (CUBA; snnTorch's `Synaptic`, Norse's LIF with a
synaptic current): one Triton launch over all T steps forward, one reverse-time launch
backward.

    i[t] = syn_decay * i[t-1] + x[t]                     i[-1] = i0 (default 0; synaptic current)
    h[t] = decay * v[t-1] + i[t]                         v[-1] = v0 (default 0)
    s[t] = 1 if h[t] >= threshold else 0
    v[t] = v_reset (hard) / h - threshold (soft) / h (none) where s[t] = 1, else h[t]
reset="subtract" (snnTorch's `Synaptic`): h[t] also loses threshold * s[t-1], fires at
h > threshold, v[t] = h[t]; backward also carries dL/dh[t+1], the path from s[t] (as LIF's).
Backward: ds/dh = sg(h - threshold) as for the LIF (`detach_reset` cuts the reset of v
from s); the adjoints of v and i run backward together:
    dL/dh[t] = (dL/ds[t] + dL/dv[t] * through_spike) * sg + dL/dv[t] * direct
    dL/di[t] = dL/dh[t] + syn_decay * dL/di[t+1]         (= dL/dx[t])
    dL/dv[t-1] = decay * dL/dh[t]
Carried past step 0 they are the initial state's gradients: dL/dv0 = decay * dL/dh[0],
dL/di0 = syn_decay * dL/di[0] (written only when asked for).

Layout and launches as spikefuse.ops.lif (same BLOCK/K rules, same helpers): each program
owns BLOCK neurons, keeps v and i in registers for the whole sequence and walks time in
chunks of K steps, prefetching the next chunk.

Saved for backward: the input x and (v, i) at the start of every chunk ([2, ceil(T/K), N]:
8/K bytes per neuron-step). The backward kernel walks the chunks in reverse, recomputes
h (and so the spikes) forward from the chunk's checkpoint into registers (bit-identical to
the forward: same operations, no FMA contraction), then runs the adjoint recurrence for
(v, i) backward through them.

torch.compile sees two torch.library triton_ops (spikefuse::cuba_forward and
spikefuse::cuba_backward) whose bodies launch these kernels.
"""
from __future__ import annotations

import torch

from .kernel_base import (EAGER, cdiv, charge, chunk_registers, f32, fires, grad_h, kernel_arg,  # noqa: F401
                          load_chunk, load_earlier_chunks, load_or_zeros, program_neurons, reset_code, reset_potential,
                          row, spike_adjoint, spike_value, state_buffer, store_chunk, store_outputs, surrogate_grad,
                          time_major)
from .launch import cached_launch
from .neuron_op import TwoStateNeuron, register
from ..surrogates import SURROGATES

from .triton_or_stub import tl, triton  # noqa: F401


@triton.jit
def cuba_forward_chunk(X, v, i, d, sd, t0, T, threshold, v_reset,
                       RESET: tl.constexpr, TAIL: tl.constexpr, STORE_H: tl.constexpr):
    """Run K steps from state (v, i) over chunk X: (spikes [K, BLOCK] float32, the membrane's
    pre-reset potentials h [K, BLOCK] float32 (zeros unless STORE_H), v, i after).
    TAIL: the chunk crosses T, and the state must stop at step T-1."""
    K: tl.constexpr = X.shape[0]
    k, Xf, S, H = chunk_registers(X)
    for j in tl.static_range(K):
        sel = (k == j)[:, None]
        i_next = sd * i + row(Xf, sel)
        h = charge(d * v + i_next, v, threshold, RESET)
        u = h - threshold
        fired = fires(u, RESET)
        s = spike_value(u, fired)
        v_next = reset_potential(h, fired, threshold, v_reset, RESET)
        if TAIL:
            v = tl.where(t0 + j < T, v_next, v)
            i = tl.where(t0 + j < T, i_next, i)
        else:
            v = v_next
            i = i_next
        S = tl.where(sel, s[None, :], S)
        if STORE_H:
            H = tl.where(sel, h[None, :], H)
    return S, H, v, i


@cached_launch
@triton.jit
def _cuba_forward_kernel(
    x_ptr, s_ptr, ckpt_ptr, v0_ptr, i0_ptr, vT_ptr, iT_ptr, h_ptr,
    decay, syn_decay, threshold, v_reset, T, N,
    RESET: tl.constexpr, HAS_V0: tl.constexpr, HAS_I0: tl.constexpr, SAVE_CKPT: tl.constexpr,
    STORE_STATE: tl.constexpr, STORE_H: tl.constexpr,
    BLOCK: tl.constexpr, K: tl.constexpr, EVEN_N: tl.constexpr,
):
    d, sd = f32(decay), f32(syn_decay)
    threshold, v_reset = f32(threshold), f32(v_reset)
    n = program_neurons(BLOCK)
    n_mask = n < N
    v = load_or_zeros(v0_ptr, n, n_mask, BLOCK, HAS_V0)
    i = load_or_zeros(i0_ptr, n, n_mask, BLOCK, HAS_I0)
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    full = T // K
    i_ckpt_ptr = ckpt_ptr + tl.cast(tl.cdiv(T, K), tl.int64) * N  # ckpt is [2, chunks, N]
    X = load_chunk(x_ptr, 0, offs, k, n_mask, T, N, EVEN_N)
    for c in range(0, full):
        t0 = c * K
        X_next = load_chunk(x_ptr, t0 + K, offs, k, n_mask, T, N, EVEN_N)  # prefetch
        if SAVE_CKPT:
            tl.store(ckpt_ptr + tl.cast(c, tl.int64) * N + n, v, mask=n_mask)
            tl.store(i_ckpt_ptr + tl.cast(c, tl.int64) * N + n, i, mask=n_mask)
        S, H, v, i = cuba_forward_chunk(X, v, i, d, sd, t0, T, threshold, v_reset, RESET, False, STORE_H)
        store_outputs(s_ptr, h_ptr, t0, offs, k, n_mask, T, N, S, H, EVEN_N, STORE_H)
        X = X_next
    if full * K < T:  # the last, partial chunk
        if SAVE_CKPT:
            tl.store(ckpt_ptr + tl.cast(full, tl.int64) * N + n, v, mask=n_mask)
            tl.store(i_ckpt_ptr + tl.cast(full, tl.int64) * N + n, i, mask=n_mask)
        S, H, v, i = cuba_forward_chunk(X, v, i, d, sd, full * K, T, threshold, v_reset, RESET, True,
                                        STORE_H)
        store_outputs(s_ptr, h_ptr, full * K, offs, k, n_mask, T, N, S, H, EVEN_N, STORE_H)
    if STORE_STATE:
        tl.store(vT_ptr + n, v, mask=n_mask)
        tl.store(iT_ptr + n, i, mask=n_mask)


@triton.jit
def cuba_backward_chunk(X, GS, v, i, gv, gi, gp, d, sd, t0, T, threshold, v_reset, alpha,
                        RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr,
                        TAIL: tl.constexpr, GH, HAS_GH: tl.constexpr):
    """Recompute the chunk forward from its checkpoint (v, i) (h[t] into registers), then
    run the adjoint recurrence backward through it: (dL/dx chunk, dL/dv[t0-1],
    syn_decay * dL/di[t0] = the gradient reaching i[t0-1], and dL/dh[t0], through which the
    "subtract" reset reaches s[t0-1]).
    HAS_GH: GH is the chunk of dL/dh from a loss on the returned potential, added to dL/dh[t]."""
    K: tl.constexpr = X.shape[0]
    k, Xf, H, GX = chunk_registers(X)  # H: the replay's potentials; GX: dL/dx, filled in reverse
    for j in tl.static_range(K):
        sel = (k == j)[:, None]
        i = sd * i + row(Xf, sel)
        h = charge(d * v + i, v, threshold, RESET)
        H = tl.where(sel, h[None, :], H)
        v = reset_potential(h, fires(h - threshold, RESET), threshold, v_reset, RESET)
    GSf = GS.to(tl.float32)
    for jj in tl.static_range(K):
        j = K - 1 - jj
        sel = (k == j)[:, None]
        h = row(H, sel)
        u = h - threshold
        sg = surrogate_grad(u, SURROGATE, alpha)
        gh = grad_h(row(GSf, sel), gv, gp, h, fires(u, RESET), sg, threshold, v_reset, RESET, DETACH)
        if HAS_GH:
            gh += row(GH.to(tl.float32), sel)
        gx = gh + gi  # dL/di[t] = dL/dh[t] + syn_decay * dL/di[t+1]
        if TAIL:  # steps past T carry no gradient
            valid = t0 + j < T
            gx = tl.where(valid, gx, 0.0)
            gv = tl.where(valid, gh * d, gv)
            gi = tl.where(valid, gx * sd, gi)
        else:
            gv = gh * d
            gi = gx * sd
        gp = tl.where(t0 + j < T, gh, 0.0) if TAIL else gh
        GX = tl.where(sel, gx[None, :], GX)
    return GX, gv, gi, gp


@cached_launch
@triton.jit
def _cuba_backward_kernel(
    gs_ptr, x_ptr, ckpt_ptr, gvT_ptr, giT_ptr, gx_ptr, gh_ptr, gv0_ptr, gi0_ptr,
    decay, syn_decay, threshold, v_reset, alpha, T, N,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr,
    HAS_GVT: tl.constexpr, HAS_GIT: tl.constexpr, HAS_GH: tl.constexpr,
    NEED_GV0: tl.constexpr, NEED_GI0: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr, EVEN_N: tl.constexpr,
):
    d, sd = f32(decay), f32(syn_decay)
    threshold, v_reset, alpha = f32(threshold), f32(v_reset), f32(alpha)
    n = program_neurons(BLOCK)
    n_mask = n < N
    # dL/dv[T-1], dL/di[T-1] when the final state was used downstream; dL/di[T-1] is carried as
    # "the gradient reaching i[T-1] from later", added to dL/dh[T-1]
    gv = load_or_zeros(gvT_ptr, n, n_mask, BLOCK, HAS_GVT)
    gi = load_or_zeros(giT_ptr, n, n_mask, BLOCK, HAS_GIT)
    gp = tl.zeros([BLOCK], tl.float32)  # dL/dh[t+1]: none after the last step
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    full = T // K
    last = tl.cdiv(T, K) - 1
    i_ckpt_ptr = ckpt_ptr + tl.cast(last + 1, tl.int64) * N
    X = load_chunk(x_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GS = load_chunk(gs_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GH = GS  # stands in (unread) unless HAS_GH
    if HAS_GH:
        GH = load_chunk(gh_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    v = tl.load(ckpt_ptr + tl.cast(last, tl.int64) * N + n, mask=n_mask, other=0.0)
    i = tl.load(i_ckpt_ptr + tl.cast(last, tl.int64) * N + n, mask=n_mask, other=0.0)
    if full * K < T:  # the partial chunk first
        prev = tl.cast(tl.maximum(last - 1, 0), tl.int64) * N + n
        X_prev, GS_prev, GH_prev = load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, (last - 1) * K, offs, n_mask, N, EVEN_N,
                                                           HAS_GH)
        v_prev = tl.load(ckpt_ptr + prev, mask=n_mask, other=0.0)
        i_prev = tl.load(i_ckpt_ptr + prev, mask=n_mask, other=0.0)
        GX, gv, gi, gp = cuba_backward_chunk(X, GS, v, i, gv, gi, gp, d, sd, last * K, T, threshold,
                                             v_reset, alpha, RESET, DETACH, SURROGATE, True, GH, HAS_GH)
        store_chunk(gx_ptr, last * K, offs, k, n_mask, T, N, GX, EVEN_N)
        X, GS, GH, v, i = X_prev, GS_prev, GH_prev, v_prev, i_prev
    for c_rev in range(0, full):
        c = full - 1 - c_rev
        t0 = c * K
        # prefetch the chunk before (nothing is read when c == 0)
        prev = tl.cast(tl.maximum(c - 1, 0), tl.int64) * N + n
        X_prev, GS_prev, GH_prev = load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, t0 - K, offs, n_mask, N, EVEN_N,
                                                           HAS_GH)
        v_prev = tl.load(ckpt_ptr + prev, mask=n_mask, other=0.0)
        i_prev = tl.load(i_ckpt_ptr + prev, mask=n_mask, other=0.0)
        GX, gv, gi, gp = cuba_backward_chunk(X, GS, v, i, gv, gi, gp, d, sd, t0, T, threshold,
                                             v_reset, alpha, RESET, DETACH, SURROGATE, False, GH, HAS_GH)
        store_chunk(gx_ptr, t0, offs, k, n_mask, T, N, GX, EVEN_N)
        X, GS, GH, v, i = X_prev, GS_prev, GH_prev, v_prev, i_prev
    if RESET == 3 and not DETACH:  # s[-1] = H(v0 - threshold) (v: the first checkpoint) resets step 0
        gv += spike_adjoint(0.0, gp, -threshold, RESET, DETACH) * surrogate_grad(v - threshold, SURROGATE, alpha)
    if NEED_GV0:  # past step 0, gv and gi are dL/dv[-1] = dL/dv0 and dL/di[-1] = dL/di0
        tl.store(gv0_ptr + n, gv, mask=n_mask)
    if NEED_GI0:
        tl.store(gi0_ptr + n, gi, mask=n_mask)


def _forward(x, v0, i0, decay, syn_decay, threshold, reset, v_reset, save, want_state=True, launch=EAGER,
             want_h=False):
    """spikes like x, v[T-1] and i[T-1] (float32, None unless `want_state`), the contiguous
    x, the checkpoints [2, ceil(T/K), N] (v then i; empty unless `save`) and the membrane's
    pre-reset potential trace h (x's dtype; None unless `want_h`). v0, i0: the initial state
    (shaped like x[0]) or None for zeros."""
    x, T, N, BLOCK, K, warps = time_major(x)
    spikes = torch.empty_like(x)
    vT = state_buffer(x, want_state)
    iT = state_buffer(x, want_state)
    ckpt = torch.empty((2, cdiv(T, K) if save else 0, N), device=x.device, dtype=torch.float32)
    h = torch.empty_like(x) if want_h else None
    if N > 0:
        unused = launch.unused(x)
        launch(_cuba_forward_kernel)[(cdiv(N, BLOCK),)](
            x, spikes, ckpt, kernel_arg(v0, unused), kernel_arg(i0, unused), kernel_arg(vT, unused),
            kernel_arg(iT, unused), kernel_arg(h, unused),
            decay, syn_decay, threshold, v_reset, T, N,
            RESET=reset_code(reset), HAS_V0=v0 is not None, HAS_I0=i0 is not None, SAVE_CKPT=save,
            STORE_STATE=want_state, STORE_H=want_h,
            BLOCK=BLOCK, K=K, EVEN_N=N % BLOCK == 0, num_warps=warps, enable_fp_fusion=False)
    return spikes, vT, iT, x, ckpt, h


def _backward(grad_s, grad_vT, grad_iT, x, ckpt, decay, syn_decay, threshold, reset, v_reset,
              detach, surrogate, alpha, need_gv0=False, need_gi0=False, launch=EAGER, grad_h=None):
    """(dL/dx like x, dL/dv0, dL/di0 (float32, shaped like x[0]; None unless needed)). x is
    the contiguous input saved by _forward; grad_s may be None (only the final state was
    used), grad_vT / grad_iT None when the state was not used, grad_h None or dL/dh for the
    returned potential trace (added to the recurrence's dL/dh)."""
    x, T, N, BLOCK, K, warps = time_major(x)
    gs = torch.zeros_like(x) if grad_s is None else grad_s.contiguous()
    grad_x = torch.empty_like(x)
    gv0 = state_buffer(x, need_gv0)
    gi0 = state_buffer(x, need_gi0)
    if N > 0:
        unused = launch.unused(gs)
        launch(_cuba_backward_kernel)[(cdiv(N, BLOCK),)](
            gs, x, ckpt, kernel_arg(grad_vT, unused), kernel_arg(grad_iT, unused), grad_x,
            kernel_arg(grad_h, unused), kernel_arg(gv0, unused), kernel_arg(gi0, unused),
            decay, syn_decay, threshold, v_reset, alpha, T, N,
            RESET=reset_code(reset), DETACH=detach, SURROGATE=SURROGATES[surrogate],
            HAS_GVT=grad_vT is not None, HAS_GIT=grad_iT is not None, HAS_GH=grad_h is not None,
            NEED_GV0=need_gv0, NEED_GI0=need_gi0,
            BLOCK=BLOCK, K=K, EVEN_N=N % BLOCK == 0, num_warps=warps, enable_fp_fusion=False)
    return grad_x, gv0, gi0


cuba_fused = register(TwoStateNeuron("cuba", state=("v", "i"), params=("decay", "syn_decay"),
                                    forward=_forward, backward=_backward))
