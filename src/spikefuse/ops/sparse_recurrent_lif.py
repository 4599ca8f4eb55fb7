"""The recurrent LIF's sparse path: per step, read only the recurrent weights that matter.

The dense path (spikefuse.ops.recurrent_lif) reads all of W [N, N] at every step, forward
and backward: at N = 5888 that is 139 MB per step, so a 100-step layer moves 14 GB per
pass for a batch of 8. But with spikes at a few percent:
- forward, s[t-1] @ W^T needs only the columns k of W where some row spiked at t-1 (the
  step's *active* union over the batch rows);
- backward, dL/ds[t] = gh[t+1] @ W matters only where the surrogate is nonzero, i.e. in
  the columns k where some row's potential reached grad_threshold at t (the *carrying*
  union; Perez-Nieves & Goodman's secondary threshold). Elsewhere gh[t] is the leak term
  alone, computed elementwise.
Both read whole rows of W^T (one transposed copy per call), the gathers looping to counts
kept on the device (static launch shapes: a CUDA graph captures them). Backward splits the
sum over n into chunks of CHUNK columns, one program each, and sums the chunks' partials
in a fixed order (deterministic; no atomics).

The index lists: the step kernel flags, per row block and column, a spike (and a potential
at grad_threshold or above); then one launch lists the active and the carrying columns of
step t from those flags, each column block (SEG columns, one program) into its own
segment, in increasing order (a prefix sum: deterministic, and no list overflows: a
segment has room for all its columns). Gradients equal the dense path's (the same products, summed in another order)
wherever the secondary threshold is the same: with grad_threshold = -inf every column
carries and the sparse path is the dense one, slower.
"""
from __future__ import annotations

import torch

from .launch import cached_launch
from .kernel_base import EAGER, reset_code, cdiv, f32, tf32_matmuls
from .recurrent_common import _rlif_backward_step, fire_and_store, store_adjoint
from ..surrogates import SURROGATES
from .triton_or_stub import tl, triton

SEG = 1024  # columns per list segment (one listing program each)
LIST_BLOCK = 32  # carrying columns per backward program
CHUNK, MAX_CHUNKS = 256, 32  # the backward's split of the sum over n: at least CHUNK each


@cached_launch
@triton.jit
def _list_columns(spiked_ptr, near_ptr, active_ptr, active_count_ptr, carry_ptr, carry_count_ptr,
                  step, RB, N, NSEG, CARRY: tl.constexpr, SEG: tl.constexpr):
    """Segment `program_id` of step `step`'s lists: columns where any row spiked, and (CARRY)
    where any row's h reached grad_floor, from the step kernel's per-row-block flags (a
    loop over RB row blocks, not over the batch: a serial walk of 256 rows per step cost
    more than the dense step)."""
    seg = tl.program_id(0)
    cols = seg * SEG + tl.arange(0, SEG)
    in_range = cols < N
    spiked = tl.zeros([SEG], tl.int32)
    near = tl.zeros([SEG], tl.int32)
    for rb in range(0, RB):
        flags = (tl.cast(step, tl.int64) * RB + rb) * N + cols
        spiked |= tl.load(spiked_ptr + flags, mask=in_range, other=0).to(tl.int32)
        if CARRY:
            near |= tl.load(near_ptr + flags, mask=in_range, other=0).to(tl.int32)
    base = (tl.cast(step, tl.int64) * NSEG + seg) * SEG
    tl.store(active_ptr + base + tl.cumsum(spiked, 0) - 1, cols, mask=spiked > 0)
    tl.store(active_count_ptr + step * NSEG + seg, tl.sum(spiked, 0))
    if CARRY:
        tl.store(carry_ptr + base + tl.cumsum(near, 0) - 1, cols, mask=near > 0)
        tl.store(carry_count_ptr + step * NSEG + seg, tl.sum(near, 0))


@cached_launch
@triton.jit
def _sparse_forward_step(
    x_ptr, wt_ptr, v_ptr, s_ptr, h_ptr, active_ptr, active_count_ptr, spiked_ptr, near_ptr,
    step, decay, threshold, v_reset, grad_floor, M, N, NSEG,
    RESET: tl.constexpr, FIRST: tl.constexpr, SAVE_H: tl.constexpr, CARRY: tl.constexpr, TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SEG: tl.constexpr,
):
    """The dense step's neuron, its recurrent input summed over step-1's active columns only:
    sum_k s[t-1][m, k] W^T[k, n] for k in the lists (W^T rows: contiguous). Flags, per row
    block and column, whether a row spiked (and, CARRY, whether h reached grad_floor): the
    lists are built from these."""
    d, threshold, v_reset = f32(decay), f32(threshold), f32(v_reset)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows[:, None] * N + cols[None, :]
    now = tl.cast(step, tl.int64) * M * N
    x = tl.load(x_ptr + now + offs, mask=mask, other=0.0).to(tl.float32)
    if FIRST:
        h = d * tl.zeros([BLOCK_M, BLOCK_N], tl.float32) + x
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        prev = now - M * N
        for seg in range(0, NSEG):
            base = (tl.cast(step - 1, tl.int64) * NSEG + seg) * SEG
            count = tl.load(active_count_ptr + (step - 1) * NSEG + seg)
            for j0 in range(0, count, BLOCK_K):
                j = j0 + tl.arange(0, BLOCK_K)
                k = tl.load(active_ptr + base + j, mask=j < count, other=0).to(tl.int64)
                a = tl.load(s_ptr + prev + rows[:, None] * N + k[None, :],
                            mask=(rows < M)[:, None] & (j < count)[None, :], other=0.0).to(tl.float32)
                b = tl.load(wt_ptr + k[:, None] * N + cols[None, :],
                            mask=(j < count)[:, None] & (cols < N)[None, :], other=0.0).to(tl.float32)
                if TF32:
                    acc = tl.dot(a, b, acc, input_precision="tf32")
                else:
                    acc = tl.dot(a, b, acc, input_precision="ieee")
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        h = (d * v + x) + acc
    s = fire_and_store(h, s_ptr, v_ptr, h_ptr, now, offs, mask, threshold, v_reset, RESET, SAVE_H)
    flags = (tl.cast(step, tl.int64) * tl.num_programs(0) + tl.program_id(0)) * N + cols
    tl.store(spiked_ptr + flags, tl.max(((s != 0.0) & mask).to(tl.int32), axis=0), mask=cols < N)
    if CARRY:
        tl.store(near_ptr + flags, tl.max(((h >= f32(grad_floor)) & mask).to(tl.int32), axis=0), mask=cols < N)


@triton.jit
def carrying_block(carry_ptr, carry_count_ptr, step, NSEG, BLOCK_K: tl.constexpr, SEG: tl.constexpr):
    """This program's block of step `step`'s carrying list (axis 1 walks the segments'
    blocks): list positions j, the segment's count, the columns k (int64; 0 past the count)."""
    per_seg: tl.constexpr = SEG // BLOCK_K
    seg = tl.program_id(1) // per_seg
    j = (tl.program_id(1) % per_seg) * BLOCK_K + tl.arange(0, BLOCK_K)
    count = tl.load(carry_count_ptr + step * NSEG + seg)
    k = tl.load(carry_ptr + (tl.cast(step, tl.int64) * NSEG + seg) * SEG + j, mask=j < count, other=0)
    return j, count, k.to(tl.int64)


@cached_launch
@triton.jit
def _carry_partial(
    gh_ptr, wt_ptr, carry_ptr, carry_count_ptr, p_ptr, step, M, N, NSEG, CHUNK,
    TF32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_I: tl.constexpr,
    SEG: tl.constexpr,
):
    """P[c, m, k] = sum over n in chunk c of gh[t+1][m, n] * W[n, k] (= W^T[k, n]), for k in
    step t's carrying list. Program (row block, list block, n chunk): the n sum is split over
    programs (a few carrying columns would otherwise leave most of the GPU idle, each
    program streaming whole W^T rows), and summed in a fixed order by _carry_finish."""
    j, count, k = carrying_block(carry_ptr, carry_count_ptr, step, NSEG, BLOCK_K, SEG)
    if tl.min(j, 0) < count:  # a block with a listed column
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        nxt = (tl.cast(step, tl.int64) + 1) * M * N
        acc = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        first = tl.program_id(2) * CHUNK
        end = tl.minimum(first + CHUNK, N)
        for i0 in range(first, end, BLOCK_I):
            i = i0 + tl.arange(0, BLOCK_I)
            a = tl.load(gh_ptr + nxt + rows[:, None] * N + i[None, :],
                        mask=(rows < M)[:, None] & (i < end)[None, :], other=0.0)
            b = tl.load(wt_ptr + k[None, :] * N + i[:, None],
                        mask=(i < end)[:, None] & (j < count)[None, :], other=0.0).to(tl.float32)
            if TF32:
                acc = tl.dot(a, b, acc, input_precision="tf32")
            else:
                acc = tl.dot(a, b, acc, input_precision="ieee")
        offs = (tl.cast(tl.program_id(2), tl.int64) * M + rows[:, None]) * N + k[None, :]
        tl.store(p_ptr + offs, acc, mask=(rows < M)[:, None] & (j < count)[None, :])


@cached_launch
@triton.jit
def _carry_finish(
    gs_ptr, h_ptr, gh_ptr, ghx_ptr, p_ptr, carry_ptr, carry_count_ptr,
    step, decay, threshold, v_reset, alpha, grad_floor, M, N, NSEG, NCHUNK,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, HAS_GHX: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SEG: tl.constexpr,
):
    """gh[t] at step t's carrying columns, with the recurrent term sum_c P[c] (gh[t+1] @ W),
    overwriting the elementwise pass's values there."""
    d, threshold, v_reset = f32(decay), f32(threshold), f32(v_reset)
    alpha, grad_floor = f32(alpha), f32(grad_floor)
    j, count, k = carrying_block(carry_ptr, carry_count_ptr, step, NSEG, BLOCK_K, SEG)
    if tl.min(j, 0) < count:  # a block with a listed column
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < M)[:, None] & (j < count)[None, :]
        offs = rows[:, None] * N + k[None, :]
        recurrent = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
        for c in range(0, NCHUNK):
            recurrent += tl.load(p_ptr + tl.cast(c, tl.int64) * M * N + offs, mask=mask, other=0.0)
        now = tl.cast(step, tl.int64) * M * N
        gs = tl.load(gs_ptr + now + offs, mask=mask, other=0.0).to(tl.float32) + recurrent
        gv = d * tl.load(gh_ptr + now + M * N + offs, mask=mask, other=0.0)
        store_adjoint(gs, gv, h_ptr, gh_ptr, ghx_ptr, now, offs, mask, threshold, v_reset, alpha, grad_floor,
                      RESET, DETACH, SURROGATE, HAS_GHX)


def _sparse_tiles(M):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) of the sparse steps. At natural activity on an
    H100 these beat the dense path's 16 x 16 tiles (ipu-shd-recurrent x4: 6.8 / 10.0 ms at
    B = 1 / 8 against 7.3 / 11.1 ms; benchmarks/results/sparse-recurrent-*.md)."""
    BLOCK_M = 16 if M <= 16 else 32 if M <= 32 else 64
    return BLOCK_M, 32 if M <= 64 else 64, 32, 4


def _lists(T, N, device):
    """(index lists [T, NSEG, SEG], counts [T, NSEG]) int32, for active or carrying columns."""
    nseg = cdiv(N, SEG)
    return (torch.zeros((T, nseg, SEG), device=device, dtype=torch.int32),
            torch.zeros((T, nseg), device=device, dtype=torch.int32))


def forward(x, weight, decay, threshold, reset, v_reset, grad_threshold, save, launch=EAGER):
    """spikes like x [T, M, N], v[T-1] [M, N] float32, h [T, M, N] float32 (empty unless
    `save`), W^T and the carrying lists (for backward) and the active counts [T, NSEG]."""
    T, M, N = x.shape
    spikes = torch.empty_like(x)
    v = torch.zeros((M, N), device=x.device, dtype=torch.float32)
    h = torch.empty((T if save else 0, M, N), device=x.device, dtype=torch.float32)
    wt = weight.t().contiguous()
    active, active_count = _lists(T, N, x.device)
    carry, carry_count = _lists(T if save else 0, N, x.device)
    if x.numel() == 0:
        return spikes, v, h, wt, carry, carry_count, active_count
    nseg = cdiv(N, SEG)
    BLOCK_M, BLOCK_N, BLOCK_K, warps = _sparse_tiles(M)
    grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    row_blocks = grid[0]
    spiked = torch.empty((T, row_blocks, N), device=x.device, dtype=torch.int8)
    near = torch.empty((T if save else 0, row_blocks, N), device=x.device, dtype=torch.int8)
    step_kernel, list_kernel = launch(_sparse_forward_step), launch(_list_columns)
    unused = launch.unused(x)
    for t in range(T):
        step_kernel[grid](
            x, wt, v, spikes, h if save else unused, active, active_count, spiked, near if save else unused,
            t, decay, threshold, v_reset, grad_threshold, M, N, nseg,
            RESET=reset_code(reset, "rlif"), FIRST=t == 0, SAVE_H=save, CARRY=save, TF32=tf32_matmuls(x),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, SEG=SEG, num_warps=warps,
            enable_fp_fusion=False)
        list_kernel[(nseg,)](
            spiked, near if save else unused, active, active_count,
            carry if save else unused, carry_count if save else unused,
            t, row_blocks, N, nseg, CARRY=save, SEG=SEG, num_warps=4)
    return spikes, v, h, wt, carry, carry_count, active_count


def backward(grad_s, grad_vT, h, spikes, wt, carry, carry_count, weight, decay, threshold, reset, v_reset,
             detach, surrogate, alpha, grad_threshold, launch=EAGER, grad_h=None):
    """(dL/dx like spikes, dL/dW like weight); grad_h: of the returned potential trace, or None."""
    T, M, N = spikes.shape
    gs = torch.zeros_like(spikes) if grad_s is None else grad_s.contiguous()
    gvT = grad_vT.contiguous() if grad_vT is not None else None
    gh = torch.empty((T, M, N), device=spikes.device, dtype=torch.float32)
    if spikes.numel() == 0:
        return gh.to(spikes.dtype), torch.zeros_like(weight)
    nseg = cdiv(N, SEG)
    BLOCK_M, BLOCK_N, BLOCK_K, warps = _sparse_tiles(M)
    chunk = cdiv(max(CHUNK, cdiv(N, MAX_CHUNKS)), 32) * 32
    nchunk = cdiv(N, chunk)
    partials = torch.empty((nchunk, M, N), device=spikes.device, dtype=torch.float32)
    lists = (cdiv(M, BLOCK_M), nseg * (SEG // LIST_BLOCK))
    elementwise = launch(_rlif_backward_step)
    partial, finish = launch(_carry_partial), launch(_carry_finish)
    unused = launch.unused(gs)
    ghx = grad_h.contiguous() if grad_h is not None else None
    ghx_arg = ghx if ghx is not None else unused
    for t in reversed(range(T)):
        last = t == T - 1
        # every column: the surrogate and leak terms, without the recurrent input's gradient
        elementwise[(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))](
            gs, weight, h, gvT if gvT is not None else unused, gh, ghx_arg, t,
            decay, threshold, v_reset, alpha, grad_threshold, M, N, weight.stride(0), weight.stride(1),
            RESET=reset_code(reset, "rlif"), DETACH=detach, SURROGATE=SURROGATES[surrogate], LAST=last,
            HAS_GVT=gvT is not None, TF32=False, RECURRENT=False, HAS_GHX=ghx is not None,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=warps, enable_fp_fusion=False)
        if not last:  # the carrying columns again, now with gh[t+1] @ W
            partial[(*lists, nchunk)](
                gh, wt, carry, carry_count, partials, t, M, N, nseg, chunk, TF32=tf32_matmuls(gs),
                BLOCK_M=BLOCK_M, BLOCK_K=LIST_BLOCK, BLOCK_I=32, SEG=SEG, num_warps=warps)
            finish[lists](
                gs, h, gh, ghx_arg, partials, carry, carry_count, t,
                decay, threshold, v_reset, alpha, grad_threshold, M, N, nseg, nchunk,
                RESET=reset_code(reset, "rlif"), DETACH=detach, SURROGATE=SURROGATES[surrogate],
                HAS_GHX=ghx is not None, BLOCK_M=BLOCK_M, BLOCK_K=LIST_BLOCK, SEG=SEG, num_warps=warps, enable_fp_fusion=False)
    grad_w = gh[1:].reshape(-1, N).t() @ spikes[:-1].reshape(-1, N).float()
    return gh.to(spikes.dtype), grad_w.to(weight.dtype)
