"""SyncBN's batch statistics in three launches around one all-reduce.

    payload = pack_moments(x, rank, world)    # [world, 2C+1] float32: this rank's (mean, var, count)
                                              # in row `rank`, zeros in the others
    payload = <sum over the ranks>            # every rank's row, exactly: x + 0 = x
    stats, scale = combine_moments(payload, ...)

combine_moments merges the rows by Chan's formula in float64 (mean = sum n_i m_i / n,
var = sum n_i (v_i + (m_i - mean)^2) / n: a sum of non-negative terms, no E[x^2] - mean^2
cancellation), updates the running statistics, writes the [4, C] stats every BN+LIF kernel
reads and scale = this rank's count / the global count (the backward's gradient sums are
scaled by it).

Why rows and not sums of count*mean and count*E[x^2] in float64: the peer-memory one-shot
all-reduce (spikefuse.parallel.sync_bn) takes float32 only, and a sum of rows that are zero
but one is exact in any type. Counts travel as float32 (exact below 2^24 values per rank; above,
a weight off by at most 6e-8 relative). The all-reduce is the caller's: this module does not
know torch.distributed.

Why kernels: the same exchange in torch ops took ~30 launches per layer, each a few
microseconds on the critical path of a captured step (0.5 ms of CIFAR-medium's 12 ms step on
2 H100s) and ~0.3 ms of host time per layer in an eager one.
"""
from __future__ import annotations

import torch

from .bn_lif import STAT_CHANNELS, _batch_moments, _batch_partials, _store_stats, _update_running
from .kernel_base import cdiv, f32, next_power_of_2
from .launch import cached_launch
from .triton_or_stub import tl, triton


@cached_launch
@triton.jit
def _pack_kernel(x_ptr, inner, part_ptr, payload_ptr, M, C, P, rows_per_program, rank, world, count,
                 PB: tl.constexpr, CB: tl.constexpr):
    c = tl.program_id(0) * CB + tl.arange(0, CB)
    c_mask = c < C
    mean, var = _batch_moments(x_ptr, inner, part_ptr, c, c_mask, M, C, P, rows_per_program, PB, CB)
    width = 2 * C + 1
    for w in range(0, world):
        own = (tl.zeros_like(c) + w) == rank
        tl.store(payload_ptr + w * width + c, tl.where(own, mean, 0.0), mask=c_mask)
        tl.store(payload_ptr + w * width + C + c, tl.where(own, var, 0.0), mask=c_mask)
        tl.store(payload_ptr + w * width + 2 * C + c * 0, tl.where(own, f32(count), 0.0), mask=c == 0)


def pack_moments(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """[world, 2C+1] float32: row `rank` holds x's per-channel mean, biased variance (over
    every dim of x [T, B, C, *] but C) and its count per channel; the other rows are zero."""
    C = x.shape[2]
    parts = _batch_partials(x)
    payload = torch.empty((world, 2 * C + 1), device=x.device, dtype=torch.float32)
    _pack_kernel[(cdiv(C, parts.CB),)](
        x, parts.inner, parts.part, payload, parts.M, C, parts.P, parts.rows_per_program, rank, world,
        x.numel() // C, PB=128, CB=parts.CB, num_warps=4)
    return payload


@triton.jit
def merge_rows(payload_ptr, c, c_mask, C, world):
    """Channels c's float32 (mean, biased variance) and float64 total count from the [world,
    2C+1] rows of pack_moments, merged by Chan's formula in float64, every rank's row in rank
    order (the same result on every rank). (bn_peer_exchange merges its 64-bit words with the
    same arithmetic in the same order.)"""
    width = 2 * C + 1
    total = tl.zeros_like(c).to(tl.float64)
    weighted = tl.zeros_like(c).to(tl.float64)
    for w in range(0, world):
        n = tl.load(payload_ptr + w * width + 2 * C + c * 0).to(tl.float64)
        m = tl.load(payload_ptr + w * width + c, mask=c_mask, other=0.0).to(tl.float64)
        total += n
        weighted += n * m
    mean = weighted / tl.maximum(total, 1.0)
    m2 = tl.zeros_like(c).to(tl.float64)
    for w in range(0, world):
        n = tl.load(payload_ptr + w * width + 2 * C + c * 0).to(tl.float64)
        m = tl.load(payload_ptr + w * width + c, mask=c_mask, other=0.0).to(tl.float64)
        v = tl.load(payload_ptr + w * width + C + c, mask=c_mask, other=0.0).to(tl.float64)
        d = m - mean
        m2 += n * (v + d * d)
    return mean.to(tl.float32), (m2 / tl.maximum(total, 1.0)).to(tl.float32), total


@triton.jit
def finish_statistics(mean, var, total, stats_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr, scale_ptr, c, c_mask, C,
                      count, eps, momentum, UPDATE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """The global moments' consumers: running statistics, the BN+LIF kernels' stats, and
    scale = this rank's count / the global count."""
    if UPDATE:
        _update_running(rm_ptr, rv_ptr, c, c_mask, mean, var, f32(momentum), total.to(tl.float32))
    _store_stats(stats_ptr, w_ptr, b_ptr, c, c_mask, C, mean, var, f32(eps), HAS_W, HAS_B)
    tl.store(scale_ptr + c * 0, (f32(count) / tl.maximum(total, 1.0)).to(tl.float32), mask=c == 0)


@cached_launch
@triton.jit
def _combine_kernel(payload_ptr, stats_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr, scale_ptr,
                    C, world, count, eps, momentum,
                    UPDATE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, CB: tl.constexpr):
    c = tl.program_id(0) * CB + tl.arange(0, CB)
    c_mask = c < C
    mean, var, total = merge_rows(payload_ptr, c, c_mask, C, world)
    finish_statistics(mean, var, total, stats_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr, scale_ptr, c, c_mask, C,
                      count, eps, momentum, UPDATE, HAS_W, HAS_B)


def combine_moments(payload: torch.Tensor, count: int, weight, bias, running_mean, running_var,
                    momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(stats [4, C] float32 as ops.bn_lif's statistics, scale [1] = count / global count)
    from the summed payload of pack_moments; running statistics (if given) updated in place
    with the unbiased variance over the global count. count: this rank's values per channel."""
    world, C = payload.shape[0], (payload.shape[1] - 1) // 2
    stats = torch.empty((4, C), device=payload.device, dtype=torch.float32)
    scale = torch.empty(1, device=payload.device, dtype=torch.float32)
    CB = min(STAT_CHANNELS, next_power_of_2(C))
    _combine_kernel[(cdiv(C, CB),)](
        payload, stats, weight if weight is not None else stats, bias if bias is not None else stats,
        running_mean if running_mean is not None else stats, running_var if running_var is not None else stats,
        scale, C, world, count, eps, momentum,
        UPDATE=running_mean is not None, HAS_W=weight is not None, HAS_B=bias is not None, CB=CB, num_warps=4)
    return stats, scale
