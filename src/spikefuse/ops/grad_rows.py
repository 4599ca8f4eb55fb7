"""A backward's note of which rows of a weight's gradient can be nonzero, for a lazy optimizer.

The sparse backward (spikefuse.ops.sparse_linear) writes only the rows of its carrying
outputs and knows their list (on the device). Without this note spikefuse.optim.LazyAdam
finds the nonzero rows again by reading the whole gradient: on a wide layer that search
costs more than the sparse backward saves (the IPU SHD network at 4x width: 0.1 of its
0.42 ms step, docs/sparse.md).

The note is only a superset of the nonzero rows (LazyAdam still skips a listed row whose
gradient is all zero), and it is trusted only while it describes the tensor that is
param.grad now: the same storage (held by a weak reference, so a new gradient that reuses
the freed memory is not mistaken for it), not modified in place since the backward wrote
it (autograd accumulating another gradient into it, a user's in-place edit), and not
cleared by a dense backward of the same layer or by LazyAdam.zero_grad. Anything else
falls back to the search.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

ATTRIBUTE = "_spikefuse_grad_rows"


class RowsNote(NamedTuple):
    rows: torch.Tensor    # int32 [>= count], the candidate rows first
    count: torch.Tensor   # int32 [1] on the device
    storage: weakref.ref  # the gradient tensor the note describes: its storage, ...
    data_ptr: int         # ... where in it,
    version: int          # ... and its version when the backward wrote it
    shape: torch.Size


def note(param: torch.Tensor, grad: torch.Tensor, rows: torch.Tensor, count: torch.Tensor) -> None:
    """Record that only rows[:count] of `grad`, the gradient about to reach param.grad, can be nonzero.
    Keeps no reference to `grad` itself: autograd then hands it to param.grad without a copy."""
    setattr(param, ATTRIBUTE, RowsNote(rows, count, weakref.ref(grad.untyped_storage()), grad.data_ptr(),
                                       grad._version, grad.shape))


def clear(param: torch.Tensor) -> None:
    if getattr(param, ATTRIBUTE, None) is not None:
        setattr(param, ATTRIBUTE, None)


def take(param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows, count) if the note still describes param.grad (and forget it: one use), else None."""
    found = getattr(param, ATTRIBUTE, None)
    clear(param)
    grad = param.grad
    if found is None or grad is None:
        return None
    if found.storage() is not grad.untyped_storage():
        return None
    if (grad.data_ptr(), grad._version, grad.shape) != (found.data_ptr, found.version, found.shape):
        return None
    return found.rows, found.count
