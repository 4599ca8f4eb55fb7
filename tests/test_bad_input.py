"""Bad input raises a clear error naming the argument."""
import pytest
import torch

import spikefuse.functional as F
from spikefuse import nn


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("call,error,match", [
    (lambda b: F.lif(torch.tensor(1.0), backend=b), ValueError, "time dimension"),
    (lambda b: F.lif(torch.zeros(0, 3), backend=b), ValueError, "T == 0"),
    (lambda b: F.lif(torch.zeros(2, 3, dtype=torch.int32), backend=b), TypeError, "floating"),
    (lambda b: F.lif([[1.0]], backend=b), TypeError, "x must be"),
    (lambda b: F.lif(torch.zeros(2, 3), decay=1.5, backend=b), ValueError, "decay"),
    (lambda b: F.lif(torch.zeros(2, 3), decay=-0.1, backend=b), ValueError, "decay"),
    (lambda b: F.plif(torch.zeros(2, 3, 4), torch.tensor([0.5, 0.2]), backend=b), ValueError, "decay"),
    (lambda b: F.plif(torch.zeros(2, 3, 4), torch.tensor([0.5, 2.0, 0.1, 0.1]), backend=b), ValueError, "decay"),
    (lambda b: F.lif(torch.zeros(2, 3), surrogate="gauss", backend=b), ValueError, "surrogate"),
    (lambda b: F.lif(torch.zeros(2, 3), reset="zero", backend=b), ValueError, "reset"),
    (lambda b: F.lif(torch.zeros(2, 3), v0=torch.zeros(4), backend=b), ValueError, "v0"),
    (lambda b: F.lif(torch.zeros(2, 3), v0=torch.zeros(3, device="meta"), backend=b), ValueError, "v0"),
    (lambda b: F.lif(torch.zeros(2, 3), threshold=float("nan"), backend=b), TypeError, "threshold"),
    (lambda b: F.lif(torch.zeros(2, 3), alpha=-1.0, backend=b), ValueError, "alpha"),
    (lambda b: F.lif(torch.zeros(2, 3), backend="cuda"), ValueError, "backend"),
])
def test_functional_rejects(backend, call, error, match):
    with pytest.raises(error, match=match):
        call(backend)


def test_fused_float64_is_refused_with_a_hint():
    with pytest.raises(TypeError, match="reference"):
        F.lif(torch.zeros(2, 3, dtype=torch.float64), backend="fused")


@pytest.mark.parametrize("make,match", [
    (lambda: nn.LIF(reset="zero"), "reset"),
    (lambda: nn.LIF(surrogate="gauss"), "surrogate"),
    (lambda: nn.LIF(decay=2.0), "decay"),
    (lambda: nn.PLIF(init_decay=1.0), "init_decay"),
])
def test_modules_reject_bad_options_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_module_needs_time_and_batch():
    with pytest.raises(ValueError, match=r"\[T, B"):
        nn.LIF()(torch.zeros(5))
