"""A float32 output gradient's fp16 twin, for a spiking convolution's weight gradient.

Spikes are exact in fp16, so the weight gradient dW = sum gy * s of a conv over spikes can
run on fp16 tensor cores (twice TF32's rate) once gy fits fp16: each output channel's gy
is scaled by a power of two that keeps that channel's sum of |gy| under 2^14. Spikes being
0 or 1, that sum bounds every entry of the channel's dW, so the fp16 result cannot overflow;
the scale comes off exactly afterwards. Against float64, on CIFAR-medium's convolutions,
this weight gradient is closer than TF32's (benchmarks/conv_fp16_accuracy.py: 3.1e-4 against
4.3-5.1e-4 relative), so the fp32 precision (TF32 allowed) takes it and fp32-strict does not.
The forward and the input gradient stay on TF32: there fp16's rounding of the result loses.

The kernel that writes the float32 gy (the fused BN+LIF's backward) writes the twin in the
same pass and offers it here; the conv's backward takes it if its output gradient is that
same memory, unmodified. One slot per thread: autograd runs a device's backward on one
thread, the producer just before its consumer, and taking empties the slot.
"""
from __future__ import annotations

import threading
import typing

import torch

SUM_LIMIT_LOG2 = 14  # per channel, sum |scaled gy| <= 2^14: under fp16's 65504 with room for rounding
SUM_LIMIT = 2.0 ** SUM_LIMIT_LOG2


class Twin(typing.NamedTuple):
    grad: torch.Tensor   # the float32 gradient offered, to recognise it by
    half: torch.Tensor   # fp16, laid out as `grad` in memory: grad * scale per channel, rounded
    scale: torch.Tensor  # [C] float32 powers of two


_slot = threading.local()


def enabled(x: torch.Tensor) -> bool:
    """Whether a float32 gradient for x's layer gets an fp16 twin: CUDA float32 with cuDNN's
    TF32 allowed (spikefuse.precision's fp32, and PyTorch's default)."""
    return x.is_cuda and x.dtype == torch.float32 and torch.backends.cudnn.allow_tf32


def offer(grad: torch.Tensor, half: torch.Tensor, scale: torch.Tensor) -> None:
    _slot.twin = (Twin(grad, half, scale), grad._version)


def take(grad: torch.Tensor) -> Twin | None:
    """The twin offered for `grad`'s memory (grad itself or a dense view of it, such as the
    conv's folded [T*B, C, H, W]), if unmodified since; None otherwise. Empties the slot."""
    entry = getattr(_slot, "twin", None)
    _slot.twin = None
    if entry is None:
        return None
    twin, version = entry
    same_memory = (grad.data_ptr() == twin.grad.data_ptr() and grad.numel() == twin.grad.numel()
                   and grad.dtype == twin.grad.dtype and _dense_order(grad) == _dense_order(twin.grad))
    if not same_memory or twin.grad._version != version:
        return None
    return twin


def half_view(twin: Twin, grad: torch.Tensor) -> torch.Tensor:
    """twin.half with grad's shape and strides (the same element at the same offset)."""
    return twin.half.as_strided(grad.shape, grad.stride())


def _dense_order(t: torch.Tensor):
    """The order of t's dimensions in memory when t is dense in NCHW-like or channels-last
    order (what the producer writes), else None: a match means the same bytes, element for element."""
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    if t.dim() == 5 and t.movedim(2, -1).is_contiguous():
        return "channels_last"
    return None
