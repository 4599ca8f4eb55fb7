"""Fused BatchNorm + LIF with the dataflow of Liang et al.: save x, recompute the rest.

    y[t] = (x[t] - mean) * invstd * gamma + beta (+ residual[t])      BN per channel
    then the LIF of spikefuse.functional.lif on y (v[-1] = 0)

Layout: x is [T, B, C, *] with every time step dense in memory, either contiguous
([B, C, *]) or channels-last ([B, H, W, C], what cuDNN convolves without conversions).
The kernels address a step's neurons in memory order, so one rule serves both: the
neuron at offset n of a step is in channel (n // inner) % C, where inner is the memory
stride of the channel dimension (H*W contiguous, 1 channels-last and for [T, B, C]).
Spikes, dL/dx and dL/dresidual come out in x's layout. Other layouts are copied once.

Statistics: one Triton pass over x (per-channel mean and M2 of row tiles, corrected two-pass
in registers, merged by Chan's formula in float64), then one small launch that combines the
partials and writes, per channel, mean, invstd, a = gamma*invstd and b = beta - mean*a (the
[4, C] `stats` every kernel reads) and updates the running statistics in place.

Saved for backward: x (the conv/linear output, which the graph holds anyway), `stats`,
and the membrane potential entering every K-th step (K = 8, or the next power of two >= T
when T is shorter; one float32 per neuron per chunk boundary: at most 0.5 byte per
neuron-step, nothing at all when T <= 8). The BN output, the potentials and the spikes
are never stored: the backward kernel walks the time chunks in reverse, recomputes the
chunk's potentials from its checkpoint and x into registers (bit-identical to the
forward: same operations, no FMA contraction), and then runs the reverse-time recurrence.

Why checkpoints and not the pre-spike potential in a narrow type: bfloat16 u costs 2
bytes per neuron-step (4x the checkpoints) and its rounding moves the surrogate gradients
by ~1e-3 relative (measured on N(0, 0.5) potentials: atan, sigmoid, fast_sigmoid and
triangle 1.0e-3, rectangular 3.7e-2), far outside the 1e-5 contract; float32 u would
double what the layer holds. Recomputing a chunk costs one more read of x, which the BN
gradient (Eq. 8-10) needs anyway, so the backward reads x once for both.

With gradients on (and whole bytes per step, N % 8 == 0) the forward kernel also writes
the spikes packed to bits (one bit per spike) and attaches them to the spikes
(spike_pack.attach_bits): the next spiking conv saves those for its weight gradient
instead of reading the spikes again to pack them.

Backward is three launches: (1) reverse walk: dL/dy[t] is written into the float32 buffer
that later becomes dL/dx, with per-neuron partial sums of dL/dy, dL/dy*xhat (and
dL/d decay); (2) their per-channel sums (torch); (3) elementwise Eq. 8 (in place for
float32). Traffic per neuron-step (float32): statistics 4 B, forward 8 B, backward 24 B.
A static input (one step read at every step, `time_steps`) gets its gradient summed over
time from the per-neuron sums of (1): no per-step dL/dy is stored at all.
"""
from __future__ import annotations

import contextlib
import functools
import math
import typing

import torch

from .kernel_base import (EAGER, TRACED, Speculate, cdiv, f32, grad_h, load_per_neuron, meta_like, next_power_of_2,
                          or_empty, program_neurons, reset_code, reset_potential, row, spike_value, store_bits,
                          surrogate_grad)
from . import half_grad
from .double_backward import grads_with_graph
from .launch import Compiling, cached_launch, fused_or, speculation_enabled
from .spike_pack import attach_bits
from ..surrogates import SURROGATES

from .triton_or_stub import INTERPRETED, tl, triton

K_STEPS = 8  # time steps per chunk = checkpoint spacing (fewer when T is shorter)
STAT_CHANNELS = 64  # statistics tile: positions (stat_rows) x channels
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension
MAX_STEP = 2**31 - 2**16  # neurons per time step: offsets within a step (n < N + BLOCK) are int32


def stat_rows(inner: int) -> int:
    """Positions per statistics tile: 256 where a channel's values are a channel apart
    (channels-last, or [T, B, C]), else 64 (a channel's values lie inner apart, and taller
    tiles read more scattered rows). Measured on an H100 (CIFAR-medium's six layer shapes,
    benchmarks/bn_stats_variants.py): with 256 rows the channels-last pass ran 1.0-1.2x as fast
    as with 64 in float32 and 1.0-1.9x in bfloat16, the other layout 1.1-2.7x as slow."""
    return 256 if inner == 1 else 64


def _steps(T: int) -> int:
    return min(K_STEPS, next_power_of_2(T))


# ---- layout ----

def _dense(order) -> bool:
    """Whether (size, stride) pairs, innermost first, lay out one dense block (a size-1
    dim's stride does not matter: torch's rule)."""
    expected = 1
    for size, stride in order:
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether the steps of x [T, B, C, H, W] are channels-last in memory ([B, H, W, C]).
    Read from the strides, with no view of x[0]: this runs on every call."""
    if x.dim() != 5:
        return False
    _, B, C, H, W = x.shape
    _, sB, sC, sH, sW = x.stride()
    return (_dense(((C, sC), (W, sW), (H, sH), (B, sB)))
            and not _dense(((W, sW), (H, sH), (C, sC), (B, sB))))


def as_layout(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """t [T, B, C, *] in memory order [T, B, *, C] (channels_last) or [T, B, C, *], dense;
    differentiable, and no copy when t already is."""
    if channels_last:
        return t.movedim(2, -1).contiguous().movedim(-1, 2)
    return t.contiguous()


def dense_steps(x: torch.Tensor) -> torch.Tensor:
    """x with every step dense (contiguous or channels-last) and steps N apart, or 0 apart
    (one step expanded over time, e.g. a static image's conv: read as is)."""
    channels_last = is_channels_last(x)
    step = x[0]
    if ((channels_last or step.is_contiguous())
            and (x.shape[0] == 1 or x.stride(0) in (0, step.numel()))):
        return x
    return as_layout(x, channels_last)


def _empty(shape, channels_last: bool, dtype, device) -> torch.Tensor:
    if channels_last:
        T, B, C, *spatial = shape
        return torch.empty((T, B, *spatial, C), dtype=dtype, device=device).movedim(-1, 2)
    return torch.empty(shape, dtype=dtype, device=device)


def _geometry(x):
    """(channels_last, neurons per step N, stride between steps, channel stride `inner`)."""
    channels_last = is_channels_last(x)
    N = x[0].numel()
    inner = 1 if channels_last else math.prod(x.shape[3:])
    return channels_last, N, (x.stride(0) if x.shape[0] > 1 else N), inner


def _channel_sums(part, shape, channels_last):
    """Per-neuron partial sums [k, N] (a step's memory order) -> per-channel sums [k, C]."""
    C = shape[2]
    if channels_last:
        return part.view(part.shape[0], -1, C).sum(1)
    return part.view(part.shape[0], shape[1], C, -1).sum(dim=(1, 3))


# ---- batch statistics ----

@cached_launch
@triton.jit
def _stats_partial_kernel(x_ptr, part_ptr, M, C, inner, tiles_per_program, P,
                          ROWS: tl.constexpr, CB: tl.constexpr):
    """Per-channel (mean, M2) over this program's rows of x seen as [M, C]: row m, channel c
    lies at (m // inner) * C * inner + c * inner + m % inner (inner = 1: a plain matrix).
    Values are shifted by row 0 so that sums stay small next to a large mean.
    Each tile's mean and M2 come from a corrected two-pass in float32; the tiles are summed
    in float64 (count-weighted means and their squares, and the M2s), so the shifted mean,
    of the size of the spread |x - shift| while the mean itself, shift + it, may be far
    smaller, keeps its digits: a float32 merge left the batch mean 20 float32 ulps off
    (issue 36's fuzz case), which a steep surrogate turned into a dL/dx 10-25x further from
    float64 than torch's float32 one. Sums, not Chan's pairwise merge, so that the loop has no
    float64 division (a merge per tile made this pass 1.4x slower in float32 and 4x in
    bfloat16 on an H100)."""
    c = tl.program_id(0) * CB + tl.arange(0, CB)
    c_mask = c < C
    shift = tl.load(x_ptr + c * inner, mask=c_mask, other=0.0).to(tl.float32)
    p = tl.program_id(1)
    r = tl.arange(0, ROWS)
    count = tl.zeros([CB], tl.float64)
    s1 = tl.zeros([CB], tl.float64)  # sum of n * tile mean
    s2 = tl.zeros([CB], tl.float64)  # sum of n * tile mean^2
    m2 = tl.zeros([CB], tl.float64)  # sum of the tiles' own M2
    for i in range(0, tiles_per_program):
        # row m = first + r: M (T*B*H*W) may pass 2^31, so first is split into int64 (a
        # scalar, once per tile) and m // inner, m % inner into int32 parts for the rows
        first = (p * tiles_per_program + i).to(tl.int64) * ROWS
        q0 = first // inner
        rr = (first - q0 * inner).to(tl.int32) + r  # < inner + ROWS
        row_mask = r < M - first
        mask = row_mask[:, None] & c_mask[None, :]
        offs = ((q0 + rr // inner) * (C * inner) + rr % inner)[:, None] + (c * inner)[None, :]
        X = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        X = tl.where(mask, X - shift[None, :], 0.0)
        n = tl.sum(row_mask.to(tl.float32), axis=0)  # 0 for a tile past the end
        per = 1.0 / tl.maximum(n, 1.0)
        rough = tl.sum(X, axis=0) * per
        D = tl.where(mask, X - rough[None, :], 0.0)
        # corrected two-pass (Chan, Golub, LeVeque): sum(D) recovers what the float32 sum of X
        # rounded off (an error growing with n * |mean of X|; sum(D)'s only with the spread)
        residue = tl.sum(D, axis=0)
        residue = tl.where(residue == residue, residue, 0.0)  # an infinite mean stays inf, not inf - inf
        correction = residue * per
        tile_mean = rough.to(tl.float64) + correction.to(tl.float64)
        n = n.to(tl.float64)
        weighted = n * tile_mean
        s1 += weighted
        s2 += weighted * tile_mean
        m2 += (tl.sum(D * D, axis=0) - residue * correction).to(tl.float64)
        count += n
    mean = s1 / tl.maximum(count, 1.0)
    # the spread of the tile means about theirs: s2 - s1 * mean loses only float64 digits,
    # since the shift keeps the tile means within a few spreads of 0
    tl.store(part_ptr + p * C + c, mean, mask=c_mask)
    tl.store(part_ptr + (P + p) * C + c, m2 + (s2 - s1 * mean), mask=c_mask)


@triton.jit
def _partial_means(part_ptr, p, c, c_mask, M, C, P, rows_per_program):
    """Partials p of channels c: (p, mask, rows each partial covers, their means)."""
    mask = (p < P)[:, None] & c_mask[None, :]
    n_p = tl.minimum(M - p.to(tl.int64) * rows_per_program, rows_per_program).to(tl.float64)
    mean_p = tl.load(part_ptr + p[:, None] * C + c[None, :], mask=mask, other=0.0)
    return p, mask, n_p, mean_p


@triton.jit
def _batch_moments(x_ptr, inner, part_ptr, c, c_mask, M, C, P, rows_per_program,
                   PB: tl.constexpr, CB: tl.constexpr):
    """Channels c's float32 (mean, biased variance) from the partials; float64 until the
    shift is added back (see _stats_partial_kernel)."""
    q = tl.arange(0, PB)
    mean = tl.zeros([CB], tl.float64)
    for p0 in range(0, P, PB):
        p, mask, n_p, mean_p = _partial_means(part_ptr, p0 + q, c, c_mask, M, C, P, rows_per_program)
        mean += tl.sum(mean_p * n_p[:, None], axis=0)
    M1 = tl.maximum(M, 1)  # M = 0 (a rank without values, see bn_exchange): zeros, not 0/0
    mean = mean / M1
    m2 = tl.zeros([CB], tl.float64)
    for p0 in range(0, P, PB):
        p, mask, n_p, mean_p = _partial_means(part_ptr, p0 + q, c, c_mask, M, C, P, rows_per_program)
        m2_p = tl.load(part_ptr + (P + p)[:, None] * C + c[None, :], mask=mask, other=0.0)
        d = mean_p - mean[None, :]
        m2 += tl.sum(tl.where(mask, m2_p + n_p[:, None] * d * d, 0.0), axis=0)
    var = (m2 / M1).to(tl.float32)
    mean += tl.load(x_ptr + c * inner, mask=c_mask & (tl.zeros_like(c) + M > 0), other=0.0).to(tl.float64)  # the shift
    return mean.to(tl.float32), var


@triton.jit
def _update_running(rm_ptr, rv_ptr, c, c_mask, mean, var, momentum, count):
    """As torch.nn.BatchNorm: the unbiased variance over `count` values into the running estimate."""
    rm = tl.load(rm_ptr + c, mask=c_mask, other=0.0)
    rv = tl.load(rv_ptr + c, mask=c_mask, other=0.0)
    new_rm = rm.to(tl.float32) * (1 - momentum) + mean * momentum
    unbias = count / tl.maximum(count - 1.0, 1.0)  # here, not on the host: under torch.compile's
    # dynamic shapes a host-side ratio of two sizes reaches the launch as an expression typed int
    new_rv = rv.to(tl.float32) * (1 - momentum) + (var * unbias) * momentum
    tl.store(rm_ptr + c, new_rm.to(rm.dtype), mask=c_mask)
    tl.store(rv_ptr + c, new_rv.to(rv.dtype), mask=c_mask)


@triton.jit
def _store_stats(stats_ptr, w_ptr, b_ptr, c, c_mask, C, mean, var, eps,
                 HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """stats [mean; invstd; a = gamma*invstd; b = beta - mean*a] of channels c."""
    invstd = tl.div_rn(1.0, tl.sqrt_rn(var + eps))  # IEEE, as torch computes it
    a = invstd
    if HAS_W:
        a = invstd * tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
    b = -mean * a
    if HAS_B:
        b = tl.load(b_ptr + c, mask=c_mask, other=0.0).to(tl.float32) - mean * a
    tl.store(stats_ptr + c, mean, mask=c_mask)
    tl.store(stats_ptr + C + c, invstd, mask=c_mask)
    tl.store(stats_ptr + 2 * C + c, a, mask=c_mask)
    tl.store(stats_ptr + 3 * C + c, b, mask=c_mask)


@cached_launch
@triton.jit
def _stats_finalize_kernel(x_ptr, inner, part_ptr, stats_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr,
                           M, C, P, rows_per_program, eps, momentum, count,
                           BATCH: tl.constexpr, UPDATE: tl.constexpr, HAS_W: tl.constexpr,
                           HAS_B: tl.constexpr, PB: tl.constexpr, CB: tl.constexpr):
    """Combine the partials (or read the running statistics) into stats [mean; invstd; a; b]."""
    eps, momentum, count = f32(eps), f32(momentum), f32(count)
    c = tl.program_id(0) * CB + tl.arange(0, CB)
    c_mask = c < C
    if BATCH:
        mean, var = _batch_moments(x_ptr, inner, part_ptr, c, c_mask, M, C, P, rows_per_program, PB, CB)
        if UPDATE:
            _update_running(rm_ptr, rv_ptr, c, c_mask, mean, var, momentum, count)
    else:
        mean = tl.load(rm_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
        var = tl.load(rv_ptr + c, mask=c_mask, other=1.0).to(tl.float32)
    _store_stats(stats_ptr, w_ptr, b_ptr, c, c_mask, C, mean, var, eps, HAS_W, HAS_B)


class BatchPartials(typing.NamedTuple):
    """The statistics pass's per-program partials of x seen as [M, C], and their geometry."""
    part: torch.Tensor
    M: int
    P: int
    rows_per_program: int
    inner: int
    CB: int


def _batch_partials(x, launch=EAGER) -> BatchPartials:
    """Launch the partial-statistics pass over x [T, B, C, *] (dense steps)."""
    C = x.shape[2]
    CB = min(STAT_CHANNELS, next_power_of_2(C))
    channel_blocks = cdiv(C, CB)
    data = x[:1] if x.shape[0] > 1 and x.stride(0) == 0 else x  # one step is enough
    M = data.numel() // C
    inner = _geometry(data)[3]
    rows = stat_rows(inner)
    tiles = cdiv(M, rows)
    # ~4 programs per GPU core; few partials, so the finalize launch stays short
    programs = max(1, (4 if INTERPRETED else 512) // channel_blocks)
    tiles_per_program = max(1, cdiv(tiles, min(max(tiles, 1), programs)))
    P = cdiv(tiles, tiles_per_program)
    part = torch.empty((2, P, C), device=x.device, dtype=torch.float64)
    if P:
        launch(_stats_partial_kernel)[(channel_blocks, P)](
            data, part, M, C, inner, tiles_per_program, P,
            ROWS=rows, CB=CB, num_warps=4)
    return BatchPartials(part, M, P, tiles_per_program * rows, inner, CB)


def _statistics(x, weight, bias, running_mean, running_var, use_batch, momentum, eps, launch=EAGER):
    """stats [4, C] float32 (mean, invstd, a, b) of x [T, B, C, *] (dense steps) over all
    dims but C; in training the running statistics are updated in place. launch: see
    spikefuse.ops.lif.Launch."""
    C = x.shape[2]
    stats = torch.empty((4, C), device=x.device, dtype=torch.float32)
    unused = launch.unused(stats)
    if use_batch:
        part, M, P, rows_per_program, inner, CB = _batch_partials(x, launch)
    else:
        part, M, P, rows_per_program, inner, CB = unused, 0, 0, stat_rows(1), 1, min(STAT_CHANNELS, next_power_of_2(C))
    count = x.numel() // C  # what torch's batch norm of the time-expanded input counts
    update = use_batch and running_mean is not None
    launch(_stats_finalize_kernel)[(cdiv(C, CB),)](
        x, inner, part, stats, weight if weight is not None else unused, bias if bias is not None else unused,
        running_mean if running_mean is not None else unused,
        running_var if running_var is not None else unused,
        M, C, P, rows_per_program, eps, momentum, count,
        BATCH=use_batch, UPDATE=update, HAS_W=weight is not None, HAS_B=bias is not None,
        PB=128, CB=CB, num_warps=4)
    return stats


# ---- BN + LIF ----

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


@cached_launch
@triton.jit
def _bn_lif_forward_kernel(
    x_ptr, r_ptr, s_ptr, bits_ptr, ckpt_ptr, stats_ptr, decay_ptr,
    decay, threshold, v_reset, T, N, stride_t, inner, C,
    RESET: tl.constexpr, DECAY: tl.constexpr, HAS_RES: tl.constexpr, SAVE: tl.constexpr,
    BITS: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr,
):
    decay, threshold, v_reset = f32(decay), f32(threshold), f32(v_reset)
    n = program_neurons(BLOCK)
    n_mask = n < N
    ch = (n // inner) % C
    a = tl.load(stats_ptr + 2 * C + ch, mask=n_mask, other=0.0)
    b = tl.load(stats_ptr + 3 * C + ch, mask=n_mask, other=0.0)
    d = load_per_neuron(decay_ptr, decay, n, n_mask, inner, C, DECAY)
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
            u = h - threshold
            fired = u >= 0.0
            v = reset_potential(h, fired, threshold, v_reset, RESET)
            S = tl.where(sel, spike_value(u, fired)[None, :], S)
        tl.store(s_ptr + t.to(tl.int64)[:, None] * N + n[None, :], S.to(s_ptr.dtype.element_ty), mask=mask)
        if BITS:  # the same spikes packed as spike_pack.pack does (N % 8 == 0: whole bytes per row)
            store_bits(bits_ptr, S, t, T, N)


@cached_launch
@triton.jit
def _bn_lif_backward_kernel(
    x_ptr, r_ptr, gs_ptr, ckpt_ptr, gy_ptr, part_ptr, stats_ptr, decay_ptr,
    decay, threshold, v_reset, alpha, T, N, stride_t, inner, C,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, DECAY: tl.constexpr,
    HAS_RES: tl.constexpr, NEED_GD: tl.constexpr, STORE_GY: tl.constexpr, ABS_ROW: tl.constexpr,
    BLOCK: tl.constexpr, K: tl.constexpr,
):
    """ABS_ROW > 0: also the per-neuron sum of |dL/dy| into part's row ABS_ROW (half_grad's
    bound on the conv gradient's channel sums)."""
    decay, threshold, v_reset, alpha = f32(decay), f32(threshold), f32(v_reset), f32(alpha)
    n = program_neurons(BLOCK)
    n_mask = n < N
    ch = (n // inner) % C
    mu = tl.load(stats_ptr + ch, mask=n_mask, other=0.0)
    istd = tl.load(stats_ptr + C + ch, mask=n_mask, other=0.0)
    a = tl.load(stats_ptr + 2 * C + ch, mask=n_mask, other=0.0)
    b = tl.load(stats_ptr + 3 * C + ch, mask=n_mask, other=0.0)
    d = load_per_neuron(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    gv = tl.zeros([BLOCK], tl.float32)  # dL/dv[t], flowing back from t+1
    sum_gy = tl.zeros([BLOCK], tl.float32)
    sum_gyx = tl.zeros([BLOCK], tl.float32)
    gd = tl.zeros([BLOCK], tl.float32)
    sum_abs_gy = tl.zeros([BLOCK], tl.float32)
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
            gh = grad_h(row(GS, sel), gv, gv, h, u >= 0.0, surrogate_grad(u, SURROGATE, alpha),
                         threshold, v_reset, RESET, DETACH)
            gh = tl.where(ci * K + j < T, gh, 0.0)  # rows past T: no gradient, gv passes
            if NEED_GD:
                gd += gh * row(V, sel)
            gv = tl.where(ci * K + j < T, gh * d, gv)
            GY = tl.where(sel, gh[None, :], GY)
            if ABS_ROW > 0:  # per row, in registers: no reduction across the chunk's rows
                sum_abs_gy += tl.abs(gh)
        if STORE_GY:
            tl.store(gy_ptr + offs, GY, mask=mask)
        sum_gy += tl.sum(GY, axis=0)
        sum_gyx += tl.sum(GY * ((X - mu[None, :]) * istd[None, :]), axis=0)
    tl.store(part_ptr + n, sum_gy, mask=n_mask)
    tl.store(part_ptr + _offset(1, N, n), sum_gyx, mask=n_mask)  # int64: 2 * N may pass 2^31
    if NEED_GD:
        tl.store(part_ptr + _offset(2, N, n), gd, mask=n_mask)
    if ABS_ROW > 0:
        tl.store(part_ptr + _offset(ABS_ROW, N, n), sum_abs_gy, mask=n_mask)


@cached_launch
@triton.jit
def _bn_grad_x_kernel(gy_ptr, x_ptr, gx_ptr, stats_ptr, sums_ptr, count, steps,
                      N, stride_t, inner, C, rows, rows_per_program, half_ptr, abs_ptr, scale_ptr, share_ptr,
                      BATCH_STATS: tl.constexpr, HALF: tl.constexpr, SHARED: tl.constexpr, LIMIT_LOG2: tl.constexpr,
                      BLOCK: tl.constexpr):
    """Eq. 8: dL/dx = gamma*invstd * (dL/dy - mean(dL/dy) - xhat * mean(dL/dy * xhat)).
    For one input repeated over `steps` steps, gy is its sum over time (and so are the means).
    Time steps t = program_id(1) + i * num_programs(1): a grid's second dimension stops at 65535.
    HALF: also dL/dx * scale in fp16 (ops/half_grad), scale per channel the power of two that
    brings a bound on the channel's sum of |dL/dx| (from abs_ptr's sum of |dL/dy|) under
    2^LIMIT_LOG2 (half_grad.SUM_LIMIT); the scales go to scale_ptr. SHARED (SyncBN): share_ptr holds this
    rank's count / the global count."""
    count = f32(count)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_mask = n < N
    ch = (n // inner) % C
    a = tl.load(stats_ptr + 2 * C + ch, mask=n_mask, other=0.0)
    if BATCH_STATS:
        mu = tl.load(stats_ptr + ch, mask=n_mask)
        istd = tl.load(stats_ptr + C + ch, mask=n_mask)
        mgy = tl.load(sums_ptr + ch, mask=n_mask) / count
        mgyx = tl.load(sums_ptr + C + ch, mask=n_mask) / count
    if HALF:  # |dL/dx| <= |a| (|dL/dy| + |mgy| + |xhat| |mgyx|), summed over the channel, where
        # sum |xhat| <= sqrt(count * sum xhat^2) <= sqrt(count * global count): the batch's
        # standardised x has sum xhat^2 <= its count over all ranks
        bound = tl.load(abs_ptr + ch, mask=n_mask, other=0.0)
        if BATCH_STATS:
            xhat_sum = count
            if SHARED:
                xhat_sum = count / tl.sqrt(tl.load(share_ptr))
            bound += count * tl.abs(mgy) + xhat_sum * tl.abs(mgyx)
        bound = tl.abs(a) * bound
        # 2^(LIMIT_LOG2 - ceil(log2 bound)): bound * scale <= the limit, to within an approximate
        # log2's error (65504 / 2^14 absorbs it); bound at least 2^-100: the scale stays finite
        scale = tl.exp2(LIMIT_LOG2 - tl.ceil(tl.log2(tl.maximum(bound, 7.888609052210118e-31))))
        # each channel's scale once: from its first neuron in memory order, at the first step
        first = (n < tl.where(tl.program_id(1) == 0, C * inner, 0)) & (n % inner == 0)
        tl.store(scale_ptr + ch, scale, mask=first)
    for i in range(0, rows_per_program):
        t = tl.program_id(1).to(tl.int64) + i * tl.num_programs(1)
        mask = n < tl.where(t < rows, N, 0)  # (n_mask & (t < rows) gives an int mask in the interpreter)
        gy = tl.load(gy_ptr + t * N + n, mask=mask, other=0.0)
        if BATCH_STATS:  # training: the gradient also flows through the batch mean and variance
            x = tl.load(x_ptr + t * stride_t + n, mask=mask, other=0.0).to(tl.float32)
            xhat = (x - mu) * istd
            gy = gy - steps * (mgy + xhat * mgyx)
        gx = a * gy
        tl.store(gx_ptr + t * N + n, gx.to(gx_ptr.dtype.element_ty), mask=mask)
        if HALF:
            tl.store(half_ptr + t * N + n, (gx * scale).to(tl.float16), mask=mask)


def _config(num_neurons: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK, num_warps). The interpreter pays per program and per op, not per element:
    few, wide programs. On a GPU one warp per program (with more, Triton spreads a chunk's
    K rows over warps and each row extraction becomes a shared-memory reduction), and the
    BLOCK that benchmarks/tune_bn_lif.py found fastest at the CIFAR networks' layers on an
    H200 (benchmarks/results/tune-bn-lif-nvidia-h200.json): 64 neurons in float32, 256 in
    16-bit types (fewer, wider programs stream 2-byte data better)."""
    if INTERPRETED:
        return min(next_power_of_2(max(num_neurons, 1)), 1 << 14), 1
    return (64 if dtype == torch.float32 else 256), 1


def _decay_code(decay_tensor):
    """load_per_neuron's DECAY: 0 = float, 1 = one tensor value, 2 = one per channel."""
    return 0 if decay_tensor is None else (1 if decay_tensor.numel() == 1 else 2)


def over_time(x, time_steps):
    """x [T_x, B, C, *] as time_steps steps: a single step is repeated (read with stride 0)."""
    return x if x.shape[0] == time_steps else x.expand(time_steps, *x.shape[1:])


def _forward(x, residual, stats, decay, decay_tensor, threshold, reset, v_reset, time_steps, save,
             bits=None, launch=EAGER):
    """x (and residual) with dense steps in one layout (dense_steps / as_layout). bits: a
    uint8 tensor of T*N/8 bytes (N % 8 == 0) to receive the spikes packed, or None."""
    x = over_time(x, time_steps)
    T, C = x.shape[0], x.shape[2]
    channels_last, N, stride_t, inner = _geometry(x)
    spikes = _empty(x.shape, channels_last, x.dtype, x.device)
    chunks = cdiv(T, _steps(T))
    ckpt = torch.empty((chunks - 1 if save else 0, N), device=x.device, dtype=torch.float32)
    BLOCK, warps = _config(N, x.dtype)
    if N > 0:
        unused = launch.unused(x)
        launch(_bn_lif_forward_kernel)[(cdiv(N, BLOCK),)](
            x, residual if residual is not None else unused, spikes, bits if bits is not None else unused,
            ckpt, stats, decay_tensor if decay_tensor is not None else unused,
            decay, threshold, v_reset, T, N, stride_t, inner, C,
            RESET=reset_code(reset, "bn_lif"), DECAY=_decay_code(decay_tensor), HAS_RES=residual is not None,
            SAVE=save and chunks > 1, BITS=bits is not None, BLOCK=BLOCK, K=_steps(T), num_warps=warps,
            enable_fp_fusion=False)
    return spikes, ckpt


def _backward(grad_s, x, residual, ckpt, stats, decay, decay_tensor, threshold, reset, v_reset,
              detach, surrogate, alpha, batch_stats, need_gd, time_steps, launch=EAGER, sync=None,
              half_twin=False):
    """dL/dx has x's shape: for one step repeated over time it is the sum over the steps,
    computed from the per-neuron sums of dL/dy without storing dL/dy per step.
    sync: SyncBN's hook (spikefuse.parallel.sync_bn), or None.
    half_twin: offer dL/dx's fp16 twin to the spiking conv that made x (ops/half_grad; the forward
    asked half_grad.enabled), where dL/dx is a float32 tensor of its own (no residual, not summed)."""
    summed = x.shape[0] != time_steps
    half_twin = half_twin and not summed and residual is None and not launch.traced
    x = over_time(x, time_steps)
    T, C = x.shape[0], x.shape[2]
    channels_last, N, stride_t, inner = _geometry(x)
    gs = as_layout(grad_s, channels_last)
    store_gy = not summed or residual is not None
    gy = _empty(x.shape if store_gy else (0,), channels_last and store_gy, torch.float32, x.device)
    abs_row = 2 + need_gd  # after [sum dL/dy, sum dL/dy*xhat] (and dL/d decay): the twin's row
    part = torch.empty((abs_row + half_twin, N), device=x.device, dtype=torch.float32)
    BLOCK, warps = _config(N, x.dtype)
    if N > 0:
        unused = launch.unused(x)
        launch(_bn_lif_backward_kernel)[(cdiv(N, BLOCK),)](
            x, residual if residual is not None else unused, gs, ckpt, gy, part, stats,
            decay_tensor if decay_tensor is not None else unused,
            decay, threshold, v_reset, alpha, T, N, stride_t, inner, C,
            RESET=reset_code(reset, "bn_lif"), DETACH=detach, SURROGATE=SURROGATES[surrogate],
            DECAY=_decay_code(decay_tensor), HAS_RES=residual is not None, NEED_GD=need_gd,
            STORE_GY=store_gy, ABS_ROW=abs_row if half_twin else 0, BLOCK=BLOCK, K=_steps(T), num_warps=warps, enable_fp_fusion=False)
    channel_sums = _channel_sums(part if half_twin else part[:2], x.shape, channels_last)
    sums = channel_sums[:2]  # [sum dL/dy (Eq. 11), sum dL/dy*xhat (Eq. 10)]
    count = x.numel() // C
    # SyncBN: Eq. 8's means run over every rank (sums scaled to this rank's count); weight
    # and bias keep this rank's sums, which DDP averages like any other gradient
    mean_sums = sync.gradient_sums(sums, count) if sync is not None and batch_stats else sums
    # dL/dy is still needed for a residual input; otherwise dL/dx overwrites it in place
    # (eager only: a traced launch would see one tensor passed twice, see lif.Launch)
    in_place = x.dtype == torch.float32 and residual is None and not summed and not launch.traced
    gx_shape = (1, *x.shape[1:]) if summed else x.shape
    gx = gy if in_place else _empty(gx_shape, channels_last, x.dtype, x.device)
    half = _empty(gx_shape, channels_last, torch.float16, x.device) if half_twin else None
    scale = torch.empty(C, device=x.device, dtype=torch.float32) if half_twin else None
    share = sync.scale if half_twin and sync is not None and batch_stats else None  # count / global count
    BLOCK2 = 1024
    if N > 0:
        rows = gx_shape[0]
        launch(_bn_grad_x_kernel)[(cdiv(N, BLOCK2), min(rows, MAX_GRID_Y))](
            part if summed else gy, x, gx, stats, mean_sums, float(count), T if summed else 1,
            N, stride_t, inner, C, rows, cdiv(rows, MAX_GRID_Y),
            half if half_twin else unused, channel_sums[abs_row:] if half_twin else unused,
            scale if half_twin else unused, share if share is not None else unused, BATCH_STATS=batch_stats,
            HALF=half_twin, SHARED=share is not None, LIMIT_LOG2=half_grad.SUM_LIMIT_LOG2, BLOCK=BLOCK2,
            num_warps=4)
    if half_twin and not isinstance(launch, Speculate):  # (a speculative compile's tensors are meta)
        half_grad.offer(gx, half, scale)
    gd = None
    if need_gd:  # dL/d decay: one value, or one per channel
        gd = (part[2].sum().reshape(1) if decay_tensor.numel() == 1
              else _channel_sums(part[2:3], x.shape, channels_last)[0])
    return gx, (gy if residual is not None else None), sums, gd


# ---- torch.library registration: what torch.compile sees (ops with autograd that
# inductor decomposes into launches of the Triton kernels it makes itself; see ops.lif) ----

@torch.library.triton_op("spikefuse::bn_statistics", mutates_args=("running_mean", "running_var"))
def bn_statistics(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                  running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                  use_batch: bool, momentum: float, eps: float) -> torch.Tensor:
    """stats [4, C] (mean, invstd, a, b); updates the running statistics when use_batch."""
    return _statistics(x, weight, bias, running_mean, running_var, use_batch, momentum, eps, TRACED)


@torch.library.triton_op("spikefuse::bn_lif_forward", mutates_args=())
def bn_lif_forward(x: torch.Tensor, residual: torch.Tensor | None, stats: torch.Tensor,
                   weight: torch.Tensor | None, bias: torch.Tensor | None,
                   decay: float, decay_tensor: torch.Tensor | None, threshold: float, reset: str,
                   v_reset: float, detach: bool, surrogate: str, alpha: float,
                   batch_stats: bool, time_steps: int, save: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Spikes [time_steps, *] in x's dtype and layout (x: time_steps steps, or one step
    repeated), and the potential checkpoints (empty unless save). weight and bias only
    receive gradients (stats hold the affine map); detach, surrogate, alpha and
    batch_stats are only used by the backward."""
    return _forward(x, residual, stats, decay, decay_tensor, threshold, reset, v_reset,
                    time_steps, save, launch=TRACED)


@torch.library.triton_op("spikefuse::bn_lif_backward", mutates_args=())
def bn_lif_backward(grad_s: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                    ckpt: torch.Tensor, stats: torch.Tensor, decay: float,
                    decay_tensor: torch.Tensor | None, threshold: float, reset: str,
                    v_reset: float, detach: bool, surrogate: str, alpha: float,
                    batch_stats: bool, need_gd: bool, time_steps: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/dx, dL/dresidual (or empty), per-channel [sum dL/dy, sum dL/dy*xhat] and
    dL/d decay (or empty)."""
    gx, gr, sums, gd = _backward(grad_s, x, residual, ckpt, stats, decay, decay_tensor,
                                 threshold, reset, v_reset, detach, surrogate, alpha,
                                 batch_stats, need_gd, time_steps, launch=TRACED)
    return gx, or_empty(gr, x), sums, or_empty(gd, x)


def _input_grads(ctx, grad_s, backward):
    """Gradients for (x, residual, stats, weight, bias, decay, decay_tensor)."""
    x, residual, ckpt, stats, weight, bias, decay_tensor = ctx.saved_tensors
    decay, threshold, reset, v_reset, detach, surrogate, alpha, batch_stats, time_steps = ctx.options
    need = ctx.needs_input_grad
    need_gd = decay_tensor is not None and need[6]
    gx, gr, sums, gd = backward(grad_s, x, residual, ckpt, stats, decay, decay_tensor, threshold,
                                reset, v_reset, detach, surrogate, alpha, batch_stats, need_gd,
                                time_steps)
    return (gx if need[0] else None,
            gr.to(residual.dtype) if residual is not None and need[1] else None, None,
            sums[1].to(weight.dtype) if weight is not None and need[3] else None,
            sums[0].to(bias.dtype) if bias is not None and need[4] else None, None,
            gd.reshape(decay_tensor.shape) if need_gd else None)


def _reference_grads(ctx, grad_s):
    """_input_grads for a backward that will itself be differentiated (create_graph=True):
    the kernels' gradients carry no graph, so BN + LIF is run again in torch from the saved
    inputs (batch norm, then spikefuse.reference.lif) and differentiated with create_graph:
    second derivatives are the reference's."""
    from .. import reference

    if getattr(ctx, "sync", None) is not None:  # its batch statistics span ranks: not recomputed here
        raise RuntimeError("double backward (create_graph=True) through a SyncBN BNLIF is not supported")
    x, residual, _, stats, weight, bias, decay_tensor = ctx.saved_tensors
    decay, threshold, reset, v_reset, detach, surrogate, alpha, batch_stats, time_steps = ctx.options
    need = ctx.needs_input_grad
    inputs, needs = (x, residual, weight, bias, decay_tensor), [need[i] for i in (0, 1, 3, 4, 6)]
    with torch.enable_grad():
        xt = over_time(x, time_steps).float()
        per_channel = (-1,) + (1,) * (x.dim() - 3)
        mean, invstd = stats[0], stats[1]  # running statistics (eval)
        if batch_stats:  # var + eps read back from the saved invstd (eps is not saved)
            var, mean = torch.var_mean(xt, dim=[d for d in range(xt.dim()) if d != 2], correction=0)
            invstd = torch.rsqrt(var + (stats[1] ** -2 - var).detach())
        y = (xt - mean.view(per_channel)) * invstd.view(per_channel)
        if weight is not None:
            y = y * weight.float().view(per_channel)
        if bias is not None:
            y = y + bias.float().view(per_channel)
        if residual is not None:
            y = y + residual.float()
        if decay_tensor is not None:
            decay = decay_tensor.view(per_channel) if decay_tensor.numel() > 1 else decay_tensor
        spikes = reference.lif(y, decay, threshold, reset, v_reset, detach, surrogate, alpha)
        gx, gr, gw, gb, gd = grads_with_graph((spikes,), (grad_s.float(),), inputs, needs)
    return gx, gr, None, gw, gb, None, gd


def _setup_context(ctx, inputs, output):
    (x, residual, stats, weight, bias, decay, decay_tensor, threshold, reset, v_reset,
     detach, surrogate, alpha, batch_stats, time_steps, _) = inputs
    ctx.save_for_backward(x, residual, output[1], stats, weight, bias, decay_tensor)
    ctx.options = (decay, threshold, reset, v_reset, detach, surrogate, alpha, batch_stats, time_steps)


def _backward_rule(ctx, grad_s, _grad_ckpt):
    if torch.is_grad_enabled():  # create_graph=True (AOT autograd traces backward without it)
        return (*_reference_grads(ctx, grad_s), *[None] * 9)
    return (*_input_grads(ctx, grad_s, bn_lif_backward), *[None] * 9)


bn_lif_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def _speculate_next(spikes, x, residual, ckpt, stats, decay, decay_tensor, threshold, reset, v_reset, detach, surrogate,
                    alpha, batch_stats, time_steps, need_gd, save, half_twin=False):
    """After a forward that compiled a new variant: compile in the background (ops/launch.py's
    speculative compiles) this layer's backward kernels, when it saved for them (with the fp16
    twin's variants under half_twin), and its forward without gradients (an evaluation's). The
    host functions run on meta tensors."""
    launch, xm, rm, sm, dm = (Speculate(x.device.index), meta_like(x), meta_like(residual), meta_like(stats),
                              meta_like(decay_tensor))
    if save:
        _backward(meta_like(spikes), xm, rm, meta_like(ckpt), sm, decay, dm, threshold, reset, v_reset, detach,
                  surrogate, alpha, batch_stats, need_gd, time_steps, launch=launch, half_twin=half_twin)
    _forward(xm, rm, sm, decay, dm, threshold, reset, v_reset, time_steps, False, launch=launch)


def _speculate_layer(x, residual, weight, bias, running_mean, running_var, use_batch, momentum, eps, decay,
                     decay_tensor, options, time_steps, half_twin=False):
    """While its statistics kernels compile (background compiles): compile every kernel this
    layer launches, its statistics (the evaluation's too), forward and backward, in the background
    too (else each would start only once the one before it is ready). The host functions run on
    meta tensors."""
    launch, xm = Speculate(x.device.index), meta_like(x)
    _statistics(over_time(xm, time_steps), weight, bias, running_mean, running_var, use_batch, momentum, eps,
                launch=launch)
    if use_batch and running_mean is not None:  # the evaluation's statistics (from the running ones) too:
        _statistics(over_time(xm, time_steps), weight, bias, running_mean, running_var, False, momentum, eps,
                    launch=launch)  # else a cold first evaluation runs torch batch norm while it compiles
    grad = torch.is_grad_enabled()
    save = grad and any(t is not None and t.requires_grad for t in (x, residual, weight, bias, decay_tensor))
    N = math.prod(x.shape[1:])
    bits = torch.empty(time_steps * N // 8, dtype=torch.uint8, device="meta") if grad and N % 8 == 0 else None
    stats = torch.empty((4, x.shape[2]), dtype=torch.float32, device="meta")
    threshold, reset, v_reset, detach, surrogate, alpha = options.common()
    spikes, ckpt = _forward(xm, meta_like(residual), stats, decay, meta_like(decay_tensor), threshold, reset, v_reset,
                            time_steps, save, bits, launch=launch)
    need_gd = decay_tensor is not None and decay_tensor.requires_grad
    _speculate_next(spikes, x, residual, ckpt, stats, decay, decay_tensor, threshold, reset, v_reset, detach,
                    surrogate, alpha, use_batch, time_steps, need_gd, save, half_twin)


class BNLIFFunction(torch.autograd.Function):
    """The eager path (a plain autograd.Function costs far less Python per call than a
    torch.library op; see spikefuse.ops.lif). Arguments as bn_lif_forward, without `save`."""

    @staticmethod
    def forward(ctx, x, residual, stats, weight, bias, decay, decay_tensor, threshold, reset,
                v_reset, detach, surrogate, alpha, batch_stats, time_steps, bits, sync, half_twin):
        save = any(ctx.needs_input_grad)
        ctx.sync, ctx.half_twin = sync, half_twin
        misses = _bn_lif_forward_kernel.misses
        try:
            spikes, ckpt = _forward(x, residual, stats, decay, decay_tensor, threshold, reset,
                                    v_reset, time_steps, save, bits)
        except Compiling:  # (background compiles) this layer's backward and evaluation compile alongside
            need_gd = decay_tensor is not None and ctx.needs_input_grad[6]
            with contextlib.suppress(Exception):
                spikes_m, ckpt_m = _forward(meta_like(x), meta_like(residual), meta_like(stats), decay,
                                            meta_like(decay_tensor), threshold, reset, v_reset, time_steps, save,
                                            meta_like(bits), launch=Speculate(x.device.index))
                _speculate_next(spikes_m, x, residual, ckpt_m, stats, decay, decay_tensor, threshold, reset, v_reset,
                                detach, surrogate, alpha, batch_stats, time_steps, need_gd, save, half_twin)
            raise
        if _bn_lif_forward_kernel.misses != misses and speculation_enabled():  # a new variant: more will follow
            need_gd = decay_tensor is not None and ctx.needs_input_grad[6]
            with contextlib.suppress(Exception):  # a guess never fails the forward (tests check the guesses)
                _speculate_next(spikes, x, residual, ckpt, stats, decay, decay_tensor, threshold, reset, v_reset,
                                detach, surrogate, alpha, batch_stats, time_steps, need_gd, save, half_twin)
        if save:
            ctx.save_for_backward(x, residual, ckpt, stats, weight, bias, decay_tensor)
            ctx.options = (decay, threshold, reset, v_reset, detach, surrogate, alpha, batch_stats,
                           time_steps)
        return spikes

    @staticmethod
    def backward(ctx, grad_s):
        if torch.is_grad_enabled():  # create_graph=True: this backward will be differentiated
            return (*_reference_grads(ctx, grad_s), *[None] * 11)
        backward = functools.partial(_backward, sync=ctx.sync, half_twin=ctx.half_twin)

        def fallback():  # a kernel is compiling (background compiles): the reference's gradients
            return tuple(None if g is None else g.detach() for g in _reference_grads(ctx, grad_s))
        return (*fused_or(lambda: _input_grads(ctx, grad_s, backward), fallback), *[None] * 11)


def _under_torch_compile() -> bool:
    """True while dynamo traces: then the torch.library ops, which it can see into, are used."""
    return torch.compiler.is_dynamo_compiling()


def bn_lif_fused(x, weight, bias, running_mean, running_var, training, momentum, eps,
                 decay, decay_tensor, options, residual=None, time_steps=None, sync=None, unfused=None,
                 half_twin=False):
    """Entry point for spikefuse.nn.BNLIF (arguments already checked there; `options` its
    spikefuse.neuron_options.NeuronOptions, whose grad_threshold and grad_scope it leaves at
    their defaults).

    training: batch statistics, and running statistics updated with `momentum` like
    torch.nn.BatchNorm (unbiased variance); otherwise the running statistics are used.
    time_steps: x [1, B, C, *] is one step repeated over time_steps steps; its gradient
    is the sum over the steps, formed without a per-step gradient tensor.
    Spikes come out in x's layout (channels-last steps stay channels-last).
    sync: SyncBN's hook (spikefuse.parallel.sync_bn): batch statistics and Eq. 8's gradient
    means over every rank. Eager only (BNLIF runs torch batch norm under torch.compile).
    unfused(update_running): the layer in torch ops, run instead while a kernel compiles in the
    background (ops/launch.py); update_running False once the statistics kernel has updated the
    running statistics. None: the kernels compile before they run, as always without it.
    half_twin: x is a spiking conv's output whose weight gradient will be taken: the backward
    offers it dL/dx's fp16 twin where ops/half_grad applies. Eager only.
    """
    use_batch = training or running_mean is None
    time_steps = x.shape[0] if time_steps is None else time_steps
    if x.numel() == 0:  # batch 0: as torch's BatchNorm, empty output, running statistics unchanged
        spikes = over_time(x, time_steps) * 0.0
        return spikes if residual is None else spikes + residual * 0.0
    if math.prod(x.shape[1:]) >= MAX_STEP:
        raise ValueError(f"x has {math.prod(x.shape[1:])} neurons per time step (shape {tuple(x.shape)}); "
                         f"the fused BN+LIF supports fewer than {MAX_STEP} (use backend='reference')")
    x = dense_steps(x)
    if residual is not None:
        residual = as_layout(residual, is_channels_last(x))
    if decay_tensor is not None:
        decay_tensor = decay_tensor.float()
    compiling = _under_torch_compile()
    half_twin = half_twin and not compiling and half_grad.enabled(x)  # decided with the forward, as TF32 is now
    statistics = (sync.statistics if sync is not None and use_batch
                  else bn_statistics if compiling else _statistics)

    def take_statistics():
        with torch.no_grad():
            return statistics(over_time(x.detach(), time_steps), weight, bias, running_mean, running_var,
                              use_batch, momentum, eps)
    stats = take_statistics() if unfused is None else fused_or(take_statistics, lambda: None)
    if stats is None:  # its kernel is compiling: the layer's others compile alongside
        with contextlib.suppress(Exception):
            _speculate_layer(x, residual, weight, bias, running_mean, running_var, use_batch, momentum, eps,
                             decay, decay_tensor, options, time_steps, half_twin)
        return unfused(True)
    args = (x, residual, stats, weight, bias, decay, decay_tensor, *options.common(), use_batch,
            time_steps)  # flat: the op's schema order
    if not compiling:
        N = math.prod(x.shape[1:])
        # with gradients on, a following spiking conv/linear saves these spikes as bits:
        # the kernel writes them (1/32 of the spikes' bytes) and saves that layer a pass
        bits = (x.new_empty(time_steps * N // 8, dtype=torch.uint8)
                if torch.is_grad_enabled() and N % 8 == 0 else None)
        if not torch.is_grad_enabled():  # no graph is recorded, so nothing is saved for a backward
            # (needs_input_grad ignores no_grad: BN's weight made every evaluation write checkpoints)
            args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)

        def apply():
            return BNLIFFunction.apply(*args, bits, sync, half_twin)
        spikes = apply() if unfused is None else fused_or(apply, lambda: None)
        if spikes is None:  # its kernel is compiling, and the running statistics took this batch already
            return unfused(False)
        if bits is not None:
            attach_bits(spikes, bits)
        return spikes
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias, decay_tensor, residual))
    return bn_lif_forward(*args, wants_grad)[0]
