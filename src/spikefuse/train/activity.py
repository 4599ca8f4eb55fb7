"""Keep hidden activity low while training: a penalty on firing rates above a per-neuron
bound, and on the rates themselves, which the spiking layers contribute during the training
forward.

The sparse backward pays where few neurons fire (docs/sparse.md), and unregularised training
lets rates climb (the IPU SHD net from 3% to 14-20% in three epochs). The penalty is the
upper-bound term of Zenke & Vogels 2021 and Cramer et al. 2020, on rates, plus an L1 term and
a log term:

    penalty = weight * sum over spiking layers of mean over neurons of relu(r_i - max_rate)^2
            + l1 * sum over spiking layers of mean over neurons of r_i
            + log * sum over spiking layers of mean over neurons of log(1 + r_i / LOG_SCALE)

r_i: neuron i's spikes per time step, averaged over the batch. The first term leaves a
neuron below the bound alone, also one whose potential keeps coming near threshold without
firing, and under the sparse backward's cut (grad_threshold) such a neuron still carries
gradient. The second (an L1 term on spikes) reaches it: its gradient per spike does not
shrink with the rate, and through the surrogate it lowers every potential near threshold.
The third pulls as the L1 term does with weight log / LOG_SCALE on a silent neuron, but
its pull halves by a rate of LOG_SCALE and keeps falling: it quiets the neurons that fire
rarely and leaves the ones the task uses (a concave penalty: measured in issue 32, it kept
the IPU net's accuracy where the L1 term, at the same pull on silent neurons, lost points).

Forward hooks on the spiking layers compute each layer's term from its spikes (so the
gradient reaches the potentials through the surrogate); `take()` sums what one forward left
and starts the next. A loss function sees only logits, so the Trainer adds `take()` to the
loss inside its step: in a captured step the hooks run at capture, and the penalty is part
of the graph.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .spikes import spiking_layers


FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # the penalty is summed in float32
LOG_SCALE = 0.005  # the rate at which the log term's pull on a neuron halves


def check_rate_options(max_rate, weight, l1=0.0, log=0.0) -> None:
    """ValueError naming the argument, for a bound outside [0, 1), a weight not > 0, or an l1
    or log weight not >= 0, each weight finite in float32 (the log term's slope on a silent
    neuron, log / LOG_SCALE, too)."""
    if isinstance(max_rate, bool) or not isinstance(max_rate, (int, float)) or not 0 <= max_rate < 1:
        raise ValueError(f"max_rate: expected a firing rate in [0, 1) (spikes per neuron per time step), "
                         f"got {max_rate!r}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= FLOAT32_MAX:
        raise ValueError(f"rate_weight: expected a finite number > 0 (at most float32's {FLOAT32_MAX:.3g}), "
                         f"got {weight!r}")
    for name, value, top in (("rate_l1", l1, FLOAT32_MAX), ("rate_log", log, FLOAT32_MAX * LOG_SCALE)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
            raise ValueError(f"{name}: expected a finite number >= 0 (at most {top:.3g}, float32's range), "
                             f"got {value!r}")


class _LayerPenalty(torch.autograd.Function):
    """One layer's penalty (float32, 0-dim) from its spikes [T, B, ...], its derivative in each
    neuron's rate taken in the forward: the backward is one broadcast view of that vector,
    which autograd adds to the spikes' other gradient. Through autograd the regulariser took
    40 of the IPU x4 batch-8 step's 99 kernels and 0.11 of its 1.24 ms of GPU time (issue 32's
    profile, H200); with this Function that dense run trained at 5795-5841 samples/s, where
    the same terms through autograd gave 5465-5566 (6618-6732 without a regulariser)."""

    @staticmethod
    def forward(ctx, spikes, regularizer):
        rows = math.prod(spikes.shape[:2])
        rates = spikes.reshape(rows, -1).sum(0, dtype=torch.float32).div_(rows)
        penalty, slope = regularizer.penalty_and_slope(rates)
        ctx.save_for_backward(slope.div_(rows))  # d penalty / d spike
        ctx.shape, ctx.dtype = spikes.shape, spikes.dtype
        return penalty

    @staticmethod
    def backward(ctx, grad):
        slope, = ctx.saved_tensors
        return (slope * grad).to(ctx.dtype).reshape(ctx.shape[2:]).expand(ctx.shape), None


class RateRegularizer:
    """The penalty above for `model`'s spiking layers (spikefuse.train.spikes.SPIKING).
    Hooks are attached while used as a context manager; only training-mode forwards with
    gradients enabled add terms (evaluation adds nothing)."""

    def __init__(self, model: nn.Module, max_rate: float | None, weight: float = 100.0, l1: float = 0.0,
                 log: float = 0.0):
        """max_rate None: no upper-bound term (then l1 or log must be > 0)."""
        check_rate_options(0.0 if max_rate is None else max_rate, weight, l1, log)
        if max_rate is None and not l1 and not log:
            raise ValueError("max_rate: None with rate_l1 and rate_log 0 leaves nothing to penalise; pass one")
        self.layers = spiking_layers(model)
        if not self.layers:
            raise ValueError("model: it has no spiking layers (spikefuse.nn neurons) whose rate to bound")
        self.max_rate = None if max_rate is None else float(max_rate)
        self.weight, self.l1, self.log = float(weight), float(l1), float(log)
        self.terms: list[torch.Tensor] = []
        self.handles = []

    def penalty_and_slope(self, rates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the terms' sum over one layer's neurons' rates [N] (float32), its derivative in each)."""
        n = rates.numel()
        penalty, slope = rates.new_zeros(()), rates.new_full(rates.shape, self.l1 / n)
        if self.max_rate is not None:
            over = (rates - self.max_rate).clamp_(min=0)
            penalty = penalty + torch.dot(over, over) * (self.weight / n)
            slope.add_(over, alpha=2 * self.weight / n)
        if self.l1:
            penalty = penalty + rates.sum() * (self.l1 / n)
        if self.log:
            penalty = penalty + torch.log1p(rates / LOG_SCALE).sum() * (self.log / n)
            slope.add_((rates + LOG_SCALE).reciprocal_(), alpha=self.log / n)
        return penalty, slope

    def _hook(self, module, inputs, out):
        if not (module.training and torch.is_grad_enabled()):
            return
        spikes = out[0] if isinstance(out, tuple) else out
        self.terms.append(_LayerPenalty.apply(spikes, self))

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
        return sum(terms[1:], terms[0])
