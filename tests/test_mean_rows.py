"""spikefuse.ops.mean_rows (the gradient buckets' average) against its torch twin and float64:
bit for bit with the twin, through the interpreter on the CPU and compiled on GPUs."""
from __future__ import annotations

import pytest
import torch

from helpers import DEVICE
from spikefuse.ops.mean_rows import mean_rows, mean_rows_reference


@pytest.mark.parametrize("world, n", [(2, 1), (2, 5000), (3, 2049), (4, 7), (1, 33)])
def test_mean_rows_equals_its_twin_bit_for_bit(world, n):
    device, dtype = DEVICE, torch.float32
    g = torch.Generator().manual_seed(world * 1000 + n)
    wide = (torch.randn(world, n + 3, generator=g) * 10).to(device, dtype)
    rows = wide[:, 2:n + 2]  # a view: rows apart by more than n
    out = torch.full((n,), float("nan"), device=device, dtype=dtype)
    assert mean_rows(rows, out) is out
    torch.testing.assert_close(out, mean_rows_reference(rows), rtol=0, atol=0)
    if world == 2:  # the halved sum, as NCCL's average of two ranks
        torch.testing.assert_close(out, (rows[0] + rows[1]) / 2, rtol=0, atol=0)
    exact = rows.double().mean(0)
    torch.testing.assert_close(out.double(), exact, rtol=1e-6, atol=1e-6)


def test_mean_rows_refuses_a_layout_it_cannot_read_by_name():
    with pytest.raises(ValueError, match="mean_rows: rows \\[world, n\\] with contiguous rows"):
        mean_rows(torch.zeros(2, 4).t(), torch.zeros(2))
    with pytest.raises(ValueError, match="mean_rows"):
        mean_rows(torch.zeros(2, 4), torch.zeros(3))
    with pytest.raises(ValueError, match="mean_rows: float32"):
        mean_rows(torch.zeros(2, 4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16))
