"""Issue 36, the numerical cases, by class of attack: a parameter the fused BNLIF took and the
reference refused (one check, one message, every backend). Fused kernels on CPU tensors run
through Triton's interpreter: tiny shapes."""

import pytest
import torch

from spikefuse import nn
from helpers import DEVICE

nan, inf = float("nan"), float("inf")
BACKENDS = ("fused", "reference", "auto")


def randn(*shape, seed=0, shift=0.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) + shift).to(DEVICE, dtype)


# ---- 1. BNLIF's LIF options: the fused path took threshold=inf (no spikes, no word) and
# v_reset=nan, which the reference refused at its first forward

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option,value", [("threshold", inf), ("threshold", -inf), ("threshold", nan),
                                          ("v_reset", nan), ("v_reset", inf), ("threshold", "1.0"),
                                          ("v_reset", torch.tensor(0.0))])
def test_bn_lif_refuses_a_non_finite_option_on_every_backend(backend, option, value):
    with pytest.raises(TypeError, match=rf"^{option} must be a finite Python number, got "):
        nn.BNLIF(3, backend=backend, **{option: value})


@pytest.mark.parametrize("backend", BACKENDS)
def test_bn_lif_checks_an_option_set_after_construction(backend):
    layer = nn.BNLIF(3, backend=backend).to(DEVICE)
    layer.threshold = inf
    with pytest.raises(TypeError, match="^threshold must be a finite Python number, got inf$"):
        layer(randn(2, 2, 3, 4))


@pytest.mark.parametrize("make", [
    lambda b: nn.spiking_layers.ConvBNLIF(2, 3, backend=b, threshold=inf),
    lambda b: nn.spiking_layers.LinearBNLIF(2, 3, backend=b, v_reset=nan),
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_blocks_built_on_bn_lif_refuse_too(make, backend):
    with pytest.raises(TypeError, match="must be a finite Python number"):
        make(backend)


def test_bn_lif_finite_options_give_the_same_spikes_on_both_backends():
    x = randn(4, 2, 3, 5, seed=1)
    out = [nn.BNLIF(3, threshold=0.2, v_reset=-0.3, reset="hard", backend=b).to(DEVICE)(x) for b in ("fused", "reference")]
    assert out[0].sum() > 0 and torch.equal(*out)
