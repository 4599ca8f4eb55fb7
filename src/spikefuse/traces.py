"""Membrane traces on request: the post-reset potential v[t] of every step, from what a
neuron returns (its spikes and, with `return_potential=True`, the pre-reset trace h).

The fused kernels keep v in registers and write only h when asked: v[t] is a function of
h[t] and s[t] (the reset), so one elementwise op gives it, with its graph, and a kernel
never has to store a second [T, *] trace. For ALIF and RecurrentALIF a soft reset
subtracts the adaptive threshold theta[t]: `adaptive_threshold_trace` rebuilds it from the
spikes.

    s, h = F.lif(x, reset="soft", return_potential=True)
    v = membrane_trace(h, s, reset="soft")              # v[T-1] is return_state's v
    s, h = F.alif(x, beta=0.3, reset="soft", return_potential=True)
    theta = adaptive_threshold_trace(s, beta=0.3)
    v = membrane_trace(h, s, reset="soft", threshold=theta)
"""
from __future__ import annotations

import torch

from .neuron_options import check_number
from .reference import _reset

RESETS = ("hard", "soft", "none")


def membrane_trace(h: torch.Tensor, spikes: torch.Tensor, reset: str = "hard",
                   threshold: float | torch.Tensor = 1.0, v_reset: float = 0.0) -> torch.Tensor:
    """v[t] after each step's reset, [T, *] like h: hard: v_reset where s[t], else h[t];
    soft: h[t] - threshold * s[t]; none: h[t]. Pass the neuron's own reset, threshold
    (a number, a tensor broadcastable to h: per channel, a learned threshold, or ALIF's
    theta trace) and v_reset. Differentiable in h, spikes and a tensor threshold."""
    for name, value in (("h", h), ("spikes", spikes)):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor [T, *], got {type(value).__name__}"
                            + (f" of {value.dtype}" if isinstance(value, torch.Tensor) else ""))
    if h.shape != spikes.shape:
        raise ValueError(f"h {tuple(h.shape)} and spikes {tuple(spikes.shape)} must have the same shape "
                         "(both as the neuron returned them)")
    if reset not in RESETS:
        raise ValueError(f"reset: unknown mode {reset!r}; expected 'hard', 'soft' or 'none'")
    if isinstance(threshold, torch.Tensor):
        try:
            torch.broadcast_shapes(threshold.shape, h.shape)
        except RuntimeError:
            raise ValueError(f"threshold {tuple(threshold.shape)} does not broadcast to h "
                             f"{tuple(h.shape)}") from None
    else:  # a number: the neurons' own check (a NaN or inf gave a NaN trace without a word)
        threshold = check_number("threshold", threshold)
    return _reset(h, spikes.to(h.dtype), threshold, reset, check_number("v_reset", v_reset))


def adaptive_threshold_trace(spikes: torch.Tensor, threshold: float = 1.0, beta: float = 0.5,
                             adapt_decay: float = 0.9, a0: torch.Tensor | None = None) -> torch.Tensor:
    """ALIF's (and RecurrentALIF's) threshold at every step, [T, *] like the spikes:
    theta[t] = threshold + beta * a[t-1], a[t] = adapt_decay * a[t-1] + s[t], a[-1] = a0
    (zeros if None). Pass the neuron's own threshold, beta, adapt_decay and initial a.
    Half-precision spikes give a float32 trace (the kernels keep a and theta in float32)."""
    if not isinstance(spikes, torch.Tensor) or not spikes.is_floating_point() or spikes.dim() < 1:
        raise TypeError("spikes must be a floating tensor [T, *] (as the neuron returned them)")
    # the bounds ALIF checks its own with (a NaN or inf gave a NaN trace without a word)
    threshold = check_number("threshold", threshold)
    beta = check_number("beta", beta, low=0.0)
    adapt_decay = check_number("adapt_decay", adapt_decay, low_open=0.0, high=1.0)
    if a0 is not None and (not isinstance(a0, torch.Tensor) or a0.shape != spikes.shape[1:]):
        raise ValueError(f"a0 must be a tensor shaped like spikes[0] {tuple(spikes.shape[1:])}, got "
                         f"{tuple(a0.shape) if isinstance(a0, torch.Tensor) else type(a0).__name__}")
    if spikes.dtype in (torch.float16, torch.bfloat16):
        spikes = spikes.float()
    if spikes.shape[0] == 0:
        return spikes.new_empty(spikes.shape)
    a = torch.zeros_like(spikes[0]) if a0 is None else a0.to(spikes.dtype)
    thetas = []
    for s in spikes:
        thetas.append(threshold + beta * a)
        a = adapt_decay * a + s
    return torch.stack(thetas)


__all__ = ["membrane_trace", "adaptive_threshold_trace"]
