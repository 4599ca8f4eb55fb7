"""Norse's `LIFBoxCell`, `LIFCell` and `IAFCell`, its sequence modules `LIF` and `IAF` (and
`LIFBox`, the box neuron's) with Norse 1.1.0's own arguments and semantics, on spikefuse's
kernels: port a model by changing one import.

    import norse.torch as norse                       # before
    import spikefuse.compat.norse as norse            # after: norse.LIFCell, norse.LIFParameters, ...

Parameters and states are Norse's named tuples, with its fields and defaults:
`LIFBoxParameters(tau_mem_inv, v_leak, v_th, v_reset, method, alpha, reset_method)`,
`LIFParameters(tau_syn_inv, tau_mem_inv, v_leak, v_th, v_reset, method, alpha)`,
`IAFParameters(v_th, v_reset, method, alpha)` (Norse's own tuples are taken too), and the
states `LIFBoxFeedForwardState(v)`, `LIFFeedForwardState(v, i)`, `IAFFeedForwardState(v)`.
The calling styles are Norse's:
  - per step, in your Python time loop: `z, state = cell(x, state)` for one step x [...];
    state=None starts where Norse's cells do (v at p.v_leak and LIFCell's current at 0;
    IAFCell's v at p.v_reset; Norse also marks that first v as requiring grad, which these
    do not: no value or input gradient changes). The dynamics are Norse's forward-Euler step
    of dt:
    `LIFBoxCell`: v += dt*tau_mem_inv*(x + v_leak - v); `LIFCell`: i += x, then
    v += dt*tau_mem_inv*((v_leak - v) + i) and i -= dt*tau_syn_inv*i; `IAFCell`: v += x (no
    dt). Each fires z = 1 where v > v_th and resets v to v_reset (not detached from z, as in
    Norse's feed-forward cells).
  - the whole sequence: `z, state = norse.LIF(p)(x)` for x [T, ...] gives z [T, ...] and the
    last step's state (record_states=True: every step's, stacked [T, ...]), as Norse's `LIF`
    and `IAF`; `LIFBox(p, dt)` is the same for the box neuron (Norse 1.1.0 has its cell only).
    This is where spikefuse's speed is: on CUDA all T steps run in one fused kernel forward
    and one backward; a per-step loop launches kernels every step.
  - `SequentialState(*modules)`: Norse's container, passing each module whose forward takes a
    `state` its own.
How exact (float32; float64 input runs in float64, as Norse's does):
  - the cells, IAF, and LIF and LIFBox where they run on the PyTorch path (backend
    "reference", or "auto" for CPU tensors): Norse's own float32 operations, so z, v and i
    are Norse's bit for bit. (The step computes Norse's voltage change in torch and fires,
    resets and backpropagates through spikefuse.functional.lif at decay 1, which adds
    exactly; IAF is that LIF over the whole sequence.)
  - LIF and LIFBox on the fused kernels (backend "fused", or "auto" for CUDA tensors) fold
    the step into spikefuse's h = decay * v + input, with decay = 1 - dt*tau_mem_inv and the
    input dt*tau_mem_inv*(x + v_leak) (LIF: on spikefuse's CUBA, its current scaled by
    dt*tau_mem_inv): another order of float32 operations. v and i agree to rounding (within
    about 10 units in the last place in the settings measured), and a spike differs only
    where v lies that close to v_th (and in that neuron's later steps). On random input over 8 parameter settings each, Norse's defaults
    among them (benchmarks/compat_norse_rounding.py; benchmarks/results/
    compat-norse-rounding-cpu.json), LIFBox's spikes differed at 38 of 80 million
    neuron-steps (in 12 neurons) and LIF's at 79 of 80 million (in 9): a first difference
    about once in 10 million neuron-steps. None differ in the tests, whose inputs keep v
    away from v_th.
  - Gradients equal Norse's up to rounding (1e-5 relative) where the spikes agree. Firing at
    v > v_th is spikefuse's h >= threshold with the threshold the next float above v_th, so
    the surrogate is evaluated one float from Norse's point.
Surrogates (p.method, p.alpha; u = v - v_th), Norse's functions on spikefuse's kernels:
  - "super" (the default): Norse 1.1.0's SuperSpike gradient is 1/(|u| + 1)^2, whatever
    p.alpha (it is not used): spikefuse's fast_sigmoid at alpha 1.
  - "triangle" at p.alpha 1 (alpha * max(0, 1 - |u|)): spikefuse's triangle at 1.
  - "tanh" at p.alpha 2 (1 - tanh(alpha u)^2): spikefuse's sigmoid at slope 4, the same
    function.
  - "heaviside" (no gradient through the spikes): a zero surrogate, which runs on the
    PyTorch path only (backend "fused" is refused; "auto" runs it unfused).
  Others ("circ", "heavi_erfc", "adjoint", "triangle" and "tanh" at other alphas) are
  refused with a ValueError naming p.method or p.alpha.
What maps is supported; the rest is refused at construction with a ValueError naming the
argument (or, for shapes, at the call): p.v_th, p.v_reset and p.alpha one value each (a
number or a one-value tensor) without a gradient; LIFCell's and LIF's tau_mem_inv and
tau_syn_inv likewise (spikefuse's CUBA takes fixed decays); LIFBox's tau_mem_inv and every
v_leak one value or a tensor broadcasting to one input step, learnable (requires_grad: the
gradient reaches it); dt*tau_mem_inv in [0, 1] (LIF: in (0, 1)) and dt*tau_syn_inv in
[0, 1] (forward Euler without overshoot); LIFBoxParameters.reset_method Norse's reset_value
(reset_subtract is refused); a state whose v (or i) does not broadcast to one input step;
sparse input. `backend` (keyword only, spikefuse's) picks spikefuse.functional's backend
("auto", "fused", "reference"). Like Norse's, the cells keep no state between calls and have
no state_dict entries: a Norse model's state dict loads.
"""
from __future__ import annotations

import inspect
import math
from typing import NamedTuple

import torch
from torch import nn

from .. import functional as F
from ._shared import next_up, per_neuron

__all__ = ["LIFBoxParameters", "LIFBoxFeedForwardState", "LIFBoxCell", "LIFBox",
           "LIFParameters", "LIFFeedForwardState", "LIFCell", "LIF",
           "IAFParameters", "IAFFeedForwardState", "IAFCell", "IAF",
           "SequentialState", "reset_value", "surrogate_of"]


def reset_value(z, v, reset, th):
    """Norse's default reset (norse.torch.functional.reset.reset_value): v to `reset` where
    z = 1. The only reset_method these modules take."""
    return (1 - z) * v + z * reset


class LIFBoxParameters(NamedTuple):
    """Norse's LIFBoxParameters: the same fields and defaults (tau_mem_inv in 1/s with dt in s)."""
    tau_mem_inv: torch.Tensor = torch.as_tensor(1.0 / 1e-2)
    v_leak: torch.Tensor = torch.as_tensor(0.0)
    v_th: torch.Tensor = torch.as_tensor(1.0)
    v_reset: torch.Tensor = torch.as_tensor(0.0)
    method: str = "super"
    alpha: float = torch.as_tensor(100.0)
    reset_method: object = reset_value


class LIFParameters(NamedTuple):
    """Norse's LIFParameters: the same fields and defaults."""
    tau_syn_inv: torch.Tensor = torch.as_tensor(1.0 / 5e-3)
    tau_mem_inv: torch.Tensor = torch.as_tensor(1.0 / 1e-2)
    v_leak: torch.Tensor = torch.as_tensor(0.0)
    v_th: torch.Tensor = torch.as_tensor(1.0)
    v_reset: torch.Tensor = torch.as_tensor(0.0)
    method: str = "super"
    alpha: float = torch.as_tensor(100.0)


class IAFParameters(NamedTuple):
    """Norse's IAFParameters: the same fields and defaults."""
    v_th: torch.Tensor = torch.as_tensor(1.0)
    v_reset: torch.Tensor = torch.as_tensor(0.0)
    method: str = "super"
    alpha: float = torch.as_tensor(100.0)


class LIFBoxFeedForwardState(NamedTuple):
    """The box cell's state: the membrane potential v."""
    v: torch.Tensor


class LIFFeedForwardState(NamedTuple):
    """LIFCell's state: the membrane potential v and the synaptic current i."""
    v: torch.Tensor
    i: torch.Tensor


class IAFFeedForwardState(NamedTuple):
    """IAFCell's state: the membrane potential v."""
    v: torch.Tensor


def _no_gradient(u: torch.Tensor) -> torch.Tensor:
    """Norse's "heaviside" method: its spikes carry no gradient, ds/du = 0."""
    return torch.zeros_like(u)


def surrogate_of(method, alpha) -> tuple[object, float | None]:
    """spikefuse's (surrogate, alpha) for Norse's threshold method and alpha (Norse 1.1.0's
    norse.torch.functional.threshold; u = v - v_th): "super" (1/(|u|+1)^2; Norse does not use
    alpha) is fast_sigmoid at 1; "triangle" at alpha 1 is triangle at 1; "tanh" at alpha 2
    (1 - tanh(2u)^2) is sigmoid at slope 4; "heaviside" a zero callable (no gradient).
    Anything else: ValueError naming p.method or p.alpha."""
    alpha = _one_value("p.alpha", alpha)
    if method == "super":
        return "fast_sigmoid", 1.0
    if method == "heaviside":
        return _no_gradient, None
    exact = {"triangle": (1.0, "triangle", 1.0), "tanh": (2.0, "sigmoid", 4.0)}
    if method in exact:
        at, name, parameter = exact[method]
        if alpha == at:
            return name, parameter
        raise ValueError(f"p.alpha={alpha!r} with method={method!r} is not supported by spikefuse.compat.norse: "
                         f"Norse's {method} gradient is a spikefuse surrogate at alpha {at} only")
    raise ValueError(f"p.method={method!r} is not supported by spikefuse.compat.norse: it maps 'super', 'triangle' "
                     f"(alpha 1), 'tanh' (alpha 2) and 'heaviside' onto spikefuse's surrogates; Norse's "
                     f"'circ', 'heavi_erfc' and 'adjoint' have none")


def _one_value(name, value) -> float:
    """A number or a one-value tensor without a gradient, as a float (checked finite)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} of shape {tuple(value.shape)} is not supported by spikefuse.compat.norse: "
                             f"it takes one value here")
        if value.requires_grad:
            raise ValueError(f"{name} requires grad: spikefuse.compat.norse takes it as a fixed number (Norse's "
                             f"IAFCell marks p.v_reset so as it starts a state: pass a fresh tensor)")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number or a one-value tensor, got {value!r}")
    return float(value)


def _values(name, value) -> torch.Tensor:
    """A number or a tensor (one value or per neuron; it may require grad), checked finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise ValueError(f"{name} must be a number or a tensor, got {value!r}")
    t = torch.as_tensor(value)
    if not t.is_floating_point() and isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a floating tensor, got {value.dtype}")
    if not torch.isfinite(t.detach()).all():
        raise ValueError(f"{name} must be finite, got {value!r}")
    return t


def _check_rate(name, value, dt, low_open=False, high_open=False) -> None:
    """dt * value within [0, 1] (or open ends): forward Euler without overshoot."""
    rate = dt * _values(name, value).detach().double()
    low = (rate > 0) if low_open else (rate >= 0)
    high = (rate < 1) if high_open else (rate <= 1)
    if not (low & high).all():
        bounds = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise ValueError(f"{name}: dt * {name.split('.')[-1]} must lie in {bounds} here (decay 1 - dt * "
                         f"{name.split('.')[-1]}), got {rate.min().item()}..{rate.max().item()}")


def _check_dt(dt) -> float:
    if isinstance(dt, bool) or not isinstance(dt, (int, float)) or not (math.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be a positive finite number, got {dt!r}")
    return dt


def _to(value, x):
    """A parameter or state on x's device (values unchanged); numbers stay numbers."""
    return value.to(x.device) if isinstance(value, torch.Tensor) else value


def _start(value, x) -> torch.Tensor:
    """A state's v (a number or a tensor broadcasting to one step of x [T, *S]) as v0 [*S] in
    x's dtype, on x's device."""
    return torch.as_tensor(value, device=x.device).to(x.dtype).expand(x.shape[1:])


def _fits(name, value, shape) -> None:
    """A tensor (or number) that broadcasts to `shape` (one input step) without growing it."""
    if not isinstance(value, torch.Tensor):
        return
    try:
        fits = torch.broadcast_shapes(value.shape, shape) == shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"{name} of shape {tuple(value.shape)} does not broadcast to one step of the input, "
                         f"{tuple(shape)}")


def _check_input(x, sequence) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"input_tensor must be a floating tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.is_sparse:
        raise ValueError("input_tensor: sparse input is not supported by spikefuse.compat.norse (Norse's sparse "
                         "path); pass x.to_dense()")
    if sequence and x.dim() < 1:
        raise ValueError(f"input_tensor must be [T, ...] (time first), got shape {tuple(x.shape)}")


def _stack_states(states):
    """Norse's record_states: each field stacked over the steps."""
    return type(states[0])(*(torch.stack([s[k] for s in states]) for k in range(len(states[0]))))


class _Neuron(nn.Module):
    """What the cells and sequence modules share: the parameters' checks, dt, the backend, the
    surrogate, and the step that fires on spikefuse.functional.lif."""
    PARAMETERS = LIFBoxParameters
    STATE = LIFBoxFeedForwardState

    def _common(self, p, dt, backend):
        fields = self.PARAMETERS._fields
        if any(not hasattr(p, f) for f in fields):
            raise ValueError(f"p must be Norse's {self.PARAMETERS.__name__} (fields {list(fields)}), got {p!r}")
        self.dt = _check_dt(dt)
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        self.backend = backend
        if not isinstance(p.method, str):
            raise ValueError(f"p.method must be a string, got {p.method!r}")
        self.surrogate, self.surrogate_alpha = surrogate_of(p.method, p.alpha)
        if not isinstance(self.surrogate, str) and backend == "fused":
            raise ValueError(f"p.method={p.method!r} with backend='fused': its zero gradient runs on the PyTorch path "
                             f"only; use backend 'auto' or 'reference'")
        self.v_th = _one_value("p.v_th", p.v_th)
        self.v_reset = _one_value("p.v_reset", p.v_reset)
        if "v_leak" in fields:
            _values("p.v_leak", p.v_leak)

    def _fire(self, x, v0, decay=1.0):
        """spikefuse.functional.lif over x [T, *S] from v0 (a number or a tensor broadcasting
        to S): spikes and the last v, firing where h > v_th and resetting to v_reset (not
        detached)."""
        return F.lif(x, decay=decay, threshold=next_up(self.v_th, x.dtype), reset="hard", v_reset=self.v_reset,
                     detach_reset=False, surrogate=self.surrogate, alpha=self.surrogate_alpha, v0=_start(v0, x),
                     return_state=True, backend=self.backend)

    def _params(self, x, shape, *names):
        """The parameters `names` of p on x's device, each checked to broadcast to `shape`."""
        values = [_to(getattr(self.p, name), x) for name in names]
        for name, value in zip(names, values):
            _fits(f"p.{name}", value, shape)
        return values

    def _fused(self, x) -> bool:
        """Whether the sequence runs folded on the fused kernels (else step by step, exactly)."""
        return isinstance(self.surrogate, str) and F._use_fused(self.backend, x)

    def _state(self, state, shape, x):
        """The given state (any tuple with Norse's fields), its tensors checked to broadcast to
        one input step; None: the initial state."""
        if state is None:
            return self._initial(shape, x)
        for name in self.STATE._fields:
            if not hasattr(state, name):
                raise ValueError(f"state must have Norse's fields {list(self.STATE._fields)}, got {state!r}")
            _fits(f"state.{name}", getattr(state, name), shape)
        return state

    def extra_repr(self):
        return f"p={self.p}, dt={self.dt}, backend={self.backend!r}"


class _Cell(_Neuron):
    """Norse's cells: one step a call, the state passed in and returned."""

    def forward(self, input_tensor: torch.Tensor, state=None):
        """One step: (z, state), z shaped like input_tensor."""
        _check_input(input_tensor, sequence=False)
        return self._step(input_tensor, self._state(state, input_tensor.shape, input_tensor))


class _Sequence(_Neuron):
    """Norse's SNN modules: x [T, ...] in one call, (z [T, ...], the last state) (all steps'
    with record_states)."""
    record_states = False

    def forward(self, input_tensor: torch.Tensor, state=None):
        """All T steps of input_tensor [T, ...]: (z [T, ...], state)."""
        _check_input(input_tensor, sequence=True)
        x = input_tensor
        given = state is not None
        state = self._state(state, x.shape[1:], x)
        if not self.record_states and self._fused(x):
            return self._sequence(x, state, given)
        zs, states = [], []
        for step in x:
            z, state = self._step(step, state)
            zs.append(z)
            states.append(state)
        return torch.stack(zs), _stack_states(states) if self.record_states else state


class _LIFBoxMath:
    """The box neuron: Norse's step exactly, and the folded sequence."""
    PARAMETERS = LIFBoxParameters
    STATE = LIFBoxFeedForwardState

    def _setup(self, p, dt, backend):
        self._common(p, dt, backend)
        reset = p.reset_method
        if not (getattr(reset, "__name__", "") == "reset_value"
                and getattr(reset, "__module__", "") in ("norse.torch.functional.reset", __name__)):
            raise ValueError(f"p.reset_method={reset!r} is not supported by spikefuse.compat.norse: it takes Norse's "
                             f"reset_value (the default) only")
        _check_rate("p.tau_mem_inv", p.tau_mem_inv, self.dt)
        self.p = p

    def _initial(self, shape, x):
        return LIFBoxFeedForwardState(v=torch.as_tensor(self.p.v_leak).detach().clone())

    def _step(self, x, state):
        """Norse's lif_box_feed_forward_step: its voltage change in its float32 operations,
        added to v (decay 1), fired and reset by spikefuse.functional.lif."""
        tau_mem_inv, v_leak = self._params(x, x.shape, "tau_mem_inv", "v_leak")
        v = _to(state.v, x)
        dv = self.dt * tau_mem_inv * (x + v_leak - v)
        z, v = self._fire(dv.unsqueeze(0), v)
        return z[0], LIFBoxFeedForwardState(v=v)

    def _sequence(self, x, state, given):
        """All steps in one spikefuse.functional.lif call: h = (1 - a) v + a (x + v_leak),
        a = dt * tau_mem_inv."""
        x = x.to(torch.promote_types(x.dtype, torch.float32))  # Norse's float32 state promotes
        tau_mem_inv, v_leak = self._params(x, x.shape[1:], "tau_mem_inv", "v_leak")
        a = self.dt * tau_mem_inv
        drive = a * (x + v_leak)
        v0 = _start(_to(state.v, x), drive)
        decay = 1 - torch.as_tensor(a, dtype=x.dtype, device=x.device)
        if decay.numel() == 1 and not decay.requires_grad:
            z, v = self._fire(drive, v0, decay.item())
            return z, LIFBoxFeedForwardState(v=v)
        shape = drive.shape
        decay, flat, v0 = per_neuron(decay, drive, v0, "p.tau_mem_inv")
        z, v = self._fire(flat, v0, decay)
        return z.reshape(shape), LIFBoxFeedForwardState(v=v.reshape(shape[1:]))


class LIFBoxCell(_LIFBoxMath, _Cell):
    """Norse's LIFBoxCell(p=LIFBoxParameters(), dt=0.001): one forward-Euler step of the LIF
    without a current a call, `z, state = cell(x, state)`; Norse's spikes and v bit for bit
    (the module docstring has the details)."""

    def __init__(self, p: LIFBoxParameters = LIFBoxParameters(), dt: float = 0.001, *, backend: str = "auto"):
        super().__init__()
        self._setup(p, dt, backend)


class LIFBox(_LIFBoxMath, _Sequence):
    """The box neuron over a sequence, as Norse's LIF module is LIFCell's (Norse 1.1.0 has
    the cell only): `z, state = LIFBox(p, dt)(x)` for x [T, ...], from state (default: v at
    p.v_leak); record_states=True returns every step's state, stacked. One fused kernel on
    CUDA (see the module docstring for how exact that is)."""

    def __init__(self, p: LIFBoxParameters = LIFBoxParameters(), dt: float = 0.001, *, record_states: bool = False,
                 backend: str = "auto"):
        super().__init__()
        self._setup(p, dt, backend)
        self.record_states = bool(record_states)


class _LIFMath:
    """Norse's current-based LIF: its step exactly, and the folded sequence on spikefuse's CUBA."""
    PARAMETERS = LIFParameters
    STATE = LIFFeedForwardState

    def _setup(self, p, dt, backend):
        self._common(p, dt, backend)
        if p.method == "adjoint":
            raise ValueError("p.method='adjoint' is not supported by spikefuse.compat.norse: Norse's adjoint "
                             "backward is its own; spikefuse's kernels have their own backward")
        for name in ("tau_syn_inv", "tau_mem_inv"):
            _one_value(f"p.{name}", getattr(p, name))
        _check_rate("p.tau_mem_inv", p.tau_mem_inv, self.dt, low_open=True, high_open=True)
        _check_rate("p.tau_syn_inv", p.tau_syn_inv, self.dt)
        # as Norse's LIFCell and LIF: each field as a tensor (a number becomes a float32 one)
        self.p = LIFParameters(*(torch.as_tensor(getattr(p, f)) for f in LIFParameters._fields[:5]), p.method,
                               torch.as_tensor(p.alpha))

    def _initial(self, shape, x):
        return LIFFeedForwardState(v=self.p.v_leak.detach().clone(),
                                   i=torch.zeros(shape, device=x.device, dtype=torch.float32))

    def _step(self, x, state):
        """Norse's lif_feed_forward_step in its float32 operations; v + dv fired and reset by
        spikefuse.functional.lif (decay 1)."""
        dt, v = self.dt, _to(state.v, x)
        tau_mem_inv, tau_syn_inv, v_leak = self._params(x, x.shape, "tau_mem_inv", "tau_syn_inv", "v_leak")
        i_new = _to(state.i, x) + x
        dv = dt * tau_mem_inv * ((v_leak - v) + i_new)
        z, v = self._fire(dv.unsqueeze(0), v)
        di = -dt * tau_syn_inv * i_new
        return z[0], LIFFeedForwardState(v=v, i=i_new + di)

    def _sequence(self, x, state, given):
        """All steps in one spikefuse.functional.cuba call on the current scaled by a = dt *
        tau_mem_inv, with the leak riding on it: i' = a i + a v_leak, so i'[t] =
        (1 - b) i'[t-1] + a x[t] + a v_leak b (b = dt * tau_syn_inv) and h = (1 - a) v + i'."""
        dt = self.dt
        x = x.to(torch.promote_types(x.dtype, torch.float32))  # Norse's float32 state promotes
        tau_mem_inv, tau_syn_inv, v_leak = self._params(x, x.shape[1:], "tau_mem_inv", "tau_syn_inv", "v_leak")
        a, b = dt * tau_mem_inv, dt * tau_syn_inv
        c = a * v_leak
        if given:  # the carried current joins the first step's input (Norse's i + x)
            x = torch.cat([(_to(state.i, x) + x[0]).unsqueeze(0), x[1:]])
        drive = a * x + c * b
        z, (v, i) = F.cuba(drive, decay=(1 - a).item(), syn_decay=(1 - b).item(),
                           threshold=next_up(self.v_th, x.dtype), reset="hard", v_reset=self.v_reset,
                           detach_reset=False, surrogate=self.surrogate, alpha=self.surrogate_alpha,
                           return_state=True, state0=(_start(_to(state.v, x), drive), _start(c, drive)),
                           backend=self.backend)
        i_new = (i - c) / a
        return z, LIFFeedForwardState(v=v, i=i_new + (-dt * tau_syn_inv) * i_new)


class LIFCell(_LIFMath, _Cell):
    """Norse's LIFCell(p=LIFParameters(), dt=0.001): one forward-Euler step of the
    current-based LIF a call, `z, state = cell(x, state)` (state: LIFFeedForwardState(v, i));
    the input is added to the current unscaled, as in Norse. Norse's spikes, v and i bit for
    bit (the module docstring has the details)."""

    def __init__(self, p: LIFParameters = LIFParameters(), *, dt: float = 0.001, backend: str = "auto"):
        super().__init__()
        self._setup(p, dt, backend)


class LIF(_LIFMath, _Sequence):
    """Norse's LIF(p=LIFParameters(), dt=0.001, record_states=False): LIFCell over x [T, ...]
    in one call, `z, state = LIF(p)(x)`, from state (default: v at p.v_leak, i at 0). One fused
    kernel (spikefuse's CUBA) on CUDA; see the module docstring for how exact that is."""

    def __init__(self, p: LIFParameters = LIFParameters(), *, dt: float = 0.001, record_states: bool = False,
                 backend: str = "auto"):
        super().__init__()
        self._setup(p, dt, backend)
        self.record_states = bool(record_states)


class _IAFMath:
    """Norse's IAF: v += x (dt unused), fire at v > v_th, reset to v_reset: spikefuse's LIF at
    decay 1, exact on every path."""
    PARAMETERS = IAFParameters
    STATE = IAFFeedForwardState

    def _setup(self, p, dt, backend):
        self._common(p, dt, backend)
        self.p = p

    def _initial(self, shape, x):
        return IAFFeedForwardState(v=torch.as_tensor(self.p.v_reset).detach().clone())

    def _step(self, x, state):
        z, v = self._fire(x.unsqueeze(0), _to(state.v, x))
        return z[0], IAFFeedForwardState(v=v)

    def _sequence(self, x, state, given):
        z, v = self._fire(x, _to(state.v, x))
        return z, IAFFeedForwardState(v=v)

    def _fused(self, x) -> bool:  # one lif call on every backend: the same operations as Norse's
        return True


class IAFCell(_IAFMath, _Cell):
    """Norse's IAFCell(p=IAFParameters(), dt=0.001): `z, state = cell(x, state)`, v += x (dt
    unused), from v at p.v_reset; Norse's spikes and v bit for bit."""

    def __init__(self, p: IAFParameters = IAFParameters(), dt: float = 0.001, *, backend: str = "auto"):
        super().__init__()
        self._setup(p, dt, backend)


class IAF(_IAFMath, _Sequence):
    """Norse's IAF(p=IAFParameters(), dt=0.001): IAFCell over x [T, ...] in one
    spikefuse.functional.lif call (one fused kernel on CUDA), `z, state = IAF(p)(x)`; Norse's
    spikes and v bit for bit on every backend."""

    def __init__(self, p: IAFParameters = IAFParameters(), dt: float = 0.001, *, backend: str = "auto"):
        super().__init__()
        self._setup(p, dt, backend)


def _stateful(module: nn.Module) -> bool:
    """Norse's test: a module whose forward takes `state` (or a torch RNN) is called with one."""
    return "state" in inspect.signature(module.forward).parameters or isinstance(module, nn.RNNBase)


class SequentialState(nn.Sequential):
    """Norse's SequentialState(*modules, return_hidden=False): torch's Sequential, except that
    each module whose forward takes a `state` gets its own from the list (None at first) and
    returns it updated. `out, state = model(x, state)`; return_hidden=True returns every
    module's output instead of the last. (Norse's forward state hooks are not here.)"""

    def __init__(self, *args: nn.Module, return_hidden: bool = False):
        super().__init__(*args)
        self.return_hidden = return_hidden
        self.stateful_layers = [_stateful(module) for module in args]

    def forward(self, input_tensor, state: list | None = None):
        state = [None] * len(self) if state is None else state
        hidden = []
        for index, module in enumerate(self):
            if self.stateful_layers[index]:
                input_tensor, state[index] = module(input_tensor, state[index])
            else:
                input_tensor = module(input_tensor)
            if self.return_hidden:
                hidden.append(input_tensor)
        return (hidden if self.return_hidden else input_tensor), state
