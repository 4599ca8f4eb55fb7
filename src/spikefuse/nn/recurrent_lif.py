"""Recurrent LIF module: a LIF layer with a learnable weight from its own spikes of the
step before (the SHD/LSNN literature's recurrent layer); the dynamics live in
spikefuse.functional.rlif."""
from __future__ import annotations

import torch

from .. import functional as F
from ..neuron_options import check_number
from .neuron_base import RecurrentOptions

PATHS = ("dense", "sparse", "auto")
SPARSE_BELOW = 0.25  # a first guess; benchmarks/results/ has the measured map


class RecurrentLIF(RecurrentOptions):
    """h = decay*v + x + s_prev @ weight.T, fire at h >= threshold, reset v.

    x [T, B, ..., features] (3 or more dims) -> spikes of x's shape. Every call starts from
    v = 0 and no spikes. `weight` [features, features] is initialised as nn.Linear's
    (uniform in +-1/sqrt(features)); put an nn.Linear before the layer for its feed-forward
    input. grad_threshold: the sparse backward's secondary threshold (see spikefuse.functional.lif).
    backend: "auto", "fused" or "reference" (see spikefuse.functional.rlif).
    path: "dense", "sparse" (spikefuse.functional.rlif's sparse=True; same results) or "auto":
    the layer counts the columns that spike per step on the device, and
    spikefuse.nn.update_dispatch (between epochs) picks sparse where that share is at most
    `sparse_below`.
    record_potential: keep each call's pre-reset potential trace h in `self.potential`
    (as spikefuse.nn.LIF).
    """

    def __init__(self, features: int, decay: float = 0.5, threshold: float = 1.0, reset: str = "hard",
                 v_reset: float = 0.0, detach_reset: bool = False, surrogate: str = "rectangular",
                 alpha: float | None = None, grad_threshold: float = float("-inf"), backend: str = "auto",
                 path: str = "dense", sparse_below: float = SPARSE_BELOW, device=None, dtype=None,
                 record_potential: bool = False):
        super().__init__(features, threshold, reset, v_reset, detach_reset, surrogate, alpha, backend,
                         record_potential, grad_threshold, device, dtype)
        self.decay = check_number("decay", decay, low_open=0.0, high=1.0)
        if path not in PATHS:
            raise ValueError(f"path: unknown {path!r}; expected one of {list(PATHS)}")
        if not 0.0 <= sparse_below <= 1.0:
            raise ValueError(f"sparse_below must be a share in [0, 1], got {sparse_below}")
        self.path, self.sparse_below = path, float(sparse_below)
        self.sparse = path == "sparse"
        self.last_share: float | None = None  # the spiking share update_dispatch decided on last
        # active columns per step, summed, and steps x features seen (path="auto")
        self.register_buffer("activity", torch.zeros(2, dtype=torch.float64, device=device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x, "rlif")
        return self.call_neuron(F.rlif, x, weight=self.weight, decay=self.decay, grad_threshold=self.grad_threshold,
                                sparse=self.sparse, activity=self.activity if self.path == "auto" else None,
                                **self.keywords())

    def active_share(self, reset: bool = True) -> float | None:
        """Mean share of columns with a spike in some row, per step, since the last reset
        (None before any fused call in path="auto"). Reads the device: call it between steps."""
        active, seen = self.activity.tolist()
        if reset:
            self.activity.zero_()
        return None if seen == 0 else active / seen

    def extra_repr(self):
        text = f"{self.features}, decay={self.decay}, " + self.options_repr()
        if self.grad_threshold > float("-inf"):
            text += f", grad_threshold={self.grad_threshold}"
        if self.path != "dense":
            text += f", path={self.path!r}"
        return text
