"""What the neuron modules share: the membrane-potential recording and the carried state
(`stateful`, `detach_state`) of LIF, IF, PLIF, ALIF and CUBA, the [T, B, ...] input check
of every neuron, and for those built on SharedOptions (ALIF, CUBA, the recurrent neurons)
the options checked once at construction (a spikefuse.NeuronOptions) and the common part of
their repr. The dynamics live in spikefuse.functional."""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from .. import functional as F
from ..neuron_options import NeuronOptions
from .layers import layer_name


class RecordsPotential(nn.Module):
    """record_potential: after each call, `self.potential` holds the pre-reset potential
    trace h [T, B, ...] (x's dtype) with its graph, for membrane-potential losses and plots;
    the module still returns only the spikes. False: `self.potential` stays None."""

    def __init__(self, record_potential: bool = False):
        super().__init__()
        self.record_potential = bool(record_potential)
        self.potential: torch.Tensor | None = None  # h of the last call (record_potential)

    def call_neuron(self, function, x, **kwargs):
        """function(x, **kwargs) (a spikefuse.functional neuron); with record_potential it
        is asked for h too, which is kept in self.potential and left out of the return."""
        if not self.record_potential:
            return function(x, **kwargs)
        spikes, self.potential, *state = function(x, return_potential=True, **kwargs)
        return (spikes, *state) if state else spikes


def check_rank(module: nn.Module, x, function: str) -> None:
    """Refuse input of fewer than 3 dims (ValueError naming the module and `function`, the
    spikefuse.functional form that takes any [T, *])."""
    if isinstance(x, torch.Tensor) and x.dim() < 3:
        hint = ("a 2-D input is ambiguous: [T, B] or [B, N]? for one neuron per sample pass x.unsqueeze(-1); "
                if x.dim() == 2 else "")
        raise ValueError(f"{layer_name(module)}: expected time-major input [T, B, ...] with at least one feature "
                         f"dim (3 or more dims), got shape {tuple(x.shape)} ({hint}spikefuse.functional.{function} "
                         f"takes any [T, *])")


class CarriesState:
    """The state of a neuron module carried from call to call (a mixin for RecordsPotential
    subclasses). `stateful=True`: the final state of a call (its functional form's
    return_state) is the initial state of the next, kept in the attributes STATE names (LIF:
    v; ALIF: v, a; CUBA: v, i); `detach_state` detaches it (truncated BPTT, one call long)
    or keeps its graph (full BPTT over the calls). spikefuse.nn.reset and
    spikefuse.nn.detach_state reach it through reset_state() and detach_state_()."""

    STATE: tuple[str, ...] = ("v",)

    def init_state(self, stateful: bool, detach_state: bool) -> None:
        self.stateful, self.detach_state = bool(stateful), bool(detach_state)
        self.reset_state()

    def call_stateful(self, function, x, initial: str, **kwargs):
        """function(x, **kwargs) through call_neuron; with stateful=True from the carried
        state, passed as the keyword `initial` (lif's v0: a tensor; alif's and cuba's state0:
        a pair), and keeping the final one."""
        if not self.stateful:
            return self.call_neuron(function, x, **kwargs)
        if isinstance(x, torch.Tensor):
            self._check_state(x)
        carried = tuple(getattr(self, name) for name in self.STATE)
        spikes, final = self.call_neuron(function, x, return_state=True,
                                         **{initial: carried if len(carried) > 1 else carried[0]}, **kwargs)
        for name, tensor in zip(self.STATE, final if len(self.STATE) > 1 else (final,)):
            setattr(self, name, tensor.detach() if self.detach_state else tensor)
        return spikes

    def _check_state(self, x):
        state = getattr(self, self.STATE[0])  # every state tensor has one step's shape
        if state is None:
            return
        if state.shape != x.shape[1:]:
            raise ValueError(
                f"{layer_name(self)}: the carried state has shape {tuple(state.shape)} (one step of the "
                f"previous input), so expected input [T, {', '.join(map(str, state.shape))}], got shape "
                f"{tuple(x.shape)}; the batch size or feature shape changed between calls of a stateful "
                f"neuron: call spikefuse.nn.reset(model) before a new sequence or batch")
        if state.device != x.device:
            raise ValueError(f"{layer_name(self)}: the carried state is on {state.device} but the input "
                             f"is on {x.device}; call spikefuse.nn.reset(model) after moving the model")

    def reset_state(self):
        """Forget the carried state: the next call starts from zeros."""
        for name in self.STATE:
            setattr(self, name, None)

    def detach_state_(self):
        """Keep the carried state's values but cut its graph (truncated BPTT)."""
        for name in self.STATE:
            tensor = getattr(self, name)
            if tensor is not None:
                setattr(self, name, tensor.detach())

    def state_repr(self) -> str:
        return f", stateful=True, detach_state={self.detach_state}" if self.stateful else ""


def option_property(name: str, read: str | None = None) -> property:
    """A module attribute kept in `self.options` (a frozen spikefuse.NeuronOptions): reading
    gives the option (or the options' attribute `read`); setting rebuilds the options, so a
    bad value is refused there, with the message the functional form gives."""
    def get(self):
        return getattr(self.options, read or name)

    def set_(self, value):
        self.options = dataclasses.replace(self.options, **{name: value})
    return property(get, set_, doc=f"The neuron option {name} (kept in self.options).")


class SharedOptions(RecordsPotential):
    """A neuron module whose shared options (threshold, reset, v_reset, detach_reset,
    surrogate, alpha; the recurrent neurons' grad_threshold) live in one NeuronOptions,
    `self.options`, checked at construction; the attributes of those names read (and set) it.
    `self.backend` is the functional form's backend."""

    threshold = option_property("threshold")
    reset = option_property("reset")
    v_reset = option_property("v_reset")
    detach_reset = option_property("detach_reset")
    surrogate = option_property("surrogate")
    alpha = option_property("alpha")

    def __init__(self, threshold, reset, v_reset, detach_reset, surrogate, alpha, backend,
                 record_potential=False, grad_threshold=float("-inf")):
        super().__init__(record_potential)
        # these neurons' kernels take a surrogate by name (callable_surrogate=False)
        self.options = NeuronOptions(threshold, reset, v_reset, detach_reset, surrogate, alpha, grad_threshold,
                                     callable_surrogate=False)
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        self.backend = backend

    def check_rank(self, x: torch.Tensor, function: str) -> None:
        check_rank(self, x, function)

    def keywords(self) -> dict:
        """The keyword arguments every functional neuron takes: the options and the backend."""
        return dict(self.options.keywords(), backend=self.backend)

    def options_repr(self) -> str:
        """threshold, reset and surrogate, then the options that differ from their defaults."""
        text = f"threshold={self.threshold}, reset={self.reset!r}, surrogate={self.surrogate!r}"
        if self.reset == "hard" and self.v_reset != 0.0:
            text += f", v_reset={self.v_reset}"
        if self.detach_reset:
            text += ", detach_reset=True"
        if self.alpha is not None:
            text += f", alpha={self.alpha}"
        if self.backend != "auto":
            text += f", backend={self.backend!r}"
        return text


class RecurrentNeuron(SharedOptions):
    """SharedOptions for the recurrent neurons, with what they share: `weight` [features,
    features], from the layer's own spikes of the step before to its input (initialised as
    nn.Linear's: uniform in +-1/sqrt(features)), and the check that an input has `features`
    in its last dim."""

    def __init__(self, features, threshold, reset, v_reset, detach_reset, surrogate, alpha, backend,
                 record_potential, grad_threshold=float("-inf"), device=None, dtype=None):
        super().__init__(threshold, reset, v_reset, detach_reset, surrogate, alpha, backend, record_potential,
                         grad_threshold)
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ValueError(f"features must be a positive int, got {features!r}")
        self.features = features
        self.weight = nn.Parameter(torch.empty(features, features, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1 / math.sqrt(self.features)
        nn.init.uniform_(self.weight, -bound, bound)

    def check_input(self, x: torch.Tensor, function: str) -> None:
        """check_rank, then x's last dim against `features` (ValueError naming the layer)."""
        self.check_rank(x, function)
        if x.shape[-1] != self.features:
            raise ValueError(f"{layer_name(self)}: expected {self.features} features in x's last dim, "
                             f"got shape {tuple(x.shape)}")


class RecurrentOptions(RecurrentNeuron):
    """A recurrent neuron with a sparse backward's cut: grad_threshold, read and set as an option."""

    grad_threshold = option_property("grad_threshold")
