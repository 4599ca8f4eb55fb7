"""SyncBN's statistics exchange (spikefuse.ops.bn_exchange) without processes: the ranks'
packed payloads summed by hand equal the statistics of the whole batch (Triton interpreter on
the CPU, compiled kernels on a GPU)."""
import pytest
import torch

from spikefuse.ops.bn_exchange import combine_moments, pack_moments
from spikefuse.ops.bn_lif import _statistics
from helpers import DEVICE


def slices(batch, counts, seed, channels_last=False):
    """x [T, B, C, H, W] cut along B into slices of `counts` samples, and the whole."""
    def own(t):  # each rank's x is a tensor of its own, its steps dense
        return t.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3) if channels_last else t.contiguous()
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(3, batch, 5, 2, 3, generator=g) * 2.0 + 4.0).to(DEVICE)
    cuts = torch.tensor(counts).cumsum(0).tolist()
    return own(x), [own(x[:, a:b]) for a, b in zip([0] + cuts[:-1], cuts)]


@pytest.mark.parametrize("counts", [[2, 2], [1, 3, 2], [0, 4], [5]], ids=["equal", "unequal", "empty-rank", "one-rank"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels-last"])
def test_summed_payloads_give_the_whole_batch_statistics(counts, channels_last):
    x, parts = slices(sum(counts), counts, seed=len(counts), channels_last=channels_last)
    C = x.shape[2]
    weight, bias = torch.linspace(0.5, 1.5, C, device=DEVICE), torch.linspace(-0.2, 0.3, C, device=DEVICE)
    rm, rv = torch.full((C,), 0.1, device=DEVICE), torch.full((C,), 2.0, device=DEVICE)
    rm_ref, rv_ref = rm.clone(), rv.clone()
    expected = _statistics(x, weight, bias, rm_ref, rv_ref, True, 0.1, 1e-5)

    world = len(parts)
    payloads = [pack_moments(part, rank, world) for rank, part in enumerate(parts)]
    for rank, payload in enumerate(payloads):  # a rank's row is its own, the others zero
        assert payload.shape == (world, 2 * C + 1)
        assert not payload[[r for r in range(world) if r != rank]].any()
        assert payload[rank, -1].item() == parts[rank].numel() // C
    summed = torch.stack(payloads).sum(0)
    local = parts[-1].numel() // C
    stats, scale = combine_moments(summed, local, weight, bias, rm, rv, 0.1, 1e-5)
    torch.testing.assert_close(stats, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rm, rm_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rv, rv_ref, rtol=1e-5, atol=1e-6)
    assert scale.item() == pytest.approx(local / (x.numel() // C), rel=1e-7)


def test_no_affine_and_no_running_statistics():
    x, _ = slices(2, [2], seed=3)
    stats, scale = combine_moments(pack_moments(x, 0, 1), x.numel() // x.shape[2], None, None, None, None, 0.1, 1e-5)
    torch.testing.assert_close(stats, _statistics(x, None, None, None, None, True, 0.1, 1e-5), rtol=1e-5, atol=1e-6)
    assert scale.item() == 1.0
