"""SyncBN's exchanges over peer memory (spikefuse.ops.bn_peer_exchange) without processes: one
rank on its own (Triton's interpreter on the CPU), and on a GPU two ranks as two streams of one
process, each kernel waiting for the other's row. The results must be bn_exchange's exactly:
the same rows, merged by the same code in the same order. (Two GPUs: tests/test_ddp.py.)"""
import pytest
import torch

from spikefuse.ops.bn_exchange import combine_moments, pack_moments
from spikefuse.ops.bn_peer_exchange import buffer_size, exchange_moments, exchange_sums
from helpers import DEVICE


def moments_buffers(C, world):
    """Each rank's zeroed buffer for the forward exchange, and the table of their addresses."""
    size, flags_at = buffer_size(2 * C + 1, C, world)
    buffers = [torch.zeros(size, device=DEVICE) for _ in range(world)]
    return buffers, torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=DEVICE), flags_at


def steps(batch, C=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(3, batch, C, 2, 3, generator=g) * 2.0 + 4.0).to(DEVICE)


def test_one_rank_matches_the_all_reduce_path_exactly_and_twice():
    x = steps(4)
    C = x.shape[2]
    buffers, table, flags_at = moments_buffers(C, 1)
    weight, bias = torch.linspace(0.5, 1.5, C, device=DEVICE), torch.linspace(-0.2, 0.3, C, device=DEVICE)
    rm, rv = torch.full((C,), 0.1, device=DEVICE), torch.full((C,), 2.0, device=DEVICE)
    rm_ref, rv_ref = rm.clone(), rv.clone()
    for _ in range(2):  # the flags were lowered: a second exchange of the same buffer meets again
        stats, scale = exchange_moments(x, 0, 1, table, weight, bias, rm, rv, 0.1, 1e-5)
        expected, expected_scale = combine_moments(pack_moments(x, 0, 1), x.numel() // C, weight, bias,
                                                   rm_ref, rv_ref, 0.1, 1e-5)
        assert torch.equal(stats, expected) and torch.equal(scale, expected_scale)
        assert torch.equal(rm, rm_ref) and torch.equal(rv, rv_ref)
        assert not buffers[0][flags_at:].any()
    sums = torch.randn(2, C, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    size, flags_at = buffer_size(2 * C, C, 1)
    buffer = torch.zeros(size, device=DEVICE)
    out = exchange_sums(sums, scale, 0, 1, torch.tensor([buffer.data_ptr()], dtype=torch.int64, device=DEVICE))
    assert torch.equal(out, sums * scale)
    assert not buffer[flags_at:].any()


@pytest.mark.gpu
@pytest.mark.parametrize("C", [5, 200])
def test_two_ranks_on_two_streams_meet_and_agree(C):
    """Rank r's kernels on stream r, issued from one thread in turn: each exchange waits for
    the other rank's row, then both hold the statistics of the combined batch (bn_exchange's,
    bit for bit), three times over. (One thread: a host call that waits for the GPU, as an
    allocation may, while holding the GIL would keep the other rank's kernel from ever
    being issued; each rank of a real run has a process, and a GPU, of its own.)"""
    parts = [steps(3, C, seed=1), steps(5, C, seed=2)]
    streams = [torch.cuda.Stream() for _ in range(2)]

    def issue(r, world, table, sum_table, i):  # rank r's forward exchange on stream r (alone: rank 0 of 1)
        with torch.cuda.stream(streams[r]):
            stats, scale = exchange_moments(parts[r], r % world, world, table, None, None, None, None, 0.1, 1e-5)
            return stats, scale, torch.full((2, C), float(r + 1 + i), device=DEVICE), sum_table

    def finish(r, world, issued):
        stats, scale, sums, sum_table = issued
        with torch.cuda.stream(streams[r]):
            return stats, scale, exchange_sums(sums, scale, r % world, world, sum_table)
    for r in range(2):  # alone first: every kernel compiled and loaded, each stream's memory cached
        _, alone, _ = moments_buffers(C, 1)
        _, alone_sums, _ = moments_buffers(C, 1)
        for i in range(3):
            finish(r, 1, issue(r, 1, alone, alone_sums, i))
    torch.cuda.synchronize()
    _, table, _ = moments_buffers(C, 2)
    size, _ = buffer_size(2 * C, C, 2)
    sum_buffers = [torch.zeros(size, device=DEVICE) for _ in range(2)]
    sum_table = torch.tensor([b.data_ptr() for b in sum_buffers], dtype=torch.int64, device=DEVICE)
    torch.cuda.synchronize()
    results = [[], []]
    for i in range(3):
        issued = [issue(r, 2, table, sum_table, i) for r in range(2)]
        for r in range(2):
            results[r].append(finish(r, 2, issued[r]))
    torch.cuda.synchronize()
    summed = pack_moments(parts[0], 0, 2) + pack_moments(parts[1], 1, 2)
    for r in range(2):
        for i, (stats, scale, sums) in enumerate(results[r]):
            expected, expected_scale = combine_moments(summed, parts[r].numel() // C, None, None, None, None,
                                                       0.1, 1e-5)
            assert torch.equal(stats, expected) and torch.equal(scale, expected_scale)
            assert torch.equal(sums, torch.full((2, C), float(1 + i) + float(2 + i), device=DEVICE) * scale)
