"""Surrogate gradients: the built-in ones, their PyTorch math, and the ones you write.

Surrogate gradients ds/dh = sg(u), u = h - threshold, shared by every backend.

Each surrogate has one shape parameter `alpha` (a width or a slope):
    rectangular   1/alpha inside |u| < alpha/2, else 0      (alpha: width)
    triangle      max(0, 1 - |u|/alpha) / alpha             (alpha: half-width)
    fast_sigmoid  1 / (alpha*|u| + 1)^2  (SuperSpike)       (alpha: slope)
    sigmoid       alpha * sig(alpha*u) * (1 - sig(alpha*u)) (alpha: slope)
    atan          (alpha/2) / (1 + (pi/2 * alpha * u)^2)    (alpha: slope)
sigmoid's is computed as alpha e / (1 + e)^2 with e = exp(-alpha |u|), the same value without
1 - sig cancelling where sig nears 1 (6e-4 relative error in float32 there, 1e-6 this way).
The integer codes are what the Triton kernels switch on at compile time.

A user-supplied surrogate: on the LIF paths (spikefuse.functional.lif, reference.lif,
ops.lif_loop, the nn.LIF/IF/PLIF modules) `surrogate=` may also be a callable sg(u) -> tensor
giving ds/du elementwise for u = h - threshold. It receives a tensor and must return a
tensor of the same shape; `alpha` is then ignored (bind a shape parameter with
functools.partial). The loop path calls it without autograd, on a fresh tensor it may
overwrite; the reference path calls it inside Heaviside's backward (so a double backward
differentiates it). The fused Triton kernels cannot run such a callable; they run a built-in
by its code, or a spikefuse.surrogates.custom surrogate (code CUSTOM) by calling its Triton
twin, which is also a callable sg(u) (its torch twin) everywhere else.

Surrogate gradients you write yourself, that the fused LIF kernels run.

`surrogate=` of the LIF family (spikefuse.functional.lif / if_ / plif, spikefuse.nn.LIF /
IF / PLIF) takes a built-in name (below), a plain callable sg(u) ->
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


# ---- the built-in surrogates, their PyTorch math (the kernels' oracle) ----
SURROGATES = {"rectangular": 0, "triangle": 1, "fast_sigmoid": 2, "sigmoid": 3, "atan": 4}
CUSTOM = 5  # the kernels' code for a CustomSurrogate: they call its Triton twin
DEFAULT_ALPHA = {"rectangular": 1.0, "triangle": 1.0, "fast_sigmoid": 10.0, "sigmoid": 4.0, "atan": 2.0}
ALIASES = {"superspike": "fast_sigmoid", "rect": "rectangular", "boxcar": "rectangular"}


def resolve(name: str, alpha: float | None) -> tuple[str, float]:
    """Canonical surrogate name and alpha; raises ValueError naming the valid choices."""
    if isinstance(name, CustomSurrogate):
        raise TypeError(f"surrogate: a custom surrogate ({name.name}) runs on LIF, IF and PLIF only; "
                        f"this neuron takes a name, one of {sorted(SURROGATES)}")
    if not isinstance(name, str):
        raise TypeError(f"surrogate must be a string, got {type(name).__name__}")
    key = ALIASES.get(name.lower(), name.lower())
    if key not in SURROGATES:
        raise ValueError(f"surrogate: unknown name {name!r}; expected one of {sorted(SURROGATES)}")
    alpha = DEFAULT_ALPHA[key] if alpha is None else float(alpha)
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    return key, alpha


def resolve_any(surrogate, alpha: float | None):
    """As `resolve` for a name; a CustomSurrogate at `alpha` (None: its own) with that alpha;
    a callable sg(u) is returned as it is, with alpha None (ignored). Anything else:
    ValueError naming `surrogate`."""
    if isinstance(surrogate, str):
        return resolve(surrogate, alpha)
    if isinstance(surrogate, CustomSurrogate):
        surrogate = surrogate.with_alpha(alpha)
        return surrogate, surrogate.alpha
    if callable(surrogate):
        return surrogate, None
    raise ValueError(f"surrogate must be one of {sorted(SURROGATES)}, a spikefuse.surrogates.custom(...) "
                     f"or a callable sg(u) -> tensor (ds/du for u = h - threshold), got {surrogate!r}")


def surrogate_name(surrogate) -> str:
    """A readable name: the string itself, a custom surrogate's name, or a callable's __name__
    (through functools.partial)."""
    if isinstance(surrogate, str):
        return surrogate
    if isinstance(surrogate, CustomSurrogate):
        return surrogate.name
    func = getattr(surrogate, "func", surrogate)  # functools.partial
    return getattr(func, "__name__", None) or type(func).__name__


def call_surrogate(fn, u: torch.Tensor) -> torch.Tensor:
    """fn(u) for a user-supplied surrogate, checked: a tensor of u's shape, in u's dtype."""
    g = fn(u)
    if not isinstance(g, torch.Tensor) or g.shape != u.shape:
        got = f"shape {tuple(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
        raise ValueError(f"surrogate: the callable {surrogate_name(fn)} must return a tensor of the "
                         f"shape of its input u {tuple(u.shape)} (ds/du elementwise), got {got}")
    return g.to(u.dtype)


def surrogate_grad(u: torch.Tensor, name, alpha: float | None) -> torch.Tensor:
    """sg(u) in plain PyTorch (the oracle for the kernels' in-register version); `name` may
    be a user callable (see the module docstring)."""
    if callable(name):
        return call_surrogate(name, u)
    if name == "rectangular":
        return (u.abs() < alpha / 2).to(u.dtype) / alpha
    if name == "triangle":
        return torch.clamp(1 - u.abs() / alpha, min=0) / alpha
    if name == "fast_sigmoid":
        return 1 / (alpha * u.abs() + 1) ** 2
    if name == "sigmoid":  # alpha sig (1 - sig) as alpha e / (1 + e)^2, e = exp(-alpha |u|): accurate in the tails
        e = torch.exp(-alpha * u.abs())
        return alpha * e / (1 + e) ** 2
    if name == "atan":
        return (alpha / 2) / (1 + (math.pi / 2 * alpha * u) ** 2)
    raise ValueError(f"surrogate: unknown name {name!r}")


class Heaviside(torch.autograd.Function):
    """s = (u >= 0) forward ((u > 0) if `strict`: snnTorch's test), NaN where u is NaN (a NaN
    potential never reads as "no spike"), sg(u) backward, zeroed where the bool tensor `cut`
    is True (sparse backward)."""

    @staticmethod
    def forward(ctx, u, name, alpha, cut=None, strict=False):
        ctx.save_for_backward(u, cut)
        ctx.name, ctx.alpha = name, alpha
        return torch.where(u > 0 if strict else u >= 0, 1.0, u.clamp(min=0))  # clamp keeps NaN: 0 below, NaN for NaN

    @staticmethod
    def backward(ctx, grad_s):
        u, cut = ctx.saved_tensors
        sg = surrogate_grad(u, ctx.name, ctx.alpha)
        if cut is not None:
            sg = sg.masked_fill(cut, 0.0)
        return grad_s * sg, None, None, None, None


def spike(u: torch.Tensor, name="rectangular", alpha: float | None = None,
          cut: torch.Tensor | None = None, strict: bool = False) -> torch.Tensor:
    """Heaviside with a surrogate: `name` a surrogate's name or a callable sg(u) -> tensor;
    `strict` fires at u > 0 (the "subtract" reset's test), else at u >= 0."""
    name, alpha = resolve_any(name, alpha)
    return Heaviside.apply(u, name, alpha, cut, strict)
