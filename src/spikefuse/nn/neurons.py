"""Spiking neuron modules: they hold parameters (and, when streaming, the state);
the dynamics live in spikefuse.functional.
`grad_threshold` (sparse backward, see spikefuse.functional.lif) zeroes the surrogate
gradient where the potential is below it; -inf (the default) cuts nothing.

Input is time-major [T, B, ...]. With `stateful=True` the membrane potential after
the last step is kept and used as v0 by the next call, so a long sequence can be
fed in chunks; call `reset_state()` between independent sequences.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .. import functional as F
from ..ops.surrogate import resolve as resolve_surrogate


class LIF(nn.Module):
    """Leaky integrate-and-fire: h = decay*v + x, fire at h >= threshold, then reset."""

    def __init__(self, decay: float = 0.5, threshold: float = 1.0, reset: str = "hard",
                 v_reset: float = 0.0, detach_reset: bool = False, surrogate: str = "rectangular",
                 alpha: float | None = None, stateful: bool = False, backend: str = "auto",
                 grad_threshold: float = float("-inf")):
        super().__init__()
        if reset not in F.RESETS:
            raise ValueError(f"reset: unknown mode {reset!r}; expected one of {list(F.RESETS)}")
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        resolve_surrogate(surrogate, alpha)
        self.grad_threshold = F._check_grad_threshold(grad_threshold)
        if not isinstance(decay, torch.Tensor):
            F._check_decay(decay, None)
        self.decay = decay
        self.threshold, self.reset, self.v_reset = threshold, reset, v_reset
        self.detach_reset, self.surrogate, self.alpha = detach_reset, surrogate, alpha
        self.stateful, self.backend = stateful, backend
        self.v: torch.Tensor | None = None

    def decay_value(self):
        return self.decay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and x.dim() < 2:
            raise ValueError(f"{type(self).__name__} expects time-major input [T, B, ...], "
                             f"got shape {tuple(x.shape)}")
        options = dict(decay=self.decay_value(), threshold=self.threshold, reset=self.reset,
                       v_reset=self.v_reset, detach_reset=self.detach_reset,
                       surrogate=self.surrogate, alpha=self.alpha, backend=self.backend,
                       grad_threshold=self.grad_threshold)
        if not self.stateful:
            return F.lif(x, **options)
        v0 = self.v if self.v is not None and self.v.shape == x.shape[1:] else None
        spikes, v = F.lif(x, v0=v0, return_state=True, **options)
        self.v = v.detach()  # streaming chunks: truncated backpropagation through time
        return spikes

    def reset_state(self):
        self.v = None

    def extra_repr(self):
        return (f"decay={self.decay}, threshold={self.threshold}, reset={self.reset!r}, "
                f"surrogate={self.surrogate!r}{self._grad_threshold_repr()}")

    def _grad_threshold_repr(self):
        return f", grad_threshold={self.grad_threshold}" if self.grad_threshold > float("-inf") else ""


class IF(LIF):
    """Integrate-and-fire: LIF with decay = 1."""

    def __init__(self, threshold: float = 1.0, **kwargs):
        super().__init__(decay=1.0, threshold=threshold, **kwargs)

    def extra_repr(self):
        return (f"threshold={self.threshold}, reset={self.reset!r}, surrogate={self.surrogate!r}"
                f"{self._grad_threshold_repr()}")


class PLIF(LIF):
    """Parametric LIF (Fang et al. 2021): decay = sigmoid(w) is learned, so it stays in (0, 1).

    channels=None learns one decay for the layer; channels=C learns one per channel
    (dim 2 of the [T, B, C, ...] input).
    """

    def __init__(self, init_decay: float = 0.5, channels: int | None = None, **kwargs):
        if not 0.0 < init_decay < 1.0:
            raise ValueError(f"init_decay must lie strictly between 0 and 1, got {init_decay}")
        super().__init__(decay=init_decay, **kwargs)
        shape = () if channels is None else (channels,)
        self.w = nn.Parameter(torch.full(shape, math.log(init_decay / (1 - init_decay))))
        self.channels = channels

    def decay_value(self):
        return torch.sigmoid(self.w)

    def extra_repr(self):
        return (f"channels={self.channels}, threshold={self.threshold}, reset={self.reset!r}"
                f"{self._grad_threshold_repr()}")
