"""Index lists of the nonzeros of each row: what the sparse kernels loop over.

active_indices(x [R, N], capacity) gives idx [R, capacity] (int32, the columns of row r's
nonzeros in increasing order, the unused tail left at 0) and count [R] (int32, the true
number of nonzeros of each row, which may exceed the capacity: then the list holds the
first `capacity` of them and the row has overflowed; the consumer decides what that means
and counts it). One program per row walks it in blocks, a prefix sum placing each
nonzero; counts stay on the device, so nothing waits on the host (CUDA graphs capture it).
A NaN counts as nonzero.
"""
from __future__ import annotations

import torch

from .kernel_base import cdiv
from .launch import cached_launch, fused_or
from .spike_pack import use_triton

from .triton_or_stub import tl, triton

BLOCK = 1024


@cached_launch
@triton.jit
def _active_indices_kernel(x_ptr, idx_ptr, count_ptr, N, stride, capacity, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    total = 0
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        active = (tl.load(x_ptr + r * stride + offs, mask=offs < N, other=0) != 0).to(tl.int32)
        slot = total + tl.cumsum(active, 0) - 1
        tl.store(idx_ptr + r * capacity + slot, offs, mask=(active > 0) & (slot < capacity))
        total += tl.sum(active, 0)
    tl.store(count_ptr + r, total)


def active_indices(x: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx [R, capacity] int32, count [R] int32) of the nonzeros of each row of x [R, N]
    (rows may be strided; columns must be contiguous)."""
    if x.dim() != 2:
        raise ValueError(f"active_indices: x must be [rows, columns], got shape {tuple(x.shape)}")
    if capacity < 1:
        raise ValueError(f"active_indices: capacity must be at least 1, got {capacity}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.contiguous()
    R, N = x.shape
    idx = torch.zeros(R, capacity, device=x.device, dtype=torch.int32)
    count = torch.empty(R, device=x.device, dtype=torch.int32)
    if R > 0:
        _active_indices_kernel[(R,)](x, idx, count, N, x.stride(0), capacity,
                                     BLOCK=min(BLOCK, triton.next_power_of_2(max(N, 16))))
    return idx, count


@cached_launch
@triton.jit
def _line_flags_kernel(x_ptr, flags_ptr, LINES, OTHER, line_stride, other_stride, SPAN,
                       BL: tl.constexpr, BO: tl.constexpr):
    """flags[l] = 1 if x[l * line_stride + o * other_stride] != 0 for some o in this program's
    span of SPAN values of o (flags start at 0; programs only ever store 1, so their order does
    not matter)."""
    line = tl.program_id(0) * BL + tl.arange(0, BL)
    line_mask = line < LINES
    found = tl.zeros([BL], tl.int32)
    start = tl.program_id(1) * SPAN
    for o0 in range(start, tl.minimum(start + SPAN, OTHER), BO):
        o = o0 + tl.arange(0, BO)
        x = tl.load(x_ptr + line.to(tl.int64)[:, None] * line_stride + o.to(tl.int64)[None, :] * other_stride,
                    mask=line_mask[:, None] & (o < OTHER)[None, :], other=0)
        found = tl.maximum(found, tl.max((x != 0).to(tl.int32), axis=1))
    tl.store(flags_ptr + line, tl.full([BL], 1, tl.uint8), mask=line_mask & (found > 0))


def line_flags(x: torch.Tensor, over: int) -> torch.Tensor:
    """uint8 [C] (over=0: the columns of x [R, C]) or [R] (over=1: its rows): 1 where the
    line holds any nonzero (NaN included). One Triton launch that reads x once, where
    `x.ne(0).any(over)` takes an elementwise pass and a reduction."""
    if not use_triton(x):
        return x.ne(0).any(over).view(torch.uint8)
    lines, other = (x.shape[1], x.shape[0]) if over == 0 else x.shape
    line_stride, other_stride = (x.stride(1), x.stride(0)) if over == 0 else x.stride()

    def kernel():
        flags = torch.zeros(lines, device=x.device, dtype=torch.uint8)
        if lines and other:
            # columns: a line block is contiguous and the rows split into spans (a program per
            # block of columns walking all rows left most SMs idle: the IPU x4 net's three scans
            # a step at batch 8 took 37 us on an H100, 28 us in spans);
            # rows: few rows per program, many programs
            bl, bo, span = (128, 16, 64) if over == 0 else (4, 256, other)
            _line_flags_kernel[(cdiv(lines, bl), cdiv(other, span))](x, flags, lines, other, line_stride,
                                                                     other_stride, span, BL=bl, BO=bo)
        return flags
    return fused_or(kernel, lambda: x.ne(0).any(over).view(torch.uint8))  # torch while the kernel compiles


def nonzero_lines(x: torch.Tensor, over: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx int32, count [1] int32) of the columns (over=0) or rows (over=1) of x [R, C]
    that hold any nonzero, in increasing order; idx has room for all of them, so it never
    overflows (its tail past the count is left unwritten)."""
    flags = line_flags(x, over)
    n = flags.numel()
    if not use_triton(flags):
        idx, count = active_indices_reference(flags.view(1, -1), max(n, 1))
        return idx.view(-1).to(x.device), count.to(x.device)
    idx = torch.empty(max(n, 1), device=x.device, dtype=torch.int32)
    count = torch.empty(1, device=x.device, dtype=torch.int32)
    # one program: a wide block (up to 8192 flags a step) keeps its walk to a few steps
    block = min(8 * BLOCK, triton.next_power_of_2(max(n, 16)))
    _active_indices_kernel[(1,)](flags, idx, count, n, n, max(n, 1), BLOCK=block, num_warps=8 if block > BLOCK else 4)
    return idx, count


def active_indices_reference(x: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same in plain torch, one row at a time (the oracle of the tests)."""
    idx = torch.zeros(x.shape[0], capacity, dtype=torch.int32)
    count = torch.zeros(x.shape[0], dtype=torch.int32)
    for r, row in enumerate(x.cpu()):
        nz = torch.nonzero(row != 0).flatten()
        count[r] = nz.numel()
        idx[r, :min(capacity, nz.numel())] = nz[:capacity].to(torch.int32)
    return idx, count
