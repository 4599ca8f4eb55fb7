"""Adaptive-threshold LIF module (ALIF / LSNN, Bellec et al. 2018); the dynamics live in
spikefuse.functional.alif."""
from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ..ops.surrogate import resolve as resolve_surrogate
from .layers import layer_name


class ALIF(nn.Module):
    """Adaptive LIF: h = decay*v + x, fire at h >= threshold + beta*a, reset v, then
    a = adapt_decay*a + s (each spike raises the threshold, which relaxes back).

    x [T, B, ...] (3 or more dims) -> spikes of x's shape. Every call starts from
    v = a = 0. backend: "auto", "fused" or "reference" (see spikefuse.functional.alif).
    """

    def __init__(self, decay: float = 0.5, adapt_decay: float = 0.9, beta: float = 0.5,
                 threshold: float = 1.0, reset: str = "hard", v_reset: float = 0.0,
                 detach_reset: bool = False, surrogate: str = "rectangular",
                 alpha: float | None = None, backend: str = "auto"):
        super().__init__()
        self.decay = F._alif_number("decay", decay, low_open=0.0, high=1.0)
        self.adapt_decay = F._alif_number("adapt_decay", adapt_decay, low_open=0.0, high=1.0)
        self.beta = F._alif_number("beta", beta, low=0.0)
        self.threshold = F._alif_number("threshold", threshold)
        self.v_reset = F._alif_number("v_reset", v_reset)
        if reset not in F.RESETS:
            raise ValueError(f"reset: unknown mode {reset!r}; expected one of {list(F.RESETS)}")
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        resolve_surrogate(surrogate, alpha)
        self.reset, self.detach_reset = reset, bool(detach_reset)
        self.surrogate, self.alpha, self.backend = surrogate, alpha, backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and x.dim() < 3:
            raise ValueError(f"{layer_name(self)}: expected time-major input [T, B, ...] with at least "
                             f"one feature dim (3 or more dims), got shape {tuple(x.shape)}; "
                             f"spikefuse.functional.alif takes any [T, *]")
        return F.alif(x, decay=self.decay, adapt_decay=self.adapt_decay, beta=self.beta,
                      threshold=self.threshold, reset=self.reset, v_reset=self.v_reset,
                      detach_reset=self.detach_reset, surrogate=self.surrogate, alpha=self.alpha,
                      backend=self.backend)

    def extra_repr(self):
        text = (f"decay={self.decay}, adapt_decay={self.adapt_decay}, beta={self.beta}, "
                f"threshold={self.threshold}, reset={self.reset!r}, surrogate={self.surrogate!r}")
        if self.reset == "hard" and self.v_reset != 0.0:
            text += f", v_reset={self.v_reset}"
        if self.detach_reset:
            text += ", detach_reset=True"
        if self.alpha is not None:
            text += f", alpha={self.alpha}"
        if self.backend != "auto":
            text += f", backend={self.backend!r}"
        return text
