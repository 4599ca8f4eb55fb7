"""SyncBN's exchanges over peer memory (spikefuse.ops.bn_peer_exchange) without processes: one
rank on its own (Triton's interpreter on the CPU, compiled on a GPU), whose results must be
bn_exchange's exactly: the same row, merged by the same code. Ranks that meet: the
multi_gpu tests of tests/test_ddp.py (transport "symmetric"), one process per GPU. (Two ranks
as two streams of one GPU hung there, so sync_bn refuses peer memory without a GPU per rank.)"""
import pytest
import torch

from spikefuse.ops.bn_exchange import combine_moments, pack_moments
from spikefuse.ops.bn_peer_exchange import buffer_size, channel_block, exchange_moments, exchange_sums
from helpers import DEVICE


def moments_buffers(C, world):
    """Each rank's zeroed buffer for the forward exchange, and the table of their addresses."""
    size, counters_at = buffer_size(2 * C + 1, C, world)
    buffers = [torch.zeros(size, device=DEVICE) for _ in range(world)]
    return buffers, torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=DEVICE), counters_at


def channel_blocks(C):
    return -(-C // channel_block(C))


def steps(batch, C=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(3, batch, C, 2, 3, generator=g) * 2.0 + 4.0).to(DEVICE)


@pytest.mark.parametrize("C", [5, 67])  # one program; two (channel_block is 64), each with its own counter
def test_one_rank_matches_the_all_reduce_path_exactly_and_twice(C):
    x = steps(4, C)
    buffers, table, counters_at = moments_buffers(C, 1)
    weight, bias = torch.linspace(0.5, 1.5, C, device=DEVICE), torch.linspace(-0.2, 0.3, C, device=DEVICE)
    rm, rv = torch.full((C,), 0.1, device=DEVICE), torch.full((C,), 2.0, device=DEVICE)
    rm_ref, rv_ref = rm.clone(), rv.clone()
    for epoch in (1, 2):  # a second exchange of the same buffer meets again, one epoch on
        stats, scale = exchange_moments(x, 0, 1, table, weight, bias, rm, rv, 0.1, 1e-5)
        expected, expected_scale = combine_moments(pack_moments(x, 0, 1), x.numel() // C, weight, bias,
                                                   rm_ref, rv_ref, 0.1, 1e-5)
        assert torch.equal(stats, expected) and torch.equal(scale, expected_scale)
        assert torch.equal(rm, rm_ref) and torch.equal(rv, rv_ref)
        assert buffers[0].view(torch.int64)[counters_at:].tolist() == [epoch] * channel_blocks(C)
    sums = torch.randn(2, C, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    size, counters_at = buffer_size(2 * C, C, 1)
    buffer = torch.zeros(size, device=DEVICE)
    out = exchange_sums(sums, scale, 0, 1, torch.tensor([buffer.data_ptr()], dtype=torch.int64, device=DEVICE))
    assert torch.equal(out, sums * scale)
    assert buffer.view(torch.int64)[counters_at:].tolist() == [1] * channel_blocks(C)
