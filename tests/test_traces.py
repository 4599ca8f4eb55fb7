"""Post-reset membrane traces (spikefuse.traces) from every neuron's spikes and pre-reset
trace: v[t] must be what the neuron's next step decays, and v[T-1] its returned state."""

import pytest
import torch

import spikefuse.functional as F
from spikefuse.traces import adaptive_threshold_trace, membrane_trace
from helpers import DEVICE

RESETS = ["hard", "soft", "none"]


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 0.8 + 0.5).to(DEVICE)


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("reset", RESETS)
def test_lif_trace_is_the_state_each_step_decays(backend, reset):
    x, decay = rand(7, 3, 5, seed=1), 0.75
    s, h, vT = F.lif(x, decay=decay, threshold=0.9, v_reset=-0.1, reset=reset, backend=backend,
                     return_potential=True, return_state=True)
    v = membrane_trace(h, s, reset=reset, threshold=0.9, v_reset=-0.1)
    assert v.shape == x.shape and torch.equal(v[-1], vT)
    # the next step charges from it: h[t] = decay * v[t-1] + x[t]
    assert torch.allclose(h[1:], decay * v[:-1] + x[1:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("reset", RESETS)
def test_alif_trace_with_its_adaptive_threshold(backend, reset):
    x = rand(9, 2, 6, seed=2)
    opts = dict(decay=0.8, adapt_decay=0.7, beta=0.6, threshold=0.9, v_reset=-0.2)
    s, h, (vT, aT) = F.alif(x, reset=reset, backend=backend, return_potential=True, return_state=True, **opts)
    theta = adaptive_threshold_trace(s, threshold=0.9, beta=0.6, adapt_decay=0.7)
    assert torch.equal(s, (h >= theta).float())  # the spikes are exactly those theta gives
    v = membrane_trace(h, s, reset=reset, threshold=theta, v_reset=-0.2)
    assert torch.allclose(v[-1], vT, rtol=0, atol=1e-6)
    assert torch.allclose(h[1:], 0.8 * v[:-1] + x[1:], rtol=0, atol=1e-6)
    assert torch.allclose(0.7 * adaptive_threshold_trace(s, 0.0, 1.0, 0.7)[-1] + s[-1], aT, rtol=0, atol=1e-6)


def test_alif_initial_adaptation():
    x = rand(5, 4, seed=3)
    a0 = torch.rand(4, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    s, h = F.alif(x, beta=0.5, return_potential=True, state0=(None, a0))
    assert torch.equal(s, (h >= adaptive_threshold_trace(s, beta=0.5, a0=a0)).float())


def test_cuba_and_per_channel_threshold():
    x = rand(6, 2, 3, seed=5)
    s, h, (vT, _) = F.cuba(x, decay=0.9, syn_decay=0.5, threshold=0.8, reset="soft",
                           return_potential=True, return_state=True)
    assert torch.allclose(membrane_trace(h, s, reset="soft", threshold=0.8)[-1], vT, rtol=0, atol=1e-6)
    theta = torch.tensor([0.5, 1.0, 1.5], device=DEVICE)
    v = membrane_trace(h, s, reset="soft", threshold=theta)
    assert torch.equal(v, h - theta * s)


def test_trace_is_differentiable():
    x = rand(5, 3, seed=6).requires_grad_()
    s, h = F.lif(x, reset="soft", return_potential=True)
    (g,) = torch.autograd.grad(membrane_trace(h, s, reset="soft").sum(), x)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_bad_input_is_named():
    h = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="same shape"):
        membrane_trace(h, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="reset"):
        membrane_trace(h, h, reset="hardest")
    with pytest.raises(TypeError, match="spikes must be a floating tensor"):
        membrane_trace(h, torch.zeros(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="threshold"):
        membrane_trace(h, h, threshold=torch.ones(5))
    with pytest.raises(ValueError, match="a0 must be"):
        adaptive_threshold_trace(h, a0=torch.zeros(3))
    assert adaptive_threshold_trace(torch.zeros(0, 2)).shape == (0, 2)


def test_half_precision_spikes_give_a_float32_threshold():
    x = rand(30, 2, 4, seed=7).bfloat16()
    s, h = F.alif(x, beta=0.3, adapt_decay=0.99, return_potential=True)
    theta = adaptive_threshold_trace(s, beta=0.3, adapt_decay=0.99)
    assert theta.dtype == torch.float32 and s.dtype == torch.bfloat16
