"""Spiking neuron modules: they hold parameters (and, when streaming, the state);
the dynamics live in spikefuse.functional.
`grad_threshold` (sparse backward, see spikefuse.functional.lif) zeroes the surrogate
gradient where the potential is below it; -inf (the default) cuts nothing. `grad_scope`
("step", "sequence" or "batch") says what the cut decides on, as in spikefuse.functional.lif.

Input is time-major [T, B, ...] with at least one feature dim (3 or more dims). A 2-D
input is refused: [T, B] and [B, N] look alike; for one neuron per sample pass
x.unsqueeze(-1), or call spikefuse.functional.lif, which takes any [T, *].

State (`stateful=True`). The membrane potential after the last step, v[T-1], is kept
in `module.v` and is the initial potential v0 of the next call, so a long sequence fed
in chunks gives exactly the spikes of one call over the whole sequence. Rules:
  - The state is shaped like one step of the input, x.shape[1:]. A call whose step has
    another shape (a new batch size, say) raises ValueError: the state is never dropped
    silently. Call `spikefuse.nn.reset(model)` between independent sequences (or batches);
    it calls `reset_state()` on every module of the model that has one.
  - `detach_state=True` (the default, and the behaviour before the option existed):
    the carried v is detached, so backward stops at the start of each call (truncated
    backpropagation through time, one chunk long).
    `detach_state=False`: v keeps its graph, so a loss on a later chunk backpropagates
    into the earlier calls (full BPTT over the chunks: the gradients equal those of one
    call over the concatenated input). The earlier graphs must still exist when backward
    runs (one backward over the summed losses, or retain_graph=True), and memory grows
    with every call until `spikefuse.nn.reset(model)` or `spikefuse.nn.detach_state(model)`
    (keeps the values, cuts the graph: truncate where you choose).
  - `stateful=False` (the default): every call starts from v0 = 0 and nothing is kept.
ALIF and CUBA carry their state (v, a) / (v, i) by the same rules (the code is shared:
spikefuse.nn.neuron_base.CarriesState).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .. import functional as F
from ..neuron_options import NeuronOptions
from ..surrogates import surrogate_name
from .neuron_base import CarriesState, RecordsPotential, check_rank, option_property


def reset(model: nn.Module) -> nn.Module:
    """Reset the state of every stateful module in `model` (itself included, nested at any
    depth): calls `reset_state()` on each module that has one (spikefuse.nn.LIF, IF, PLIF,
    ALIF, CUBA, or your own module following the same protocol). Call it between independent
    sequences, and before a batch of another size. Returns `model`."""
    for module in model.modules():
        method = getattr(module, "reset_state", None)
        if callable(method):
            method()
    return model


def detach_state(model: nn.Module) -> nn.Module:
    """Cut the autograd graph behind the carried state of every stateful module in `model`,
    keeping its values: truncated BPTT for neurons built with detach_state=False (calls
    `detach_state_()` on each module that has one). Returns `model`."""
    for module in model.modules():
        method = getattr(module, "detach_state_", None)
        if callable(method):
            method()
    return model


class LIF(RecordsPotential, CarriesState):
    """Leaky integrate-and-fire: h = decay*v + x, fire at h >= threshold, then reset.

    x [T, B, ...] (3 or more dims) -> spikes of x's shape.
    stateful: keep v[T-1] in `self.v` as the next call's initial potential (see the
        module docstring); False: every call starts from zero.
    detach_state: with stateful=True, detach the carried v (True, the default: backward
        stops at each call's start, as before this option existed) or keep its graph
        across calls (False: full BPTT over the chunks; truncating is the caller's job,
        with spikefuse.nn.detach_state(model) or spikefuse.nn.reset(model)).
    surrogate: a name (see spikefuse.surrogates) or a callable sg(u) -> tensor of u's
        shape, ds/du for u = h - threshold (alpha is then ignored; see spikefuse.functional.lif).
    learn_threshold: make the threshold an nn.Parameter (`self.threshold`, initialised to
        `threshold`) that gets a gradient; threshold_channels=C learns one per channel (dim 2
        of the input), None one for the layer. It runs fused where a float threshold would
        (its gradient from the backward kernel; see spikefuse.functional.lif).
    record_potential: after each call, `self.potential` holds the pre-reset potential trace
        h [T, B, ...] (x's dtype) with its graph, for membrane-potential losses and plots;
        the module still returns only the spikes. False: `self.potential` stays None.
        (spikefuse.nn.neuron_base.RecordsPotential, shared with ALIF and CUBA.)
    """

    # kept in self.options (a NeuronOptions); the threshold is a plain attribute (it may be a Parameter)
    reset = option_property("reset")
    v_reset = option_property("v_reset")
    detach_reset = option_property("detach_reset")
    surrogate = option_property("surrogate")
    alpha = option_property("alpha")
    grad_threshold = option_property("grad_threshold")
    grad_scope = option_property("grad_scope")

    def __init__(self, decay: float = 0.5, threshold: float = 1.0, reset: str = "hard",
                 v_reset: float = 0.0, detach_reset: bool = False, surrogate="rectangular",
                 alpha: float | None = None, stateful: bool = False, backend: str = "auto",
                 grad_threshold: float = float("-inf"), detach_state: bool = True,
                 learn_threshold: bool = False, threshold_channels: int | None = None,
                 record_potential: bool = False, grad_scope: str = "step"):
        super().__init__(record_potential)
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        if not isinstance(decay, torch.Tensor):
            F._check_decay(decay, None)
        self.decay = decay
        # a number, or a tensor (learned: an nn.Parameter, a state_dict entry): passed to F.lif as it is
        self.threshold = self._make_threshold(threshold, learn_threshold, threshold_channels)
        # the float threshold is checked here too; a tensor one is F.lif's own argument
        self.options = NeuronOptions(1.0 if isinstance(self.threshold, torch.Tensor) else self.threshold, reset,
                                     v_reset, detach_reset, surrogate, alpha, grad_threshold, grad_scope)
        self.backend = backend
        self.init_state(stateful, detach_state)  # self.v: the carried v[T-1] (stateful only)

    @staticmethod
    def _make_threshold(threshold, learn, channels):
        if channels is not None and not learn:
            raise ValueError("threshold_channels is only meaningful with learn_threshold=True")
        if not learn:
            return threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite number with learn_threshold=True, got {threshold!r}")
        if channels is not None and (isinstance(channels, bool) or not isinstance(channels, int) or channels < 1):
            raise ValueError(f"threshold_channels must be a positive int or None, got {channels!r}")
        return nn.Parameter(torch.full(() if channels is None else (channels,), float(threshold)))

    def _threshold_repr(self):
        t = self.threshold
        if isinstance(t, torch.Tensor):  # a Parameter is learned; a buffer is fixed (e.g. loaded from NIR)
            return f"{'learned' if isinstance(t, nn.Parameter) else 'tensor'}{list(t.shape)}"
        return f"{t}"

    def decay_value(self):
        return self.decay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_rank(self, x, "lif")
        options = dict(self.options.keywords(), decay=self.decay_value(), threshold=self.threshold,
                       backend=self.backend, grad_threshold=self.grad_threshold, grad_scope=self.grad_scope)
        return self.call_stateful(F.lif, x, "v0", **options)

    def extra_repr(self):
        return (f"decay={self.decay}, threshold={self._threshold_repr()}, reset={self.reset!r}, "
                f"surrogate={self._surrogate_repr()}{self._options_repr()}")

    def _surrogate_repr(self):
        """The name in quotes, or a callable's name (no quotes)."""
        if isinstance(self.surrogate, str):
            return repr(self.surrogate)
        return surrogate_name(self.surrogate)

    def _options_repr(self):
        text = f", grad_threshold={self.grad_threshold}" if self.grad_threshold > float("-inf") else ""
        text += f", grad_scope={self.grad_scope!r}" if self.grad_scope != "step" else ""
        return text + self.state_repr()


class IF(LIF):
    """Integrate-and-fire: LIF with decay = 1."""

    def __init__(self, threshold: float = 1.0, **kwargs):
        super().__init__(decay=1.0, threshold=threshold, **kwargs)

    def extra_repr(self):
        return (f"threshold={self._threshold_repr()}, reset={self.reset!r}, surrogate={self._surrogate_repr()}"
                f"{self._options_repr()}")


class PLIF(LIF):
    """Parametric LIF (Fang et al. 2021): decay = sigmoid(w) is learned, so it stays in (0, 1).

    channels=None learns one decay for the layer; channels=C learns one per channel
    (dim 2 of the [T, B, C, ...] input).
    """

    def __init__(self, init_decay: float = 0.5, channels: int | None = None, **kwargs):
        if not 0.0 < init_decay < 1.0:
            raise ValueError(f"init_decay must lie strictly between 0 and 1, got {init_decay}")
        super().__init__(decay=init_decay, **kwargs)
        shape = () if channels is None else (channels,)
        self.w = nn.Parameter(torch.full(shape, math.log(init_decay / (1 - init_decay))))
        self.channels = channels

    def decay_value(self):
        return torch.sigmoid(self.w)

    def extra_repr(self):
        return (f"channels={self.channels}, threshold={self._threshold_repr()}, reset={self.reset!r}, "
                f"surrogate={self._surrogate_repr()}{self._options_repr()}")
