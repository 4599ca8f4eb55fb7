"""The mean of a [world, n] tensor's rows, added in row order: the average of the data-parallel
gradient buckets (spikefuse.parallel.grad_peer), every rank's row of a bucket pulled next to
its own.

torch.mean over dim 0 did this as a reduction kernel: beside backward's kernels on an H100 it
took 167 us for a 33.5 MB bucket, five times its traffic at the copy bandwidth, all of it on
SMs that backward wanted. Here one elementwise pass loads each element's rows, adds them in
row order and scales by 1/world (exact where world is a power of two: on 2 ranks the halved
sum, what NCCL's average gives). Every rank holding the same rows gets the same bits.
"""
from __future__ import annotations

import torch

from .kernel_base import cdiv
from .launch import cached_launch
from .spike_pack import use_triton
from .triton_or_stub import tl, triton

BLOCK = 2048


@cached_launch
@triton.jit(do_not_specialize=["n", "row_stride"])
def _mean_rows_kernel(rows_ptr, out_ptr, n, row_stride, scale, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    total = tl.load(rows_ptr + i, mask=inside)
    for r in tl.static_range(1, WORLD):
        total += tl.load(rows_ptr + r * row_stride + i, mask=inside)
    tl.store(out_ptr + i, total * scale, mask=inside)


def mean_rows(rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = the mean of float32 rows [world, n] over its first dimension, the rows added in
    order 0, 1, ... then scaled by 1/world; rows' elements contiguous within a row, out
    contiguous [n]. Returns out."""
    world, n = rows.shape
    if rows.dtype != torch.float32 or out.dtype != torch.float32:
        raise ValueError(f"mean_rows: float32 rows and out expected, got {rows.dtype} and {out.dtype}")
    if out.shape != (n,) or not out.is_contiguous() or rows.stride(1) != 1:
        raise ValueError(f"mean_rows: rows [world, n] with contiguous rows and a contiguous out [n] expected, "
                         f"got rows {tuple(rows.shape)} strides {rows.stride()}, out {tuple(out.shape)}")
    if not use_triton(rows):
        return out.copy_(mean_rows_reference(rows))
    if n:
        _mean_rows_kernel[(cdiv(n, BLOCK),)](rows, out, n, rows.stride(0), 1.0 / world, WORLD=world, BLOCK=BLOCK)
    return out


def mean_rows_reference(rows: torch.Tensor) -> torch.Tensor:
    """The twin in torch: the same order of additions."""
    total = rows[0]
    for r in range(1, rows.shape[0]):
        total = total + rows[r]
    return total * (1.0 / rows.shape[0])
