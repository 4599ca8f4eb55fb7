"""Keep hidden activity low while training: a penalty on firing rates above a per-neuron
bound, and on the rates themselves, which the spiking layers contribute during the training
forward.

The sparse backward pays where few neurons fire (docs/sparse.md), and unregularised training
lets rates climb (the IPU SHD net from 3% to 14-20% in three epochs). The penalty is the
upper-bound term of Zenke & Vogels 2021 and Cramer et al. 2020, on rates, plus an L1 term:

    penalty = weight * sum over spiking layers of mean over neurons of relu(r_i - max_rate)^2
            + l1 * sum over spiking layers of mean over neurons of r_i

r_i: neuron i's spikes per time step, averaged over the batch. The first term leaves a
neuron below the bound alone, also one whose potential keeps coming near threshold without
firing, and under the sparse backward's cut (grad_threshold) such a neuron still carries
gradient. The second (an L1 term on spikes) reaches it: its gradient per spike does not
shrink with the rate, and through the surrogate it lowers every potential near threshold.

Forward hooks on the spiking layers compute each layer's term from its spikes (so the
gradient reaches the potentials through the surrogate); `take()` sums what one forward left
and starts the next. A loss function sees only logits, so the Trainer adds `take()` to the
loss inside its step: in a captured step the hooks run at capture, and the penalty is part
of the graph.
"""
from __future__ import annotations


import torch
from torch import nn

from .spikes import spiking_layers


FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # the penalty is summed in float32


def check_rate_options(max_rate, weight, l1=0.0) -> None:
    """ValueError naming the argument, for a bound outside [0, 1), a weight not > 0, or an l1
    weight not >= 0, each weight finite in float32."""
    if isinstance(max_rate, bool) or not isinstance(max_rate, (int, float)) or not 0 <= max_rate < 1:
        raise ValueError(f"max_rate: expected a firing rate in [0, 1) (spikes per neuron per time step), "
                         f"got {max_rate!r}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= FLOAT32_MAX:
        raise ValueError(f"rate_weight: expected a finite number > 0 (at most float32's {FLOAT32_MAX:.3g}), "
                         f"got {weight!r}")
    if isinstance(l1, bool) or not isinstance(l1, (int, float)) or not 0 <= l1 <= FLOAT32_MAX:
        raise ValueError(f"rate_l1: expected a finite number >= 0 (at most float32's {FLOAT32_MAX:.3g}), "
                         f"got {l1!r}")


class _PerNeuronRate(torch.autograd.Function):
    """Each neuron's mean over the first two dims (time and batch) of spikes [T, B, ...], in
    float32. Its backward hands back a broadcast view, so the only pass over T x B x N is
    autograd adding it to the spikes' other gradient (torch's mean materialised it first:
    about 70 of the step's 1100 us, with the reduction's 64, in issue 32's profile)."""

    @staticmethod
    def forward(ctx, spikes):
        ctx.shape, ctx.dtype = spikes.shape, spikes.dtype
        rows = spikes.shape[0] * spikes.shape[1]
        ctx.rows = rows
        return spikes.reshape(rows, -1).sum(0, dtype=torch.float32).div_(rows).reshape(spikes.shape[2:])

    @staticmethod
    def backward(ctx, grad):
        return (grad / ctx.rows).to(ctx.dtype).expand(ctx.shape)


def per_neuron_rate(spikes: torch.Tensor) -> torch.Tensor:
    """Spikes per time step of each neuron, averaged over the batch (float32)."""
    return _PerNeuronRate.apply(spikes) if spikes.dim() >= 2 else spikes.float().mean()


class RateRegularizer:
    """The penalty above for `model`'s spiking layers (spikefuse.train.spikes.SPIKING).
    Hooks are attached while used as a context manager; only training-mode forwards with
    gradients enabled add terms (evaluation adds nothing)."""

    def __init__(self, model: nn.Module, max_rate: float | None, weight: float = 100.0, l1: float = 0.0):
        """max_rate None: no upper-bound term (then l1 must be > 0)."""
        check_rate_options(0.0 if max_rate is None else max_rate, weight, l1)
        if max_rate is None and not l1:
            raise ValueError("max_rate: None and rate_l1 0 leave nothing to penalise; pass either")
        self.layers = spiking_layers(model)
        if not self.layers:
            raise ValueError("model: it has no spiking layers (spikefuse.nn neurons) whose rate to bound")
        self.max_rate, self.weight, self.l1 = None if max_rate is None else float(max_rate), float(weight), float(l1)
        self.terms: list[torch.Tensor] = []
        self.handles = []

    def _hook(self, module, inputs, out):
        if not (module.training and torch.is_grad_enabled()):
            return
        spikes = out[0] if isinstance(out, tuple) else out
        per_neuron = per_neuron_rate(spikes)
        term = per_neuron.new_zeros(())
        if self.max_rate is not None:
            term = term + self.weight * torch.relu(per_neuron - self.max_rate).square().mean()
        if self.l1:
            term = term + self.l1 * per_neuron.mean()
        self.terms.append(term)

    def __enter__(self):
        self.handles = [m.register_forward_hook(self._hook) for m in self.layers.values()]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        self.terms = []

    def take(self, device=None) -> torch.Tensor:
        """The penalty of the forwards since the last call (a 0-dim float32 tensor; zero if
        none ran with the hooks attached)."""
        terms, self.terms = self.terms, []
        if not terms:
            return torch.zeros((), device=device)
        return torch.stack(terms).sum()
