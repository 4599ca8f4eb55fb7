"""SyncBN's two exchanges as one kernel each, over GPU peer memory.

bn_exchange's path costs a layer three launches around an all-reduce in forward (pack the
moments, all-reduce, combine) and two in backward (all-reduce, scale), each a few
microseconds on a captured step's critical path (issue 35). Here every GPU of the group has
mapped every other's exchange buffers (PyTorch's symmetric memory, set up by
spikefuse.parallel.sync_bn), and one kernel per exchange does it all. Each program, for its
block of channels:

1. computes its rank's row (forward: mean, variance and count from the statistics pass's
   partials; backward: the two gradient sums) and stores it into row `rank` of every rank's
   buffer;
2. counts this exchange of its buffer (the epoch: a counter per program in its own buffer,
   which every rank advances alike), writes the epoch into flag [program, rank] of every
   rank's buffer (release, system scope: the row's stores are visible first; no reply is
   awaited, so a rank's signals to all peers are in flight at once) and waits until its own
   buffer's flags [program, w] reach the epoch for every rank w (acquire);
3. reads the rows, all in its own memory now, in rank order (the same result on every rank)
   and finishes as bn_exchange does.

Flags only grow, so nothing lowers them and a sender never waits for a reader. (The first
protocol, compare-and-swap 0 -> 1 and back, waited for each peer's reply in turn: an
exchange took 5.5 us on 2 H100s and 11.3 us on 4 inside a graph,
benchmarks/probe_bn_exchange.py.) A rank may write a buffer again only after it passed the
exchange in between, which no rank reaches before it finished reading (every site has two
buffers, used in turn: spikefuse.parallel.sync_bn). Programs wait on their own flags only:
no program waits for another of its grid to be resident.

This module knows addresses, not torch.distributed: `buffers` is an int64 tensor on the
device holding every rank's buffer address as mapped here. A buffer holds the rows, then the
flags and the epochs (int32; buffer_size says where), zero before its first exchange.
"""
from __future__ import annotations

import torch

from .bn_exchange import finish_statistics, merge_rows
from .bn_lif import STAT_CHANNELS, _batch_moments, _batch_partials
from .kernel_base import cdiv, f32, next_power_of_2
from .launch import cached_launch
from .triton_or_stub import tl, triton


def channel_block(channels: int) -> int:
    """Channels per program (the statistics pass's, whose partials the forward kernel reads)."""
    return min(STAT_CHANNELS, next_power_of_2(channels))


def buffer_size(rows: int, channels: int, world: int) -> tuple[int, int]:
    """(32-bit elements of an exchange's buffer, where its flags start) for `rows` [world,
    `rows`] of data over `channels` channels: after the rows, one flag per program and rank,
    then one epoch per program."""
    flags_at = world * rows
    programs = cdiv(channels, channel_block(channels))
    return flags_at + programs * (world + 1), flags_at


@triton.jit
def _address(table_ptr, w, DTYPE: tl.constexpr):
    return tl.load(table_ptr + w).to(tl.pointer_type(DTYPE))


@triton.jit
def _meet(buffers_ptr, flags_at, program, rank, world):
    """Signal this exchange's epoch on every rank's buffer, then wait for every rank's on ours."""
    own = _address(buffers_ptr, rank, tl.int32) + flags_at
    programs = tl.num_programs(0)
    counter = own + programs * world + program  # this program's exchanges of this buffer so far
    epoch = tl.load(counter, volatile=True) + 1
    tl.debug_barrier()  # every thread has read the count, and stored its part of the row
    tl.store(counter, epoch)
    for w in range(0, world):  # the reply is not used: the signals go out without waiting
        tl.atomic_xchg(_address(buffers_ptr, w, tl.int32) + flags_at + program * world + rank, epoch,
                       sem="release", scope="sys")
    for w in range(0, world):
        seen = tl.atomic_add(own + program * world + w, 0, sem="acquire", scope="sys")
        while seen < epoch:
            seen = tl.atomic_add(own + program * world + w, 0, sem="acquire", scope="sys")
    tl.debug_barrier()


@cached_launch
@triton.jit(do_not_specialize=["rank", "world"])  # one compiled kernel for every rank
def _moments_exchange_kernel(x_ptr, inner, part_ptr, buffers_ptr, flags_at, stats_ptr, w_ptr, b_ptr, rm_ptr,
                             rv_ptr, scale_ptr, M, C, P, rows_per_program, rank, world, count, eps, momentum,
                             UPDATE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, PB: tl.constexpr,
                             CB: tl.constexpr):
    program = tl.program_id(0)
    c = program * CB + tl.arange(0, CB)
    c_mask = c < C
    mean, var = _batch_moments(x_ptr, inner, part_ptr, c, c_mask, M, C, P, rows_per_program, PB, CB)
    width = 2 * C + 1
    for w in range(0, world):  # bn_exchange's row; each program writes the count (the same value)
        row = _address(buffers_ptr, w, tl.float32) + rank * width
        tl.store(row + c, mean, mask=c_mask)
        tl.store(row + C + c, var, mask=c_mask)
        tl.store(row + 2 * C + c * 0, f32(count), mask=c == program * CB)
    _meet(buffers_ptr, flags_at, program, rank, world)
    mean, var, total = merge_rows(_address(buffers_ptr, rank, tl.float32), c, c_mask, C, world, True)
    finish_statistics(mean, var, total, stats_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr, scale_ptr, c, c_mask, C,
                      count, eps, momentum, UPDATE, HAS_W, HAS_B)


def exchange_moments(x: torch.Tensor, rank: int, world: int, buffers: torch.Tensor, weight, bias, running_mean,
                     running_var, momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """bn_exchange's pack_moments, all-reduce and combine_moments in one launch (after the
    statistics pass): (stats [4, C], scale [1]). buffers: the ranks' buffers of
    buffer_size(2C + 1, C, world)."""
    C = x.shape[2]
    parts = _batch_partials(x)
    assert parts.CB == channel_block(C), "the buffer's flags are counted by channel_block's programs"
    stats = torch.empty((4, C), device=x.device, dtype=torch.float32)
    scale = torch.empty(1, device=x.device, dtype=torch.float32)
    _moments_exchange_kernel[(cdiv(C, parts.CB),)](
        x, parts.inner, parts.part, buffers, buffer_size(2 * C + 1, C, world)[1], stats,
        weight if weight is not None else stats, bias if bias is not None else stats,
        running_mean if running_mean is not None else stats, running_var if running_var is not None else stats,
        scale, parts.M, C, parts.P, parts.rows_per_program, rank, world, x.numel() // C, eps, momentum,
        UPDATE=running_mean is not None, HAS_W=weight is not None, HAS_B=bias is not None, PB=128, CB=parts.CB,
        num_warps=4)
    return stats, scale


@cached_launch
@triton.jit(do_not_specialize=["rank", "world"])
def _sums_exchange_kernel(sums_ptr, buffers_ptr, flags_at, out_ptr, scale_ptr, C, rank, world, CB: tl.constexpr):
    program = tl.program_id(0)
    c = program * CB + tl.arange(0, CB)
    c_mask = c < C
    first = tl.load(sums_ptr + c, mask=c_mask, other=0.0)
    second = tl.load(sums_ptr + C + c, mask=c_mask, other=0.0)
    for w in range(0, world):
        row = _address(buffers_ptr, w, tl.float32) + rank * 2 * C
        tl.store(row + c, first, mask=c_mask)
        tl.store(row + C + c, second, mask=c_mask)
    _meet(buffers_ptr, flags_at, program, rank, world)
    rows = _address(buffers_ptr, rank, tl.float32)
    first = tl.zeros_like(first)
    second = tl.zeros_like(second)
    for w in range(0, world):
        first += tl.load(rows + w * 2 * C + c, mask=c_mask, other=0.0, volatile=True)
        second += tl.load(rows + w * 2 * C + C + c, mask=c_mask, other=0.0, volatile=True)
    scale = tl.load(scale_ptr + c * 0)
    tl.store(out_ptr + c, first * scale, mask=c_mask)
    tl.store(out_ptr + C + c, second * scale, mask=c_mask)


def exchange_sums(sums: torch.Tensor, scale: torch.Tensor, rank: int, world: int, buffers: torch.Tensor
                  ) -> torch.Tensor:
    """[2, C] float32: `sums` summed over the ranks (in rank order), times `scale` (the
    forward's count / global count). buffers: the ranks' buffers of buffer_size(2C, C, world)."""
    C = sums.shape[1]
    out = torch.empty_like(sums)
    CB = channel_block(C)
    _sums_exchange_kernel[(cdiv(C, CB),)](sums.contiguous(), buffers, buffer_size(2 * C, C, world)[1], out, scale,
                                          C, rank, world, CB=CB, num_warps=4)
    return out
