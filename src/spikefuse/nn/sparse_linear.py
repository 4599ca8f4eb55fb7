"""SpikingLinear with a sparse backward, chosen from the measured share of outputs that
carry gradient.

Put it in front of a LIF with a secondary gradient threshold (LIF(grad_threshold=...)):
then only the outputs whose neurons came near threshold carry gradient, and the backward
(spikefuse.ops.sparse_linear) works on those alone. Dispatch, backward="auto": both
backwards count the carrying outputs on the device (no host sync inside a step);
`update_dispatch(model)`, called where the loop already reads the device (between epochs,
or every few hundred steps), reads the counts and picks the sparse backward where the
mean carrying share is at most `sparse_below` (0.5: the sparse step paid up to about 0.6 at
the IPU networks' widths 1 and 4, batches 8 and 64, on an H200, docs/sparse.md), the dense
one elsewhere. It also sets each sparse layer's `capacity` (the carrying outputs its
backward hands to cuBLAS, the rest to the Triton kernels: spikefuse.ops.sparse_linear) from
the largest count it measured. It returns whether any layer changed its choice or capacity:
a captured step must then be captured again.
"""
from __future__ import annotations

import warnings

import torch

from ..ops.sparse_linear import sparse_spike_linear
from ..neuron_options import check_number
from .layers import check_input, layer_name
from .spiking_layers import SpikingLinear, _saved_bits

BACKWARDS = ("auto", "sparse", "dense")
# The carrying share up to which the sparse backward pays. Measured on one H200 with a fixed share
# carrying (bench sparse --activity 0.05,0.2,0.4,0.6, benchmarks/results/s29-2026-11-28/), the
# capacity's cuBLAS products in: sparse / dense step 1.22x, 1.19x, 1.09x at 0.4 and 1.03x, 1.01x,
# 1.04x at 0.6 (IPU width 4 batch 8, width 4 batch 64, width 1 batch 8). Before the capacity
# (Triton kernels alone) the bound was 0.35, where batch 64 broke even on an H100.
SPARSE_BELOW = 0.5
CAPACITY_MARGIN = 1.25  # capacity: the largest count measured, times this, rounded up to CAPACITY_STEP
CAPACITY_STEP = 64
CAPACITY_KEEP = 0.6  # a capacity stays while the new target is above this share of it (fewer re-captures)


class SparseSpikingLinear(SpikingLinear):
    """nn.Linear over binary spikes [T, B, ..., in_features] (input saved as bits) whose
    backward runs sparse over the outputs that carry gradient. backward: "auto" (start
    sparse, then follow update_dispatch), "sparse" or "dense" (fixed)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, backward: str = "auto",
                 sparse_below: float = SPARSE_BELOW, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        if backward not in BACKWARDS:
            raise ValueError(f"backward: unknown {backward!r}; expected one of {list(BACKWARDS)}")
        self.backward_mode, self.sparse_below = backward, check_number("sparse_below", sparse_below, low=0.0, high=1.0)
        self.sparse = backward != "dense"
        # summed carrying count, backward calls, the largest count; on the device, read by update_dispatch
        self.register_buffer("carry", torch.zeros(3, dtype=torch.float64, device=device), persistent=False)
        self.last_share: float | None = None  # the carrying share update_dispatch decided on last
        self.capacity = 0  # carrying outputs the backward's cuBLAS products take; 0 until measured

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_dynamo_compiling():  # the traced op is SpikingLinear's (dense)
            return super().forward(s)
        check_input(self, s, "[T, B, ..., in_features]", rank=tuple(range(3, 9)),
                    channels=self.in_features, dim=-1)
        x = s if s.is_contiguous() else s.contiguous()
        return sparse_spike_linear(x, self.weight, self.bias, _saved_bits(s, x, self.weight),
                                   self.carry, self.sparse, self.capacity)

    def carrying_share(self, reset: bool = True) -> float | None:
        """Mean share of outputs that carried gradient per backward since the last reset
        (None before any backward). Reads the device: call it between steps."""
        return self._measured(reset)[0]

    def _measured(self, reset: bool) -> tuple[float | None, int]:
        """(mean carrying share or None, largest carrying count) since the last reset."""
        total, calls, most = self.carry.tolist()
        if reset:
            self.carry.zero_()
        return (None if calls == 0 else total / calls / max(self.out_features, 1)), int(most)

    def _update_capacity(self, most: int) -> bool:
        """Capacity from the largest count measured; True if it changed."""
        target = min(-(-int(most * CAPACITY_MARGIN) // CAPACITY_STEP) * CAPACITY_STEP, self.out_features)
        if most <= self.capacity and target > CAPACITY_KEEP * self.capacity:
            return False
        changed, self.capacity = target != self.capacity, target
        return changed

    def extra_repr(self):
        return super().extra_repr() + f", backward={self.backward_mode!r}"


class NoGradientWarning(UserWarning):
    """A sparse layer received no gradient at all since the last dispatch."""


def update_dispatch(model: torch.nn.Module) -> bool:
    """Re-choose the backward of every backward="auto" SparseSpikingLinear in `model` from
    the carrying share measured since the last call, and the path of every path="auto"
    RecurrentLIF from its share of spiking columns, and every sparse layer's capacity from
    its largest carrying count; True if any choice or capacity changed. Warns
    (NoGradientWarning) when a layer got no gradient at all: with a secondary threshold a
    network silent at initialisation never learns (no potential reaches it)."""
    changed = False
    for layer in model.modules():
        if isinstance(layer, SparseSpikingLinear):
            share, most = layer._measured(reset=True)
            if layer.backward_mode == "auto":
                layer.last_share = share
                if share == 0.0:
                    warnings.warn(f"{layer_name(layer)}: no output carried gradient since the last dispatch (the "
                                  "neurons after it never reached their grad_threshold), so no gradient reaches "
                                  "the layers before it: lower grad_threshold, or train dense until the network "
                                  "is active", NoGradientWarning, stacklevel=2)
                if share is not None and (share <= layer.sparse_below) != layer.sparse:
                    layer.sparse = not layer.sparse
                    changed = True
            if share is not None and layer.sparse and layer._update_capacity(most):
                changed = True
        elif getattr(layer, "path", None) == "auto":  # RecurrentLIF: by the share of columns that spike
            share = layer.active_share()
            layer.last_share = share
            if share is not None and (share <= layer.sparse_below) != layer.sparse:
                layer.sparse = not layer.sparse
                changed = True
    return changed


def dispatch_report(model: torch.nn.Module) -> dict[str, dict]:
    """Per dispatched layer of `model` (named as in named_modules): the share update_dispatch
    last decided on (the carrying outputs of a sparse Linear, the spiking columns of a
    recurrent LIF; None before any call) and the backward it chose. Reads no device."""
    return {name: {"share": layer.last_share, "backward": "sparse" if layer.sparse else "dense"}
            for name, layer in model.named_modules()
            if isinstance(layer, SparseSpikingLinear) and layer.backward_mode == "auto"
            or getattr(layer, "path", None) == "auto"}


__all__ = ["SparseSpikingLinear", "update_dispatch", "dispatch_report", "NoGradientWarning", "SPARSE_BELOW"]
