"""A neuron op's note, on its spikes, of the positions whose gradient it will use.

A LIF with a per-neuron cut shared over the batch (grad_threshold with grad_scope "batch")
multiplies the gradient reaching its spikes by a surrogate that is 0 at every step of each
position (a neuron of x[0, 0]) that never reached grad_threshold: a finite gradient arriving
there is discarded. The forward knows those positions, so it notes them on the spikes it
returns, and a consumer that computes that gradient (the input gradient of
spikefuse.ops.sparse_linear) may compute it at the kept positions only and leave zeros
elsewhere. The one difference it can make: a non-finite gradient at a cut position reaches
the LIF as 0, not NaN (NaN * 0); no gradient passes a cut neuron either way.

The note is trusted only while the tensor is not modified in place (its version counter is
recorded), like spike_pack.attach_bits.
"""
from __future__ import annotations

import torch

ATTRIBUTE = "spikefuse_kept_positions"


def note(spikes: torch.Tensor, flags: torch.Tensor) -> None:
    """Record flags (float32 [positions], nonzero: kept) on the spikes [T, B, *positions] a
    neuron op made."""
    setattr(spikes, ATTRIBUTE, (flags, spikes._version))


def of(s: torch.Tensor) -> torch.Tensor | None:
    """The flags `note` left on s (one per position of s[0, 0]), or None (none noted, or s
    modified since)."""
    entry = getattr(s, ATTRIBUTE, None)
    if entry is None or entry[1] != s._version:
        return None
    return entry[0]
