"""Public neuron functions. They check their input, then pick a backend:

    "fused"      the Triton kernels of spikefuse.ops.lif (one launch over all T steps
                 forward, one reverse-time launch backward); on a CPU tensor they run
                 through the Triton interpreter (slow: for tests)
    "reference"  the step-by-step PyTorch loop of spikefuse.reference
    "auto"       fused on CUDA for float32/bfloat16/float16; for `lif` on a float32/float64
                 CPU tensor the graph-free loop of spikefuse.ops.lif_loop (spikes bit-identical
                 to the reference, hand-written reverse-time backward); reference otherwise

All take time-major input x of shape [T, *] and return spikes of x's shape and dtype.
The options every neuron shares (threshold, reset, v_reset, detach_reset, surrogate, alpha,
grad_threshold, grad_scope) are checked by building one spikefuse.NeuronOptions, which the
backends receive.
"""
from __future__ import annotations

import importlib.util
import warnings
from typing import Callable

import torch

from . import reference
from .neuron_options import ArgumentError, NeuronOptions, check_immediate_reset, check_number
from .neuron_options import GRAD_SCOPES, RESETS  # noqa: F401  (public names here before NeuronOptions)
from .surrogates import resolve as resolve_surrogate  # noqa: F401  (likewise)
from .surrogates import surrogate_name
from .surrogates import CustomSurrogate

BACKENDS = ("auto", "fused", "reference")
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def lif(
    x: torch.Tensor,
    decay: float | torch.Tensor = 0.5,
    threshold: float | torch.Tensor = 1.0,
    reset: str = "hard",
    v_reset: float = 0.0,
    detach_reset: bool = False,
    surrogate: str | CustomSurrogate | Callable[[torch.Tensor], torch.Tensor] = "rectangular",
    alpha: float | None = None,
    v0: torch.Tensor | None = None,
    return_state: bool = False,
    backend: str = "auto",
    grad_threshold: float = float("-inf"),
    return_potential: bool = False,
    grad_scope: str = "step",
):
    """Leaky integrate-and-fire neurons over all T steps of x [T, *].

    decay: float in [0, 1], or a tensor (PLIF) that is a scalar or holds one value per
        channel, channel being dim 2 of x ([T, B, C, ...]).
    reset: "hard" (to v_reset), "soft" (subtract threshold), "none", or "subtract": snnTorch's
        default reset, a step late and firing at h > threshold (h[t] = decay * v[t-1] + x[t] -
        threshold * s[t-1], v[t] = h[t]; spikes bit-equal to snnTorch's `Leaky`, whose
        detached reset is detach_reset=True; spikefuse.NeuronOptions gives the details).
    surrogate, alpha: the backward ds/dh (see spikefuse.surrogates); alpha=None
        takes the surrogate's default width/slope. `surrogate` may also be
        - spikefuse.surrogates.custom(triton_fn, torch_fn, alpha): your surrogate written for
          Triton and in torch; it runs fused wherever a name would (the backward kernel calls
          triton_fn), on the loop path or reference with torch_fn elsewhere. Under
          torch.compile it runs on the reference with torch_fn (the traced LIF ops take no
          Triton function; it traces without a graph break), as does double backward.
          alpha=None takes the custom surrogate's alpha; a number overrides it.
        - a callable sg(u) -> tensor in torch ops giving ds/du elementwise for
          u = h - threshold: it receives a tensor and must return one of the same shape; it
          is called without autograd on the loop path (alpha is ignored: bind parameters
          with functools.partial). The fused kernels cannot run it: it runs on the loop path
          of spikefuse.ops.lif_loop for float32/float64 (CPU or CUDA; backend="auto") and
          on the reference otherwise, with a one-time warning where (on CUDA) the fused
          kernels would have run; backend="fused" with a callable raises ValueError.
    v0: initial membrane potential, shaped like x[0]; default zeros. Any floating dtype: the
        results do not take v0's dtype on any backend, as the fused kernels give them (they
        read v0 into float32): spikes and h in x's dtype, and the final state too (except
        the fused kernels' for a bfloat16/float16 x: float32, the state they keep); v0's
        gradient comes in v0's dtype. A decay tensor of another dtype likewise.
    threshold: a finite float, or a floating tensor (a learnable threshold: it gets a
        gradient) that is a scalar or holds one value per channel (dim 2 of x), on x's device
        and finite (checked on the CPU). A tensor threshold runs fused wherever a float one
        would (the kernels read it per channel; the backward kernel sums its gradient over
        time, torch over the batch and spatial dims: deterministic), torch.compile included;
        where a float threshold would take the loop path (CPU, or a torch-only callable) it
        runs on spikefuse.reference (the loop kernels take a float threshold).
    return_state: also return the membrane potential after the last step, v[T-1].
    return_potential: also return the pre-reset potential trace h [T, *] (h[t] = decay *
        v[t-1] + x[t], before the spike's reset), in x's dtype (the fused kernels compute in
        float32 and round it to x's dtype), with its graph: a loss on h (membrane-potential
        losses) backpropagates into x, decay and v0. The return is spikes, then h if
        return_potential, then v[T-1] if return_state: `s`, `(s, h)`, `(s, v)` or `(s, h, v)`.
        All backends compute it (the fused one in its kernels, eagerly; under torch.compile
        it runs on the reference).
    grad_threshold: sparse backward (Perez-Nieves & Goodman): the surrogate gradient is zeroed
        where the potential h[t] < grad_threshold (e.g. 0.9 for threshold 1); -inf: no cut.
    grad_scope: what the grad_threshold cut decides on.
        "step" (the paper's): each step by its own potential, as above.
        "sequence": a neuron keeps its whole surrogate (every step) if its potential reached
            grad_threshold at some step, and loses all of it otherwise.
        "batch": as "sequence", decided per position (the dims after the batch, dim 1) over
            every sample of the batch: the neurons a following sparse Linear
            (spikefuse.nn.SparseSpikingLinear) computes anyway, with their exact gradient.
        NaN potentials count as reached (a NaN gradient is never cut to 0). "sequence" and
        "batch" decide over what this call sees: the steps of x (a stateful LIF fed in chunks
        decides per chunk; the temporal pipeline refuses them) and, for "batch", this
        process's batch (under data parallelism, each rank's own).

    Non-finite values, alike on every backend and device (the IEEE arithmetic of the
    equations; nothing is checked on the device, nothing synchronises):
      - NaN never reads as "no spike": where h[t] is NaN, s[t] and v[t] are NaN, and every
        later step of that neuron too. NaN in x, v0 or a tensor decay gives NaN spikes.
      - h = +inf fires; then hard reset: v = v_reset, soft: v = inf - threshold = inf,
        none: v = inf. h = -inf does not fire, v = -inf. 0 * inf and inf - inf are NaN
        (decay 0 after an infinite v, or -inf input after +inf): NaN spikes follow.
      - threshold, v_reset and a float decay must be finite; a tensor decay is range-checked
        on the CPU only (NaN passes the check and propagates).
      - Gradients: the same arithmetic, NaN in -> NaN out. Where h is infinite, the hard
        reset's term (v_reset - h) * sg(h - threshold) is inf * 0: NaN in the fused
        kernels, 0 or NaN in the reference.
    Double backward (create_graph=True, e.g. a gradient penalty) is supported: the fused
    backward then differentiates the reference (slower), so second derivatives are its.
    """
    _check_x(x)
    decay_value, decay_tensor = _check_decay(decay, x)
    threshold_tensor = _check_threshold(threshold, x)
    options = NeuronOptions(1.0 if threshold_tensor is not None else threshold, reset, v_reset, detach_reset,
                            surrogate, alpha, grad_threshold, grad_scope)
    surrogate = options.resolved_surrogate
    _check_v0(v0, x)
    return_potential = bool(return_potential)
    if return_potential and backend != "reference" and torch.compiler.is_dynamo_compiling():
        backend = "reference"  # the traced custom op has no h output: the reference traces as torch ops
    custom = isinstance(surrogate, CustomSurrogate)
    if custom and torch.compiler.is_dynamo_compiling():
        backend = "reference"  # the traced ops take no Triton function: the torch twin traces as torch ops
    torch_only = callable(surrogate) and not custom  # a user's sg(u) in torch ops: never fused
    threshold = options.threshold  # the reference's: the float, or a tensor threshold off the fused kernels
    if threshold_tensor is not None and (torch_only or not _use_fused(backend, x)):
        threshold, threshold_tensor = threshold_tensor, None  # a learnable threshold off the fused kernels
    if torch_only:  # the loop path (any device) or the reference
        if backend not in BACKENDS and backend is not _STAND_IN:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(BACKENDS)}")
        if backend == "fused":
            raise ValueError(f"surrogate: the fused kernels cannot run the Python callable "
                             f"{surrogate_name(surrogate)}; pass spikefuse.surrogates.custom(triton_fn, torch_fn) "
                             f"to run it fused, or use backend='auto' or 'reference'")
        if backend == "auto" and not torch.compiler.is_dynamo_compiling() and _use_fused(backend, x):
            _warn_unfused_once(surrogate)
    elif _use_fused(backend, x):
        return _fused_or()(
            lambda: _fused_lif()(x, decay_value, decay_tensor, options, v0, bool(return_state), return_potential,
                                 threshold_tensor),
            # while its kernel compiles in the background: the loop path, or the reference for a tensor threshold
            lambda: _unfused_lif(x, decay_value, decay_tensor, threshold_tensor if threshold_tensor is not None
                                 else threshold, options, v0, return_state, return_potential, loop_anywhere=True))
    return _unfused_lif(x, decay_value, decay_tensor, threshold, options, v0, return_state, return_potential,
                        loop=backend == "auto" or backend is _STAND_IN,
                        loop_anywhere=callable(surrogate) or backend is _STAND_IN)


_STAND_IN = object()  # lif's backend for lif_stand_in: not a name a user could pass


def lif_stand_in(x: torch.Tensor, decay, **options):
    """lif(x, decay, **options) off the fused kernels, as a fused layer's stand-in while its kernels
    compile in the background (spikefuse.ops.launch): the loop path (spikefuse.ops.lif_loop: a few
    torch ops per step and a hand-written backward) on CUDA too, where it applies, else the reference
    (an autograd node per op and step). Same spikes as lif; gradients within 1e-5."""
    return lif(x, decay, backend=_STAND_IN, **options)


def _unfused_lif(x, decay_value, decay_tensor, threshold, options, v0, return_state, return_potential,
                 loop=True, loop_anywhere=False):
    """lif off the fused kernels: the loop path where `loop` allows it (on CUDA too with
    `loop_anywhere`: a callable surrogate's torch twin, or a fused call whose kernel is compiling),
    else the reference. threshold: a float, or a learnable threshold tensor (reference only)."""
    if isinstance(threshold, torch.Tensor):
        threshold = threshold.to(x.dtype)  # spikes keep x's dtype; the gradient flows back through the cast
        threshold = threshold.reshape(threshold.shape + (1,) * max(x.dim() - 3, 0))
        loop = False  # the loop takes a float threshold
    # the fused kernels' rule on every path: results in x's dtype, whatever v0's or the decay's
    # (the casts are autograd ops: the gradients come back in v0's and the decay's dtypes)
    v0 = v0.to(x.dtype) if v0 is not None else None
    decay_tensor = decay_tensor.to(x.dtype) if decay_tensor is not None else None
    if loop and _loop_lif().usable(x, decay_tensor, v0, any_device=loop_anywhere):
        return _loop_lif().lif_loop(x, decay_value, decay_tensor, options, v0, bool(return_state),
                                    return_potential)
    if decay_tensor is not None:
        decay_value = decay_tensor.reshape(decay_tensor.shape + (1,) * max(x.dim() - 3, 0))
    _, *common = options.common()
    return reference.lif(x, decay_value, threshold, *common, v0, bool(return_state), options.grad_threshold,
                         return_potential, options.grad_scope)


_warned_unfused = False


def _warn_unfused_once(surrogate):
    """Once per process: a callable surrogate kept a CUDA LIF off the fused kernels."""
    global _warned_unfused
    if not _warned_unfused:
        _warned_unfused = True
        warnings.warn(f"surrogate {surrogate_name(surrogate)} is a Python callable, which the fused LIF "
                      f"kernels cannot run: it runs on the slower loop/reference path. To run it fused, pass "
                      f"spikefuse.surrogates.custom(triton_fn, torch_fn, alpha) with a @triton.jit twin "
                      f"sg(u, alpha) (docs/concepts.md, 'Your own surrogate, fused')", stacklevel=3)


def if_(x: torch.Tensor, threshold: float = 1.0, **kwargs):
    """Integrate-and-fire (LIF with decay = 1); same options (and non-finite policy) as `lif`."""
    if "decay" in kwargs:
        raise TypeError("if_() takes no decay: integrate-and-fire has decay = 1")
    return lif(x, decay=1.0, threshold=threshold, **kwargs)


def plif(x: torch.Tensor, decay: torch.Tensor, **kwargs):
    """Parametric LIF: `decay` is a tensor (scalar or per channel) that gets a gradient.
    Non-finite values as `lif`: a NaN decay gives NaN spikes (from the first step), never
    silent zeros; an infinite one is out of [0, 1] (refused on the CPU, unchecked on CUDA)."""
    if not isinstance(decay, torch.Tensor):
        raise TypeError(f"decay must be a tensor for plif, got {type(decay).__name__}")
    return lif(x, decay=decay, **kwargs)


# ---- input checks: each names the argument and what was expected ----

def _check_x(x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have a leading time dimension [T, *], got a 0-d tensor")
    if x.shape[0] == 0:
        raise ValueError(f"x has T == 0 time steps (shape {tuple(x.shape)}); expected T >= 1")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")


def _check_threshold(threshold, x):
    """A tensor threshold, checked, as shape [1] or [C]; None for a number (NeuronOptions checks it)."""
    if not isinstance(threshold, torch.Tensor):
        return None
    if not threshold.is_floating_point():
        raise TypeError(f"threshold must be a finite number or a floating-point tensor, got dtype {threshold.dtype}")
    if threshold.device != x.device:
        raise ValueError(f"threshold is on {threshold.device} but x is on {x.device}")
    channels = x.shape[2] if x.dim() >= 3 else None
    if threshold.numel() != 1 and (threshold.dim() != 1 or threshold.shape[0] != channels):
        raise ValueError(
            f"threshold must be a number, a scalar tensor or a tensor with one value per channel "
            f"(shape [{channels}] for x of shape {tuple(x.shape)}), got shape {tuple(threshold.shape)}")
    if threshold.device.type == "cpu" and not torch.compiler.is_dynamo_compiling():
        if not torch.isfinite(threshold).all():  # CUDA values are not checked: it would force a sync
            raise ValueError("threshold values must be finite")
    return threshold.reshape(-1)


def _check_decay(decay, x):
    """Returns (float decay, None) or (1.0, tensor decay of shape [1] or [C])."""
    if isinstance(decay, torch.Tensor):
        if not decay.is_floating_point():
            raise TypeError(f"decay must be a floating-point tensor, got dtype {decay.dtype}")
        if x is not None and decay.device != x.device:
            raise ValueError(f"decay is on {decay.device} but x is on {x.device}")
        channels = x.shape[2] if x is not None and x.dim() >= 3 else None
        if decay.numel() != 1 and (decay.dim() != 1 or decay.shape[0] != channels):
            raise ValueError(
                f"decay must be a scalar tensor or have one value per channel "
                f"(shape [{channels}] for x of shape {tuple(x.shape)}), got shape {tuple(decay.shape)}")
        if decay.device.type == "cpu" and not torch.compiler.is_dynamo_compiling():
            if ((decay < 0) | (decay > 1)).any():  # CUDA values are not checked: it would force a sync
                raise ValueError("decay values must lie in [0, 1]")
        return 1.0, decay.reshape(-1)
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be a number in [0, 1] or a tensor, got {decay!r}")
    return float(decay), None


def _check_v0(v0, x):
    if v0 is not None:
        _check_initial_state(v0, x, "v0")


def _check_initial_state(tensor, x, label):
    """An initial state: a floating tensor shaped like x[0] on x's device; `label` names it."""
    if not isinstance(tensor, torch.Tensor):
        raise ArgumentError(f"{label} must be a tensor shaped like x[0], got {type(tensor).__name__}")
    if tensor.shape != x.shape[1:]:
        raise ValueError(f"{label} must have shape {tuple(x.shape[1:])} (one step of x), got {tuple(tensor.shape)}")
    if tensor.device != x.device:
        raise ValueError(f"{label} is on {tensor.device} but x is on {x.device}")
    if not tensor.is_floating_point():
        raise ArgumentError(f"{label} must be floating point, got dtype {tensor.dtype}")


def _use_fused(backend, x):
    if backend is _STAND_IN:
        return False
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown {backend!r}; expected one of {list(BACKENDS)}")
    if backend == "reference":
        return False
    fusable = x.dtype in FUSED_DTYPES
    if backend == "fused":
        if not fusable:
            raise TypeError(f"x dtype {x.dtype} has no fused kernel; expected one of "
                            f"{[str(d) for d in FUSED_DTYPES]} or backend='reference'")
        if not x.is_cuda and not _interpreted():  # else Triton's error says less
            raise RuntimeError(FUSED_ON_CPU)
        return True
    return fusable and x.is_cuda and _triton_available()


FUSED_ON_CPU = ("backend='fused' with a CPU tensor needs Triton's interpreter (TRITON_INTERPRET=1 set before "
                "triton is imported; slow: for tests), and it is off: the fused kernels run on CUDA tensors; "
                "backend='auto' (the default) runs CPU tensors on the pure-PyTorch path")


# Module-level values, not functools.cache: dynamo warns on (and cannot see into) an
# lru_cache wrapper.
_TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None  # found, not imported
_LIF_FUSED = None


def _triton_available():
    return _TRITON_AVAILABLE


def _interpreted() -> bool:
    """Whether Triton's interpreter runs the fused kernels (spikefuse.ops.triton_or_stub chooses)."""
    from .ops.triton_or_stub import INTERPRETED
    return INTERPRETED


def _loop_lif():
    """The module spikefuse.ops.lif_loop (no Triton), imported on first use and kept."""
    global _LIF_LOOP
    if _LIF_LOOP is None:
        from .ops import lif_loop
        _LIF_LOOP = lif_loop
    return _LIF_LOOP


_LIF_LOOP = None


def _fused_or():
    """spikefuse.ops.launch.fused_or, imported on first use (as _fused_lif)."""
    global _FUSED_OR
    if torch.compiler.is_dynamo_compiling():
        from .ops.launch import fused_or
        return fused_or
    if _FUSED_OR is None:
        from .ops.launch import fused_or
        _FUSED_OR = fused_or
    return _FUSED_OR


_FUSED_OR = None


def _fused_lif():
    """spikefuse.ops.lif.lif_fused, imported on first use (it imports Triton) and then
    kept: an import statement costs microseconds on every call. While dynamo traces, a
    plain import: a global filled inside a traced frame would fail that frame's guards
    on its next call (a recompile)."""
    global _LIF_FUSED
    if torch.compiler.is_dynamo_compiling():
        from .ops.lif import lif_fused
        return lif_fused
    if _LIF_FUSED is None:
        from .ops.lif import lif_fused
        _LIF_FUSED = lif_fused
    return _LIF_FUSED


# ---- adaptive-threshold LIF (ALIF / LSNN) ----

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
    backend: str = "auto",
    return_potential: bool = False,
    state0: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
):
    """Adaptive-threshold LIF (ALIF / LSNN, Bellec et al. 2018) over all T steps of x [T, *]:

        h[t] = decay * v[t-1] + x[t]                 v[-1] = v0 (default 0)
        theta[t] = threshold + beta * a[t-1]         a[-1] = a0 (default 0; the adaptation variable)
        s[t] = 1 if h[t] >= theta[t] else 0
        v[t] = reset as `lif` ("hard" to v_reset, "soft" subtracts theta[t], "none")
        a[t] = adapt_decay * a[t-1] + s[t]

    decay, adapt_decay: floats in (0, 1]. beta: float >= 0 (0 gives `lif` exactly).
    surrogate, alpha: backward ds/dh = sg(h - theta), also through theta (ds/da[t-1] =
        -beta * sg). detach_reset cuts the reset of v from s (not a's update).
    return_state: also return the final state (v[T-1], a[T-1]): (spikes, (v, a)).
    return_potential: also return the pre-reset potential trace h [T, *] (as `lif`: x's
        dtype, differentiable): spikes, then h, then (v, a) if return_state.
    state0: the initial state (v0, a0), each a floating tensor shaped like x[0] on x's device,
        or None for zeros; both get gradients. A previous call's final state continues it:
        chunks of a sequence give the spikes of one call over the whole. Any floating dtype:
        the results are in x's dtype on every backend (as `lif`'s v0).
    backend: "fused" (spikefuse.ops.alif; on a CPU tensor through the Triton interpreter),
        "reference" (spikefuse.reference.alif) or "auto" (fused on CUDA, else reference).
        Under torch.compile, return_potential runs on the reference.
    """
    _check_float_x(x)
    state0 = _check_state0(state0, x, ("v0", "a0"))
    decay = check_number("decay", decay, low_open=0.0, high=1.0)
    adapt_decay = check_number("adapt_decay", adapt_decay, low_open=0.0, high=1.0)
    beta = check_number("beta", beta, low=0.0)
    options = NeuronOptions(threshold, reset, v_reset, detach_reset, surrogate, alpha, callable_surrogate=False)
    check_immediate_reset(reset, "alif")
    return_potential = bool(return_potential)
    if _use_fused(backend, x) and not (return_potential and torch.compiler.is_dynamo_compiling()):
        from .ops.alif import alif_fused
        return alif_fused(x, decay, adapt_decay, beta, options, bool(return_state),
                          return_potential=return_potential, state0=state0)
    return reference.alif(x, decay, adapt_decay, beta, *options.common(), bool(return_state), return_potential,
                          state0)


def _check_float_x(x):
    """_check_x, and a floating-point dtype (ArgumentError otherwise)."""
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] > 0 and not x.is_floating_point():
        raise ArgumentError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    _check_x(x)


def _check_state0(state0, x, names):
    """ALIF's and CUBA's initial state: None, or a pair (named `names`, e.g. v0, a0) of
    floating tensors shaped like x[0] on x's device, either None (zeros). Returns the pair."""
    if state0 is None:
        return None, None
    pair = f"({names[0]}, {names[1]})"
    if not isinstance(state0, (tuple, list)) or len(state0) != 2:
        raise ArgumentError(f"state0 must be None or a pair {pair} of tensors shaped like x[0], got "
                            f"{type(state0).__name__}")
    for name, tensor in zip(names, state0):
        if tensor is not None:
            _check_initial_state(tensor, x, f"state0 {pair}: {name}")
    return tuple(state0)


# ---- current-based synaptic LIF (CUBA) ----

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
    backend: str = "auto",
    return_potential: bool = False,
    state0: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
):
    """Current-based synaptic LIF (CUBA; snnTorch `Synaptic`, Norse's LIF with a synaptic
    current) over all T steps of x [T, *]:

        i[t] = syn_decay * i[t-1] + x[t]             i[-1] = i0 (default 0; the synaptic current)
        h[t] = decay * v[t-1] + i[t]                 v[-1] = v0 (default 0)
        s[t] = 1 if h[t] >= threshold else 0
        v[t] = reset as `lif` ("hard" to v_reset, "soft" subtracts threshold, "none")

    reset="subtract" is snnTorch's `Synaptic` (its default reset; alpha = syn_decay, beta =
        decay): h[t] also loses threshold * s[t-1], fires at h > threshold and is not reset at
        once (as `lif`'s "subtract"); its spikes are snnTorch's bit for bit.
    decay: float in (0, 1]. syn_decay: float in [0, 1] (0 feeds x straight through: `lif`
        exactly).
    surrogate, alpha: backward ds/dh = sg(h - threshold). detach_reset cuts the reset of v
        from s.
    return_state: also return the final state (v[T-1], i[T-1]): (spikes, (v, i)).
    return_potential: also return the membrane's pre-reset potential trace h [T, *] (h[t] =
        decay * v[t-1] + i[t]; not the current i), as `lif`: x's dtype, differentiable;
        spikes, then h, then (v, i) if return_state.
    state0: the initial state (v0, i0), as `alif`'s (v0, a0): tensors shaped like x[0] or
        None for zeros, both differentiable; the results are in x's dtype whatever theirs.
    backend: "fused" (spikefuse.ops.cuba; on a CPU tensor through the Triton interpreter),
        "reference" (spikefuse.reference.cuba) or "auto" (fused on CUDA, else reference).
        Under torch.compile, return_potential runs on the reference.
    """
    _check_float_x(x)
    state0 = _check_state0(state0, x, ("v0", "i0"))
    decay = check_number("decay", decay, low_open=0.0, high=1.0)
    syn_decay = check_number("syn_decay", syn_decay, low=0.0, high=1.0)
    options = NeuronOptions(threshold, reset, v_reset, detach_reset, surrogate, alpha, callable_surrogate=False)
    return_potential = bool(return_potential)
    if _use_fused(backend, x) and not (return_potential and torch.compiler.is_dynamo_compiling()):
        from .ops.cuba import cuba_fused
        return cuba_fused(x, decay, syn_decay, options, bool(return_state), return_potential=return_potential,
                          state0=state0)
    return reference.cuba(x, decay, syn_decay, *options.common(), bool(return_state), return_potential, state0)


# ---- recurrent LIF ----

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
    sparse: bool = False,
    activity: torch.Tensor | None = None,
    return_potential: bool = False,
    backend: str = "auto",
):
    """Recurrent LIF over all T steps of x [T, *, N]: a LIF whose input also carries its
    own spikes of the step before through `weight` [N, N] (the SHD/LSNN literature's
    recurrent layer; SpikingJelly's LinearRecurrentContainer around a LIFNode):

        h[t] = decay * v[t-1] + x[t] + s[t-1] @ weight.T      v[-1] = 0, s[-1] = 0
        s[t] = 1 if h[t] >= threshold else 0
        v[t] = reset as `lif` ("hard" to v_reset, "soft" subtracts threshold, "none")

    decay: float in (0, 1]. weight: floating tensor [N, N] on x's device (gradients flow
        to it). surrogate, alpha, detach_reset, grad_threshold: as `lif`.
    return_state, return_potential: as `lif`: spikes, then the pre-reset potential trace h
        [T, *, N] (differentiable) if return_potential, then v[T-1] if return_state.
    sparse: the fused sparse path (spikefuse.ops.sparse_recurrent_lif: each step reads only
        the weights of the columns that spiked, backward only those of the columns that
        reached grad_threshold); the same results as the dense path, faster at low activity
        (docs/sparse.md). The reference ignores it.
    activity: None, or a float64 tensor [2] on x's device to which the fused path adds (the
        number of columns with a spike in some row, summed over steps; steps x N), without
        a host sync: what path dispatch reads (spikefuse.nn.RecurrentLIF, path="auto").
    backend: "fused" (spikefuse.ops.recurrent_lif: one launch per step; on a CPU tensor
        through the Triton interpreter), "reference" (spikefuse.reference.rlif) or "auto"
        (fused on CUDA, else reference).
    """
    _check_recurrent(x, weight)
    decay = check_number("decay", decay, low_open=0.0, high=1.0)
    options = NeuronOptions(threshold, reset, v_reset, detach_reset, surrogate, alpha, grad_threshold,
                            callable_surrogate=False)
    check_immediate_reset(reset, "rlif")
    if activity is not None and not (isinstance(activity, torch.Tensor) and activity.shape == (2,)
                                     and activity.dtype == torch.float64 and activity.device == x.device):
        raise ValueError(f"activity must be None or a float64 tensor [2] on {x.device}")
    return_potential = bool(return_potential)
    if return_potential and torch.compiler.is_dynamo_compiling():
        backend = "reference"  # the traced op has no differentiable h output
    if _use_fused(backend, x):
        from .ops.recurrent_lif import rlif_fused
        return rlif_fused(x, weight, decay, options, bool(return_state), bool(sparse), activity, return_potential)
    return reference.rlif(x, weight.to(x.dtype), decay, *options.common(), bool(return_state),
                          options.grad_threshold, return_potential)


def _check_recurrent(x, weight):
    """x [T, *, N], floating point, and the recurrent weight [N, N] beside it (a ValueError or
    ArgumentError naming the argument)."""
    _check_float_x(x)
    if isinstance(x, torch.Tensor) and x.dim() < 2:
        raise ValueError(f"x must be [T, *, N] (2 or more dims), got shape {tuple(x.shape)}")
    n = x.shape[-1]
    if not isinstance(weight, torch.Tensor):
        raise ArgumentError(f"weight must be a tensor [{n}, {n}], got {type(weight).__name__}")
    if weight.shape != (n, n):
        raise ValueError(f"weight must be [N, N] = [{n}, {n}] for x of shape {tuple(x.shape)} "
                         f"(N = x's last dim), got {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise ArgumentError(f"weight must be a floating-point tensor, got dtype {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device} but x is on {x.device}")


# ---- recurrent CUBA ----

def rcuba(
    x: torch.Tensor,
    weight: torch.Tensor,
    decay: float = 0.5,
    syn_decay: float = 0.5,
    threshold: float = 1.0,
    reset: str = "hard",
    v_reset: float = 0.0,
    detach_reset: bool = False,
    surrogate: str = "rectangular",
    alpha: float | None = None,
    return_state: bool = False,
    backend: str = "auto",
    return_potential: bool = False,
):
    """Recurrent current-based LIF (snnTorch's `RSynaptic`): `cuba` whose synaptic current
    also takes the layer's own spikes of the step before through `weight` [N, N] (x [T, *, N]):

        i[t] = syn_decay * i[t-1] + x[t] + s[t-1] @ weight.T     i[-1] = 0, s[-1] = 0
        h[t] = decay * v[t-1] + i[t]                              v[-1] = 0

    then fire and reset as `cuba` (reset="subtract" with detach_reset=True is RSynaptic's
    default). Returns spikes [T, *, N], then h if `return_potential`, then (v[T-1], i[T-1]) if
    `return_state`. backend: "auto" or "reference" (spikefuse.reference.cuba, torch ops step by
    step: this neuron has no fused kernel; "fused" is refused).
    """
    _check_recurrent(x, weight)
    decay = check_number("decay", decay, low_open=0.0, high=1.0)
    syn_decay = check_number("syn_decay", syn_decay, low=0.0, high=1.0)
    options = NeuronOptions(threshold, reset, v_reset, detach_reset, surrogate, alpha, callable_surrogate=False)
    if backend not in BACKENDS or backend == "fused":
        raise ValueError(f"backend: {backend!r}; rcuba has no fused kernel: 'auto' and 'reference' run "
                         "spikefuse.reference.cuba with the recurrent weight")
    return reference.cuba(x, decay, syn_decay, *options.common(), bool(return_state), bool(return_potential), None,
                          recurrent=weight.to(x.dtype))


# ---- recurrent adaptive LIF (LSNN) ----

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
    backend: str = "auto",
    return_potential: bool = False,
):
    """Recurrent adaptive LIF (the LSNN of Bellec et al. 2018 with a recurrent weight) over all
    T steps of x [T, *, N]: `alif`'s adaptive threshold on `rlif`'s recurrent input:

        h[t] = decay * v[t-1] + x[t] + s[t-1] @ weight.T      v[-1] = 0, s[-1] = 0
        theta[t] = threshold + beta * a[t-1]                  a[-1] = 0
        s[t] = 1 if h[t] >= theta[t] else 0
        v[t] = reset as `alif` ("hard" to v_reset, "soft" subtracts theta[t], "none")
        a[t] = adapt_decay * a[t-1] + s[t]

    decay, adapt_decay: floats in (0, 1]. beta: float >= 0 (0 gives `rlif` exactly).
    weight: floating tensor [N, N] on x's device (gradients flow to it).
    surrogate, alpha, detach_reset: as `alif`; grad_threshold: as `lif`.
    return_state: also return the final state (v[T-1], a[T-1]): (spikes, (v, a)).
    return_potential: also return the pre-reset potential trace h [T, *, N] (as `lif`: x's
        dtype, differentiable): spikes, then h, then (v, a) if return_state.
    backend: "fused" (spikefuse.ops.recurrent_alif: one launch per step; on a CPU tensor
        through the Triton interpreter), "reference" (spikefuse.reference.ralif) or "auto"
        (fused on CUDA, else reference). Under torch.compile, return_potential runs on the
        reference.
    """
    _check_recurrent(x, weight)
    decay = check_number("decay", decay, low_open=0.0, high=1.0)
    adapt_decay = check_number("adapt_decay", adapt_decay, low_open=0.0, high=1.0)
    beta = check_number("beta", beta, low=0.0)
    options = NeuronOptions(threshold, reset, v_reset, detach_reset, surrogate, alpha, grad_threshold,
                            callable_surrogate=False)
    check_immediate_reset(reset, "ralif")
    return_potential = bool(return_potential)
    if _use_fused(backend, x) and not (return_potential and torch.compiler.is_dynamo_compiling()):
        from .ops.recurrent_alif import ralif_fused
        return ralif_fused(x, weight, decay, adapt_decay, beta, options, bool(return_state), return_potential)
    return reference.ralif(x, weight.to(x.dtype), decay, adapt_decay, beta, *options.common(),
                           bool(return_state), options.grad_threshold, return_potential)
