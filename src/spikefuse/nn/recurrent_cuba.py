"""Recurrent current-based LIF module (snnTorch's `RSynaptic`): a CUBA layer whose synaptic
current also takes its own spikes of the step before through a learnable weight; the dynamics
live in spikefuse.functional.rcuba."""
from __future__ import annotations

import torch

from .. import functional as F
from ..neuron_options import check_number
from .neuron_base import RecurrentNeuron


class RecurrentCUBA(RecurrentNeuron):
    """i = syn_decay*i + x + s_prev @ weight.T, h = decay*v + i, fire at h >= threshold, reset v.

    x [T, B, ..., features] (3 or more dims) -> spikes of x's shape. Every call starts from
    v = i = 0 and no spikes. `weight` [features, features] is initialised as nn.Linear's; put an
    nn.Linear before the layer for its feed-forward input. reset="subtract" with
    detach_reset=True is snnTorch's RSynaptic (its default). backend: "auto" or "reference":
    this neuron runs on torch ops step by step (spikefuse.reference.cuba), with no fused kernel.
    record_potential: keep each call's pre-reset potential trace h in `self.potential`.
    """

    def __init__(self, features: int, decay: float = 0.5, syn_decay: float = 0.5, threshold: float = 1.0,
                 reset: str = "hard", v_reset: float = 0.0, detach_reset: bool = False,
                 surrogate: str = "rectangular", alpha: float | None = None, backend: str = "auto", device=None,
                 dtype=None, record_potential: bool = False):
        if backend == "fused":
            raise ValueError("backend: RecurrentCUBA has no fused kernel; use 'auto' or 'reference'")
        # RecurrentNeuron, not RecurrentOptions: no grad_threshold, as it has no sparse backward
        super().__init__(features, threshold, reset, v_reset, detach_reset, surrogate, alpha, backend,
                         record_potential, device=device, dtype=dtype)
        self.decay = check_number("decay", decay, low_open=0.0, high=1.0)
        self.syn_decay = check_number("syn_decay", syn_decay, low=0.0, high=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x, "rcuba")
        return self.call_neuron(F.rcuba, x, weight=self.weight, decay=self.decay, syn_decay=self.syn_decay,
                                **self.keywords())

    def extra_repr(self):
        return f"{self.features}, decay={self.decay}, syn_decay={self.syn_decay}, " + self.options_repr()
