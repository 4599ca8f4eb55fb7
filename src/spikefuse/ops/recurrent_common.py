"""What the recurrent neurons' fused ops share (spikefuse.ops.recurrent_lif, its sparse path
spikefuse.ops.sparse_recurrent_lif, and spikefuse.ops.recurrent_alif): a step's tile of
(row, neuron), the charge h = decay*v + x[t] + s[t-1] @ W^T accumulated in registers, the
fire-and-store epilogue, the incoming gradients of a reverse step and the reverse step of
the recurrent LIF itself, the tile sizes, and dL/dW as one GEMM (the TF32 choice is
kernel_base.tf32_matmuls). The equations are in spikefuse.ops.recurrent_lif's docstring."""
from __future__ import annotations

from .kernel_base import f32, grad_h, reset_potential, spike_value, surrogate_grad
from .launch import cached_launch
from .triton_or_stub import tl, triton


@triton.jit
def _accumulate(a_ptr, a_rows, b_ptr, stride_bk, stride_bn, cols, M, N, acc,
                BLOCK_K: tl.constexpr, TF32: tl.constexpr):
    """acc + A[rows, :] @ B[:, cols] over the N inner indices; A is [M, N] contiguous,
    B is addressed through its strides."""
    for k0 in range(0, N, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] * N + k[None, :],
                    mask=(a_rows < M)[:, None] & (k < N)[None, :], other=0.0).to(tl.float32)
        b = tl.load(b_ptr + k[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(k < N)[:, None] & (cols < N)[None, :], other=0.0).to(tl.float32)
        if TF32:
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@triton.jit
def step_tile(step, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's [BLOCK_M, BLOCK_N] tile of (row, neuron): its rows, columns, mask and
    offsets within one step [M, N], and step `step`'s offset in a [T, M, N] tensor."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return rows, cols, mask, rows[:, None] * N + cols[None, :], tl.cast(step, tl.int64) * M * N


@triton.jit
def charge(x_ptr, w_ptr, v_ptr, s_ptr, now, rows, cols, offs, mask, d, M, N, stride_wn, stride_wk,
           FIRST: tl.constexpr, TF32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr):
    """h[t] = decay*v[t-1] + x[t] + s[t-1] @ W^T on this tile (v is the [M, N] buffer, x and s
    the whole [T, M, N] tensors)."""
    x = tl.load(x_ptr + now + offs, mask=mask, other=0.0).to(tl.float32)
    if FIRST:  # v[-1] = 0 and s[-1] = 0
        h = d * tl.zeros([BLOCK_M, BLOCK_N], tl.float32) + x
    else:
        # (s @ W^T)[m, n] = sum_k s[m, k] W[n, k]: B = W^T, B[k, n] at k*stride_wk + n*stride_wn
        recurrent = _accumulate(s_ptr + (now - M * N), rows, w_ptr, stride_wk, stride_wn, cols, M, N,
                                tl.zeros([BLOCK_M, BLOCK_N], tl.float32), BLOCK_K, TF32)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        h = (d * v + x) + recurrent
    return h


@triton.jit
def fire_and_store(h, s_ptr, v_ptr, h_ptr, now, offs, mask, threshold, v_reset, RESET: tl.constexpr,
                   SAVE_H: tl.constexpr):
    """A step's epilogue: spikes and reset potential from h, stored (and h, if SAVE_H); returns
    the spikes (float32). threshold: a number, or a tile of them (the adaptive threshold)."""
    u = h - threshold
    fired = u >= 0.0
    s = spike_value(u, fired)
    tl.store(s_ptr + now + offs, s.to(s_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, reset_potential(h, fired, threshold, v_reset, RESET), mask=mask)
    if SAVE_H:
        tl.store(h_ptr + now + offs, h, mask=mask)
    return s


@triton.jit
def incoming_grads(gs_ptr, gh_ptr, w_ptr, gvT_ptr, now, rows, cols, offs, mask, d, M, N, stride_wn,
                   stride_wk, LAST: tl.constexpr, HAS_GVT: tl.constexpr, RECURRENT: tl.constexpr,
                   TF32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """What reaches step t from outside and from step t+1, on this tile: (dL/ds[t] = grad_s[t]
    + gh[t+1] @ W, dL/dv[t] = decay * gh[t+1]); at LAST the final state's gradient, if any."""
    gh_next_ptr = gh_ptr + (now + M * N)
    gs = tl.load(gs_ptr + now + offs, mask=mask, other=0.0).to(tl.float32)
    if LAST:  # nothing after step T-1 but the final state's gradient
        if HAS_GVT:
            gv = tl.load(gvT_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            gv = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        # (gh[t+1] @ W)[m, k] = sum_n gh[m, n] W[n, k]: B = W, B[n, k] at n*stride_wn + k*stride_wk
        if RECURRENT:
            gs = _accumulate(gh_next_ptr, rows, w_ptr, stride_wn, stride_wk, cols, M, N, gs,
                             BLOCK_K, TF32)
        gv = d * tl.load(gh_next_ptr + offs, mask=mask, other=0.0)
    return gs, gv


@triton.jit
def store_adjoint(gs, gv, h_ptr, gh_ptr, ghx_ptr, now, offs, mask, threshold, v_reset, alpha, grad_floor,
                  RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, HAS_GHX: tl.constexpr):
    """gh[t] = dL/dh[t] from dL/ds[t] (gs) and dL/dv[t] (gv) through the surrogate, cut below
    grad_floor, and the reset (ops.kernel_base.grad_h), plus ghx[t] where a loss is on the
    returned potential trace (HAS_GHX); stored in gh[t]."""
    h = tl.load(h_ptr + now + offs, mask=mask, other=0.0)
    u = h - threshold
    fired = u >= 0.0
    sg = tl.where(h < grad_floor, 0.0, surrogate_grad(u, SURROGATE, alpha))  # NaN h keeps its NaN (as ops.lif)
    gh = grad_h(gs, gv, gv, h, fired, sg, threshold, v_reset, RESET, DETACH)
    if HAS_GHX:
        gh += tl.load(ghx_ptr + now + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(gh_ptr + now + offs, gh, mask=mask)


@cached_launch
@triton.jit
def _rlif_backward_step(
    gs_ptr, w_ptr, h_ptr, gvT_ptr, gh_ptr, ghx_ptr,
    step, decay, threshold, v_reset, alpha, grad_floor, M, N, stride_wn, stride_wk,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, LAST: tl.constexpr,
    HAS_GVT: tl.constexpr, TF32: tl.constexpr, RECURRENT: tl.constexpr, HAS_GHX: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Reverse step `step`: gh[t] from grad_s[t], gh[t+1] (through W and the decay) and h[t].
    RECURRENT=False leaves out the term through W (the sparse path adds it where it matters).
    HAS_GHX: a loss on the returned potential trace adds its gradient ghx[t] to gh[t]."""
    d, threshold, v_reset = f32(decay), f32(threshold), f32(v_reset)
    alpha, grad_floor = f32(alpha), f32(grad_floor)
    rows, cols, mask, offs, now = step_tile(step, M, N, BLOCK_M, BLOCK_N)
    gs, gv = incoming_grads(gs_ptr, gh_ptr, w_ptr, gvT_ptr, now, rows, cols, offs, mask, d, M, N,
                            stride_wn, stride_wk, LAST, HAS_GVT, RECURRENT, TF32, BLOCK_M, BLOCK_N, BLOCK_K)
    store_adjoint(gs, gv, h_ptr, gh_ptr, ghx_ptr, now, offs, mask, threshold, v_reset, alpha, grad_floor,
                  RESET, DETACH, SURROGATE, HAS_GHX)


def _tiles(M, N):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps): tl.dot needs 16 or more per dimension. Small
    tiles keep enough programs busy at small batch (M = 32, N = 1024: 128 programs); on an
    H100 16 x 16 was the best or within 5 % of it at B = 1-32, N = 1024-5888
    (benchmarks/results/tune-rlif-*.txt)."""
    if M <= 64:
        return 16, 16, 32, 4
    return 64, 64, 32, 4


def weight_grad(gh, spikes):
    """dL/dW[n, k] = sum over t >= 1 and rows of gh[t][m, n] * s[t-1][m, k]: one GEMM."""
    N = spikes.shape[-1]
    return gh[1:].reshape(-1, N).t() @ spikes[:-1].reshape(-1, N).float()
