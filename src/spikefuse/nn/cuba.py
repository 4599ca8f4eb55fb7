"""Current-based synaptic LIF module (CUBA; snnTorch `Synaptic`, Norse's LIF with a
synaptic current); the dynamics live in spikefuse.functional.cuba."""
from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ..ops.surrogate import resolve as resolve_surrogate
from .layers import layer_name


class CUBA(nn.Module):
    """Synaptic LIF: i = syn_decay*i + x, h = decay*v + i, fire at h >= threshold, reset v.

    x [T, B, ...] (3 or more dims) -> spikes of x's shape. Every call starts from
    v = i = 0. backend: "auto", "fused" or "reference" (see spikefuse.functional.cuba).
    """

    def __init__(self, decay: float = 0.5, syn_decay: float = 0.5, threshold: float = 1.0,
                 reset: str = "hard", v_reset: float = 0.0, detach_reset: bool = False,
                 surrogate: str = "rectangular", alpha: float | None = None,
                 backend: str = "auto"):
        super().__init__()
        self.decay = F._alif_number("decay", decay, low_open=0.0, high=1.0)
        self.syn_decay = F._alif_number("syn_decay", syn_decay, low=0.0, high=1.0)
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
                             f"spikefuse.functional.cuba takes any [T, *]")
        return F.cuba(x, decay=self.decay, syn_decay=self.syn_decay, threshold=self.threshold,
                      reset=self.reset, v_reset=self.v_reset, detach_reset=self.detach_reset,
                      surrogate=self.surrogate, alpha=self.alpha, backend=self.backend)

    def extra_repr(self):
        text = (f"decay={self.decay}, syn_decay={self.syn_decay}, threshold={self.threshold}, "
                f"reset={self.reset!r}, surrogate={self.surrogate!r}")
        if self.reset == "hard" and self.v_reset != 0.0:
            text += f", v_reset={self.v_reset}"
        if self.detach_reset:
            text += ", detach_reset=True"
        if self.alpha is not None:
            text += f", alpha={self.alpha}"
        if self.backend != "auto":
            text += f", backend={self.backend!r}"
        return text
