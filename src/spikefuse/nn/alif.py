"""Adaptive-threshold LIF module (ALIF / LSNN, Bellec et al. 2018); the dynamics live in
spikefuse.functional.alif."""
from __future__ import annotations

import torch

from .. import functional as F
from ..neuron_options import check_number
from .neuron_base import CarriesState, SharedOptions


class ALIF(SharedOptions, CarriesState):
    """Adaptive LIF: h = decay*v + x, fire at h >= threshold + beta*a, reset v, then
    a = adapt_decay*a + s (each spike raises the threshold, which relaxes back).

    x [T, B, ...] (3 or more dims) -> spikes of x's shape. backend: "auto", "fused" or
    "reference" (see spikefuse.functional.alif).
    stateful: keep the final (v, a) in `self.v`, `self.a` as the next call's initial state
        (False, the default: every call starts from v = a = 0); detach_state: detach it
        (True, the default) or keep its graph across calls. As spikefuse.nn.LIF's, with
        spikefuse.nn.reset(model) and spikefuse.nn.detach_state(model).
    record_potential: keep each call's pre-reset potential trace h in `self.potential`
    (as spikefuse.nn.LIF).
    """
    STATE = ("v", "a")

    def __init__(self, decay: float = 0.5, adapt_decay: float = 0.9, beta: float = 0.5,
                 threshold: float = 1.0, reset: str = "hard", v_reset: float = 0.0,
                 detach_reset: bool = False, surrogate: str = "rectangular",
                 alpha: float | None = None, backend: str = "auto", record_potential: bool = False,
                 stateful: bool = False, detach_state: bool = True):
        super().__init__(threshold, reset, v_reset, detach_reset, surrogate, alpha, backend, record_potential)
        self.init_state(stateful, detach_state)
        self.decay = check_number("decay", decay, low_open=0.0, high=1.0)
        self.adapt_decay = check_number("adapt_decay", adapt_decay, low_open=0.0, high=1.0)
        self.beta = check_number("beta", beta, low=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_rank(x, "alif")
        return self.call_stateful(F.alif, x, "state0", decay=self.decay, adapt_decay=self.adapt_decay,
                                  beta=self.beta, **self.keywords())

    def extra_repr(self):
        return (f"decay={self.decay}, adapt_decay={self.adapt_decay}, beta={self.beta}, " + self.options_repr()
                + self.state_repr())
