"""The precisions by name: one meaning for `spikefuse train --precision`, Trainer/fit and
the benchmarks.

    fp32         float32; matmuls and convolutions on TF32 tensor cores where the GPU has
                 them (Ampere and later: a 10-bit mantissa, float32's range and float32
                 sums), cuBLAS, cuDNN and spikefuse's Triton kernels alike; a spiking
                 convolution's weight gradient on fp16 tensor cores instead, from exact
                 spikes and a per-channel scaled gradient: as close to float64 as TF32's or
                 closer (spikefuse.ops.half_grad, docs/capture.md)
    fp32-strict  float32 with IEEE matmuls and convolutions (TF32 off for both)
    bf16, fp16   torch.autocast to that dtype; what stays float32 follows fp32 (TF32)

    with precision.applied("fp32"):   # sets the flags for the block, restores the caller's after
        ...

PyTorch's own default differs: cuDNN convolutions on TF32, cuBLAS matmuls not. The flags are
global to the process, so applied() gives back exactly what it found, also on an exception.
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["PRECISIONS", "check", "autocast_dtype", "uses_tf32", "applied"]

PRECISIONS = ("fp32", "fp32-strict", "bf16", "fp16")
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check(precision, argument: str = "precision") -> str:
    """`precision` if it is one of PRECISIONS, else a ValueError naming `argument`."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"{argument}: unknown {precision!r}; expected one of {list(PRECISIONS)}")
    return precision


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype torch.autocast runs `precision` in; None for fp32 and fp32-strict (no autocast)."""
    return _AUTOCAST.get(check(precision))


def uses_tf32(precision: str) -> bool:
    """Whether float32 matmuls and convolutions may run on TF32 under `precision`."""
    return check(precision) != "fp32-strict"


@contextlib.contextmanager
def applied(precision: str):
    """Float32 matmuls and convolutions as `precision` says, for the duration of the block:
    torch.set_float32_matmul_precision ("high" = TF32, which also sets
    torch.backends.cuda.matmul.allow_tf32, the flag spikefuse's Triton kernels read) and
    torch.backends.cudnn.allow_tf32. The caller's settings come back on exit."""
    tf32 = uses_tf32(precision)
    # only what differs is set and restored: PyTorch's initial cuDNN setting (TF32 unless
    # torch.backends.fp32_precision says otherwise) cannot be written back once overwritten
    wanted = "high" if tf32 else "highest"  # not "medium": it lets oneDNN's CPU matmuls take bfloat16
    matmul = None if _reads(_matmul_precision, wanted) else _saved(torch.get_float32_matmul_precision, "highest",
                                                                     _matmul_knobs())
    cudnn = None if _reads(_cudnn_tf32, tf32) else _saved(_cudnn_tf32, True, _cudnn_knobs())
    try:
        if matmul is not None:
            torch.set_float32_matmul_precision(wanted)
        if cudnn is not None:
            torch.backends.cudnn.allow_tf32 = tf32
            if not tf32:  # off falls back to torch.backends.fp32_precision, which may say tf32
                for knob in _cudnn_knobs():
                    knob.fp32_precision = "ieee"
        yield
    finally:
        if matmul is not None:
            _restore(matmul, torch.set_float32_matmul_precision, _matmul_knobs())
        if cudnn is not None:
            _restore(cudnn, _set_cudnn_tf32, _cudnn_knobs())


# torch >= 2.9 keeps the same choice twice, in the legacy flags above and in per-backend
# fp32_precision strings; its legacy getters raise once a caller has mixed the two.
_NEW_API = hasattr(torch.backends.cudnn, "conv") and hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _matmul_precision() -> str:
    torch.backends.cuda.matmul.allow_tf32  # raises where the new API's cuBLAS setting disagrees
    return torch.get_float32_matmul_precision()


def _cudnn_tf32() -> bool:
    return torch.backends.cudnn.allow_tf32


def _set_cudnn_tf32(on: bool) -> None:
    torch.backends.cudnn.allow_tf32 = on


def _matmul_knobs() -> list:
    """What torch.set_float32_matmul_precision writes in the new API's terms."""
    return [torch.backends.cuda.matmul, torch.backends.mkldnn.matmul] if _NEW_API else []


def _cudnn_knobs() -> list:
    """What torch.backends.cudnn.allow_tf32 writes in the new API's terms."""
    return [torch.backends.cudnn.conv, torch.backends.cudnn.rnn] if _NEW_API else []


def _reads(get, value) -> bool:
    """Whether the legacy getter reads `value` (False where it raises: the APIs were mixed)."""
    try:
        return get() == value
    except RuntimeError:
        return False


def _saved(get, default, knobs) -> tuple:
    try:
        legacy = get()
    except RuntimeError:  # mixed APIs: the caller chose through fp32_precision, restored after
        legacy = default  # PyTorch's own initial value, which the new API leaves in place
    return legacy, [knob.fp32_precision for knob in knobs]


def _restore(saved: tuple, set_legacy, knobs) -> None:
    legacy, strings = saved
    set_legacy(legacy)  # first: it also writes the strings
    for knob, value in zip(knobs, strings):
        knob.fp32_precision = "none"  # inherit from torch.backends.fp32_precision where that reads the same
        if knob.fp32_precision != value:
            knob.fp32_precision = value
