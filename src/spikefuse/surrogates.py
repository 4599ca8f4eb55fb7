"""Surrogate gradients you write yourself, that the fused LIF kernels run.

`surrogate=` of the LIF family (spikefuse.functional.lif / if_ / plif, spikefuse.nn.LIF /
IF / PLIF) takes a built-in name (see spikefuse.ops.surrogate), a plain callable sg(u) ->
tensor (torch ops: it runs on the loop or reference path, never fused), or `custom(...)`:
the same function written twice, once for Triton (the fused backward kernel calls it where
it would compute a built-in surrogate) and once in PyTorch (for the loop and reference
paths, torch.compile and double backward, and as the oracle in tests).

    import triton
    import triton.language as tl

    @triton.jit
    def scaled_fast_sigmoid(u, alpha):          # u: float32 block, alpha: float32 scalar
        d = alpha * tl.abs(u) + 1.0
        return 0.5 / (d * d)

    def scaled_fast_sigmoid_torch(u, alpha):
        return 0.5 / (alpha * u.abs() + 1) ** 2

    sg = spikefuse.surrogates.custom(scaled_fast_sigmoid, scaled_fast_sigmoid_torch, alpha=10.0)
    spikes = spikefuse.functional.lif(x, surrogate=sg)
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import sys
from typing import Callable

import torch

__all__ = ["CustomSurrogate", "custom"]


@dataclasses.dataclass(frozen=True, eq=False)
class CustomSurrogate:
    """A user's surrogate ds/du = sg(u, alpha) for u = h - threshold, in two twins that must
    compute the same function: `triton_fn` (a triton.jit function of a float32 block u and a
    float32 alpha, returning ds/du of u's shape) and `torch_fn` (the same in torch ops, on a
    tensor u and a Python float alpha). Build it with `custom`. Called as sg(u), it is the
    torch twin at its alpha: what the loop and reference paths call."""

    triton_fn: object
    torch_fn: Callable[[torch.Tensor, float], torch.Tensor]
    alpha: float
    name: str

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        return self.torch_fn(u, self.alpha)

    def __repr__(self) -> str:
        return f"CustomSurrogate({self.name!r}, alpha={self.alpha})"

    def with_alpha(self, alpha: float | None) -> CustomSurrogate:
        """This surrogate at another alpha (None: this one's)."""
        if alpha is None:
            return self
        alpha = _check_alpha(alpha)
        return self if alpha == self.alpha else dataclasses.replace(self, alpha=alpha)


def custom(triton_fn, torch_fn: Callable[[torch.Tensor, float], torch.Tensor], alpha: float = 1.0,
           name: str | None = None) -> CustomSurrogate:
    """A surrogate the fused LIF backward runs: `triton_fn(u, alpha)` is a @triton.jit function
    (u a float32 block of u = h - threshold, alpha a float32 scalar) returning ds/du elementwise,
    and `torch_fn(u, alpha)` its PyTorch twin, which the loop and reference paths run (and
    torch.compile, and double backward: see spikefuse.functional.lif). alpha: the shape
    parameter both receive (a finite number; `alpha=` of lif and the modules overrides it).
    name: for reprs (default: triton_fn's name). Bad arguments raise TypeError/ValueError
    naming the argument."""
    if not _is_triton_function(triton_fn):
        raise TypeError(f"triton_fn must be a @triton.jit function sg(u, alpha), got {triton_fn!r} "
                        f"(a torch-only surrogate is passed as surrogate= directly and runs unfused)")
    params = list(inspect.signature(triton_fn.fn).parameters)
    if len(params) != 2:
        raise TypeError(f"triton_fn must take exactly two arguments (u, alpha), got {params}")
    if not callable(torch_fn) or _is_triton_function(torch_fn):
        raise TypeError(f"torch_fn must be a callable torch_fn(u, alpha) -> tensor in torch ops "
                        f"(the twin of triton_fn), got {torch_fn!r}")
    if name is None:
        name = triton_fn.fn.__name__
    if not isinstance(name, str):
        raise TypeError(f"name must be a string or None, got {name!r}")
    return CustomSurrogate(triton_fn, torch_fn, _check_alpha(alpha), name)


def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")
    return float(alpha)


def _is_triton_function(fn) -> bool:
    """A @triton.jit function (an InterpretedFunction under TRITON_INTERPRET=1). Triton is
    looked up, not imported: a Triton function exists only where Triton was imported."""
    if "triton" not in sys.modules:
        return False
    from triton.runtime import JITFunction
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(fn, (JITFunction, InterpretedFunction))
