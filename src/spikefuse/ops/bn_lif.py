"""Fused BatchNorm + LIF with the dataflow of Liang et al.: save x, recompute the rest.

    y[t] = (x[t] - mean) * invstd * gamma + beta (+ residual[t])      BN per channel
    then the LIF of spikefuse.functional.lif on y (v[-1] = 0)

Saved for backward: x (the conv/linear output, which the graph holds anyway), the
per-channel statistics, and the membrane potential entering every K-th step (K = 8, or
the next power of two >= T when T is shorter; one float32 per neuron per chunk boundary:
at most 0.5 byte per neuron-step, nothing at all when T <= 8). The BN output, the
potentials and the spikes are never stored: the backward kernel walks the time chunks
in reverse, recomputes the chunk's potentials from its checkpoint and x into registers
(bit-identical to the forward: same operations, no FMA contraction), and then runs the
reverse-time recurrence through the chunk.

Why checkpoints and not the pre-spike potential in a narrow type: bfloat16 u costs 2
bytes per neuron-step (4x the checkpoints) and its rounding moves the surrogate gradients
by ~1e-3 relative (measured on N(0, 0.5) potentials: atan, sigmoid, fast_sigmoid and
triangle 1.0e-3, rectangular 3.7e-2), far outside the 1e-5 contract; float32 u would
double what the layer holds. Recomputing a chunk costs one more read of x, which the BN
gradient (Eq. 8-10) needs anyway, so the backward reads x once for both.

Backward is two launches: (1) reverse walk: dL/dy[t] is written into the float32 buffer
that later becomes dL/dx, with per-neuron partial sums of dL/dy, dL/dy*xhat (and
dL/d decay) reduced per channel by torch; (2) elementwise Eq. 8 (in place for float32).
Traffic per neuron-step (float32): statistics 4 B, forward 8 B, backward 24 B.
"""
from __future__ import annotations

import math
import os

import torch

from .lif import (RESET_CODES, _reduce_decay_grad, grad_h, load_decay, reset_potential, row,
                  surrogate_grad)
from .surrogate import SURROGATES

import triton  # noqa: E402  (after .lif: it picks the interpreter on GPU-less machines)
import triton.language as tl  # noqa: E402

K_STEPS = 8  # time steps per chunk = checkpoint spacing (fewer when T is shorter)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _steps(T: int) -> int:
    return min(K_STEPS, triton.next_power_of_2(T))


@triton.jit
def _bn_y(x_ptr, r_ptr, t, n, mask, a, b, stride_t, N, HAS_RES: tl.constexpr):
    """y for a [K, BLOCK] chunk: x * (gamma*invstd) + (beta - mean*gamma*invstd) (+ r)."""
    X = tl.load(x_ptr + t.to(tl.int64)[:, None] * stride_t + n[None, :], mask=mask, other=0.0)
    Y = X.to(tl.float32) * a[None, :] + b[None, :]
    if HAS_RES:
        R = tl.load(r_ptr + t.to(tl.int64)[:, None] * N + n[None, :], mask=mask, other=0.0)
        Y = Y + R.to(tl.float32)
    return X.to(tl.float32), Y


@triton.jit
def _offset(row_index, N, n):
    """row_index * N + n in int64 (row_index is a scalar: a Python int when interpreted)."""
    return (tl.zeros_like(n).to(tl.int64) + row_index) * N + n


@triton.jit
def _bn_lif_forward_kernel(
    x_ptr, r_ptr, s_ptr, ckpt_ptr, a_ptr, b_ptr, decay_ptr,
    decay, threshold, v_reset, T, N, stride_t, inner, C,
    RESET: tl.constexpr, DECAY: tl.constexpr, HAS_RES: tl.constexpr, SAVE: tl.constexpr,
    BLOCK: tl.constexpr, K: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_mask = n < N
    ch = (n // inner) % C
    a = tl.load(a_ptr + ch, mask=n_mask, other=0.0)
    b = tl.load(b_ptr + ch, mask=n_mask, other=0.0)
    d = load_decay(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    v = tl.zeros([BLOCK], tl.float32)
    k = tl.arange(0, K)
    for t0 in range(0, T, K):
        if SAVE:  # checkpoint: the potential entering this chunk (chunk 0 starts at 0)
            tl.store(ckpt_ptr + _offset(t0 // K - 1, N, n), v, mask=n_mask & (t0 > 0))
        t = t0 + k
        mask = (t < T)[:, None] & n_mask[None, :]
        _, Y = _bn_y(x_ptr, r_ptr, t, n, mask, a, b, stride_t, N, HAS_RES)
        S = tl.zeros([K, BLOCK], tl.float32)
        for j in tl.static_range(K):
            sel = (k == j)[:, None]
            h = d * v + row(Y, sel)
            fired = h - threshold >= 0.0
            v = reset_potential(h, fired, threshold, v_reset, RESET)
            S = tl.where(sel, fired.to(tl.float32)[None, :], S)
        tl.store(s_ptr + t.to(tl.int64)[:, None] * N + n[None, :], S.to(s_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bn_lif_backward_kernel(
    x_ptr, r_ptr, gs_ptr, ckpt_ptr, gy_ptr, part_ptr, a_ptr, b_ptr, mean_ptr, invstd_ptr, decay_ptr,
    decay, threshold, v_reset, alpha, T, N, stride_t, inner, C,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, DECAY: tl.constexpr,
    HAS_RES: tl.constexpr, NEED_GD: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_mask = n < N
    ch = (n // inner) % C
    a = tl.load(a_ptr + ch, mask=n_mask, other=0.0)
    b = tl.load(b_ptr + ch, mask=n_mask, other=0.0)
    mu = tl.load(mean_ptr + ch, mask=n_mask, other=0.0)
    istd = tl.load(invstd_ptr + ch, mask=n_mask, other=0.0)
    d = load_decay(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    gv = tl.zeros([BLOCK], tl.float32)  # dL/dv[t], flowing back from t+1
    sum_gy = tl.zeros([BLOCK], tl.float32)
    sum_gyx = tl.zeros([BLOCK], tl.float32)
    gd = tl.zeros([BLOCK], tl.float32)
    k = tl.arange(0, K)
    chunks = tl.cdiv(T, K)
    for c in range(0, chunks):
        ci = chunks - 1 - c
        t = ci * K + k
        mask = (t < T)[:, None] & n_mask[None, :]
        offs = t.to(tl.int64)[:, None] * N + n[None, :]
        # recompute the chunk forward from its checkpoint (chunk 0 starts at v = 0)
        v = tl.load(ckpt_ptr + _offset(ci - 1, N, n), mask=n_mask & (tl.zeros_like(n) + ci > 0), other=0.0)
        X, Y = _bn_y(x_ptr, r_ptr, t, n, mask, a, b, stride_t, N, HAS_RES)
        H = tl.zeros([K, BLOCK], tl.float32)
        V = tl.zeros([K, BLOCK], tl.float32)  # v[t-1], for the decay gradient
        for j in tl.static_range(K):
            sel = (k == j)[:, None]
            h = d * v + row(Y, sel)
            H = tl.where(sel, h[None, :], H)
            V = tl.where(sel, v[None, :], V)
            v = reset_potential(h, h - threshold >= 0.0, threshold, v_reset, RESET)
        # then walk it in reverse
        GS = tl.load(gs_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        GY = tl.zeros([K, BLOCK], tl.float32)
        for jj in tl.static_range(K):
            j = K - 1 - jj
            sel = (k == j)[:, None]
            h = row(H, sel)
            u = h - threshold
            gh = grad_h(row(GS, sel), gv, h, u >= 0.0, surrogate_grad(u, SURROGATE, alpha),
                         threshold, v_reset, RESET, DETACH)
            gh = tl.where(ci * K + j < T, gh, 0.0)  # rows past T: no gradient, gv passes
            if NEED_GD:
                gd += gh * row(V, sel)
            gv = tl.where(ci * K + j < T, gh * d, gv)
            GY = tl.where(sel, gh[None, :], GY)
        tl.store(gy_ptr + offs, GY, mask=mask)
        sum_gy += tl.sum(GY, axis=0)
        sum_gyx += tl.sum(GY * ((X - mu[None, :]) * istd[None, :]), axis=0)
    tl.store(part_ptr + n, sum_gy, mask=n_mask)
    tl.store(part_ptr + N + n, sum_gyx, mask=n_mask)
    if NEED_GD:
        tl.store(part_ptr + 2 * N + n, gd, mask=n_mask)


@triton.jit
def _bn_grad_x_kernel(gy_ptr, x_ptr, gx_ptr, a_ptr, mean_ptr, invstd_ptr, mgy_ptr, mgyx_ptr,
                      N, stride_t, inner, C, BATCH_STATS: tl.constexpr, BLOCK: tl.constexpr):
    """Eq. 8: dL/dx = gamma*invstd * (dL/dy - mean(dL/dy) - xhat * mean(dL/dy * xhat))."""
    t = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_mask = n < N
    ch = (n // inner) % C
    gy = tl.load(gy_ptr + t * N + n, mask=n_mask, other=0.0)
    a = tl.load(a_ptr + ch, mask=n_mask, other=0.0)
    if BATCH_STATS:  # training: the gradient also flows through the batch mean and variance
        x = tl.load(x_ptr + t * stride_t + n, mask=n_mask, other=0.0).to(tl.float32)
        xhat = (x - tl.load(mean_ptr + ch, mask=n_mask)) * tl.load(invstd_ptr + ch, mask=n_mask)
        gy = gy - tl.load(mgy_ptr + ch, mask=n_mask) - xhat * tl.load(mgyx_ptr + ch, mask=n_mask)
    tl.store(gx_ptr + t * N + n, (a * gy).to(gx_ptr.dtype.element_ty), mask=n_mask)


def _config(num_neurons: int, backward: bool) -> tuple[int, int]:
    """(BLOCK, num_warps); the backward holds ~6 [K, BLOCK] tiles, so it takes half.
    The interpreter pays per program and per op, not per element: few, wide programs."""
    if INTERPRETED:
        return min(triton.next_power_of_2(max(num_neurons, 1)), 1 << 14), 1
    # one warp per program: with more, Triton spreads a chunk's K rows over warps and each
    # row extraction becomes a shared-memory reduction (10x slower for the LIF kernels,
    # benchmarks/results/tune-lif-nvidia-h200.txt)
    return 64, 1


def _decay_code(decay_tensor):
    """load_decay's DECAY: 0 = float, 1 = one tensor value, 2 = one per channel."""
    return 0 if decay_tensor is None else (1 if decay_tensor.numel() == 1 else 2)


def _rows(x):
    """x [T, B, C, *] as (tensor, stride between steps); each step's neurons contiguous.
    A stride of 0 (x expanded over time, e.g. a static image's conv) is read as is."""
    step = x[0]
    if step.is_contiguous() and (x.stride(0) in (0, step.numel()) or x.shape[0] == 1):
        return x, (x.stride(0) if x.shape[0] > 1 else step.numel())
    x = x.contiguous()
    return x, step.numel()


def _affine(mean, invstd, weight, bias):
    """Per-channel a = gamma*invstd and b = beta - mean*a (as torch's CPU batch norm)."""
    a = invstd if weight is None else invstd * weight.float()
    b = -mean * a if bias is None else bias.float() - mean * a
    return a.contiguous(), b.contiguous()


def _forward(x, residual, mean, invstd, weight, bias, decay, decay_tensor, threshold, reset,
             v_reset, save):
    T = x.shape[0]
    xr, stride_t = _rows(x)
    N = x[0].numel()
    C, inner = x.shape[2], math.prod(x.shape[3:])
    a, b = _affine(mean, invstd, weight, bias)
    spikes = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    chunks = triton.cdiv(T, _steps(T))
    ckpt = torch.empty((chunks - 1 if save else 0, N), device=x.device, dtype=torch.float32)
    r = residual.contiguous() if residual is not None else xr
    mode = _decay_code(decay_tensor)
    BLOCK, warps = _config(N, backward=False)
    if N > 0:
        _bn_lif_forward_kernel[(triton.cdiv(N, BLOCK),)](
            xr, r, spikes, ckpt, a, b, decay_tensor if decay_tensor is not None else a,
            decay, threshold, v_reset, T, N, stride_t, inner, C,
            RESET=RESET_CODES[reset], DECAY=mode, HAS_RES=residual is not None,
            SAVE=save and chunks > 1, BLOCK=BLOCK, K=_steps(T), num_warps=warps,
            enable_fp_fusion=False)
    return spikes, ckpt


def _backward(grad_s, x, residual, ckpt, mean, invstd, weight, bias, decay, decay_tensor,
              threshold, reset, v_reset, detach, surrogate, alpha, batch_stats, need_gd):
    T = x.shape[0]
    xr, stride_t = _rows(x)
    N = x[0].numel()
    C, inner = x.shape[2], math.prod(x.shape[3:])
    a, b = _affine(mean, invstd, weight, bias)
    gs = grad_s.contiguous()
    gy = torch.empty((T, N), device=x.device, dtype=torch.float32)
    part = torch.empty((3 if need_gd else 2, N), device=x.device, dtype=torch.float32)
    r = residual.contiguous() if residual is not None else xr
    mode = _decay_code(decay_tensor)
    BLOCK, warps = _config(N, backward=True)
    if N > 0:
        _bn_lif_backward_kernel[(triton.cdiv(N, BLOCK),)](
            xr, r, gs, ckpt, gy, part, a, b, mean, invstd,
            decay_tensor if decay_tensor is not None else a,
            decay, threshold, v_reset, alpha, T, N, stride_t, inner, C,
            RESET=RESET_CODES[reset], DETACH=detach, SURROGATE=SURROGATES[surrogate], DECAY=mode,
            HAS_RES=residual is not None, NEED_GD=need_gd, BLOCK=BLOCK, K=_steps(T),
            num_warps=warps, enable_fp_fusion=False)
    # per-channel sums: Eq. 11 (beta) and Eq. 10 (gamma)
    sums = part[:2].view(2, x.shape[1], C, inner).sum(dim=(1, 3))
    count = T * x.shape[1] * inner
    mgy, mgyx = sums[0] / count, sums[1] / count
    # dL/dy is still needed for a residual input; otherwise dL/dx overwrites it in place
    in_place = x.dtype == torch.float32 and residual is None
    gx = gy if in_place else torch.empty((T, N), device=x.device, dtype=x.dtype)
    BLOCK2 = 1024
    if N > 0:
        _bn_grad_x_kernel[(triton.cdiv(N, BLOCK2), T)](
            gy, xr, gx, a, mean, invstd, mgy, mgyx, N, stride_t, inner, C,
            BATCH_STATS=batch_stats, BLOCK=BLOCK2, num_warps=4)
    gd = part[2] if need_gd else None
    return gx.view(x.shape), (gy.view(x.shape) if residual is not None else None), sums, gd


# ---- torch.library registration: opaque to torch.compile, autograd attached ----

@torch.library.custom_op("spikefuse::bn_lif_forward", mutates_args=())
def bn_lif_forward(x: torch.Tensor, residual: torch.Tensor | None, mean: torch.Tensor,
                   invstd: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   decay: float, decay_tensor: torch.Tensor | None, threshold: float, reset: str,
                   v_reset: float, detach: bool, surrogate: str, alpha: float,
                   batch_stats: bool, save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Spikes [T, *] in x's dtype and the potential checkpoints (empty unless save).
    detach, surrogate, alpha and batch_stats are only used by the backward."""
    return _forward(x, residual, mean, invstd, weight, bias, decay, decay_tensor, threshold,
                    reset, v_reset, save)


@bn_lif_forward.register_fake
def _(x, residual, mean, invstd, weight, bias, decay, decay_tensor, threshold, reset, v_reset,
      detach, surrogate, alpha, batch_stats, save):
    chunks = triton.cdiv(x.shape[0], _steps(x.shape[0]))
    ckpt = x.new_empty((chunks - 1 if save else 0, math.prod(x.shape[1:])), dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.contiguous_format), ckpt


@torch.library.custom_op("spikefuse::bn_lif_backward", mutates_args=())
def bn_lif_backward(grad_s: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                    ckpt: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                    weight: torch.Tensor | None, bias: torch.Tensor | None, decay: float,
                    decay_tensor: torch.Tensor | None, threshold: float, reset: str,
                    v_reset: float, detach: bool, surrogate: str, alpha: float,
                    batch_stats: bool, need_gd: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/dx, dL/dresidual (or empty), per-channel [sum dL/dy, sum dL/dy*xhat] and the
    per-neuron dL/d decay partials (or empty)."""
    gx, gr, sums, gd = _backward(grad_s, x, residual, ckpt, mean, invstd, weight, bias, decay,
                                 decay_tensor, threshold, reset, v_reset, detach, surrogate,
                                 alpha, batch_stats, need_gd)
    def or_empty(t):  # a custom op may not return one tensor twice
        return t if t is not None else x.new_empty(0, dtype=torch.float32)
    return gx, or_empty(gr), sums, or_empty(gd)


@bn_lif_backward.register_fake
def _(grad_s, x, residual, ckpt, mean, invstd, weight, bias, decay, decay_tensor, threshold,
      reset, v_reset, detach, surrogate, alpha, batch_stats, need_gd):
    f32 = dict(dtype=torch.float32, device=x.device)
    n = math.prod(x.shape[1:])
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape if residual is not None else (0,), **f32),
            torch.empty((2, x.shape[2]), **f32), torch.empty(n if need_gd else 0, **f32))


def _input_grads(ctx, grad_s, backward):
    """Gradients for (x, residual, mean, invstd, weight, bias, decay, decay_tensor)."""
    x, residual, ckpt, mean, invstd, weight, bias, decay_tensor = ctx.saved_tensors
    decay, threshold, reset, v_reset, detach, surrogate, alpha, batch_stats = ctx.options
    need = ctx.needs_input_grad
    need_gd = decay_tensor is not None and need[7]
    gx, gr, sums, gd = backward(grad_s, x, residual, ckpt, mean, invstd, weight, bias, decay,
                                decay_tensor, threshold, reset, v_reset, detach, surrogate,
                                alpha, batch_stats, need_gd)
    return (gx if need[0] else None,
            gr.to(residual.dtype) if residual is not None and need[1] else None, None, None,
            sums[1].to(weight.dtype) if weight is not None and need[4] else None,
            sums[0].to(bias.dtype) if bias is not None and need[5] else None, None,
            _reduce_decay_grad(gd, x.shape, decay_tensor) if need_gd else None)


def _setup_context(ctx, inputs, output):
    (x, residual, mean, invstd, weight, bias, decay, decay_tensor, threshold, reset, v_reset,
     detach, surrogate, alpha, batch_stats, _) = inputs
    ctx.save_for_backward(x, residual, output[1], mean, invstd, weight, bias, decay_tensor)
    ctx.options = (decay, threshold, reset, v_reset, detach, surrogate, alpha, batch_stats)


def _backward_rule(ctx, grad_s, _grad_ckpt):
    return (*_input_grads(ctx, grad_s, bn_lif_backward), *[None] * 8)


bn_lif_forward.register_autograd(_backward_rule, setup_context=_setup_context)


class BNLIFFunction(torch.autograd.Function):
    """The eager path (a plain autograd.Function costs far less Python per call than a
    torch.library op; see spikefuse.ops.lif). Arguments as bn_lif_forward, without `save`."""

    @staticmethod
    def forward(ctx, x, residual, mean, invstd, weight, bias, decay, decay_tensor, threshold,
                reset, v_reset, detach, surrogate, alpha, batch_stats):
        save = any(ctx.needs_input_grad)
        spikes, ckpt = _forward(x, residual, mean, invstd, weight, bias, decay, decay_tensor,
                                threshold, reset, v_reset, save)
        if save:
            ctx.save_for_backward(x, residual, ckpt, mean, invstd, weight, bias, decay_tensor)
            ctx.options = (decay, threshold, reset, v_reset, detach, surrogate, alpha, batch_stats)
        return spikes

    @staticmethod
    def backward(ctx, grad_s):
        return (*_input_grads(ctx, grad_s, _backward), *[None] * 7)


def batch_stats(x: torch.Tensor, eps: float):
    """Per-channel mean, biased variance and invstd of x [T, B, C, *] over all other dims."""
    if x.shape[0] > 1 and x.stride(0) == 0:  # the same values at every step: one is enough
        x = x[:1]
    dims = [0, 1, *range(3, x.dim())]
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    var, mean = torch.var_mean(xf.detach(), dim=dims, correction=0)
    return mean.float(), var.float(), 1.0 / torch.sqrt(var.float() + eps)


def bn_lif_fused(x, weight, bias, running_mean, running_var, training, momentum, eps,
                 decay, decay_tensor, threshold, reset, v_reset, detach, surrogate, alpha,
                 residual=None):
    """Entry point for spikefuse.nn.BNLIF (arguments already checked there).

    training: batch statistics, and running statistics updated with `momentum` like
    torch.nn.BatchNorm (unbiased variance); otherwise the running statistics are used.
    """
    use_batch = training or running_mean is None
    with torch.no_grad():
        if use_batch:
            mean, var, invstd = batch_stats(x, eps)
            if training and running_mean is not None:
                count = x.numel() // x.shape[2]
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = var * (count / max(count - 1, 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        else:
            mean = running_mean.float()
            invstd = 1.0 / torch.sqrt(running_var.float() + eps)
    if decay_tensor is not None:
        decay_tensor = decay_tensor.float()
    args = (x, residual, mean, invstd, weight, bias, decay, decay_tensor, threshold, reset,
            v_reset, detach, surrogate, alpha, use_batch)
    if not torch.compiler.is_dynamo_compiling():
        return BNLIFFunction.apply(*args)
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias, decay_tensor, residual))
    return bn_lif_forward(*args, wants_grad)[0]
