"""Fused LIF: one Triton launch over all T steps forward, one reverse-time launch backward.

Each program owns BLOCK neurons and keeps their membrane potential in registers for the
whole sequence. Time is walked in chunks of K steps: a chunk's K rows are loaded at once
(K independent loads in flight per thread, which is what keeps a latency-bound walk at
the bandwidth limit) and the recurrence then runs through the chunk in registers.

Saved for backward: u = h - threshold, one value per neuron-step in x's dtype. Spikes are
recomputed from the sign bit of u (rounding never flips a sign, so this is exact also when
u is stored in bfloat16), the surrogate is evaluated at u, and v[t-1] for the PLIF decay
gradient is recomputed from u[t-1]. Traffic per element: forward reads x, writes s and u;
backward reads grad_s and u, writes grad_x: 6 accesses, against the 5 of the floor.
"""
from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():  # no GPU: Triton can only run through its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .surrogate import SURROGATES  # noqa: E402

RESET_CODES = {"hard": 0, "soft": 1, "none": 2}


@triton.jit
def surrogate_grad(u, SURROGATE: tl.constexpr, alpha):
    """sg(u) for the surrogate code (see surrogate.py for the formulas)."""
    if SURROGATE == 0:  # rectangular
        return tl.where(tl.abs(u) < alpha * 0.5, 1.0 / alpha, 0.0)
    elif SURROGATE == 1:  # triangle
        return tl.maximum(1.0 - tl.abs(u) / alpha, 0.0) / alpha
    elif SURROGATE == 2:  # fast sigmoid / SuperSpike
        d = alpha * tl.abs(u) + 1.0
        return 1.0 / (d * d)
    elif SURROGATE == 3:  # sigmoid
        sig = 1.0 / (1.0 + tl.exp(-alpha * u))
        return alpha * sig * (1.0 - sig)
    else:  # atan
        z = (math.pi / 2) * alpha * u
        return (alpha * 0.5) / (1.0 + z * z)


@triton.jit
def reset_potential(h, fired, threshold, v_reset, RESET: tl.constexpr):
    """v[t] from h[t] and s[t]: hard, soft (subtract) or no reset."""
    if RESET == 0:
        return tl.where(fired, v_reset, h)
    elif RESET == 1:
        return tl.where(fired, h - threshold, h)
    else:
        return h


@triton.jit
def load_decay(decay_ptr, decay, n, mask, inner, C, DECAY: tl.constexpr):
    """Per-neuron decay: 0 = the float `decay`, 1 = one tensor value, 2 = per channel."""
    if DECAY == 0:
        return decay
    elif DECAY == 1:
        return tl.load(decay_ptr).to(tl.float32)
    else:
        return tl.load(decay_ptr + (n // inner) % C, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def row(X, sel):
    """Row `sel` of a [K, BLOCK] chunk; K lies in each thread's registers, so this folds."""
    return tl.sum(tl.where(sel, X, 0.0), axis=0)


@triton.jit
def _lif_forward_kernel(
    x_ptr, s_ptr, u_ptr, v0_ptr, vT_ptr, decay_ptr,
    decay, threshold, v_reset, T, N, inner, C,
    RESET: tl.constexpr, DECAY: tl.constexpr, HAS_V0: tl.constexpr,
    SAVE_U: tl.constexpr, STORE_VT: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_mask = n < N
    d = load_decay(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    if HAS_V0:
        v = tl.load(v0_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        v = tl.zeros([BLOCK], tl.float32)
    k = tl.arange(0, K)
    for t0 in range(0, T, K):
        t = t0 + k
        offs = t.to(tl.int64)[:, None] * N + n[None, :]
        mask = (t < T)[:, None] & n_mask[None, :]
        X = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        S = tl.zeros([K, BLOCK], tl.float32)
        U = tl.zeros([K, BLOCK], tl.float32)
        for j in tl.static_range(K):
            sel = (k == j)[:, None]
            h = d * v + row(X, sel)
            u = h - threshold
            fired = u >= 0.0
            v = tl.where(t0 + j < T, reset_potential(h, fired, threshold, v_reset, RESET), v)
            S = tl.where(sel, fired.to(tl.float32)[None, :], S)
            # +0.0 for u == 0 so that the sign bit alone tells a spike in backward
            U = tl.where(sel, tl.where(u == 0.0, 0.0, u)[None, :], U)
        tl.store(s_ptr + offs, S.to(s_ptr.dtype.element_ty), mask=mask)
        if SAVE_U:
            tl.store(u_ptr + offs, U.to(u_ptr.dtype.element_ty), mask=mask)
    if STORE_VT:
        tl.store(vT_ptr + n, v, mask=n_mask)


@triton.jit
def _lif_backward_kernel(
    gs_ptr, u_ptr, gvT_ptr, v0_ptr, gx_ptr, gv0_ptr, gd_ptr, decay_ptr,
    decay, threshold, v_reset, alpha, T, N, inner, C,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, DECAY: tl.constexpr,
    HAS_GVT: tl.constexpr, HAS_V0: tl.constexpr, NEED_GV0: tl.constexpr, NEED_GD: tl.constexpr,
    U_BITS: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_mask = n < N
    d = load_decay(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    if HAS_GVT:  # dL/dv[T-1] when the final state was used downstream
        gv = tl.load(gvT_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        gv = tl.zeros([BLOCK], tl.float32)
    gh_next = tl.zeros([BLOCK], tl.float32)  # dL/dh[t+1], waiting for v[t] (decay gradient)
    gd = tl.zeros([BLOCK], tl.float32)
    k = tl.arange(0, K)
    int_type = tl.int16 if U_BITS == 16 else tl.int32
    for c in range(0, tl.cdiv(T, K)):
        t0 = T - (c + 1) * K  # negative in the last chunk: those rows are masked
        t = t0 + k
        offs = t.to(tl.int64)[:, None] * N + n[None, :]
        mask = (t >= 0)[:, None] & n_mask[None, :]
        GS = tl.load(gs_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        U_raw = tl.load(u_ptr + offs, mask=mask, other=0.0)
        FIRED = (U_raw.to(int_type, bitcast=True) >= 0).to(tl.float32)
        U = U_raw.to(tl.float32)
        GX = tl.zeros([K, BLOCK], tl.float32)
        for jj in tl.static_range(K):
            j = K - 1 - jj
            sel = (k == j)[:, None]
            valid = t0 + j >= 0
            u = row(U, sel)
            fired = row(FIRED, sel) > 0.5
            h = u + threshold
            if NEED_GD:  # dL/d decay += dL/dh[t+1] * v[t]
                v_t = reset_potential(h, fired, threshold, v_reset, RESET)
                gd += tl.where(valid, gh_next * v_t, 0.0)
            sg = surrogate_grad(u, SURROGATE, alpha)
            if RESET == 0:
                direct = tl.where(fired, 0.0, 1.0)
                through_spike = 0.0 if DETACH else v_reset - h
            elif RESET == 1:
                direct = 1.0
                through_spike = 0.0 if DETACH else -threshold
            else:
                direct = 1.0
                through_spike = 0.0
            gh = (row(GS, sel) + gv * through_spike) * sg + gv * direct
            gv = tl.where(valid, gh * d, gv)
            gh_next = tl.where(valid, gh, gh_next)
            GX = tl.where(sel, gh[None, :], GX)
        tl.store(gx_ptr + offs, GX.to(gx_ptr.dtype.element_ty), mask=mask)
    if NEED_GV0:
        tl.store(gv0_ptr + n, gv, mask=n_mask)
    if NEED_GD:
        if HAS_V0:
            gd += gh_next * tl.load(v0_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(gd_ptr + n, gd, mask=n_mask)


def _launch_config(num_neurons: int) -> tuple[int, int, int]:
    """(BLOCK, K, num_warps). Few neurons: small blocks so every SM gets programs, and
    more steps per chunk so enough bytes are in flight; many neurons: wide blocks."""
    if num_neurons >= 1 << 18:
        return 1024, 4, 4
    if num_neurons >= 1 << 16:
        return 512, 8, 4
    return 128, 8, 1


def _decay_mode(decay_tensor, x):
    if decay_tensor is None:
        return 0, 1
    if decay_tensor.numel() == 1:
        return 1, 1
    return 2, x.shape[2]


def _forward(x, decay, decay_tensor, v0, threshold, reset, v_reset, save_u):
    T = x.shape[0]
    x2 = x.reshape(T, -1)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    N = x2.shape[1]
    spikes = torch.empty_like(x2)
    u = torch.empty_like(x2) if save_u else spikes  # unused pointer when not saving
    vT = torch.empty(N, device=x.device, dtype=torch.float32)
    mode, C = _decay_mode(decay_tensor, x)
    inner = math.prod(x.shape[3:]) if mode == 2 else 1
    BLOCK, K, warps = _launch_config(N)
    if N > 0:
        _lif_forward_kernel[(triton.cdiv(N, BLOCK),)](
            x2, spikes, u, v0.reshape(-1).contiguous() if v0 is not None else x2, vT,
            decay_tensor if decay_tensor is not None else x2,
            decay, threshold, v_reset, T, N, inner, C,
            RESET=RESET_CODES[reset], DECAY=mode, HAS_V0=v0 is not None, SAVE_U=save_u,
            STORE_VT=True, BLOCK=BLOCK, K=K, num_warps=warps, enable_fp_fusion=False)
    return spikes.view(x.shape), vT.view(x.shape[1:]), u if save_u else None


def _backward(grad_s, grad_vT, u, x_shape, decay, decay_tensor, v0, threshold, reset,
              v_reset, detach, surrogate, alpha, need_gv0, need_gd):
    T = x_shape[0]
    gs = grad_s.reshape(T, -1)
    if not gs.is_contiguous():
        gs = gs.contiguous()
    N = gs.shape[1]
    grad_x = torch.empty(gs.shape, device=gs.device, dtype=u.dtype)
    gv0 = torch.empty(N, device=gs.device, dtype=torch.float32) if need_gv0 else None
    gd = torch.empty(N, device=gs.device, dtype=torch.float32) if need_gd else None
    gvT = grad_vT.reshape(-1).contiguous() if grad_vT is not None else None
    mode, C = _decay_mode(decay_tensor, torch.empty(x_shape, device="meta"))
    inner = math.prod(x_shape[3:]) if mode == 2 else 1
    BLOCK, K, warps = _launch_config(N)
    if N > 0:
        _lif_backward_kernel[(triton.cdiv(N, BLOCK),)](
            gs, u, gvT if gvT is not None else gs, v0.reshape(-1).contiguous() if v0 is not None else gs,
            grad_x, gv0 if gv0 is not None else gs, gd if gd is not None else gs,
            decay_tensor if decay_tensor is not None else gs,
            decay, threshold, v_reset, alpha, T, N, inner, C,
            RESET=RESET_CODES[reset], DETACH=detach, SURROGATE=SURROGATES[surrogate],
            DECAY=mode, HAS_GVT=gvT is not None, HAS_V0=v0 is not None, NEED_GV0=need_gv0,
            NEED_GD=need_gd, U_BITS=u.element_size() * 8, BLOCK=BLOCK, K=K, num_warps=warps,
            enable_fp_fusion=False)
    return grad_x, gv0, gd


# ---- torch.library registration: opaque to torch.compile, autograd attached ----

@torch.library.custom_op("spikefuse::lif_forward", mutates_args=())
def lif_forward(x: torch.Tensor, decay: float, decay_tensor: torch.Tensor | None,
                v0: torch.Tensor | None, threshold: float, reset: str, v_reset: float,
                detach: bool, surrogate: str, alpha: float, save_u: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Spikes [T, *], v[T-1] (float32) and the saved u (empty unless save_u).
    detach, surrogate and alpha are only used by the backward."""
    spikes, vT, u = _forward(x, decay, decay_tensor, v0, threshold, reset, v_reset, save_u)
    return spikes, vT, (u if u is not None else x.new_empty(0))


@lif_forward.register_fake
def _(x, decay, decay_tensor, v0, threshold, reset, v_reset, detach, surrogate, alpha, save_u):
    u = x.new_empty(x.shape[0], math.prod(x.shape[1:])) if save_u else x.new_empty(0)
    return torch.empty_like(x), x.new_empty(x.shape[1:], dtype=torch.float32), u


@torch.library.custom_op("spikefuse::lif_backward", mutates_args=())
def lif_backward(grad_s: torch.Tensor, grad_vT: torch.Tensor | None, u: torch.Tensor,
                 decay: float, decay_tensor: torch.Tensor | None, v0: torch.Tensor | None,
                 threshold: float, reset: str, v_reset: float, detach: bool, surrogate: str,
                 alpha: float, need_gv0: bool, need_gd: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """grad_x [T, *], and per-neuron float32 dL/dv0 and dL/d(decay) partials (or empty)."""
    gx, gv0, gd = _backward(grad_s, grad_vT, u, grad_s.shape, decay, decay_tensor, v0, threshold,
                            reset, v_reset, detach, surrogate, alpha, need_gv0, need_gd)
    def or_empty(t):  # a custom op may not return one tensor twice
        return t if t is not None else u.new_empty(0, dtype=torch.float32)
    return gx.view(grad_s.shape), or_empty(gv0), or_empty(gd)


@lif_backward.register_fake
def _(grad_s, grad_vT, u, decay, decay_tensor, v0, threshold, reset, v_reset, detach,
      surrogate, alpha, need_gv0, need_gd):
    n = math.prod(grad_s.shape[1:])
    f32 = dict(dtype=torch.float32, device=grad_s.device)
    return (torch.empty(grad_s.shape, dtype=u.dtype, device=grad_s.device),
            torch.empty(n if need_gv0 else 0, **f32), torch.empty(n if need_gd else 0, **f32))


def _setup_context(ctx, inputs, output):
    x, decay, decay_tensor, v0, threshold, reset, v_reset, detach, surrogate, alpha, _ = inputs
    ctx.save_for_backward(output[2], decay_tensor, v0)
    ctx.x_shape = x.shape
    ctx.options = (decay, threshold, reset, v_reset, detach, surrogate, alpha)


def _backward_rule(ctx, grad_s, grad_vT, _grad_u):
    u, decay_tensor, v0 = ctx.saved_tensors
    need_gd = decay_tensor is not None and ctx.needs_input_grad[2]
    need_gv0 = v0 is not None and ctx.needs_input_grad[3]
    if grad_s is None:  # only the final state was used
        grad_s = u.new_zeros(ctx.x_shape)
    gx, gv0, gd = lif_backward(grad_s, grad_vT, u, *ctx.options[:1], decay_tensor, v0,
                               *ctx.options[1:], need_gv0, need_gd)
    grad_decay = _reduce_decay_grad(gd, ctx.x_shape, decay_tensor) if need_gd else None
    grad_v0 = gv0.view(ctx.x_shape[1:]).to(v0.dtype) if need_gv0 else None
    return gx.view(ctx.x_shape), None, grad_decay, grad_v0, None, None, None, None, None, None, None


def _reduce_decay_grad(gd, x_shape, decay_tensor):
    """Per-neuron partial sums -> the decay's shape (one value, or one per channel)."""
    if decay_tensor.numel() == 1:
        return gd.sum().reshape(decay_tensor.shape)
    return gd.view(x_shape[1], x_shape[2], -1).sum(dim=(0, 2))


lif_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def lif_fused(x, decay, decay_tensor, threshold, reset, v_reset, detach, surrogate, alpha,
              v0, return_state):
    """Entry point for spikefuse.functional (arguments already checked there)."""
    if decay_tensor is not None:
        decay_tensor = decay_tensor.float()
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, decay_tensor, v0))
    spikes, vT, _ = lif_forward(x, decay, decay_tensor, v0, threshold, reset, v_reset,
                                detach, surrogate, alpha, wants_grad)
    return (spikes, vT) if return_state else spikes
