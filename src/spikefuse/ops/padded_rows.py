"""Activations handed on as a view of a buffer whose rows are padded to an aligned width.

cuBLAS runs a product whose leading dimension is not a multiple of 16 bytes on its align-1
kernels, and a spiking linear layer with out_features % 8 != 0 therefore computes into a
padded, aligned buffer (spike_linear.output_padding). Copying the layer's columns out of it,
and padding the gradient on the way back, cost two passes over the activations (issue 34:
0.26 ms of the IPU SHD net's 3.09 ms step at batch 256 on an H100), and the next layer's
product still read a misaligned input.

Instead such a layer can return the view of its columns, with the padded buffer attached
(`attach`). Its pad columns are exactly zero (zero weight rows, zero bias). A consumer that
knows the padding runs on the whole buffer: the fused LIF treats the pad columns as neurons
that never fire (zero input from zero potential, threshold > 0), whose spikes and input
gradients are zero, and the next spiking linear multiplies them by zero weight columns. So
the real columns get exactly the values of the unpadded computation and nothing is copied.
Any other consumer reads the view as an ordinary (non-contiguous) tensor.
"""
from __future__ import annotations

import torch


def attach(view: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """Remember on `view` (full[..., :width]) the padded buffer it was cut from, whose extra
    columns are zero; valid while neither is modified in place (they share a version counter)."""
    view.padded_rows = (full, full._version)
    return view


def padded_full(t: torch.Tensor) -> torch.Tensor | None:
    """The zero-padded buffer `attach` left on t, or None (none attached, or modified since)."""
    entry = getattr(t, "padded_rows", None)
    if entry is None or entry[1] != entry[0]._version:
        return None
    return entry[0]
