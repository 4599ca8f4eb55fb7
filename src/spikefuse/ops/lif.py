"""Fused LIF: one Triton launch over all T steps forward, one reverse-time launch backward.

Each program owns BLOCK neurons and keeps their membrane potential in registers for the
whole sequence. Time is walked in chunks of K steps: a chunk's K rows are loaded at once,
and the next chunk is loaded before the current one is computed, so enough bytes are in
flight for a recurrence over few neurons to still stream at the bandwidth limit.

Saved for backward: the input x (which the caller usually holds anyway) and the potential
at the start of every chunk (4/K bytes per neuron-step). The backward kernel walks the
chunks in reverse; for each it recomputes h, v and the spikes forward from the chunk's
checkpoint into registers (bit-identical to the forward: same operations, no FMA
contraction), then runs the gradient recurrence backward through them. Traffic per
element: forward reads x and writes s, backward reads grad_s and x and writes grad_x:
the 5 accesses of the floor, plus the checkpoints.

The forward walks the full chunks and the partial one in two unrolled copies of its chunk
step (only the last pays for the masks past T); the backward walks once, every chunk in the
masked form: one unrolled copy of its long reverse step compiles in half the time (a cold
Triton cache, issue 38) at the same GPU time, where one walk would cost the forward up to 11%
(benchmarks/results/compile-time-lif-nvidia-h100-80gb-hbm3.md).

Sparse backward (Perez-Nieves & Goodman): the surrogate gradient is zeroed where the
potential h[t] < grad_floor (the caller's grad_threshold; -inf cuts nothing), step by step
(grad_scope "step"). Under "sequence" or "batch" the forward kernel also notes, per neuron,
whether h reached grad_floor at any step (in a row after the checkpoints), and the backward
keeps the whole surrogate of the neurons that did ("batch": of every sample's neuron at a
position some sample's neuron reached it; the flags are reduced over the batch by torch).

reset="subtract" (snnTorch's, a step late: kernel_base.charge) needs no state beyond v: v[t-1] =
h[t-1] gives s[t-1]. Backward carries dL/dh[t+1] (gp) besides dL/dv[t], as the path from s[t]
to h[t+1]; past step 0 it reaches v0 (and the threshold) through s[-1] = H(v0 - threshold).

A tensor threshold (learnable: one value, or one per channel) is read per neuron like a
tensor decay; its gradient is summed over time in registers, one partial per neuron, and
reduced over the batch and spatial dims by torch (no atomics: deterministic).
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch

from .kernel_base import (EAGER, TRACED, cdiv, channel_layout, charge, chunk_registers, f32, fires, grad_h,
                          load_chunk, load_earlier_chunks, load_per_neuron, meta_like, or_empty, param_mode,
                          program_neurons, reset_code, reset_partials, reset_potential, row, Speculate,
                          spike_adjoint, spike_value, state_buffer, store_bits, store_chunk, store_outputs,
                          surrogate_grad, time_major)
from .triton_or_stub import tl, triton
from .launch import (Compiling, cached_launch, cold_compiles_in_flight, compiles_in_processes, fused_or,
                     speculation_enabled)
from . import lif_loop
from .double_backward import grads_with_graph
from . import padded_rows
from .spike_pack import attach_bits
from ..surrogates import CUSTOM, SURROGATES, CustomSurrogate


@triton.jit
def lif_surrogate_grad(u, SURROGATE: tl.constexpr, alpha, CUSTOM_FN: tl.constexpr):
    """surrogate_grad, or for the custom code (5) the user's Triton function CUSTOM_FN(u, alpha)
    (spikefuse.surrogates.custom; None for a built-in, whose code compiles as before)."""
    if SURROGATE == 5:
        return CUSTOM_FN(u, alpha)
    else:
        return surrogate_grad(u, SURROGATE, alpha)


@triton.jit
def cut_surrogate(sg, h, keep, grad_floor, KEEP: tl.constexpr):
    """The sparse backward's cut: sg where kept (per neuron with KEEP, else h >= grad_floor;
    a NaN h keeps its NaN)."""
    return tl.where(keep == 0.0, 0.0, sg) if KEEP else tl.where(h < grad_floor, 0.0, sg)


@triton.jit
def threshold_grad_step(gs, g_reset, h, fired, sg, threshold, v_reset, RESET: tl.constexpr, DETACH: tl.constexpr):
    """dL/dthreshold at step t: s = H(h - threshold) gives -(dL/ds[t] total) * sg, and the
    soft reset v = h - threshold*s gives -dL/dv[t] where it fired (detach_reset detaches s,
    not the threshold). g_reset: what the reset's spike term multiplies (grad_h's: dL/dv[t],
    or dL/dh[t+1] for "subtract", whose own threshold term backward_chunk adds)."""
    _, through_spike = reset_partials(h, fired, threshold, v_reset, RESET, DETACH)
    g = -spike_adjoint(gs, g_reset, through_spike, RESET, DETACH) * sg
    if RESET == 1:  # -dL/dv[t] * s[t]: NaN where the spike is NaN (the reference's NaN * gv)
        u = h - threshold
        g -= tl.where(u == u, tl.where(fired, g_reset, 0.0), u)
    return g


@triton.jit
def forward_chunk(X, v, d, t0, T, threshold, v_reset, RESET: tl.constexpr, TAIL: tl.constexpr,
                  STORE_H: tl.constexpr, reached, grad_floor, TRACK: tl.constexpr):
    """Run K steps from potential v over chunk X: (spikes [K, BLOCK] float32, pre-reset
    potentials h [K, BLOCK] float32 (zeros unless STORE_H), v after, `reached`).
    TAIL: the chunk crosses T, and v must stop at step T-1. TRACK: `reached` becomes 1 where
    some step's h >= grad_floor (or is NaN, so that NaN gradients are never cut)."""
    K: tl.constexpr = X.shape[0]
    k, Xf, S, H = chunk_registers(X)
    for j in tl.static_range(K):
        sel = (k == j)[:, None]
        h = charge(d * v + row(Xf, sel), v, threshold, RESET)
        u = h - threshold
        fired = fires(u, RESET)
        v_next = reset_potential(h, fired, threshold, v_reset, RESET)
        v = tl.where(t0 + j < T, v_next, v) if TAIL else v_next
        S = tl.where(sel, spike_value(u, fired)[None, :], S)
        if STORE_H:
            H = tl.where(sel, h[None, :], H)
        if TRACK:
            hit = (h >= grad_floor) | (h != h)
            reached = tl.where(((t0 + j < T) & hit) if TAIL else hit, 1.0, reached)
    return S, H, v, reached


@cached_launch
@triton.jit
def _lif_forward_kernel(
    x_ptr, s_ptr, ckpt_ptr, v0_ptr, vT_ptr, decay_ptr, h_ptr, thr_ptr, bits_ptr,
    decay, threshold, v_reset, grad_floor, T, N, inner, C,
    RESET: tl.constexpr, DECAY: tl.constexpr, THRESHOLD: tl.constexpr, HAS_V0: tl.constexpr,
    SAVE_CKPT: tl.constexpr, STORE_VT: tl.constexpr, STORE_H: tl.constexpr, TRACK: tl.constexpr,
    BITS: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr, EVEN_N: tl.constexpr,
):
    """TRACK: after the checkpoints (row cdiv(T, K) of ckpt), 1.0 for each neuron whose h
    reached grad_floor at some step, else 0.0. BITS: the spikes also packed into bits_ptr
    (spike_pack's layout; N % 8 == 0)."""
    decay, threshold, v_reset, grad_floor = f32(decay), f32(threshold), f32(v_reset), f32(grad_floor)
    n = program_neurons(BLOCK)
    n_mask = n < N
    d = load_per_neuron(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    threshold = load_per_neuron(thr_ptr, threshold, n, n_mask, inner, C, THRESHOLD)
    if HAS_V0:
        v = tl.load(v0_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        v = tl.zeros([BLOCK], tl.float32)
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    full = T // K
    reached = tl.zeros([BLOCK], tl.float32)
    X = load_chunk(x_ptr, 0, offs, k, n_mask, T, N, EVEN_N)
    for c in range(0, full):
        t0 = c * K
        X_next = load_chunk(x_ptr, t0 + K, offs, k, n_mask, T, N, EVEN_N)  # prefetch
        if SAVE_CKPT:
            tl.store(ckpt_ptr + tl.cast(c, tl.int64) * N + n, v, mask=n_mask)
        S, H, v, reached = forward_chunk(X, v, d, t0, T, threshold, v_reset, RESET, False, STORE_H,
                                         reached, grad_floor, TRACK)
        store_outputs(s_ptr, h_ptr, t0, offs, k, n_mask, T, N, S, H, EVEN_N, STORE_H)
        if BITS:
            store_bits(bits_ptr, S, t0 + k, T, N)
        X = X_next
    if full * K < T:  # the last, partial chunk
        if SAVE_CKPT:
            tl.store(ckpt_ptr + tl.cast(full, tl.int64) * N + n, v, mask=n_mask)
        S, H, v, reached = forward_chunk(X, v, d, full * K, T, threshold, v_reset, RESET, True, STORE_H,
                                         reached, grad_floor, TRACK)
        store_outputs(s_ptr, h_ptr, full * K, offs, k, n_mask, T, N, S, H, EVEN_N, STORE_H)
        if BITS:
            store_bits(bits_ptr, S, full * K + k, T, N)
    if STORE_VT:
        tl.store(vT_ptr + n, v, mask=n_mask)
    if TRACK:
        tl.store(ckpt_ptr + tl.cast(tl.cdiv(T, K), tl.int64) * N + n, reached, mask=n_mask)


@triton.jit
def backward_chunk(X, GS, v, gv, gp, gd, gthr, d, t0, T, threshold, v_reset, alpha, grad_floor, keep,
                   RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr,
                   CUSTOM_FN: tl.constexpr, NEED_GD: tl.constexpr, TAIL: tl.constexpr, GH,
                   HAS_GH: tl.constexpr, NEED_GTHR: tl.constexpr, KEEP: tl.constexpr):
    """Recompute the chunk forward from its checkpoint v (h[t] and v[t-1] into registers),
    then run the gradient recurrence backward through it: (dL/dx chunk, dL/dv, dL/dh at the
    chunk's first step (gp: "subtract" reaches s[t] through dL/dh[t+1]), dL/d decay,
    dL/d threshold; the last two summed over the chunk's steps onto gd, gthr).
    HAS_GH: GH is the chunk of dL/dh from a loss on the returned potential, added to dL/dh[t].
    KEEP: the cut is per neuron, not per step: the surrogate is kept where keep != 0."""
    K: tl.constexpr = X.shape[0]
    k, Xf, H, V_before = chunk_registers(X)
    DELAYED_GTHR: tl.constexpr = NEED_GTHR and RESET == 3  # its threshold term reads s[t-1], from v[t-1]
    for j in tl.static_range(K):
        sel = (k == j)[:, None]
        h = charge(d * v + row(Xf, sel), v, threshold, RESET)
        H = tl.where(sel, h[None, :], H)
        if NEED_GD or DELAYED_GTHR:
            V_before = tl.where(sel, v[None, :], V_before)
        v = reset_potential(h, fires(h - threshold, RESET), threshold, v_reset, RESET)
    GSf = GS.to(tl.float32)
    GX = tl.zeros(X.shape, tl.float32)
    for jj in tl.static_range(K):
        j = K - 1 - jj
        sel = (k == j)[:, None]
        h = row(H, sel)
        u = h - threshold
        fired = fires(u, RESET)
        sg = cut_surrogate(lif_surrogate_grad(u, SURROGATE, alpha, CUSTOM_FN), h, keep, grad_floor, KEEP)
        gs = row(GSf, sel)
        reset_threshold = threshold  # what s[t]'s reset subtracts
        if RESET == 3 and not DETACH:  # ...from h[t+1]: s[T-1] reaches nothing (no 0 * an infinite threshold)
            reset_threshold = tl.where(t0 + j + 1 < T, threshold, 0.0)
        if NEED_GTHR:  # (before gv moves on: it is dL/dv[t] here)
            gt = threshold_grad_step(gs, gp if RESET == 3 else gv, h, fired, sg, reset_threshold, v_reset, RESET,
                                     DETACH)
            gthr += tl.where(t0 + j < T, gt, 0.0) if TAIL else gt
        gh = grad_h(gs, gv, gp, h, fired, sg, reset_threshold, v_reset, RESET, DETACH)
        if HAS_GH:
            gh += row(GH.to(tl.float32), sel)
        if TAIL:  # steps past T carry no gradient
            gh = tl.where(t0 + j < T, gh, 0.0)
            gv = tl.where(t0 + j < T, gh * d, gv)
        else:
            gv = gh * d
        gp = gh
        if DELAYED_GTHR:  # h[t] = ... - threshold * s[t-1]: -dL/dh[t] * s[t-1] (past T, s[t-1] may be NaN: 0 * NaN)
            u_before = row(V_before, sel) - threshold
            delayed = gh * spike_value(u_before, fires(u_before, RESET))
            gthr -= tl.where(t0 + j < T, delayed, 0.0) if TAIL else delayed
        if NEED_GD:  # dL/d decay += dL/dh[t] * v[t-1] (past T, v is the last step's: 0 * inf would be NaN)
            gd += tl.where(t0 + j < T, gh * row(V_before, sel), 0.0) if TAIL else gh * row(V_before, sel)
        GX = tl.where(sel, gh[None, :], GX)
    return GX, gv, gp, gd, gthr


@cached_launch
@triton.jit
def _lif_backward_kernel(
    gs_ptr, x_ptr, ckpt_ptr, gvT_ptr, gx_ptr, gv0_ptr, gd_ptr, decay_ptr, gh_ptr, thr_ptr, gthr_ptr, keep_ptr,
    decay, threshold, v_reset, alpha, grad_floor, T, N, inner, C, KEEP_N,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, CUSTOM_FN: tl.constexpr,
    DECAY: tl.constexpr, THRESHOLD: tl.constexpr, HAS_GVT: tl.constexpr, NEED_GV0: tl.constexpr,
    NEED_GD: tl.constexpr, HAS_GH: tl.constexpr, NEED_GTHR: tl.constexpr, KEEP: tl.constexpr, BLOCK: tl.constexpr,
    K: tl.constexpr, EVEN_N: tl.constexpr,
):
    """KEEP: keep_ptr holds KEEP_N flags, neuron n reading flag n % KEEP_N (KEEP_N = N: one
    per neuron; N / B: one per position, shared by the batch)."""
    decay, threshold, v_reset, alpha = f32(decay), f32(threshold), f32(v_reset), f32(alpha)
    grad_floor = f32(grad_floor)
    n = program_neurons(BLOCK)
    n_mask = n < N
    d = load_per_neuron(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    threshold = load_per_neuron(thr_ptr, threshold, n, n_mask, inner, C, THRESHOLD)
    if HAS_GVT:  # dL/dv[T-1] when the final state was used downstream
        gv = tl.load(gvT_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        gv = tl.zeros([BLOCK], tl.float32)
    gd = tl.zeros([BLOCK], tl.float32)
    gthr = tl.zeros([BLOCK], tl.float32)
    gp = gthr  # dL/dh[t+1]: none after the last step
    keep = gthr
    if KEEP:
        keep = tl.load(keep_ptr + n % KEEP_N, mask=n_mask, other=0.0)
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    last = tl.cdiv(T, K) - 1
    X = load_chunk(x_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GS = load_chunk(gs_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GH = GS  # stands in (unread) unless HAS_GH
    if HAS_GH:
        GH = load_chunk(gh_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    v = tl.load(ckpt_ptr + tl.cast(last, tl.int64) * N + n, mask=n_mask, other=0.0)
    for i in range(0, last + 1):  # one reverse walk, every chunk in the TAIL form (compiled once)
        c = last - i
        t0 = c * K
        # prefetch the chunk before (nothing is read when c == 0)
        X_prev, GS_prev, GH_prev = load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, t0 - K, offs, n_mask, N, EVEN_N,
                                                           HAS_GH)
        v_prev = tl.load(ckpt_ptr + tl.cast(tl.maximum(c - 1, 0), tl.int64) * N + n, mask=n_mask, other=0.0)
        GX, gv, gp, gd, gthr = backward_chunk(X, GS, v, gv, gp, gd, gthr, d, t0, T, threshold, v_reset, alpha,
                                              grad_floor, keep, RESET, DETACH, SURROGATE, CUSTOM_FN, NEED_GD, True,
                                              GH, HAS_GH, NEED_GTHR, KEEP)
        store_chunk(gx_ptr, t0, offs, k, n_mask, T, N, GX, EVEN_N)
        X, GS, GH, v = X_prev, GS_prev, GH_prev, v_prev
    if RESET == 3 and not DETACH:  # s[-1] = H(v0 - threshold) (v: the first checkpoint) resets step 0
        u0 = v - threshold
        g0 = spike_adjoint(0.0, gp, -threshold, RESET, DETACH) * cut_surrogate(
            lif_surrogate_grad(u0, SURROGATE, alpha, CUSTOM_FN), v, keep, grad_floor, KEEP)
        gv += g0
        gthr -= g0
    if NEED_GV0:
        tl.store(gv0_ptr + n, gv, mask=n_mask)
    if NEED_GD:
        tl.store(gd_ptr + n, gd, mask=n_mask)
    if NEED_GTHR:
        tl.store(gthr_ptr + n, gthr, mask=n_mask)


# The neuron dimension is always masked: an unmasked variant for N % BLOCK == 0 measured no
# faster (H200, the IPU SHD net's layers: forward 18.5 against 21.0 us, backward equal;
# benchmarks/kernel_variants.py) and cost a compile more per kernel from a cold cache (issue 38).
EVEN_N = False

# Under background compiles from a cold Triton cache, training steps run kernels of chunk length
# QUICK_K while compiles are in flight: they compile in about a third of the time (one step per
# chunk, no unrolled chunk body: 0.75 + 0.72 s against 2.1 + 3.1 s at K=16 on a 2-core CPU,
# benchmarks/results/compile-time-lif-by-k-cpu.md) and replace the torch twin (~10x the GPU time,
# and a torch op per step that waits for the GIL the compile threads hold). The tuned kernels are
# sent to compile once a quick one runs: fewer compiles at once. A quick forward's checkpoints, one
# per step, serve the tuned backward too (every K-th).
QUICK_K = 1

# The host side runs once per layer per step, next to kernels of ~0.1 ms, so it avoids
# views and reshapes: every tensor is allocated in its final shape (the kernels see
# contiguous memory as [T, N]).

def _forward(x, decay, decay_tensor, v0, threshold, reset, v_reset, save, want_state=True,
             launch=EAGER, want_h=False, threshold_tensor=None, grad_threshold=float("-inf"), grad_scope="step",
             bits=None, k=None):
    """spikes like x, v[T-1] (float32, None unless `want_state`) and, if `save`,
    (contiguous x, checkpoints) for backward; with `want_h` the pre-reset potential trace
    h (x's dtype) follows as a fifth value. threshold_tensor (float32, one value or one per
    channel) stands in for the float threshold when given. A per-neuron cut (grad_scope other
    than "step") adds a row of flags after the checkpoints (tracks_cut). bits (uint8, T * N / 8,
    N % 8 == 0: spike_bits_buffer): filled with the spikes packed, as spike_pack.pack would.
    k: the chunk length, if not the tuned one (QUICK_K)."""
    x, T, N, BLOCK, K, warps = time_major(x)
    K = k or K
    spikes = torch.empty_like(x)
    vT = state_buffer(x, want_state)
    track = save and tracks_cut(grad_threshold, grad_scope)
    ckpt = torch.empty((cdiv(T, K) + track if save else 0, N), device=x.device, dtype=torch.float32)
    C, inner = channel_layout(x.shape, decay_tensor, threshold_tensor)
    h = torch.empty_like(x) if want_h else None
    if N > 0:
        unused = launch.unused(x)
        launch(_lif_forward_kernel)[(cdiv(N, BLOCK),)](
            x, spikes, ckpt, v0.contiguous() if v0 is not None else unused, vT if want_state else unused,
            decay_tensor if decay_tensor is not None else unused, h if want_h else unused,
            threshold_tensor if threshold_tensor is not None else unused, bits if bits is not None else unused,
            decay, threshold, v_reset, grad_threshold if track else 0.0, T, N, inner, C,
            RESET=reset_code(reset), DECAY=param_mode(decay_tensor), THRESHOLD=param_mode(threshold_tensor),
            HAS_V0=v0 is not None, SAVE_CKPT=save, STORE_VT=want_state, STORE_H=want_h, TRACK=track,
            BITS=bits is not None, BLOCK=BLOCK, K=K, EVEN_N=EVEN_N, num_warps=warps,
            enable_fp_fusion=False)
    if want_h:
        return spikes, vT, x, ckpt, h
    return spikes, vT, x, ckpt


def spike_bits_buffer(x: torch.Tensor) -> torch.Tensor | None:
    """Room for the spikes as bits (spike_pack's layout) when gradients are on and each step's
    N neurons fill whole bytes: a spiking conv or linear that reads these spikes then saves the
    kernel's bits (spike_pack.attached_bits) instead of packing them in a pass of its own (issue 34:
    0.06 ms a layer at the IPU SHD net's batch 256 on an H100). The kernel writes 1/32 of the
    spikes' bytes more; unused, they live as long as the spikes."""
    if not torch.is_grad_enabled() or x.dim() == 0 or x.shape[0] == 0:
        return None
    N = x.numel() // x.shape[0]
    return x.new_empty(x.numel() // 8, dtype=torch.uint8) if N % 8 == 0 else None


def tracks_cut(grad_threshold, grad_scope):
    """Whether the forward notes which neurons reached grad_threshold (a per-neuron cut)."""
    return grad_scope != "step" and grad_threshold > float("-inf")


def keep_flags(ckpt, x, grad_threshold, grad_scope):
    """The backward's per-neuron flags (float32, nonzero: keep the surrogate) from the row
    _forward wrote after the checkpoints: one per neuron ("sequence"), or reduced over the
    batch (dim 1 of x) to one per position ("batch"). None for a per-step cut."""
    if not tracks_cut(grad_threshold, grad_scope) or ckpt.shape[1] == 0:
        return None
    reached = ckpt[-1]
    if grad_scope == "batch" and x.dim() >= 2 and x.shape[1] > 1:
        reached = reached.view(x.shape[1], -1).amax(0)
    return reached


def _backward(grad_s, grad_vT, x, ckpt, decay, decay_tensor, threshold, reset,
              v_reset, detach, surrogate, alpha, need_gv0, need_gd, grad_threshold=float("-inf"),
              launch=EAGER, grad_h=None, threshold_tensor=None, need_gthr=False, grad_scope="step", k=None):
    """grad_x like x, and float32 dL/dv0 (shaped like x[0]), per-neuron dL/d(decay) and
    dL/d(threshold_tensor) partial sums (summed over time), or None. x is the contiguous input
    saved by _forward. grad_h: None, or dL/dh for the returned potential trace (shaped like x),
    added to the recurrence's dL/dh. k: the chunk length of ckpt, if not the tuned one."""
    x, T, N, BLOCK, K, warps = time_major(x)
    K = k or K
    keep = keep_flags(ckpt, x, grad_threshold, grad_scope)
    gs = grad_s if grad_s.is_contiguous() else grad_s.contiguous()
    grad_x = torch.empty_like(x)
    gv0 = state_buffer(x, need_gv0)
    gd = torch.empty(N, device=x.device, dtype=torch.float32) if need_gd else None
    gthr = torch.empty(N, device=x.device, dtype=torch.float32) if need_gthr else None
    gvT = grad_vT.contiguous() if grad_vT is not None else None
    gh = grad_h.contiguous() if grad_h is not None else None
    C, inner = channel_layout(x.shape, decay_tensor, threshold_tensor)
    custom = surrogate if isinstance(surrogate, CustomSurrogate) else None  # its Triton twin is a constexpr
    if N > 0:
        unused = launch.unused(gs)
        launch(_lif_backward_kernel)[(cdiv(N, BLOCK),)](
            gs, x, ckpt, gvT if gvT is not None else unused, grad_x,
            gv0 if gv0 is not None else unused, gd if gd is not None else unused,
            decay_tensor if decay_tensor is not None else unused, gh if gh is not None else unused,
            threshold_tensor if threshold_tensor is not None else unused, gthr if gthr is not None else unused,
            keep if keep is not None else unused,
            decay, threshold, v_reset, alpha, grad_threshold, T, N, inner, C, 1 if keep is None else keep.numel(),
            RESET=reset_code(reset), DETACH=detach, SURROGATE=CUSTOM if custom else SURROGATES[surrogate],
            CUSTOM_FN=custom.triton_fn if custom else None,
            DECAY=param_mode(decay_tensor), THRESHOLD=param_mode(threshold_tensor), HAS_GVT=gvT is not None,
            NEED_GV0=need_gv0, NEED_GD=need_gd, HAS_GH=gh is not None, NEED_GTHR=need_gthr, KEEP=keep is not None,
            BLOCK=BLOCK, K=K, EVEN_N=EVEN_N, num_warps=warps, enable_fp_fusion=False)
    return grad_x, gv0, gd, gthr


def _reduce_per_channel(partials, x_shape, param):
    """Per-neuron partial sums [N] -> the parameter's shape (one value, or one per channel)."""
    if param.numel() == 1:
        return partials.sum().reshape(param.shape)
    return partials.view(x_shape[1], x_shape[2], math.prod(x_shape[3:])).sum(dim=(0, 2))  # no -1: B may be 0


class LIFFunction(torch.autograd.Function):
    """The eager path: a plain autograd.Function costs ~20 us of Python per call, against
    ~125 us for a torch.library custom op, which matters next to kernels of ~100 us. The
    non-tensor options travel as one tuple (autograd handles every input of apply on each
    call), and v[T-1] and the potential trace h are outputs only when asked for
    (options[-2:]: return_state, return_potential; the outputs are spikes, [h], [v[T-1]])."""

    @staticmethod
    def forward(ctx, x, decay_tensor, v0, threshold_tensor, bits, options):
        decay, threshold, reset, v_reset, detach, surrogate, alpha, grad_threshold, grad_scope, want_state, want_h = \
            options
        save = any(ctx.needs_input_grad)
        misses = _lif_forward_kernel.misses

        def run(x, launch=EAGER, bits=bits, k=None):
            return _forward(x, decay, decay_tensor, v0, threshold, reset, v_reset, save, want_state, launch, want_h,
                            threshold_tensor, grad_threshold, grad_scope, bits, k)

        def speculate(k, evaluation=False):
            """Compile this layer's variants of chunk length k (None: tuned) in the background; with
            `evaluation`, also its forward without gradients (tuned), which an evaluation runs."""
            with contextlib.suppress(Exception):  # a guess never fails the forward (tests check the guesses)
                _, _, xm, ckpt_m, *_ = run(meta_like(x), Speculate(x.device.index), meta_like(bits), k)
                _speculate_next(x.device.index, xm, ckpt_m, decay_tensor, v0, threshold_tensor, options,
                                ctx.needs_input_grad, save, k)
                if evaluation:
                    _speculate_next(x.device.index, xm, None, decay_tensor, v0, threshold_tensor, options,
                                    ctx.needs_input_grad, False, None)
        # from a cold cache, training steps run the quick kernels while anything compiles (their checkpoints
        # serve either backward); an evaluation takes its tuned kernel, sent to compile early
        ctx.k = QUICK_K if save and cold_compiles_in_flight() else None
        try:
            spikes, vT, x, ckpt, *h = run(x, k=ctx.k)
        except Compiling:  # (background compiles) the quick forward and backward compile first, then ...
            # with compile processes, the evaluation's forward too: sent with the tuned kernels, once a quick
            # one ran, it was still compiling at a cold IPU SHD net's first evaluation (0.22 s on the twins)
            speculate(QUICK_K, evaluation=compiles_in_processes())
            if ctx.k is not None:
                raise
            spikes, vT, x, ckpt, *h = run(x, k=QUICK_K)  # (Compiling while it compiles)
            ctx.k = QUICK_K
        if _lif_forward_kernel.misses != misses and speculation_enabled():  # a new variant: more will follow
            speculate(None)  # ... the tuned ones, once a quick one runs: fewer compiles at once (the GIL)
        if save:
            ctx.save_for_backward(x, ckpt, decay_tensor, v0, threshold_tensor)
            ctx.options = options[:-2]
            ctx.want = (want_h, want_state)
        out = (spikes, *h) + ((vT,) if want_state else ())
        return out if len(out) > 1 else spikes

    @staticmethod
    def backward(ctx, grad_s, *grads):
        x, ckpt, decay_tensor, v0, threshold_tensor = ctx.saved_tensors
        decay, *options, grad_threshold, grad_scope = ctx.options
        grads = iter(grads)
        grad_h = next(grads) if ctx.want[0] else None
        grad_vT = next(grads) if ctx.want[1] else None
        if torch.is_grad_enabled():  # create_graph=True: this backward will be differentiated
            return (*reference_grads(x, decay, decay_tensor, v0, grad_s, grad_vT, options, ctx.needs_input_grad[:4],
                                     grad_threshold, grad_h, threshold_tensor, grad_scope), None, None)

        def run(grad_s, need_gv0, need_gd, need_gthr, ckpt=ckpt, k=None):
            return _backward(grad_s, grad_vT, x, ckpt, decay, decay_tensor, *options, need_gv0, need_gd,
                             grad_threshold, grad_h=grad_h, threshold_tensor=threshold_tensor, need_gthr=need_gthr,
                             grad_scope=grad_scope, k=k)

        def grads_by(run_backward):
            return _input_grads(run_backward, grad_s, x, decay_tensor, v0, threshold_tensor, ctx.needs_input_grad[1:4])

        def fused():
            if ctx.k is None:
                return grads_by(run)
            try:  # after a quick forward: the tuned kernel on every K-th checkpoint, else the quick one
                return grads_by(functools.partial(run, ckpt=_every_kth_checkpoint(ckpt, x, grad_threshold, grad_scope)))
            except Compiling:
                return grads_by(functools.partial(run, k=ctx.k))

        def fallback():  # the kernel is compiling (background compiles): the torch twin's gradients
            if threshold_tensor is None and lif_loop.usable(x, decay_tensor, v0, any_device=True):
                return (*lif_loop.recomputed_grads(x, decay_tensor, v0, grad_s, grad_vT, grad_h,
                                                   (decay, *options, grad_threshold), grad_scope,
                                                   ctx.needs_input_grad[:3]), None)
            grads = reference_grads(x, decay, decay_tensor, v0, grad_s, grad_vT, options, ctx.needs_input_grad[:4],
                                    grad_threshold, grad_h, threshold_tensor, grad_scope)
            return tuple(None if g is None else g.detach() for g in grads)
        grads = fused_or(fused, fallback)
        return (*grads, None, None)


def _every_kth_checkpoint(ckpt, x, grad_threshold, grad_scope):
    """A quick (K = 1) forward's checkpoints, one per step, as the tuned kernels' (one per chunk of
    their K steps), with the cut's flags row after them."""
    x, T, _, _, K, _ = time_major(x)
    if not tracks_cut(grad_threshold, grad_scope):
        return ckpt[::K].contiguous()
    return torch.cat((ckpt[:T:K], ckpt[T:]))


def _speculate_next(device, x, ckpt, decay_tensor, v0, threshold_tensor, options, needs, save, k=None):
    """After a forward that compiled a new variant: compile in the background (launch.py's
    speculative compiles) what this layer will likely launch next on CUDA device `device` (x
    may be a meta tensor already, whose device says nothing): its backward, when the forward
    saved for one (no final-state or potential gradient, the common case), and its forward
    without gradients (an evaluation's; not for a quick chunk length `k`, which only training steps
    run while the tuned kernels compile). The host functions run on meta tensors."""
    decay, threshold, reset, v_reset, detach, surrogate, alpha, grad_threshold, grad_scope, want_state, want_h = \
        options

    launch, xm = Speculate(device), meta_like(x)
    decay_m, threshold_m = meta_like(decay_tensor), meta_like(threshold_tensor)
    if save:
        _backward(torch.empty_like(xm), None, xm, meta_like(ckpt), decay, decay_m, threshold, reset, v_reset, detach,
                  surrogate, alpha, v0 is not None and needs[2], decay_tensor is not None and needs[1],
                  grad_threshold, launch=launch, threshold_tensor=threshold_m,
                  need_gthr=threshold_tensor is not None and needs[3], grad_scope=grad_scope, k=k)
    if k is None:
        _forward(xm, decay, decay_m, meta_like(v0), threshold, reset, v_reset, False, want_state, launch=launch,
                 want_h=want_h, threshold_tensor=threshold_m, grad_threshold=grad_threshold, grad_scope=grad_scope)


def _input_grads(run_backward, grad_s, x, decay_tensor, v0, threshold_tensor, needs):
    """(grad_x, grad_decay, grad_v0, grad_threshold) for either autograd path; run_backward
    runs the backward kernel for grad_s and says which of dL/dv0, dL/d(decay), dL/d(threshold)
    to compute. needs: whether decay_tensor, v0, threshold_tensor need a gradient."""
    decay_needs_grad, v0_needs_grad, threshold_needs_grad = needs
    need_gd = decay_tensor is not None and decay_needs_grad
    need_gv0 = v0 is not None and v0_needs_grad
    need_gthr = threshold_tensor is not None and threshold_needs_grad
    if grad_s is None:  # only the final state was used
        grad_s = torch.zeros_like(x)
    gx, gv0, gd, gthr = run_backward(grad_s, need_gv0, need_gd, need_gthr)
    grad_decay = _reduce_per_channel(gd, x.shape, decay_tensor) if need_gd else None
    grad_v0 = gv0.view(v0.shape).to(v0.dtype) if need_gv0 else None
    grad_thr = _reduce_per_channel(gthr, x.shape, threshold_tensor) if need_gthr else None
    return gx, grad_decay, grad_v0, grad_thr


def reference_grads(x, decay, decay_tensor, v0, grad_s, grad_vT, options, needs,
                    grad_threshold=float("-inf"), grad_h=None, threshold_tensor=None, grad_scope="step"):
    """(grad_x, grad_decay, grad_v0, the threshold tensor's gradient) for a backward that will itself be
    differentiated (create_graph=True): the backward kernel's output carries no graph, so the
    forward is run again through spikefuse.reference (in float32, spike for spike the kernel's)
    from the saved inputs and differentiated with create_graph: second derivatives are the
    reference's. needs: ctx.needs_input_grad for (x, decay_tensor, v0, threshold_tensor)."""
    from .. import reference

    threshold, reset, v_reset, detach, surrogate, alpha = options
    inputs = (x, decay_tensor, v0, threshold_tensor)

    def per_channel(t):  # [1] or [C] -> broadcastable to x[0] ([B, C, *])
        return t.reshape((-1,) + (1,) * max(x.dim() - 3, 0)) if t.numel() > 1 else t
    if decay_tensor is not None:
        decay = per_channel(decay_tensor)
    if threshold_tensor is not None:
        threshold = per_channel(threshold_tensor)
    with torch.enable_grad():
        spikes, h, vT = reference.lif(x.float(), decay, threshold, reset, v_reset, detach, surrogate, alpha,
                                      None if v0 is None else v0.float(), return_state=True,
                                      grad_threshold=grad_threshold, return_potential=True, grad_scope=grad_scope)
        return grads_with_graph((spikes, h, vT), (grad_s, grad_h, grad_vT), inputs, needs)


# ---- torch.library registration: what torch.compile sees (an op with autograd that
# inductor decomposes into launches of the Triton kernels it then makes itself) ----

@torch.library.triton_op("spikefuse::lif_forward", mutates_args=())
def lif_forward(x: torch.Tensor, decay: float, decay_tensor: torch.Tensor | None,
                v0: torch.Tensor | None, threshold: float, reset: str, v_reset: float,
                detach: bool, surrogate: str, alpha: float, save: bool,
                grad_threshold: float | None = None, threshold_tensor: torch.Tensor | None = None,
                grad_scope: str = "step") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Spikes, v[T-1] (float32) and the checkpoints (empty unless `save`).
    detach, surrogate, alpha and grad_threshold are only used by the backward; None stands
    for -inf (no cut), which a schema default cannot spell. threshold_tensor (float32, one
    value or one per channel) replaces the float threshold when given. (A triton_op's body is
    also its fake kernel: only torch ops, launches and Python on shapes.)"""
    spikes, vT, _, ckpt = _forward(x, decay, decay_tensor, v0, threshold, reset, v_reset, save,
                                   launch=TRACED, threshold_tensor=threshold_tensor,
                                   grad_threshold=float("-inf") if grad_threshold is None else grad_threshold,
                                   grad_scope=grad_scope)
    return spikes, vT, ckpt


@torch.library.triton_op("spikefuse::lif_backward", mutates_args=())
def lif_backward(grad_s: torch.Tensor, grad_vT: torch.Tensor | None, x: torch.Tensor,
                 ckpt: torch.Tensor, decay: float, decay_tensor: torch.Tensor | None,
                 threshold: float, reset: str, v_reset: float, detach: bool, surrogate: str,
                 alpha: float, need_gv0: bool, need_gd: bool, grad_threshold: float | None = None,
                 threshold_tensor: torch.Tensor | None = None, need_gthr: bool = False, grad_scope: str = "step"
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """grad_x, and per-neuron dL/dv0, dL/d(decay) and dL/d(threshold) partial sums (empty if
    not needed)."""
    gx, gv0, gd, gthr = _backward(grad_s, grad_vT, x.contiguous(), ckpt, decay, decay_tensor, threshold,
                                  reset, v_reset, detach, surrogate, alpha, need_gv0, need_gd,
                                  float("-inf") if grad_threshold is None else grad_threshold, launch=TRACED,
                                  threshold_tensor=threshold_tensor, need_gthr=need_gthr, grad_scope=grad_scope)
    return gx, or_empty(gv0, x), or_empty(gd, x), or_empty(gthr, x)


def _setup_context(ctx, inputs, output):
    (x, decay, decay_tensor, v0, threshold, reset, v_reset, detach, surrogate, alpha, _, grad_threshold,
     threshold_tensor, grad_scope) = inputs
    ctx.save_for_backward(x, output[2], decay_tensor, v0, threshold_tensor)
    ctx.options = (decay, threshold, reset, v_reset, detach, surrogate, alpha,
                   float("-inf") if grad_threshold is None else grad_threshold, grad_scope)


def _backward_rule(ctx, grad_s, grad_vT, _grad_ckpt):
    x, ckpt, decay_tensor, v0, threshold_tensor = ctx.saved_tensors
    decay, *options, grad_threshold, grad_scope = ctx.options
    # decay_tensor, v0, threshold_tensor (a trailing default: needs_input_grad ends before it when not passed)
    needs = (*ctx.needs_input_grad[2:4], any(ctx.needs_input_grad[12:13]))
    if torch.is_grad_enabled():  # create_graph=True (AOT autograd traces backward without it)
        gx, grad_decay, grad_v0, grad_thr = reference_grads(
            x, decay, decay_tensor, v0, grad_s, grad_vT, options, (ctx.needs_input_grad[0], *needs),
            grad_threshold, threshold_tensor=threshold_tensor, grad_scope=grad_scope)
    else:
        def run(grad_s, need_gv0, need_gd, need_gthr):
            return lif_backward(grad_s, grad_vT, x, ckpt, decay, decay_tensor, *options, need_gv0, need_gd,
                                grad_threshold, threshold_tensor, need_gthr, grad_scope)
        gx, grad_decay, grad_v0, grad_thr = _input_grads(run, grad_s, x, decay_tensor, v0, threshold_tensor, needs)
    return (gx, None, grad_decay, grad_v0) + (None,) * 8 + (grad_thr, None)


lif_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def pads_stay_silent(decay_tensor, v0, threshold_tensor, options, return_state, return_potential) -> bool:
    """Whether a LIF may run on the padded buffer behind its input (padded_rows): with one
    float threshold > 0 and decay, from zero potential, a pad column's neuron (zero input)
    never fires and passes back a zero gradient; no per-neuron parameter or state to widen."""
    return (decay_tensor is None and v0 is None and threshold_tensor is None and options.threshold > 0
            and not return_state and not return_potential)


def _lif_on_padded(full, width, flat):
    """The LIF over the padded buffer `full` [..., P]: its spikes' first `width` columns, a view
    with the padded spikes (and their bits) attached for the next layer. Autograd links the
    spikes to `full` itself, so the gradient reaches its producer padded, without a copy."""
    x = full if torch.is_grad_enabled() else full.detach()
    bits = spike_bits_buffer(x)
    spikes = LIFFunction.apply(x, None, None, None, bits, flat)
    if bits is not None:
        attach_bits(spikes, bits)
    return padded_rows.attach(spikes[..., :width], spikes)


def lif_fused(x, decay, decay_tensor, options, v0, return_state, return_potential=False, threshold_tensor=None):
    """Entry point for spikefuse.functional (arguments already checked there; `options` a
    spikefuse.neuron_options.NeuronOptions).
    return_potential (eager only: spikefuse.functional sends it to the reference while dynamo
    traces): the forward kernel also writes h, and the backward adds dL/dh into its recurrence.
    threshold_tensor: a learnable threshold ([1] or [C]; `threshold` is then ignored), read
    per neuron by the kernels, its gradient summed over time in the backward kernel."""
    if decay_tensor is not None:
        decay_tensor = decay_tensor.float()
    if threshold_tensor is not None:
        threshold_tensor = threshold_tensor.float()
    common = options.common()  # threshold ... alpha, flat: the op schemas take primitives
    if not torch.compiler.is_dynamo_compiling():
        flat = (decay, *common, options.grad_threshold, options.grad_scope, return_state, bool(return_potential))
        full = padded_rows.padded_full(x)
        if full is not None and pads_stay_silent(decay_tensor, v0, threshold_tensor, options, return_state,
                                                 return_potential):
            return _lif_on_padded(full, x.shape[-1], flat)
        if not x.is_contiguous():  # copied here, not inside: the x saved for backward keeps its graph
            x = x.contiguous()     # (a double backward differentiates through it)
        if not torch.is_grad_enabled():  # no graph is recorded, so nothing is saved for a backward (an
            # autograd.Function's needs_input_grad ignores no_grad: a PLIF's decay would write checkpoints)
            x, decay_tensor, v0, threshold_tensor = (t if t is None else t.detach()
                                                     for t in (x, decay_tensor, v0, threshold_tensor))
        bits = spike_bits_buffer(x)
        out = LIFFunction.apply(x, decay_tensor, v0, threshold_tensor, bits, flat)
        if bits is not None:
            attach_bits(out[0] if isinstance(out, tuple) else out, bits)
        return out
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, decay_tensor, v0, threshold_tensor))
    spikes, vT, _ = lif_forward(x, decay, decay_tensor, v0, *common, wants_grad, options.grad_threshold,
                                threshold_tensor, options.grad_scope)
    return (spikes, vT) if return_state else spikes
