"""Adam on the nonzero rows of a gradient only (lazy Adam, torch.optim.SparseAdam's rule on
a dense gradient): rows whose gradient is all zero keep their parameters and moments.

A sparse backward (spikefuse.ops.sparse_linear) leaves most rows of a large weight's
gradient zero; dense Adam still reads and writes 7 floats per parameter. Here the nonzero
rows are listed on the device (spikefuse.ops.spike_index; or taken from the sparse
backward's note of the rows it wrote, spikefuse.ops.grad_rows, then checked for all-zero
rows by a short pass over just those rows) and one launch updates just them, its loop
running to the device-side count, so a CUDA graph captures it. The step counter
and the learning rate may be device tensors (capturable, like torch's Adam).

For a row that is updated the arithmetic is torch.optim.Adam's (amsgrad off, no weight
decay): m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
"""
from __future__ import annotations

import math

import torch

from .launch import cached_launch
from .spike_index import nonzero_lines
from .triton_or_stub import tl, triton

PROGRAMS = 1024  # each walks every PROGRAMS-th work item


@cached_launch
@triton.jit
def _listed_rows_nonzero_kernel(g_ptr, rows_ptr, count_ptr, flags_ptr, COLS, STRIDE, BLOCK: tl.constexpr):
    """flags[k] = 1 where the listed row rows[k] (k < count) of g holds a nonzero (a NaN counts,
    as in nonzero_rows), else 0."""
    n = tl.load(count_ptr)
    for k in range(tl.program_id(0), n, STRIDE):
        base = tl.load(rows_ptr + k).to(tl.int64) * COLS
        nonzeros = 0
        for c0 in range(0, COLS, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            g = tl.load(g_ptr + base + cols, mask=cols < COLS, other=0.0)
            nonzeros += tl.sum((g != 0).to(tl.int32), 0)
        tl.store(flags_ptr + k, (nonzeros > 0).to(tl.int8))


@triton.jit
def _one_minus_power(step, log_beta):
    """1 - beta**step from log(beta) (computed in float64 on the host): a series where it is
    small, since 1 - exp(x) near x = 0 loses its digits to cancellation (with the GPU's fast
    exp and log of beta, the step-1 updates were 3.6e-5 off torch Adam's, relative)."""
    x = step * log_beta
    series = -x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x / 120.0))))
    return tl.where(x > -0.1, series, 1.0 - tl.exp(x))


@cached_launch
@triton.jit
def _lazy_adam_kernel(p_ptr, g_ptr, m_ptr, v_ptr, rows_ptr, count_ptr, flags_ptr, step_ptr, lr_ptr, lr,
                      beta1, beta2, log_beta1, log_beta2, eps, COLS, COL_BLOCKS, STRIDE, LR_TENSOR: tl.constexpr,
                      CHECK_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Update rows[k] for k < count. A work item is one listed row's block of BLOCK columns,
    and the programs stride over the items, so that a few listed rows of a wide layer still
    spread over the whole GPU. CHECK_ROWS: skip the rows whose flags[k] is 0 (listed as
    candidates, but their gradient is all zero)."""
    beta1, beta2, eps = tl.cast(beta1, tl.float32), tl.cast(beta2, tl.float32), tl.cast(eps, tl.float32)
    log_beta1, log_beta2 = tl.cast(log_beta1, tl.float32), tl.cast(log_beta2, tl.float32)
    step = tl.load(step_ptr)
    if LR_TENSOR:
        lr = tl.load(lr_ptr).to(tl.float32)
    else:
        lr = tl.cast(lr, tl.float32)
    step_size = lr / _one_minus_power(step, log_beta1)
    bias2_sqrt = tl.sqrt(_one_minus_power(step, log_beta2))
    items = tl.load(count_ptr) * COL_BLOCKS
    for item in range(tl.program_id(0), items, STRIDE):
        k = item // COL_BLOCKS
        cols = (item % COL_BLOCKS) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < COLS
        if CHECK_ROWS:
            mask = mask & (tl.broadcast_to(tl.load(flags_ptr + k), [BLOCK]) != 0)
        offs = tl.load(rows_ptr + k).to(tl.int64) * COLS + cols
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = m + (1.0 - beta1) * (g - m)  # torch's lerp
        v = beta2 * v + (1.0 - beta2) * g * g
        p = p - step_size * m / (tl.sqrt(v) / bias2_sqrt + eps)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)


def nonzero_rows(grad2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [R] int32, count [1] int32): the rows of grad2 [R, C] with any nonzero."""
    return nonzero_lines(grad2, over=1)


def _log(beta: float) -> float:
    return math.log(beta) if beta > 0 else -math.inf


def lazy_adam_step_reference(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps):
    """The same update in plain torch (where Triton does not run: a CPU without the
    interpreter), on the rows of grad with a nonzero."""
    p2 = param.view(param.shape[0], -1) if param.dim() > 1 else param.view(1, -1)
    g2, m2, v2 = grad.view(p2.shape).float(), exp_avg.view(p2.shape), exp_avg_sq.view(p2.shape)
    rows = g2.ne(0).any(1)
    g, m, v = g2[rows], m2[rows], v2[rows]
    m = m + (1.0 - beta1) * (g - m)
    v = beta2 * v + (1.0 - beta2) * g * g
    step = step.double()
    step_size = lr / -torch.expm1(step * _log(beta1))
    bias2_sqrt = (-torch.expm1(step * _log(beta2))).sqrt()
    p2[rows] = (p2[rows].float() - (step_size * m / (v.sqrt() / bias2_sqrt + eps)).float()).to(p2.dtype)
    m2[rows], v2[rows] = m, v


def lazy_adam_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, candidates=None):
    """One lazy Adam update in place; all tensors contiguous, `step` a float32 device
    tensor already counting this step, `lr` a float or a device tensor. candidates:
    (rows, count), a list that holds every nonzero row of grad (spikefuse.ops.grad_rows),
    instead of searching grad for them."""
    p2 = param.view(param.shape[0], -1) if param.dim() > 1 else param.view(1, -1)
    g2 = grad.view(p2.shape)
    rows, count = nonzero_rows(g2) if candidates is None else candidates
    R, C = p2.shape
    if R == 0 or C == 0:
        return
    lr_tensor = isinstance(lr, torch.Tensor)
    block = min(1024, triton.next_power_of_2(C))
    col_blocks = triton.cdiv(C, block)
    check_rows = candidates is not None
    flags = torch.empty(rows.numel() if check_rows else 0, device=p2.device, dtype=torch.int8)
    if check_rows:
        programs = min(R, PROGRAMS)
        _listed_rows_nonzero_kernel[(programs,)](g2, rows, count, flags, C, programs, BLOCK=block)
    programs = min(R * col_blocks, PROGRAMS)
    _lazy_adam_kernel[(programs,)](p2, g2, exp_avg, exp_avg_sq, rows, count, flags if check_rows else rows, step,
                                   lr if lr_tensor else step, 0.0 if lr_tensor else float(lr),
                                   beta1, beta2, _log(beta1), _log(beta2), eps, C, col_blocks, programs,
                                   LR_TENSOR=lr_tensor,
                                   CHECK_ROWS=check_rows, BLOCK=block)
