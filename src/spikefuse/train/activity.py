"""Keep hidden activity low while training: a penalty on firing rates above a per-neuron
bound, which the spiking layers contribute during the training forward.

The sparse backward pays where few neurons fire (docs/sparse.md), and unregularised training
lets rates climb (the IPU SHD net from 3% to 14-20% in three epochs). The penalty is the
upper-bound term of Zenke & Vogels 2021 and Cramer et al. 2020, on rates:

    penalty = weight * sum over spiking layers of mean over neurons of relu(r_i - max_rate)^2

r_i: neuron i's spikes per time step, averaged over the batch. Forward hooks on the spiking
layers compute each layer's term from its spikes (so the gradient reaches the potentials
through the surrogate); `take()` sums what one forward left and starts the next. A loss
function sees only logits, so the Trainer adds `take()` to the loss inside its step: in a
captured step the hooks run at capture, and the penalty is part of the graph.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .spikes import spiking_layers


def check_rate_options(max_rate, weight) -> None:
    """ValueError naming the argument, for a bound outside [0, 1) or a weight not finite and > 0."""
    if isinstance(max_rate, bool) or not isinstance(max_rate, (int, float)) or not 0 <= max_rate < 1:
        raise ValueError(f"max_rate: expected a firing rate in [0, 1) (spikes per neuron per time step), "
                         f"got {max_rate!r}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (weight > 0 and math.isfinite(weight)):
        raise ValueError(f"rate_weight: expected a finite number > 0, got {weight!r}")


class RateRegularizer:
    """The penalty above for `model`'s spiking layers (spikefuse.train.spikes.SPIKING).
    Hooks are attached while used as a context manager; only training-mode forwards with
    gradients enabled add terms (evaluation adds nothing)."""

    def __init__(self, model: nn.Module, max_rate: float, weight: float = 100.0):
        check_rate_options(max_rate, weight)
        self.layers = spiking_layers(model)
        if not self.layers:
            raise ValueError("model: it has no spiking layers (spikefuse.nn neurons) whose rate to bound")
        self.max_rate, self.weight = float(max_rate), float(weight)
        self.terms: list[torch.Tensor] = []
        self.handles = []

    def _hook(self, module, inputs, out):
        if not (module.training and torch.is_grad_enabled()):
            return
        spikes = out[0] if isinstance(out, tuple) else out
        per_neuron = spikes.float().mean(dim=(0, 1)) if spikes.dim() >= 2 else spikes.float().mean()
        self.terms.append(torch.relu(per_neuron - self.max_rate).square().mean())

    def __enter__(self):
        self.handles = [m.register_forward_hook(self._hook) for m in self.layers.values()]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        self.terms = []

    def take(self, device=None) -> torch.Tensor:
        """The weighted penalty of the forwards since the last call (a 0-dim float32 tensor;
        zero if none ran with the hooks attached)."""
        terms, self.terms = self.terms, []
        if not terms:
            return torch.zeros((), device=device)
        return self.weight * torch.stack(terms).sum()
