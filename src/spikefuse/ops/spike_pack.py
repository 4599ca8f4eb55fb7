"""Spikes as bits: pack a {0, 1} tensor into uint8 (8 spikes per byte) and back.

Element i of the flattened tensor is bit (i % 8) of byte i // 8 (little-endian within a
byte); the last byte is zero-padded. Packing treats every nonzero value as a spike, so
a non-binary input is silently rounded up to 1. Set SPIKEFUSE_DEBUG=1 (or
`spike_pack.DEBUG = True`) to have `check_binary` verify inputs, at the price of a
device sync per call.

On CUDA (or on the CPU under TRITON_INTERPRET=1) one Triton launch does each direction;
otherwise plain torch bit operations do the same job (the reference twin, which also stands in
while a kernel compiles in the background: ops/launch.py).
"""
from __future__ import annotations

import os

import torch

from .kernel_base import EAGER, cdiv
from .launch import cached_launch, fused_or

from .triton_or_stub import HAVE_TRITON, INTERPRETED, tl, triton

DEBUG = os.environ.get("SPIKEFUSE_DEBUG", "0") not in ("", "0")
BLOCK = 1024  # bytes per program: 8 KiB of spikes in, 1 KiB out


# n_bytes not specialized: a last, smaller batch would otherwise often need a variant of its own
# (n_bytes no longer divisible by 16), compiled late in a cold first epoch (0.3 s on an H200);
# only byte accesses read it
@cached_launch
@triton.jit(do_not_specialize=["n_bytes"])
def _pack_kernel(s_ptr, out_ptr, n, n_bytes, BLOCK: tl.constexpr):
    byte = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bit = tl.arange(0, 8)
    idx = byte.to(tl.int64)[:, None] * 8 + bit[None, :]
    s = tl.load(s_ptr + idx, mask=idx < n, other=0)
    bits = tl.where(s != 0, 1, 0).to(tl.int32) << bit[None, :]
    tl.store(out_ptr + byte, tl.sum(bits, axis=1).to(tl.uint8), mask=byte < n_bytes)


@cached_launch
@triton.jit(do_not_specialize=["n_bytes"])  # as _pack_kernel's
def _unpack_kernel(p_ptr, out_ptr, n, n_bytes, BLOCK: tl.constexpr):
    byte = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bit = tl.arange(0, 8)
    idx = byte.to(tl.int64)[:, None] * 8 + bit[None, :]
    p = tl.load(p_ptr + byte, mask=byte < n_bytes, other=0).to(tl.int32)
    # through float32: a direct int -> bfloat16 cast gives garbage in the interpreter
    s = ((p[:, None] >> bit[None, :]) & 1).to(tl.float32)
    tl.store(out_ptr + idx, s.to(out_ptr.dtype.element_ty), mask=idx < n)


@cached_launch
@triton.jit(do_not_specialize=["rows", "ld"])  # as _pack_kernel's: rows follow the batch
def _unpack_transposed_kernel(p_ptr, out_ptr, rows, cols, ld, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # out[c, r] (row stride ld) = spike (r, c) of the [rows, cols] tensor packed row by row
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (c[:, None] < cols) & (r[None, :] < rows)
    idx = r.to(tl.int64)[None, :] * cols + c[:, None]
    p = tl.load(p_ptr + (idx >> 3), mask=inside, other=0).to(tl.int32)
    s = ((p >> (idx & 7).to(tl.int32)) & 1).to(tl.float32)  # (through float32: see _unpack_kernel)
    tl.store(out_ptr + c.to(tl.int64)[:, None] * ld + r[None, :], s.to(out_ptr.dtype.element_ty), mask=inside)


def use_triton(t: torch.Tensor) -> bool:
    """Whether the Triton kernels run on t: on CUDA, or on the CPU under the interpreter."""
    return HAVE_TRITON and (t.is_cuda or INTERPRETED)


def check_binary(s: torch.Tensor, name: str = "spikes") -> None:
    """In debug mode, raise ValueError unless every value of s is 0 or 1."""
    if DEBUG and not ((s == 0) | (s == 1)).all():
        bad = s[(s != 0) & (s != 1)].flatten()[:4].tolist()
        raise ValueError(f"{name} must be binary (0 or 1) to be saved as bits; found values {bad}")


def pack(s: torch.Tensor, launch=EAGER) -> torch.Tensor:
    """Flattened s -> uint8 tensor of ceil(numel / 8) bytes (nonzero = 1). launch: see
    spikefuse.ops.lif.Launch (TRACED inside a torch.library op's body: there the debug
    check, which reads values, is skipped)."""
    if not launch.traced:
        check_binary(s)
    flat = s.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    n = flat.numel()
    n_bytes = (n + 7) // 8
    if not use_triton(flat):
        return _pack_in_torch(flat, n, n_bytes)
    flat = flat.contiguous()

    def kernel():
        out = torch.empty(n_bytes, dtype=torch.uint8, device=flat.device)
        if n:
            launch(_pack_kernel)[(cdiv(n_bytes, BLOCK),)](flat, out, n, n_bytes, BLOCK=BLOCK)
        return out
    return fused_or(kernel, lambda: _pack_in_torch(flat, n, n_bytes))  # torch while the kernel compiles


def _pack_in_torch(flat, n, n_bytes):
    bits = torch.zeros(n_bytes * 8, dtype=torch.uint8, device=flat.device)
    bits[:n] = flat != 0
    weights = torch.ones(8, dtype=torch.uint8, device=flat.device) << torch.arange(8, dtype=torch.uint8,  # 1..128,
                                                                                   device=flat.device)  # capturable
    return (bits.view(-1, 8) * weights).sum(1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, shape, dtype: torch.dtype = torch.float32, launch=EAGER) -> torch.Tensor:
    """Inverse of `pack`: the first prod(shape) bits as a tensor of `shape` and `dtype`."""
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise TypeError(f"packed must be a 1-d uint8 tensor, got {packed.dtype} of shape {tuple(packed.shape)}")
    n = 1
    for size in shape:
        n *= size
    if packed.numel() != (n + 7) // 8:
        raise ValueError(f"packed holds {packed.numel()} bytes; shape {tuple(shape)} needs {(n + 7) // 8}")
    if not use_triton(packed):
        return _unpack_in_torch(packed, shape, dtype, n)

    def kernel():
        out = torch.empty(shape, dtype=dtype, device=packed.device)
        if n:
            launch(_unpack_kernel)[(cdiv(packed.numel(), BLOCK),)](packed, out, n, packed.numel(), BLOCK=BLOCK)
        return out
    return fused_or(kernel, lambda: _unpack_in_torch(packed, shape, dtype, n))  # torch while the kernel compiles


TRANSPOSED_BLOCK = (64, 64)  # (rows, cols) per program
ROW_ALIGN = 8  # the transposed spikes' row stride, in elements: 32 bytes in fp32


def unpack_transposed(packed: torch.Tensor, rows: int, cols: int, dtype: torch.dtype = torch.float32,
                      launch=EAGER) -> torch.Tensor:
    """The spikes of a packed [rows, cols] tensor, transposed: a [cols, rows] view whose row
    stride is rows rounded up to ROW_ALIGN (cuBLAS's fast kernels want aligned strides).

    Why: in a weight gradient gy^T @ s the sum runs over the rows, which neither operand holds
    contiguously; Hopper's TF32 tensor-core instructions read operands only in that order, and
    cuBLAS's kernel for it took 1.3-1.7x as long as with s^T contiguous (spike_linear)."""
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise TypeError(f"packed must be a 1-d uint8 tensor, got {packed.dtype} of shape {tuple(packed.shape)}")
    if packed.numel() != (rows * cols + 7) // 8:
        raise ValueError(f"packed holds {packed.numel()} bytes; shape ({rows}, {cols}) needs {(rows * cols + 7) // 8}")
    ld = -(-rows // ROW_ALIGN) * ROW_ALIGN if rows else ROW_ALIGN
    if not use_triton(packed):
        return _unpack_transposed_in_torch(packed, rows, cols, dtype, ld)

    def kernel():
        out = torch.empty((cols, ld), dtype=dtype, device=packed.device)
        if rows * cols:
            block_r, block_c = TRANSPOSED_BLOCK
            launch(_unpack_transposed_kernel)[(cdiv(rows, block_r), cdiv(cols, block_c))](
                packed, out, rows, cols, ld, BLOCK_R=block_r, BLOCK_C=block_c)
        return out[:, :rows]
    return fused_or(kernel, lambda: _unpack_transposed_in_torch(packed, rows, cols, dtype, ld))


def _unpack_transposed_in_torch(packed, rows, cols, dtype, ld):
    out = torch.empty((cols, ld), dtype=dtype, device=packed.device)[:, :rows]
    out.copy_(_unpack_in_torch(packed, (rows, cols), dtype, rows * cols).t())
    return out


def _unpack_in_torch(packed, shape, dtype, n):
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed[:, None] >> shifts) & 1
    return bits.reshape(-1)[:n].to(dtype).view(shape)


def attach_bits(spikes: torch.Tensor, packed: torch.Tensor) -> None:
    """Remember `packed` (pack(spikes), made by the kernel that made the spikes) on the spikes
    tensor, so that a spiking conv/linear reading them need not pack them again. Valid only
    while the tensor is not modified in place (its version counter is recorded)."""
    spikes.spike_bits = (packed, spikes._version)


def attached_bits(s: torch.Tensor) -> torch.Tensor | None:
    """The bits attach_bits left on s, or None (none attached, or s modified since)."""
    entry = getattr(s, "spike_bits", None)
    if entry is None or entry[1] != s._version:
        return None
    return entry[0]

