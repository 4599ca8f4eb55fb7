"""SyncBN's two exchanges as one kernel each, over GPU peer memory.

bn_exchange's path costs a layer three launches around an all-reduce in forward (pack the
moments, all-reduce, combine) and two in backward (all-reduce, scale), each a few
microseconds on a captured step's critical path (issue 35). Here every GPU of the group has
mapped every other's exchange buffers (PyTorch's symmetric memory, set up by
spikefuse.parallel.sync_bn), and one kernel per exchange does it all. Each program, for its
block of channels:

1. counts this exchange of its buffer (the epoch: a counter per program in its own buffer;
   every rank's programs count alike);
2. computes its rank's row (forward: mean, variance and count from the statistics pass's
   partials; backward: the two gradient sums) and stores it into row `rank` of every rank's
   buffer, each float32 value in one 64-bit word beside the epoch;
3. reads its own buffer's rows until every word carries this epoch, then merges them in rank
   order (the same result on every rank) and finishes as bn_exchange does.

A strong 64-bit store arrives whole (_publish: PTX promises it for relaxed system-scope
stores, not for plain weak ones), so a word that shows the epoch holds its value: no fence and
no separate flag (NCCL's low-latency protocol does the same). The first protocol stored plain
rows, then raised flags after a system-scope release; each fence waited a round trip over
NVLink, one per peer: an exchange cost 5.4 us on 2 H100s and 11 us on 4 inside a graph
(benchmarks/probe_bn_exchange.py), now 1.9 and 3.4 us. A rank may
write a buffer again only after it passed the exchange in between, which no rank reaches
before it finished reading (every site has two buffers, used in turn:
spikefuse.parallel.sync_bn), so a stale word shows an older epoch. Programs wait on their own
words only: no program waits for another of its grid to be resident.

This module knows addresses, not torch.distributed: `buffers` is an int64 tensor on the
device holding every rank's buffer address as mapped here. A buffer holds the rows' words,
then one epoch counter per program (64-bit; buffer_size says where), zero before its first
exchange.
"""

from __future__ import annotations

import torch

from .bn_exchange import finish_statistics
from .bn_lif import STAT_CHANNELS, _batch_moments, _batch_partials
from .kernel_base import cdiv, f32, next_power_of_2
from .launch import cached_launch
from .triton_or_stub import INTERPRETED, tl, triton


def channel_block(channels: int) -> int:
    """Channels per program (the statistics pass's, whose partials the forward kernel reads)."""
    return min(STAT_CHANNELS, next_power_of_2(channels))


def buffer_size(rows: int, channels: int, world: int) -> tuple[int, int]:
    """(float32 elements an exchange's buffer takes, where its counters start in 64-bit
    words) for [world, `rows`] words of data over `channels` channels."""
    counters_at = world * rows
    return 2 * (counters_at + cdiv(channels, channel_block(channels))), counters_at


@triton.jit
def _address(table_ptr, w, DTYPE: tl.constexpr):
    return tl.load(table_ptr + w).to(tl.pointer_type(DTYPE))


@triton.jit
def _epoch(buffers_ptr, counters_at, rank):
    """This program's count of its buffer's exchanges, this one included."""
    counter = _address(buffers_ptr, rank, tl.int64) + counters_at + tl.program_id(0)
    epoch = tl.load(counter, volatile=True) + 1
    tl.debug_barrier()  # every thread has read the count before it changes
    tl.store(counter, epoch)
    return epoch


@triton.jit
def _flagged(value, epoch):
    """A float32 and the epoch in one 64-bit word."""
    return (epoch << 32) | value.to(tl.uint32, bitcast=True).to(tl.int64)


@triton.jit
def _publish(ptr, word, mask, STRONG: tl.constexpr):
    """Store 64-bit words that arrive whole. PTX promises that only of strong stores (relaxed
    or volatile, here system scope: the reader is another GPU); a plain st.global is weak and
    might, in principle, be seen half-written. The interpreter has no PTX: a plain store."""
    if STRONG:
        tl.inline_asm_elementwise(
            "{ .reg .pred %publish; setp.ne.b32 %publish, $1, 0;"
            " @%publish st.relaxed.sys.global.b64 [$2], $3; mov.b32 $0, 0; }",
            "=r,r,l,l", [mask.to(tl.int32), ptr, word], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.store(ptr, word, mask=mask)


@triton.jit
def _value(word):
    return (word & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _awaited(ptr, epoch, mask):
    """The float32 values of the words at ptr (this GPU's memory, written by any rank), once
    each carries `epoch`; masked lanes 0."""
    word = tl.load(ptr, mask=mask, other=0, volatile=True)
    while tl.min(tl.where(mask, (word >> 32) == epoch, True).to(tl.int32), axis=0) == 0:
        word = tl.load(ptr, mask=mask, other=0, volatile=True)
    return _value(word)


@triton.jit
def _merged_moments(rows, c, c_mask, C, world, epoch):
    """merge_rows (bn_exchange) over the flagged rows, once they have arrived: the same float64
    arithmetic in the same order, so the same bits as the all-reduce path."""
    width = 2 * C + 1
    every = c >= 0
    total = tl.zeros_like(c).to(tl.float64)
    weighted = tl.zeros_like(c).to(tl.float64)
    for w in range(0, world):
        n = _awaited(rows + w * width + 2 * C + c * 0, epoch, every).to(tl.float64)
        m = _awaited(rows + w * width + c, epoch, c_mask).to(tl.float64)
        _awaited(rows + w * width + C + c, epoch, c_mask)  # the variances, read below
        total += n
        weighted += n * m
    mean = weighted / tl.maximum(total, 1.0)
    m2 = tl.zeros_like(c).to(tl.float64)
    for w in range(0, world):
        n = _value(tl.load(rows + w * width + 2 * C + c * 0, volatile=True)).to(tl.float64)
        m = _value(tl.load(rows + w * width + c, mask=c_mask, other=0, volatile=True)).to(tl.float64)
        v = _value(tl.load(rows + w * width + C + c, mask=c_mask, other=0, volatile=True)).to(tl.float64)
        d = m - mean
        m2 += n * (v + d * d)
    return mean.to(tl.float32), (m2 / tl.maximum(total, 1.0)).to(tl.float32), total


@cached_launch
@triton.jit(do_not_specialize=["rank", "world"])  # one compiled kernel for every rank
def _moments_exchange_kernel(x_ptr, inner, part_ptr, buffers_ptr, counters_at, stats_ptr, w_ptr, b_ptr, rm_ptr,
                             rv_ptr, scale_ptr, M, C, P, rows_per_program, rank, world, count, eps, momentum,
                             UPDATE: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, PB: tl.constexpr,
                             CB: tl.constexpr, STRONG: tl.constexpr):
    program = tl.program_id(0)
    c = program * CB + tl.arange(0, CB)
    c_mask = c < C
    epoch = _epoch(buffers_ptr, counters_at, rank)
    mean, var = _batch_moments(x_ptr, inner, part_ptr, c, c_mask, M, C, P, rows_per_program, PB, CB)
    width = 2 * C + 1
    for w in range(0, world):  # bn_exchange's row; each program writes the count (the same word)
        row = _address(buffers_ptr, w, tl.int64) + rank * width
        _publish(row + c, _flagged(mean, epoch), c_mask, STRONG)
        _publish(row + C + c, _flagged(var, epoch), c_mask, STRONG)
        _publish(row + 2 * C + c * 0, _flagged(f32(count) + tl.zeros_like(mean), epoch), c == program * CB, STRONG)
    mean, var, total = _merged_moments(_address(buffers_ptr, rank, tl.int64), c, c_mask, C, world, epoch)
    finish_statistics(mean, var, total, stats_ptr, w_ptr, b_ptr, rm_ptr, rv_ptr, scale_ptr, c, c_mask, C,
                      count, eps, momentum, UPDATE, HAS_W, HAS_B)


def exchange_moments(x: torch.Tensor, rank: int, world: int, buffers: torch.Tensor, weight, bias, running_mean,
                     running_var, momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """bn_exchange's pack_moments, all-reduce and combine_moments in one launch (after the
    statistics pass): (stats [4, C], scale [1]). buffers: the ranks' buffers of
    buffer_size(2C + 1, C, world)."""
    C = x.shape[2]
    parts = _batch_partials(x)
    assert parts.CB == channel_block(C), "the buffer holds a counter for each of channel_block's programs"
    stats = torch.empty((4, C), device=x.device, dtype=torch.float32)
    scale = torch.empty(1, device=x.device, dtype=torch.float32)
    _moments_exchange_kernel[(cdiv(C, parts.CB),)](
        x, parts.inner, parts.part, buffers, buffer_size(2 * C + 1, C, world)[1], stats,
        weight if weight is not None else stats, bias if bias is not None else stats,
        running_mean if running_mean is not None else stats, running_var if running_var is not None else stats,
        scale, parts.M, C, parts.P, parts.rows_per_program, rank, world, x.numel() // C, eps, momentum,
        UPDATE=running_mean is not None, HAS_W=weight is not None, HAS_B=bias is not None, PB=128, CB=parts.CB,
        STRONG=not INTERPRETED, num_warps=4)
    return stats, scale


@cached_launch
@triton.jit(do_not_specialize=["rank", "world"])
def _sums_exchange_kernel(sums_ptr, buffers_ptr, counters_at, out_ptr, scale_ptr, C, rank, world,
                          CB: tl.constexpr, STRONG: tl.constexpr):
    program = tl.program_id(0)
    c = program * CB + tl.arange(0, CB)
    c_mask = c < C
    epoch = _epoch(buffers_ptr, counters_at, rank)
    first = tl.load(sums_ptr + c, mask=c_mask, other=0.0)
    second = tl.load(sums_ptr + C + c, mask=c_mask, other=0.0)
    for w in range(0, world):
        row = _address(buffers_ptr, w, tl.int64) + rank * 2 * C
        _publish(row + c, _flagged(first, epoch), c_mask, STRONG)
        _publish(row + C + c, _flagged(second, epoch), c_mask, STRONG)
    rows = _address(buffers_ptr, rank, tl.int64)
    first = tl.zeros_like(first)
    second = tl.zeros_like(second)
    for w in range(0, world):
        first += _awaited(rows + w * 2 * C + c, epoch, c_mask)
        second += _awaited(rows + w * 2 * C + C + c, epoch, c_mask)
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
                                          C, rank, world, CB=CB, STRONG=not INTERPRETED, num_warps=4)
    return out
