"""SpikingJelly's surrogate functions that have a spikefuse twin of the same formula:
`Sigmoid`, `ATan`, `PiecewiseQuadratic` and `Rect`, with SpikingJelly's arguments.

A neuron of spikefuse.compat.spikingjelly takes these, or SpikingJelly's own objects of the
same names (recognised without importing SpikingJelly), and runs spikefuse's surrogate of the
same formula in its kernels. Called on a tensor, each is SpikingJelly's: a Heaviside step
(x >= 0) forward, the surrogate gradient backward.
"""
from __future__ import annotations

from torch import nn

from ...neuron_options import check_number
from ...surrogates import spike

__all__ = ["Sigmoid", "ATan", "PiecewiseQuadratic", "Rect", "surrogate_of"]

SJ_MODULE = "spikingjelly.activation_based.surrogate"


# SpikingJelly's class -> (spikefuse's surrogate of the same formula, SpikingJelly's default
# alpha, whether spikefuse's alpha is 1/alpha: a width where SpikingJelly's is a slope)
MAPPED = {
    "Sigmoid": ("sigmoid", 4.0, False),                 # alpha * sig(alpha x) * (1 - sig(alpha x))
    "ATan": ("atan", 2.0, False),                       # (alpha / 2) / (1 + (pi/2 * alpha * x)^2)
    "PiecewiseQuadratic": ("triangle", 1.0, True),      # max(0, alpha - alpha^2 |x|): half-width 1/alpha
    "Rect": ("rectangular", 1.0, True),                 # alpha where |x| < 0.5 / alpha: width 1/alpha
}


def _mapped(name: str, alpha: float) -> tuple[str, float]:
    ours, _, inverse = MAPPED[name]
    return ours, 1.0 / alpha if inverse else alpha


class _Surrogate(nn.Module):
    """One of SpikingJelly's surrogates: `alpha` and `spiking` as SpikingJelly's."""

    def __init__(self, alpha=None, spiking=True):
        super().__init__()
        if not spiking:
            raise ValueError(f"spiking={spiking!r}: spikefuse.compat.spikingjelly's surrogates always spike "
                             f"(SpikingJelly's spiking=False runs the smooth primitive instead)")
        default = MAPPED[type(self).__name__][1]
        self.alpha = check_number("alpha", default if alpha is None else alpha, low_open=0.0)
        self.spiking = True

    def spikefuse(self) -> tuple[str, float]:
        """spikefuse's (surrogate, alpha) of the same formula."""
        return _mapped(type(self).__name__, self.alpha)

    def forward(self, x):
        return spike(x, *self.spikefuse())

    def extra_repr(self):
        return f"alpha={self.alpha}, spiking=True"


class Sigmoid(_Surrogate):
    """SpikingJelly's `Sigmoid(alpha=4.0)`: spikefuse's "sigmoid" at the same alpha."""

    def __init__(self, alpha=4.0, spiking=True):
        super().__init__(alpha, spiking)


class ATan(_Surrogate):
    """SpikingJelly's `ATan(alpha=2.0)`: spikefuse's "atan" at the same alpha."""

    def __init__(self, alpha=2.0, spiking=True):
        super().__init__(alpha, spiking)


class PiecewiseQuadratic(_Surrogate):
    """SpikingJelly's `PiecewiseQuadratic(alpha=1.0)`: spikefuse's "triangle" at alpha 1/alpha."""

    def __init__(self, alpha=1.0, spiking=True):
        super().__init__(alpha, spiking)


class Rect(_Surrogate):
    """SpikingJelly's `Rect(alpha=1.0)`: spikefuse's "rectangular" at alpha 1/alpha."""

    def __init__(self, alpha=1.0, spiking=True):
        super().__init__(alpha, spiking)


def surrogate_of(function) -> tuple[str, float]:
    """spikefuse's (surrogate, alpha) for a neuron's `surrogate_function`: None is
    SpikingJelly's default, Sigmoid at alpha 4; this module's classes and SpikingJelly's own
    Sigmoid, ATan, PiecewiseQuadratic and Rect (spiking, with a number alpha) map to the same
    formula. Anything else: ValueError naming surrogate_function."""
    if function is None:
        return "sigmoid", 4.0
    if isinstance(function, _Surrogate):
        return function.spikefuse()
    name, alpha = type(function).__name__, getattr(function, "alpha", None)
    if (type(function).__module__ == SJ_MODULE and name in MAPPED and getattr(function, "spiking", False)
            and isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha > 0):
        return _mapped(name, float(alpha))
    raise ValueError(f"surrogate_function: spikefuse.compat.spikingjelly maps None (Sigmoid, alpha 4) and the "
                     f"spiking {', '.join(MAPPED)} surrogates (its own or SpikingJelly's, a number alpha) onto its "
                     f"kernels, not {function!r}")
