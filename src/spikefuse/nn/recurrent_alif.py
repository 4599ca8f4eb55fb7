"""Recurrent adaptive LIF module (the LSNN of Bellec et al. 2018 with a recurrent weight);
the dynamics live in spikefuse.functional.ralif."""
from __future__ import annotations

import torch

from .. import functional as F
from ..neuron_options import check_number
from .neuron_base import RecurrentOptions


class RecurrentALIF(RecurrentOptions):
    """h = decay*v + x + s_prev @ weight.T, fire at h >= threshold + beta*a, reset v, then
    a = adapt_decay*a + s.

    x [T, B, ..., features] (3 or more dims) -> spikes of x's shape. Every call starts from
    v = a = 0 and no spikes. `weight` [features, features] is initialised as nn.Linear's
    (uniform in +-1/sqrt(features)); put an nn.Linear before the layer for its feed-forward
    input. grad_threshold: the secondary threshold of the backward (see spikefuse.functional.lif).
    backend: "auto", "fused" or "reference" (see spikefuse.functional.ralif).
    record_potential: keep each call's pre-reset potential trace h in `self.potential`
    (as spikefuse.nn.LIF).
    """

    def __init__(self, features: int, decay: float = 0.5, adapt_decay: float = 0.9, beta: float = 0.5,
                 threshold: float = 1.0, reset: str = "hard", v_reset: float = 0.0, detach_reset: bool = False,
                 surrogate: str = "rectangular", alpha: float | None = None,
                 grad_threshold: float = float("-inf"), backend: str = "auto", record_potential: bool = False,
                 device=None, dtype=None):
        super().__init__(features, threshold, reset, v_reset, detach_reset, surrogate, alpha, backend,
                         record_potential, grad_threshold, device, dtype)
        self.decay = check_number("decay", decay, low_open=0.0, high=1.0)
        self.adapt_decay = check_number("adapt_decay", adapt_decay, low_open=0.0, high=1.0)
        self.beta = check_number("beta", beta, low=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x, "ralif")
        return self.call_neuron(F.ralif, x, weight=self.weight, decay=self.decay, adapt_decay=self.adapt_decay,
                                beta=self.beta, grad_threshold=self.grad_threshold, **self.keywords())

    def extra_repr(self):
        text = (f"{self.features}, decay={self.decay}, adapt_decay={self.adapt_decay}, beta={self.beta}, "
                + self.options_repr())
        if self.grad_threshold > float("-inf"):
            text += f", grad_threshold={self.grad_threshold}"
        return text
