"""SNN losses on a network's output and integer class targets [B].

Each loss takes the output either time-major, [T, B, C] (spikes or membrane potential per
step), or already reduced over time, [B, C] (what spikefuse's models return: the mean over
time), and says below how it reads each form.

The `loss_fn` contract of spikefuse.train (Trainer, fit), which all of these meet:
    loss_fn(output, target) -> scalar mean over the batch   (training; backpropagated)
    loss_fn(output, target, reduction="sum") -> scalar sum   (evaluation; summed over batches
                                                             and divided by the sample count)
with output the model's float32 [B, C] output and target the int64 labels [B]; accuracy
is output.argmax(1). As in torch: reduction "none" gives the per-sample losses [B], "sum"
their sum and "mean" their mean, so "sum" == "mean" * B.

Shapes, dtypes and arguments are checked always; target's range is checked on CPU tensors
only, where it costs no device sync (on a GPU an out-of-range class fails in the indexing).
"""
from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

__all__ = ["rate_cross_entropy", "count_mse", "membrane_cross_entropy"]

REDUCTIONS = ("mean", "sum", "none")


def rate_cross_entropy(spikes: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the spike counts: softmax over classes of spikes.sum(0) for [T, B, C].

    A [B, C] output is used as it is (counts, or the rates spikefuse's models return).
    Cross-entropy is not scale-invariant: rates (counts / T) give a softer softmax than counts.
    """
    target = _check(spikes, target, reduction)
    counts = spikes.sum(0) if spikes.dim() == 3 else spikes
    return F.cross_entropy(counts, target, reduction=reduction)


def count_mse(spikes: torch.Tensor, target: torch.Tensor, *, correct_rate: float = 0.8,
              incorrect_rate: float = 0.2, reduction: str = "mean") -> torch.Tensor:
    """Mean squared error between spike counts and target counts, as snnTorch's mse_count_loss:
    for [T, B, C], counts = spikes.sum(0) against correct_rate * T for the target class and
    incorrect_rate * T for the others. A sample's loss is the mean over its C classes.

    A [B, C] output is read as firing rates (spikes per step) and compared with the rates
    themselves: the same loss divided by T**2.
    """
    target = _check(spikes, target, reduction)
    for name, value in (("correct_rate", correct_rate), ("incorrect_rate", incorrect_rate)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0 <= value <= 1:
            raise ValueError(f"{name}: expected a number in [0, 1] (spikes per step), got {value!r}")
    if spikes.dim() == 3:
        counts, steps = spikes.sum(0), spikes.shape[0]
    else:
        counts, steps = spikes, 1
    is_target = torch.zeros_like(counts, dtype=torch.bool).scatter_(1, target[:, None], True)
    wanted = torch.where(is_target, correct_rate * steps, incorrect_rate * steps).to(counts.dtype)
    return _reduce(F.mse_loss(counts, wanted, reduction="none").mean(1), reduction)


def membrane_cross_entropy(mem: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the membrane potential at every step, averaged over time: a sample's
    loss is mean over t of cross_entropy(mem[t], target) for [T, B, C].

    A [B, C] output is one step (or a time-averaged potential): plain cross-entropy.
    """
    target = _check(mem, target, reduction, name="mem")
    if mem.dim() == 2:
        return F.cross_entropy(mem, target, reduction=reduction)
    steps, batch, classes = mem.shape
    per_step = F.cross_entropy(mem.reshape(steps * batch, classes), target.repeat(steps), reduction="none")
    return _reduce(per_step.view(steps, batch).mean(0), reduction)


def _reduce(per_sample: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return per_sample.mean()
    return per_sample.sum() if reduction == "sum" else per_sample


def _check(output, target, reduction: str, name: str = "spikes") -> torch.Tensor:
    """Raise on bad arguments; return target as int64, the index type torch needs."""
    if not isinstance(output, torch.Tensor) or not output.is_floating_point():
        kind = output.dtype if isinstance(output, torch.Tensor) else type(output).__name__
        raise TypeError(f"{name}: expected a floating-point tensor, got {kind}")
    if output.dim() not in (2, 3) or output.shape[-1] == 0 or (output.dim() == 3 and output.shape[0] == 0):
        raise ValueError(f"{name}: expected [T, B, C] (T >= 1) or [B, C] (C >= 1), got shape {tuple(output.shape)}")
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        kind = target.dtype if isinstance(target, torch.Tensor) else type(target).__name__
        raise TypeError(f"target: expected an integer tensor of class indices, got {kind}")
    batch, classes = output.shape[-2:]
    if target.shape != (batch,):
        raise ValueError(f"target: expected shape [{batch}] (one class per sample of {name}, shape "
                         f"{tuple(output.shape)}), got {tuple(target.shape)}")
    if target.device != output.device:
        raise ValueError(f"target: expected the device of {name} ({output.device}), got {target.device}")
    if target.device.type == "cpu" and batch and not 0 <= int(target.min()) <= int(target.max()) < classes:
        raise ValueError(f"target: expected class indices in [0, {classes}), got values in "
                         f"[{int(target.min())}, {int(target.max())}]")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {list(REDUCTIONS)}, got {reduction!r}")
    return target.long()
