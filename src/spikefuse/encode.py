"""Spike encoders: turn values into time-major spike trains [T, B, ...] of 0/1.

    spikes = encode.rate(images, 25)                   # [25, B, C, H, W], Bernoulli per step
    spikes = encode.latency(images, 25)                # one spike per pixel, bright ones first
    spikes = encode.delta(signal, threshold=0.1)       # signal is already [T, B, ...]

Outputs have the input's floating dtype (float32 for integer or bool input) and its device.
Shapes, dtypes and arguments are checked always; NaN is checked on CPU tensors only, where
the check costs no device sync.
"""
from __future__ import annotations

import math
import numbers

import torch

__all__ = ["rate", "latency", "delta"]


def rate(x: torch.Tensor, time_steps: int, *, gain: float = 1.0,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """Rate (Bernoulli, "Poisson") coding: [T, B, ...] spikes, each step firing independently
    with probability p = clamp(gain * x, 0, 1); x is read as a probability in [0, 1].

    generator: a torch.Generator on x's device, for reproducible spikes.
    """
    _check_tensor("x", x)
    _check_steps(time_steps)
    gain = _check_number("gain", gain, lambda g: g >= 0, "a finite number >= 0")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    p = (gain * x.float()).clamp(0, 1)
    # uniform draws in float32 whatever x's dtype: bf16 would quantise the probabilities
    u = torch.rand((time_steps, *x.shape), generator=generator, device=x.device)
    return (u < p).to(_out_dtype(x))


def latency(x: torch.Tensor, time_steps: int, *, tau: float = 1.0, threshold: float = 0.01,
            linear: bool = False, normalize: bool = True) -> torch.Tensor:
    """Latency coding: [T, B, ...] with at most one spike per input, earlier for larger x
    (x clamped to [0, 1]); inputs with x <= threshold never fire.

    Spike time t(x), in steps, then rounded to the nearest step:
        RC (default): t = tau * ln(x / (x - threshold)), the time an RC membrane charged by a
                      constant current x takes to reach `threshold`;
        linear:       t = tau * (1 - x).
    normalize: rescale t by (T-1) / t_max so that the latest possible spike time t_max lands on
        step T-1: t_max = tau (linear, x = 0) or t(threshold + 1e-7) (RC). x = 1 then fires
        at step 0, and tau no longer matters.
    Without normalize, a spike whose time falls past step T-1 is dropped (never fires).
    As snnTorch's spikegen.latency(clip=True), except that snnTorch normalizes RC times by
    the batch's largest time; the two agree whenever the batch has an input below threshold.
    """
    _check_tensor("x", x)
    _check_steps(time_steps)
    tau = _check_number("tau", tau, lambda t: t > 0, "a finite number > 0")
    threshold = _check_number("threshold", threshold, lambda t: 0 < t < 1, "a number in (0, 1)")
    if normalize:  # t / t_max: tau cancels, and a huge one (1e300) made t_max inf and every t NaN
        tau = 1.0
    v = x.float().clamp(0, 1)
    fires = v > threshold
    if linear:
        t, t_max = tau * (1 - v), tau
    else:
        v = v.clamp_min(threshold + 1e-7)  # keeps the log finite where x cannot fire anyway
        t = tau * torch.log(v / (v - threshold))
        t_max = tau * math.log((threshold + 1e-7) / 1e-7)
    if normalize:
        t = t * ((time_steps - 1) / t_max)
    step = t.round()
    fires &= step <= time_steps - 1
    steps = torch.arange(time_steps, device=x.device).view(-1, *([1] * x.dim()))
    return ((steps == step) & fires).to(_out_dtype(x))


def delta(x: torch.Tensor, *, threshold: float = 0.1, off_spikes: bool = False) -> torch.Tensor:
    """Delta (change) coding of a time-major x [T, B, ...]: a spike where x rose by at least
    `threshold` since the previous step (the first step is compared with zeros).

    off_spikes: also encode falls (x dropped by at least `threshold`) as spikes of their own,
        returned on a new polarity axis after the batch axis, as event frames have it:
        [T, B, 2, ...] with index 0 the rises (on) and 1 the falls (off); all values stay 0/1.
    Same rule as snnTorch's spikegen.delta (padding=False), which returns off spikes as -1.
    """
    _check_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x: expected time-major [T, B, ...] (at least 2 dimensions), got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError("x: expected at least one time step (T >= 1), got T == 0")
    threshold = _check_number("threshold", threshold, lambda t: t > 0, "a finite number > 0")
    v = x.float()
    change = v - torch.cat([torch.zeros_like(v[:1]), v[:-1]])
    on = change >= threshold
    if not off_spikes:
        return on.to(_out_dtype(x))
    return torch.stack([on, change <= -threshold], dim=2).to(_out_dtype(x))


# ---- argument checks ----

def _check_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name}: expected a real (floating, integer or bool) tensor, got {x.dtype}")
    if x.device.type == "cpu" and x.is_floating_point() and torch.isnan(x).any():
        raise ValueError(f"{name}: contains NaN; expected finite values")


MAX_STEPS = 2**31 - 1  # far past any [T, ...] train that fits in memory; 2**70 overflowed inside torch


def _check_steps(time_steps) -> None:
    if not isinstance(time_steps, int) or isinstance(time_steps, bool) or not 1 <= time_steps <= MAX_STEPS:
        raise ValueError(f"time_steps: expected a positive int (at most 2**31 - 1), got {time_steps!r}")


def _check_number(name: str, value, valid, expected: str) -> float:
    """value as a float, or TypeError (not a real number) / ValueError (not finite, not `valid`)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    try:  # as a float: torch refused a Python int past int64 (2**70) with an OverflowError
        number = float(value)
    except OverflowError:
        number = math.inf
    if not (math.isfinite(number) and valid(number)):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return number


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.float32
