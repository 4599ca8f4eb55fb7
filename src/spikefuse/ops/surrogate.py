"""Surrogate gradients ds/dh = sg(u), u = h - threshold, shared by every backend.

Each surrogate has one shape parameter `alpha` (a width or a slope):
    rectangular   1/alpha inside |u| < alpha/2, else 0      (alpha: width)
    triangle      max(0, 1 - |u|/alpha) / alpha             (alpha: half-width)
    fast_sigmoid  1 / (alpha*|u| + 1)^2  (SuperSpike)       (alpha: slope)
    sigmoid       alpha * sig(alpha*u) * (1 - sig(alpha*u)) (alpha: slope)
    atan          (alpha/2) / (1 + (pi/2 * alpha * u)^2)    (alpha: slope)
The integer codes are what the Triton kernels switch on at compile time.
"""
from __future__ import annotations

import math

import torch

SURROGATES = {"rectangular": 0, "triangle": 1, "fast_sigmoid": 2, "sigmoid": 3, "atan": 4}
DEFAULT_ALPHA = {"rectangular": 1.0, "triangle": 1.0, "fast_sigmoid": 10.0, "sigmoid": 4.0, "atan": 2.0}
ALIASES = {"superspike": "fast_sigmoid", "rect": "rectangular", "boxcar": "rectangular"}


def resolve(name: str, alpha: float | None) -> tuple[str, float]:
    """Canonical surrogate name and alpha; raises ValueError naming the valid choices."""
    if not isinstance(name, str):
        raise TypeError(f"surrogate must be a string, got {type(name).__name__}")
    key = ALIASES.get(name.lower(), name.lower())
    if key not in SURROGATES:
        raise ValueError(f"surrogate: unknown name {name!r}; expected one of {sorted(SURROGATES)}")
    alpha = DEFAULT_ALPHA[key] if alpha is None else float(alpha)
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    return key, alpha


def surrogate_grad(u: torch.Tensor, name: str, alpha: float) -> torch.Tensor:
    """sg(u) in plain PyTorch (the oracle for the kernels' in-register version)."""
    if name == "rectangular":
        return (u.abs() < alpha / 2).to(u.dtype) / alpha
    if name == "triangle":
        return torch.clamp(1 - u.abs() / alpha, min=0) / alpha
    if name == "fast_sigmoid":
        return 1 / (alpha * u.abs() + 1) ** 2
    if name == "sigmoid":
        sig = torch.sigmoid(alpha * u)
        return alpha * sig * (1 - sig)
    if name == "atan":
        return (alpha / 2) / (1 + (math.pi / 2 * alpha * u) ** 2)
    raise ValueError(f"surrogate: unknown name {name!r}")


class Heaviside(torch.autograd.Function):
    """s = (u >= 0) forward (NaN where u is NaN: a NaN potential never reads as "no spike"),
    sg(u) backward, zeroed where the bool tensor `cut` is True (sparse backward)."""

    @staticmethod
    def forward(ctx, u, name, alpha, cut=None):
        ctx.save_for_backward(u, cut)
        ctx.name, ctx.alpha = name, alpha
        return torch.where(u >= 0, 1.0, u.clamp(min=0))  # clamp keeps NaN: 0 below, NaN for NaN

    @staticmethod
    def backward(ctx, grad_s):
        u, cut = ctx.saved_tensors
        sg = surrogate_grad(u, ctx.name, ctx.alpha)
        if cut is not None:
            sg = sg.masked_fill(cut, 0.0)
        return grad_s * sg, None, None, None


def spike(u: torch.Tensor, name: str = "rectangular", alpha: float | None = None,
          cut: torch.Tensor | None = None) -> torch.Tensor:
    name, alpha = resolve(name, alpha)
    return Heaviside.apply(u, name, alpha, cut)
