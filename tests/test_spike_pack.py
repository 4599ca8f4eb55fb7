"""Spike bit-packing: exact round trips through the Triton kernels and the torch twin."""
import pytest
import torch

from spikefuse.ops import spike_pack


def spikes(shape, seed=0, dtype=torch.float32, rate=0.3):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < rate).to(dtype)


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (3, 5, 7), (2, 3, 1031), (0, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.bool])
def test_round_trip_exact(shape, dtype):
    s = spikes(shape, seed=sum(shape), dtype=dtype)
    packed = spike_pack.pack(s)
    assert packed.dtype == torch.uint8 and packed.numel() == (s.numel() + 7) // 8
    assert torch.equal(spike_pack.unpack(packed, s.shape, dtype), s)


def test_triton_matches_torch_twin(monkeypatch):
    s = spikes((5, 3, 77), seed=3)
    packed = spike_pack.pack(s)
    monkeypatch.setattr(spike_pack, "INTERPRETED", False)  # route through the torch bit operations
    assert torch.equal(spike_pack.pack(s), packed)
    assert torch.equal(spike_pack.unpack(packed, s.shape), s)


def test_bit_order_is_little_endian():
    s = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 1, 1])
    assert spike_pack.pack(s).tolist() == [129, 1]


def test_non_contiguous_input():
    s = spikes((6, 10), seed=4).t()
    assert torch.equal(spike_pack.unpack(spike_pack.pack(s), s.shape), s)


def test_debug_mode_rejects_non_binary(monkeypatch):
    s = torch.tensor([0.0, 1.0, 0.5])
    assert spike_pack.unpack(spike_pack.pack(s), s.shape).tolist() == [0, 1, 1]  # documented
    monkeypatch.setattr(spike_pack, "DEBUG", True)
    with pytest.raises(ValueError, match="binary"):
        spike_pack.pack(s)


def test_unpack_checks_sizes():
    with pytest.raises(ValueError, match="needs 2"):
        spike_pack.unpack(torch.zeros(3, dtype=torch.uint8), (2, 5))
    with pytest.raises(TypeError, match="uint8"):
        spike_pack.unpack(torch.zeros(2), (2, 5))


@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 13), (7, 9), (64, 64), (65, 130), (131, 3), (0, 5), (5, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpack_transposed_exact(rows, cols, dtype):
    """s^T of a packed [rows, cols], rows rounded up in its stride (aligned for cuBLAS)."""
    s = spikes((rows, cols), seed=rows * 7 + cols, dtype=dtype)
    t = spike_pack.unpack_transposed(spike_pack.pack(s), rows, cols, dtype)
    assert t.shape == (cols, rows) and t.dtype == dtype
    assert t.stride() == (-(-rows // 8) * 8 or 8, 1)
    assert torch.equal(t, s.t())


def test_unpack_transposed_torch_twin(monkeypatch):
    s = spikes((37, 21), seed=5)
    packed = spike_pack.pack(s)
    kernel = spike_pack.unpack_transposed(packed, 37, 21)
    monkeypatch.setattr(spike_pack, "INTERPRETED", False)
    twin = spike_pack.unpack_transposed(packed, 37, 21)
    assert torch.equal(twin, kernel) and twin.stride() == kernel.stride()


def test_unpack_transposed_checks_sizes():
    with pytest.raises(ValueError, match="needs 2"):
        spike_pack.unpack_transposed(torch.zeros(3, dtype=torch.uint8), 2, 5)
    with pytest.raises(TypeError, match="uint8"):
        spike_pack.unpack_transposed(torch.zeros(2), 2, 5)
