"""Watch the spiking layers: forward hooks on every module that emits spikes
(spikefuse.nn.LIF, IF, PLIF, ALIF, CUBA, the recurrent LIF, ALIF and CUBA, and the fused BNLIF)
count spikes for firing rates, or keep whole spike trains for rasters."""
from __future__ import annotations

import torch
from torch import nn

from ..nn import ALIF, BNLIF, CUBA, LIF, RecurrentALIF, RecurrentCUBA, RecurrentLIF

SPIKING = (LIF, ALIF, CUBA, RecurrentLIF, RecurrentALIF, RecurrentCUBA, BNLIF)  # modules whose output is spikes


EXACT_IN_FLOAT32 = 1 << 24  # every integer up to 2^24 is a float32


def spike_count(spikes: torch.Tensor) -> torch.Tensor:
    """The sum of `spikes` as a float32 tensor per 2^24 elements (a list): exact for 0/1
    spikes, whose float32 partial sums are integers below 2^24. Summing in float64 instead
    converts every spike first, which took about 5 times as long on an H100 (issue 32's
    training profile: 84 of the step's 1100 us)."""
    return [chunk.sum(dtype=torch.float32) for chunk in spikes.detach().reshape(-1).split(EXACT_IN_FLOAT32)]


def spiking_layers(model: nn.Module) -> dict[str, nn.Module]:
    """name -> module for every spiking neuron layer, in forward order of registration."""
    return {name: m for name, m in model.named_modules() if isinstance(m, SPIKING)}


class SpikeMonitor:
    """Context manager: while active, counts spikes per layer (and keeps them if asked).

    The counts live in one device tensor updated in place, so watching costs no host sync
    per step, a CUDA graph captured while watching keeps counting when replayed, and
    torch.compile traces the hooks without recompiling (the tensor never changes identity;
    `reset()` zeroes it). `rates()` syncs once.
    mode: "train" or "eval" counts only forward passes in that mode (two monitors can then
    stay attached through a whole run); None counts every pass.
    """

    def __init__(self, model: nn.Module, keep: bool = False, mode: str | None = None, device=None):
        if mode not in (None, "train", "eval"):
            raise ValueError(f"mode: expected 'train', 'eval' or None, got {mode!r}")
        self.layers = spiking_layers(model)
        self.keep, self.mode = keep, mode
        self.handles = []
        if device is None:
            first = next(iter(model.parameters()), None)
            first = first if first is not None else next(iter(model.buffers()), None)
            device = first.device if first is not None else "cpu"
        # row i: (spikes, neuron-steps) of layer i; float64 counts stay exact past 2^24
        self.counts = torch.zeros(len(self.layers), 2, dtype=torch.float64, device=device)
        self.trains: dict[str, torch.Tensor] = {}

    def reset(self):
        self.counts.zero_()
        self.trains = {}

    def _hook(self, index, name):
        def hook(module, inputs, out):
            if self.mode is not None and module.training != (self.mode == "train"):
                return
            out = out.detach()
            row = self.counts[index]
            for count in spike_count(out):
                row[0].add_(count.to(row.device))
            row[1].add_(out.numel())
            if self.keep:
                self.trains[name] = out.cpu()
        return hook

    def __enter__(self):
        self.handles = [m.register_forward_hook(self._hook(i, n)) for i, (n, m) in enumerate(self.layers.items())]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []

    def rates(self) -> dict[str, float]:
        """Mean spikes per neuron per time step, per layer (0 for a layer not yet run)."""
        counts = self.counts.tolist()
        return {n: spikes / steps if steps else 0.0 for n, (spikes, steps) in zip(self.layers, counts)}

    def rate(self) -> float:
        """Mean firing rate over all spiking neurons of all layers."""
        spikes, steps = self.counts.sum(0).tolist() if len(self.layers) else (0.0, 0.0)
        return spikes / steps if steps else 0.0
