"""What the neuron modules share: the membrane-potential recording of every neuron
(LIF, IF, PLIF, ALIF, CUBA), and for the stateless ones built on NeuronOptions (ALIF, CUBA,
the recurrent neurons) the options checked once at construction, the [T, B, ...] input
check, and the common part of their repr. The dynamics live in spikefuse.functional."""
from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from .layers import layer_name


class RecordsPotential(nn.Module):
    """record_potential: after each call, `self.potential` holds the pre-reset potential
    trace h [T, B, ...] (x's dtype) with its graph, for membrane-potential losses and plots;
    the module still returns only the spikes. False: `self.potential` stays None."""

    def __init__(self, record_potential: bool = False):
        super().__init__()
        self.record_potential = bool(record_potential)
        self.potential: torch.Tensor | None = None  # h of the last call (record_potential)

    def call_neuron(self, function, x, **kwargs):
        """function(x, **kwargs) (a spikefuse.functional neuron); with record_potential it
        is asked for h too, which is kept in self.potential and left out of the return."""
        if not self.record_potential:
            return function(x, **kwargs)
        spikes, self.potential, *state = function(x, return_potential=True, **kwargs)
        return (spikes, *state) if state else spikes


class NeuronOptions(RecordsPotential):
    def __init__(self, threshold, reset, v_reset, detach_reset, surrogate, alpha, backend,
                 record_potential=False):
        super().__init__(record_potential)
        self.threshold, self.v_reset, _, _ = F._neuron_options(threshold, v_reset, reset, surrogate, alpha)
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        self.reset, self.detach_reset = reset, bool(detach_reset)
        self.surrogate, self.alpha, self.backend = surrogate, alpha, backend

    def options(self) -> dict:
        """The keyword arguments every functional neuron takes."""
        return dict(threshold=self.threshold, reset=self.reset, v_reset=self.v_reset,
                    detach_reset=self.detach_reset, surrogate=self.surrogate, alpha=self.alpha,
                    backend=self.backend)

    def check_rank(self, x: torch.Tensor, function: str) -> None:
        if isinstance(x, torch.Tensor) and x.dim() < 3:
            raise ValueError(f"{layer_name(self)}: expected time-major input [T, B, ...] with at least "
                             f"one feature dim (3 or more dims), got shape {tuple(x.shape)}; "
                             f"spikefuse.functional.{function} takes any [T, *]")

    def options_repr(self) -> str:
        """threshold, reset and surrogate, then the options that differ from their defaults."""
        text = f"threshold={self.threshold}, reset={self.reset!r}, surrogate={self.surrogate!r}"
        if self.reset == "hard" and self.v_reset != 0.0:
            text += f", v_reset={self.v_reset}"
        if self.detach_reset:
            text += ", detach_reset=True"
        if self.alpha is not None:
            text += f", alpha={self.alpha}"
        if self.backend != "auto":
            text += f", backend={self.backend!r}"
        return text
