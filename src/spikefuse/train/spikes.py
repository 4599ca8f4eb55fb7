"""Watch the spiking layers: forward hooks on every module that emits spikes
(spikefuse.nn.LIF, IF, PLIF and the fused BNLIF) count spikes for firing rates, or keep
whole spike trains for rasters."""
from __future__ import annotations

import torch
from torch import nn

from ..nn import BNLIF, LIF

SPIKING = (LIF, BNLIF)  # modules whose output is spikes


def spiking_layers(model: nn.Module) -> dict[str, nn.Module]:
    """name -> module for every spiking neuron layer, in forward order of registration."""
    return {name: m for name, m in model.named_modules() if isinstance(m, SPIKING)}


class SpikeMonitor:
    """Context manager: while active, counts spikes per layer (and keeps them if asked).

    Sums stay on the device as tensors so watching costs no host sync per step;
    `rates()` syncs once.
    """

    def __init__(self, model: nn.Module, keep: bool = False):
        self.layers = spiking_layers(model)
        self.keep = keep
        self.handles = []
        self.reset()

    def reset(self):
        self.spikes = {name: 0.0 for name in self.layers}
        self.counts = {name: 0 for name in self.layers}
        self.trains: dict[str, torch.Tensor] = {}

    def _hook(self, name):
        def hook(module, inputs, out):
            out = out.detach()
            self.spikes[name] = self.spikes[name] + out.float().sum()
            self.counts[name] += out.numel()
            if self.keep:
                self.trains[name] = out.cpu()
        return hook

    def __enter__(self):
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in self.layers.items()]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []

    def rates(self) -> dict[str, float]:
        """Mean spikes per neuron per time step, per layer (0 for a layer not yet run)."""
        return {n: float(self.spikes[n]) / self.counts[n] if self.counts[n] else 0.0 for n in self.layers}

    def rate(self) -> float:
        """Mean firing rate over all spiking neurons of all layers."""
        total = sum(self.counts.values())
        return float(sum(self.spikes.values())) / total if total else 0.0
