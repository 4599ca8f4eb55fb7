"""The oracle itself: float64 gradcheck of what has a true derivative, and the surrogates."""
import math

import pytest
import torch

from spikefuse import reference
from spikefuse.surrogates import DEFAULT_ALPHA, SURROGATES, spike, surrogate_grad

# Each surrogate is the derivative of a smooth-ish "soft step"; autograd of the soft step
# in float64 must equal the closed form used by every backend.
SOFT_STEPS = {
    "rectangular": lambda u, a: torch.clamp(u / a + 0.5, 0, 1),
    "triangle": lambda u, a: torch.where(u < 0, 0.5 * torch.clamp(1 + u / a, min=0) ** 2,
                                         1 - 0.5 * torch.clamp(1 - u / a, min=0) ** 2),
    "fast_sigmoid": lambda u, a: u / (1 + a * u.abs()),
    "sigmoid": lambda u, a: torch.sigmoid(a * u),
    "atan": lambda u, a: torch.atan(math.pi / 2 * a * u) / math.pi,
}


@pytest.mark.parametrize("name", SURROGATES)
def test_surrogate_is_derivative_of_its_soft_step(name):
    alpha = DEFAULT_ALPHA[name] * 0.7
    u = (torch.rand(1000, dtype=torch.float64) - 0.5) * 4
    u = u[(u.abs() - alpha / 2).abs() > 1e-6]  # away from the rectangle's corners
    u.requires_grad_(True)
    (auto,) = torch.autograd.grad(SOFT_STEPS[name](u, alpha).sum(), u)
    torch.testing.assert_close(surrogate_grad(u.detach(), name, alpha), auto)


def test_spike_forward_and_backward():
    u = torch.tensor([-1.0, -0.1, 0.0, 0.2], requires_grad=True)
    s = spike(u, "rectangular", 1.0)
    assert s.tolist() == [0.0, 0.0, 1.0, 1.0]
    s.sum().backward()
    assert u.grad.tolist() == [0.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("reset", ["hard", "soft", "none"])
def test_reference_state_path_gradcheck(reset):
    """With the reset detached, v[T-1] is piecewise linear in x, v0 and decay: its true
    gradient exists (away from spike flips) and autograd must match finite differences."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 2, 3, dtype=torch.float64, generator=g).requires_grad_(True)
    v0 = torch.randn(2, 3, dtype=torch.float64, generator=g).requires_grad_(True)
    decay = torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64).requires_grad_(True)

    def final_state(x, v0, decay):
        return reference.lif(x, decay, 0.8, reset, 0.1, True, "sigmoid", None, v0, True)[1]

    assert torch.autograd.gradcheck(final_state, (x, v0, decay), eps=1e-7)
