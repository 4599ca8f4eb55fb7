"""Pure-PyTorch, step-by-step neuron dynamics: the oracle every fused kernel is tested against.

Equations (docs/neurons.md gives them for every neuron), time-major x of shape [T, *]:
    h[t] = decay * v[t-1] + x[t]                     charge, v[-1] = v0 (default 0)
    s[t] = 1 if h[t] >= threshold else 0             fire (surrogate gradient in backward)
    v[t] = h[t]*(1-s[t]) + v_reset*s[t]              reset="hard"
         = h[t] - threshold*s[t]                     reset="soft"
         = h[t]                                      reset="none"
reset="subtract" (snnTorch's, delayed): h[t] = decay * v[t-1] + x[t] - threshold*s[t-1],
s[t] = 1 if h[t] > threshold, v[t] = h[t], s[-1] = 1 if v0 > threshold (NeuronOptions).
`detach_reset` cuts the reset's dependence on s. `grad_threshold` (sparse backward) zeroes
the surrogate gradient where h[t] < grad_threshold; -inf (the default) cuts nothing.
Gradients come from autograd alone, so this file is deliberately the plainest possible
reading of the equations.
Non-finite values (spikefuse.functional.lif): a NaN potential gives a NaN spike, and
h = +inf fires and, with the hard reset, resets to v_reset (not inf * 0 = NaN).
Every neuron adds one thing to autograd: the last step's 0 * dv/ds, 0 * dv/dh and (a
threshold tensor under the soft reset) 0 * dv/dtheta (_LastStepAdjoint), so that its NaN
gradients fall where the fused kernels' and the loop path's do (NaN in, NaN out:
with a hard reset and the rectangular surrogate, plain autograd gave 0 at the last step of a
NaN neuron).
"""
from __future__ import annotations

from typing import Callable

import torch

from .neuron_options import check_immediate_reset
from .surrogates import spike


def lif(
    x: torch.Tensor,
    decay: float | torch.Tensor = 0.5,
    threshold: float = 1.0,
    reset: str = "hard",
    v_reset: float = 0.0,
    detach_reset: bool = False,
    surrogate: str | Callable[[torch.Tensor], torch.Tensor] = "rectangular",
    alpha: float | None = None,
    v0: torch.Tensor | None = None,
    return_state: bool = False,
    grad_threshold: float = float("-inf"),
    return_potential: bool = False,
    grad_scope: str = "step",
):
    """Leaky integrate-and-fire over all T steps; returns spikes [T, *], then the pre-reset
    potential h [T, *] if `return_potential`, then v[T-1] if `return_state`.
    grad_scope: where the grad_threshold cut is decided (`reached_grad_threshold`): "step"
    (h[t] < grad_threshold zeroes step t's surrogate), "sequence" or "batch".

    `decay` is a float or a tensor broadcastable to one time step x[0] (PLIF: a scalar
    tensor, or per channel shaped [C, 1, ..., 1] for x of shape [T, B, C, ...]); so is
    `threshold` (a learnable threshold: autograd gives its gradient).
    `surrogate` is a name of spikefuse.surrogates or a callable sg(u) -> tensor of u's
    shape (ds/du for u = h - threshold; `alpha` is then ignored), called in backward.
    """
    v = torch.zeros_like(x[0]) if v0 is None else v0.to(x.dtype)  # results in x's dtype, as fused
    sparse = grad_threshold > float("-inf")
    cut = None
    if sparse and grad_scope != "step":  # a first pass finds the neurons that reach the cut
        with torch.no_grad():
            _, h_trace = lif(x, _detached(decay), _detached(threshold), reset, v_reset, False, surrogate, alpha,
                             _detached(v0), return_potential=True)
        cut = ~reached_grad_threshold(h_trace, grad_threshold, grad_scope)
    def fire(h):  # the spike of potential h, its surrogate cut where the sparse backward cuts
        return spike(h - threshold, surrogate, alpha, cut if cut is not None else h < grad_threshold if sparse else None,
                     strict=reset == "subtract")
    s_prev = _initial_spike(v, fire, reset, detach_reset)
    spikes, potentials = [], []
    for t in range(x.shape[0]):
        h = _charge(decay * v + x[t], threshold, s_prev)
        s = fire(h)
        v = _reset(h, s.detach() if detach_reset else s, threshold, reset, v_reset)
        s_prev = s_prev if s_prev is None else s.detach() if detach_reset else s
        spikes.append(s)
        if return_potential:
            potentials.append(h)
    last = (h, _reset_slope(h, threshold, reset, v_reset, detach_reset)) if spikes else None
    return _outputs(spikes, potentials if return_potential else None, v if return_state else None, last)


def reached_grad_threshold(h: torch.Tensor, grad_threshold: float, grad_scope: str) -> torch.Tensor:
    """Where a per-neuron cut keeps the surrogate, from the potential trace h [T, B, ...]
    (shaped like h[0]): "sequence", each neuron whose h reached grad_threshold at some step;
    "batch", each neuron at a position (dims after the batch) where some sample's neuron did.
    NaN counts as reached, so that a NaN gradient is never cut to 0."""
    if grad_scope not in ("sequence", "batch"):
        raise ValueError(f"grad_scope: unknown {grad_scope!r}; expected 'step', 'sequence' or 'batch'")
    reached = ((h >= grad_threshold) | h.isnan()).any(0)
    if grad_scope == "batch" and reached.dim() > 0:
        reached = reached.any(0, keepdim=True).expand_as(reached)
    return reached


def _detached(t):
    return t.detach() if isinstance(t, torch.Tensor) else t


def _initial_spike(v0, fire, reset, detach_reset):
    """s[-1] for the "subtract" reset, fire(v0) (detached with detach_reset: snnTorch's
    reset of the first step); None for the resets that act at once."""
    if reset != "subtract":
        return None
    s = fire(v0)
    return s.detach() if detach_reset else s


def _charge(h, threshold, s_prev):
    """h[t] less the "subtract" reset of the step before (s_prev None: no delayed reset), as
    snnTorch computes it: (decay * v + x) - threshold * s[t-1], in that order."""
    return h if s_prev is None else h - threshold * s_prev


def _reset(h, s, threshold, reset, v_reset):
    """v[t] from h[t] and the spikes s (detached or not): hard to v_reset, soft (subtract
    the threshold), or none (and "subtract", whose reset acts on the next step: _charge)."""
    if reset == "hard":  # h capped at the largest float: h = +inf resets to v_reset, not to inf * 0
        # (addcmul: one op for the product and sum, exact as both terms are h or 0, v_reset or 0;
        # where, not clamp: clamp's backward is 0 at a NaN h, which would cut a NaN gradient)
        largest = torch.finfo(h.dtype).max
        return torch.addcmul(v_reset * s, torch.where(h > largest, largest, h), 1 - s)
    if reset == "soft":
        return h - threshold * s
    if reset in ("none", "subtract"):
        return h
    raise ValueError(f"reset: unknown mode {reset!r}; expected 'hard', 'soft', 'none' or 'subtract'")


def if_(x: torch.Tensor, **kwargs):
    """Integrate-and-fire: LIF with decay = 1."""
    return lif(x, decay=1.0, **kwargs)


def plif(x: torch.Tensor, decay: torch.Tensor, **kwargs):
    """Parametric LIF: `decay` is a tensor that requires grad (scalar or per channel)."""
    return lif(x, decay=decay, **kwargs)


def alif(
    x: torch.Tensor,
    decay: float = 0.5,
    adapt_decay: float = 0.9,
    beta: float = 0.5,
    threshold: float = 1.0,
    reset: str = "hard",
    v_reset: float = 0.0,
    detach_reset: bool = False,
    surrogate: str = "rectangular",
    alpha: float | None = None,
    return_state: bool = False,
    return_potential: bool = False,
    state0: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
):
    """Adaptive-threshold LIF (ALIF / LSNN, Bellec et al. 2018) over all T steps of x [T, *]:
        h[t] = decay * v[t-1] + x[t]                 v[-1] = v0
        theta[t] = threshold + beta * a[t-1]         a[-1] = a0
        s[t] = 1 if h[t] >= theta[t] else 0          (surrogate sg(h - theta) in backward)
        v[t] = hard: v_reset where s, else h / soft: h - theta[t]*s / none: h
        a[t] = adapt_decay * a[t-1] + s[t]
    `detach_reset` cuts the reset of v from s; a[t] keeps s's gradient, and the threshold
    (hence a) keeps its own. Returns spikes [T, *], then the pre-reset potential h [T, *] if
    `return_potential`, then (v[T-1], a[T-1]) if `return_state`. state0: the initial
    (v0, a0), each shaped like x[0] or None for zeros.
    """
    check_immediate_reset(reset, "alif")
    v, a = _initial_state(x, state0)
    spikes, potentials = [], []
    for t in range(x.shape[0]):
        h = decay * v + x[t]
        theta = threshold + beta * a
        s = spike(h - theta, surrogate, alpha)
        v = _reset(h, s.detach() if detach_reset else s, theta, reset, v_reset)
        a = adapt_decay * a + s
        spikes.append(s)
        potentials.append(h)
    return _outputs(spikes, potentials if return_potential else None, (v, a) if return_state else None,
                    (h, _reset_slope(h, theta, reset, v_reset, detach_reset)))


def _initial_state(x, state0):
    """The two initial state tensors (ALIF's v0, a0; CUBA's v0, i0): state0's in x's dtype (the
    results are x's, as the fused kernels give them), zeros where None."""
    return tuple(torch.zeros_like(x[0]) if t is None else t.to(x.dtype) for t in (state0 or (None, None)))


class _LastStepAdjoint(torch.autograd.Function):
    """The last step's (s, h), copied; backward adds 0 * dv[T-1]/ds[T-1] to dL/ds[T-1] and
    0 * dv[T-1]/dh[T-1] to dL/dh[T-1]. The fused kernels run the adjoint recurrence from
    dL/dv[T-1] = 0 when no loss reads the final state (and dL/ds = 0 where no loss reads the
    spikes), so the last step gets 0 * (v_reset - h) (hard reset) or 0 * -theta (soft)
    through the spike and 0 * (1 - s) (hard) directly, NaN where h, theta or the spike is
    NaN: NaN in, NaN out. Autograd skips that unused path, and with the rectangular
    surrogate (0 at NaN) gave 0 there. Finite gradients are unchanged (+ 0)."""

    @staticmethod
    def forward(ctx, s, h, dv_ds, dv_dh, theta=None, dv_dtheta=None):
        """theta: a threshold tensor the soft reset reads (v = h - theta * s), given with
        dv_dtheta (-s's NaNs): it gets 0 * dv_dtheta, as the kernels' threshold adjoint does."""
        ctx.save_for_backward(dv_ds, dv_dh, dv_dtheta)
        ctx.theta_shape = None if theta is None else theta.shape
        return s.clone(), h.clone()

    @staticmethod
    def backward(ctx, gs, gh):
        dv_ds, dv_dh, dv_dtheta = ctx.saved_tensors
        g_theta = None if ctx.theta_shape is None else (0.0 * dv_dtheta).sum_to_size(ctx.theta_shape)
        return gs + 0.0 * dv_ds, gh + 0.0 * dv_dh, None, None, g_theta, None


def _reset_slope(h, theta, reset, v_reset, detach_reset):
    """(dv[t]/ds[t], dv[t]/dh[t] with s held, (theta, dv[t]/dtheta) or None) of the reset,
    detached, each None where it is a finite constant (0 * it adds nothing): dv/ds with
    detach_reset, no reset or "subtract" (v = h), or a float soft threshold; dv/dh except under the hard reset,
    whose 1 - s stands here as NaN where the spike is NaN and 1 elsewhere (only 0 * it is
    used); dv/dtheta = -s only for a threshold tensor with a gradient under the soft reset
    (detach_reset detaches s, not theta), NaN where the spike is."""
    dv_ds = None
    if not (detach_reset or reset in ("none", "subtract") or (reset == "soft" and not isinstance(theta, torch.Tensor))):
        dv_ds = (v_reset - h if reset == "hard" else -theta).detach()
    u = (h - theta).detach()
    dv_dh = torch.where(u.isnan(), u, 1.0) if reset == "hard" else None
    through_theta = None
    if reset == "soft" and isinstance(theta, torch.Tensor) and theta.requires_grad:
        through_theta = (theta, torch.where(u.isnan(), u, 1.0))
    return dv_ds, dv_dh, through_theta


def _outputs(spikes, potentials, state, last=None):
    """spikes [T, *], then h [T, *] unless potentials is None, then the state unless None.
    last: (h[T-1], _reset_slope's triple): the last step, tied through _LastStepAdjoint when a
    gradient may flow. spikes (and potentials) are lists, changed in place."""
    h, (dv_ds, dv_dh, through_theta) = last if last is not None else (None, (None, None, None))
    if (dv_ds is not None or dv_dh is not None or through_theta is not None) and torch.is_grad_enabled() and (
            spikes[-1].requires_grad or h.requires_grad):
        zero = h.new_zeros(())
        spikes[-1], h = _LastStepAdjoint.apply(spikes[-1], h, zero if dv_ds is None else dv_ds,
                                               zero if dv_dh is None else dv_dh, *(through_theta or ()))
        if potentials is not None:
            potentials[-1] = h
    out = (torch.stack(spikes),)
    if potentials is not None:
        out += (torch.stack(potentials),)
    if state is not None:
        out += (state,)
    return out if len(out) > 1 else out[0]


def rlif(
    x: torch.Tensor,
    weight: torch.Tensor,
    decay: float = 0.5,
    threshold: float = 1.0,
    reset: str = "hard",
    v_reset: float = 0.0,
    detach_reset: bool = False,
    surrogate: str = "rectangular",
    alpha: float | None = None,
    return_state: bool = False,
    grad_threshold: float = float("-inf"),
    return_potential: bool = False,
):
    """Recurrent LIF: a LIF whose input also carries its own spikes of the step before
    through `weight` [N, N] (x [T, *, N]):
        h[t] = decay * v[t-1] + x[t] + s[t-1] @ weight.T     v[-1] = 0, s[-1] = 0
    then fire and reset as `lif`. Returns spikes [T, *, N], then the pre-reset potential h
    [T, *, N] if `return_potential`, then v[T-1] if `return_state` (as `lif`).
    """
    check_immediate_reset(reset, "rlif")
    v = torch.zeros_like(x[0])
    sparse = grad_threshold > float("-inf")
    spikes, potentials = [], []
    for t in range(x.shape[0]):
        h = decay * v + x[t]
        if spikes:
            h = h + spikes[-1] @ weight.t()
        s = spike(h - threshold, surrogate, alpha, h < grad_threshold if sparse else None)
        v = _reset(h, s.detach() if detach_reset else s, threshold, reset, v_reset)
        spikes.append(s)
        potentials.append(h)
    return _outputs(spikes, potentials if return_potential else None, v if return_state else None,
                    (h, _reset_slope(h, threshold, reset, v_reset, detach_reset)))


def ralif(
    x: torch.Tensor,
    weight: torch.Tensor,
    decay: float = 0.5,
    adapt_decay: float = 0.9,
    beta: float = 0.5,
    threshold: float = 1.0,
    reset: str = "hard",
    v_reset: float = 0.0,
    detach_reset: bool = False,
    surrogate: str = "rectangular",
    alpha: float | None = None,
    return_state: bool = False,
    grad_threshold: float = float("-inf"),
    return_potential: bool = False,
):
    """Recurrent ALIF (LSNN with a recurrent weight): `alif` whose input also carries its own
    spikes of the step before through `weight` [N, N] (x [T, *, N]):
        h[t] = decay * v[t-1] + x[t] + s[t-1] @ weight.T     v[-1] = 0, s[-1] = 0
    then theta, fire, reset and a as `alif`; grad_threshold as `lif`. Returns spikes
    [T, *, N], then the pre-reset potential h [T, *, N] if `return_potential`, then
    (v[T-1], a[T-1]) if `return_state`.
    """
    check_immediate_reset(reset, "ralif")
    v = torch.zeros_like(x[0])
    a = torch.zeros_like(x[0])
    sparse = grad_threshold > float("-inf")
    spikes, potentials = [], []
    for t in range(x.shape[0]):
        h = decay * v + x[t]
        if spikes:
            h = h + spikes[-1] @ weight.t()
        theta = threshold + beta * a
        s = spike(h - theta, surrogate, alpha, h < grad_threshold if sparse else None)
        v = _reset(h, s.detach() if detach_reset else s, theta, reset, v_reset)
        a = adapt_decay * a + s
        spikes.append(s)
        potentials.append(h)
    return _outputs(spikes, potentials if return_potential else None, (v, a) if return_state else None,
                    (h, _reset_slope(h, theta, reset, v_reset, detach_reset)))


def cuba(
    x: torch.Tensor,
    decay: float = 0.5,
    syn_decay: float = 0.5,
    threshold: float = 1.0,
    reset: str = "hard",
    v_reset: float = 0.0,
    detach_reset: bool = False,
    surrogate: str = "rectangular",
    alpha: float | None = None,
    return_state: bool = False,
    return_potential: bool = False,
    state0: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
    recurrent: torch.Tensor | None = None,
):
    """Current-based synaptic LIF (CUBA; snnTorch `Synaptic`, Norse LIF with a synaptic
    current) over all T steps of x [T, *]:
        i[t] = syn_decay * i[t-1] + x[t]             i[-1] = i0 (synaptic current)
                 (+ s[t-1] @ recurrent.T with a recurrent weight [N, N], x [T, *, N]: snnTorch's
                 `RSynaptic`; s[-1] = 0)
        h[t] = decay * v[t-1] + i[t]                 v[-1] = v0
        s[t] = 1 if h[t] >= threshold else 0         (surrogate sg(h - threshold) in backward)
        v[t] = hard: v_reset where s, else h / soft: h - threshold*s / none: h
    reset="subtract" (snnTorch's `Synaptic`): h[t] = decay * v[t-1] + i[t] - threshold*s[t-1],
    fire at h > threshold, v[t] = h[t] (as `lif`'s). `detach_reset` cuts the reset of v from s.
    syn_decay = 0 is `lif` exactly.
    Returns spikes [T, *], then the membrane's pre-reset potential h [T, *] (not the current
    i) if `return_potential`, then (v[T-1], i[T-1]) if `return_state`. state0: the initial
    (v0, i0), each shaped like x[0] or None for zeros.
    """
    v, i = _initial_state(x, state0)

    def fire(h):
        return spike(h - threshold, surrogate, alpha, strict=reset == "subtract")
    s_prev = _initial_spike(v, fire, reset, detach_reset)
    spikes, potentials = [], []
    for t in range(x.shape[0]):
        i = syn_decay * i + x[t]
        if recurrent is not None and spikes:
            i = i + spikes[-1] @ recurrent.t()
        h = _charge(decay * v + i, threshold, s_prev)
        s = fire(h)
        v = _reset(h, s.detach() if detach_reset else s, threshold, reset, v_reset)
        s_prev = s_prev if s_prev is None else s.detach() if detach_reset else s
        spikes.append(s)
        potentials.append(h)
    return _outputs(spikes, potentials if return_potential else None, (v, i) if return_state else None,
                    (h, _reset_slope(h, threshold, reset, v_reset, detach_reset)))
