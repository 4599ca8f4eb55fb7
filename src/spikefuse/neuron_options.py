"""The options every spiking neuron shares, checked once: `NeuronOptions`.

spikefuse.functional builds one from a neuron's keyword arguments and hands it to the
backends (spikefuse.ops, the loop path, spikefuse.reference); the modules of spikefuse.nn
build theirs at construction, so a bad value fails there, with the message the functional
form gives, on every backend. The generic number check of the neurons' own parameters
(decay, beta, ...) lives here too.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from .surrogates import CustomSurrogate
from .surrogates import resolve as resolve_surrogate
from .surrogates import resolve_any as resolve_any_surrogate

__all__ = ["NeuronOptions", "ArgumentError"]

RESETS = ("hard", "soft", "none", "subtract")
IMMEDIATE_RESETS = RESETS[:3]  # what every neuron supports; "subtract" only lif, if_, plif and cuba
GRAD_SCOPES = ("step", "sequence", "batch")


class ArgumentError(TypeError, ValueError):
    """A bad argument's type (a non-float x, a string for a number): a TypeError that is
    also a ValueError, so callers catching either see it."""


@dataclasses.dataclass(frozen=True)
class NeuronOptions:
    """The options a spiking neuron shares with the others, checked at construction
    (ArgumentError, a TypeError and ValueError, or ValueError, naming the field):

    threshold: a finite number (a learnable tensor threshold is `lif`'s own argument).
    reset: "hard" (to v_reset), "soft" (subtract the threshold), "none", or "subtract":
        snnTorch's reset by subtraction (its default), delayed by one step and firing at `>`:
            h[t] = decay * v[t-1] + x[t] - threshold * s[t-1]     v[t] = h[t]
            s[t] = 1 if h[t] > threshold else 0                   s[-1] = 1 if v0 > threshold else 0
        in snnTorch's order of float32 operations, so its spikes are bit-equal to
        snnTorch's `Leaky`/`Synaptic` (a strict `>`: equality is common, e.g. x = threshold
        at decay 0). "soft" is the same reset applied at once, h[t] - threshold * s[t],
        which rounds differently and fires at `>=`. detach_reset cuts h[t]'s dependence
        on s[t-1] (snnTorch always detaches it: its default is detach_reset=True); without
        it the gradient also reaches v0 through s[-1]. Only lif, if_, plif and cuba have it
        (check_immediate_reset: the others refuse it).
    v_reset: a finite number. detach_reset: cut the reset from the spike in backward.
    surrogate, alpha: the backward ds/dh (spikefuse.surrogates): a name, and for LIF a
        spikefuse.surrogates.custom(...) or a callable sg(u); alpha=None takes its default.
    grad_threshold: the sparse backward's cut (-inf: none); grad_scope: "step", "sequence"
        or "batch", what the cut decides on (see spikefuse.functional.lif).
    callable_surrogate: whether `surrogate` may be a custom surrogate or a callable (True:
        the LIF family; False: ALIF, CUBA and the recurrent neurons, whose kernels take a name).

    `surrogate` and `alpha` keep what was given (reprs show it); `resolved_surrogate` and
    `resolved_alpha` are what the backends run (the canonical name and its alpha)."""

    threshold: float = 1.0
    reset: str = "hard"
    v_reset: float = 0.0
    detach_reset: bool = False
    surrogate: str | CustomSurrogate | Callable[[torch.Tensor], torch.Tensor] = "rectangular"
    alpha: float | None = None
    grad_threshold: float = float("-inf")
    grad_scope: str = "step"
    callable_surrogate: bool = True
    resolved_surrogate: object = dataclasses.field(init=False, repr=False, compare=False)
    resolved_alpha: float | None = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # frozen: the checked (normalised) values are set through object.__setattr__ (not one
        # __dict__.update, which torch 2.11's dynamo cannot trace: a graph break under compile)
        threshold, v_reset = check_number("threshold", self.threshold), check_number("v_reset", self.v_reset)
        if self.reset not in RESETS:
            raise ValueError(f"reset: unknown mode {self.reset!r}; expected one of {list(RESETS)}")
        resolve = resolve_any_surrogate if self.callable_surrogate else resolve_surrogate
        surrogate, alpha = resolve(self.surrogate, self.alpha)
        grad_threshold = _check_grad_threshold(self.grad_threshold)
        if not isinstance(self.grad_scope, str) or self.grad_scope not in GRAD_SCOPES:
            raise ValueError(f"grad_scope must be one of {list(GRAD_SCOPES)}, got {self.grad_scope!r}")
        for name, value in (("threshold", threshold), ("v_reset", v_reset), ("detach_reset", bool(self.detach_reset)),
                            ("resolved_surrogate", surrogate), ("resolved_alpha", alpha),
                            ("grad_threshold", grad_threshold)):
            object.__setattr__(self, name, value)

    def common(self) -> tuple:
        """(threshold, reset, v_reset, detach_reset, surrogate, alpha), resolved: the order of
        the ops' schemas and launchers and of spikefuse.reference's positional arguments
        (torch.library ops take primitives, not this object)."""
        return (self.threshold, self.reset, self.v_reset, self.detach_reset, self.resolved_surrogate,
                self.resolved_alpha)

    def keywords(self) -> dict:
        """threshold, reset, v_reset, detach_reset, surrogate, alpha as given: the keyword
        arguments every spikefuse.functional neuron takes (a module passes its options on)."""
        return dict(threshold=self.threshold, reset=self.reset, v_reset=self.v_reset,
                    detach_reset=self.detach_reset, surrogate=self.surrogate, alpha=self.alpha)


def check_immediate_reset(reset: str, neuron: str) -> None:
    """ValueError naming `reset` where a neuron that resets at once (all but lif, if_, plif
    and cuba) is given the delayed "subtract" reset."""
    if reset not in IMMEDIATE_RESETS:
        raise ValueError(f"reset: {neuron} supports {list(IMMEDIATE_RESETS)}, not {reset!r} (snnTorch's delayed "
                         f"subtract reset runs on lif, if_, plif and cuba)")


def check_number(name, value, low=None, low_open=None, high=None, high_open=None) -> float:
    """A finite Python number (bools refused) within the bounds, as a float. Not a number, or
    not finite where no bounds are given: ArgumentError; out of the bounds: ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(f"{name} must be a finite Python number, got {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond float range
        value = math.inf
    bounds = (low, low_open, high, high_open)
    if all(b is None for b in bounds) and not math.isfinite(value):
        raise ArgumentError(f"{name} must be a finite Python number, got {value!r}")
    ok = math.isfinite(value)
    ok = ok and (low is None or value >= low) and (low_open is None or value > low_open)
    ok = ok and (high is None or value <= high) and (high_open is None or value < high_open)
    if not ok:
        raise ValueError(f"{name} must be a number {_describe(*bounds)}, got {value!r}")
    return value


MAX_INT = 2**31 - 1  # the largest size, count or step number a parameter may take: far past memory


def check_int(name, value, low=1, high=MAX_INT) -> int:
    """A Python int (bools refused; a numpy integer taken) in [low, high], as an int. Not an
    int (2.5, "3", NaN): ArgumentError; out of the bounds: ValueError. Sizes, counts and time
    steps are checked here where they enter, so no float or 2**70 reaches torch's allocator."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ArgumentError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be an int {_describe(low, None, high, None)}, got {value!r}")
    return value


def _describe(low, low_open, high, high_open) -> str:
    """The bounds in words: "in (0, 1]", ">= 0", "< 1"."""
    def fmt(b):
        return str(int(b)) if float(b).is_integer() else f"{b:g}"
    lower = f"[{fmt(low)}" if low is not None else f"({fmt(low_open)}" if low_open is not None else None
    upper = f"{fmt(high)}]" if high is not None else f"{fmt(high_open)})" if high_open is not None else None
    if lower and upper:
        return f"in {lower}, {upper}"
    if lower:
        return (">= " if lower[0] == "[" else "> ") + lower[1:]
    return ("<= " + upper[:-1] if upper[-1] == "]" else "< " + upper[:-1]) if upper else "finite"


def _check_grad_threshold(value) -> float:
    """A float: a real number, or -inf for no cut (+inf would cut every gradient)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            if float(value) < math.inf:  # False for NaN and +inf
                return float(value)
        except OverflowError:  # an int beyond float range
            pass
    raise ValueError(f"grad_threshold must be a real number or -inf (no cut), got {value!r}")
