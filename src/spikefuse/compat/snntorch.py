"""snnTorch's `Leaky` and `Synaptic` with snnTorch's own arguments and semantics, on
spikefuse's kernels: port a model by changing one import.

    import snntorch as snn                            # before
    import spikefuse.compat.snntorch as snn           # after: snn.Leaky, snn.Synaptic

Both take snnTorch 1.0's constructor arguments and calling styles:
  - per step, in your Python time loop: `mem = lif.init_leaky()` (or `reset_mem()`), then
    `spk, mem = lif(cur, mem)` each step (`Synaptic`: `syn, mem = lif.init_synaptic()`,
    `spk, syn, mem = lif(cur, syn, mem)`); called without the state, the module's own
    (`lif.mem`, kept from the last call) is used, as in snnTorch;
  - init_hidden=True: the state lives in the module, a call returns `spk` (`spk, mem` with
    output=True; `Synaptic`: `spk, syn, mem`); `reset_mem()` clears it.
  - the whole sequence in one call, spikefuse's own: `spk_rec, mem_rec = lif.sequence(x)`
    for x [T, ...] runs all T steps in one fused kernel (forward and backward) from the
    module's state (or `mem=` / `syn=`, `mem=`), leaving the last step's state in the module.
    This is where spikefuse's speed is: a per-step loop launches a kernel per step.
The results are snnTorch's: spikes bit for bit, `mem` the same float32 values (snnTorch's
`mem` is the potential before the delayed reset: h[t] = beta*mem[t-1] + x[t] - threshold*s[t-1]
under "subtract"), `syn` likewise, and gradients equal up to rounding (snnTorch detaches its
reset; its surrogates atan, fast_sigmoid and sigmoid are spikefuse's of the same name and
parameter, alpha or slope). The state dict has snnTorch's entries (beta, threshold,
graded_spikes_factor, reset_mechanism_val; alpha for Synaptic): a trained snnTorch model's
`load_state_dict` loads. One difference: spikes come in the input's dtype (snnTorch's are
always float32); for float64 input the values are still snnTorch's.

What maps exactly is supported; the rest is refused at construction with a ValueError
naming the argument:
  - reset_mechanism: "subtract" (snnTorch's default) is spikefuse's reset="subtract";
    `Leaky`'s "zero" (the potential zeroed at the next step when mem > threshold) is
    reset="hard" with the threshold moved to the next float up (which fires exactly where
    h > threshold); "none" likewise with reset="none". `Synaptic`'s "zero" (it zeroes the
    whole next membrane value, input included) is no spikefuse reset: refused.
    (With the moved threshold the surrogate is evaluated one float from snnTorch's point:
    gradients differ by about 1e-7 relative.)
  - beta (`Leaky`): a number, a one-value tensor, or a tensor broadcasting to one step of
    the input (one value per neuron); learn_beta=True makes it an nn.Parameter, clamped to
    [0, 1] in forward as snnTorch does. `Synaptic`: alpha and beta numbers or one-value
    tensors, not learned (spikefuse's CUBA takes float decays), beta > 0 after clamping.
  - threshold: a number or a one-value tensor, not learned.
  - spike_grad: None (atan, alpha 2), or snntorch.surrogate.atan(alpha), fast_sigmoid(slope),
    sigmoid(slope). Other surrogates, surrogate_disable=True, inhibition=True,
    learn_threshold=True, state_quant, graded_spikes_factor != 1,
    learn_graded_spikes_factor=True and reset_delay=False are refused.
`backend` (keyword only, spikefuse's) picks spikefuse.functional's backend ("auto", "fused",
"reference"). snnTorch's class-wide `reset_hidden()`/`detach_hidden()` are per module here,
and spikefuse.nn.reset(model) / detach_state(model) reach these modules too.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ._shared import next_up, per_neuron

__all__ = ["Leaky", "Synaptic", "surrogate_of"]

RESETS = ("subtract", "zero", "none")
# snnTorch's surrogate factories -> (spikefuse's surrogate, the factory's parameter); the same formulas
SURROGATES = {"atan": ("atan", "alpha"), "fast_sigmoid": ("fast_sigmoid", "slope"), "sigmoid": ("sigmoid", "slope")}


def surrogate_of(spike_grad) -> tuple[str, float]:
    """spikefuse's (surrogate, alpha) for snnTorch's `spike_grad`: None is snnTorch's default,
    atan at alpha 2; snntorch.surrogate.atan(alpha), fast_sigmoid(slope) and sigmoid(slope)
    are spikefuse's atan, fast_sigmoid and sigmoid with alpha = that parameter (the same
    formulas). Anything else: ValueError naming spike_grad."""
    if spike_grad is None:
        return "atan", 2.0
    qualname = getattr(spike_grad, "__qualname__", "")
    factory = qualname.split(".<locals>.")[0]
    code, closure = getattr(spike_grad, "__code__", None), getattr(spike_grad, "__closure__", None)
    if (getattr(spike_grad, "__module__", "") == "snntorch.surrogate" and qualname == f"{factory}.<locals>.inner"
            and factory in SURROGATES and code is not None and closure):
        name, parameter = SURROGATES[factory]
        cells = dict(zip(code.co_freevars, (cell.cell_contents for cell in closure)))
        if parameter in cells:
            return name, float(cells[parameter])
    raise ValueError(f"spike_grad: spikefuse.compat.snntorch maps None (atan, alpha 2) and snntorch.surrogate's "
                     f"atan, fast_sigmoid and sigmoid onto its kernels, not {spike_grad!r}")


def _refuse(name, value, why):
    raise ValueError(f"{name}={value!r} is not supported by spikefuse.compat.snntorch: {why}")


def _one_value(name, value) -> float:
    """A number or a one-value tensor, as a float (checked finite)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            _refuse(name, f"<tensor of shape {tuple(value.shape)}>", "it takes one value here")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not torch.isfinite(torch.tensor(value)):
        raise ValueError(f"{name} must be a finite number or a one-value tensor, got {value!r}")
    return float(value)


class _SnnTorchNeuron(nn.Module):
    """What Leaky and Synaptic share: the argument checks, snnTorch's buffers, the state."""
    STATE: tuple[str, ...] = ()

    def _common(self, beta, threshold, spike_grad, surrogate_disable, init_hidden, inhibition, learn_threshold,
                reset_mechanism, state_quant, output, graded_spikes_factor, learn_graded_spikes_factor,
                reset_delay, backend):
        if surrogate_disable:
            _refuse("surrogate_disable", surrogate_disable, "the kernels always have a surrogate gradient")
        if inhibition:
            _refuse("inhibition", inhibition, "the kernels have no winner-take-all firing")
        if learn_threshold:
            _refuse("learn_threshold", learn_threshold, "the threshold is a fixed number here")
        if state_quant:
            _refuse("state_quant", state_quant, "the kernels do not quantise the state")
        if learn_graded_spikes_factor or _one_value("graded_spikes_factor", graded_spikes_factor) != 1.0:
            _refuse("graded_spikes_factor", graded_spikes_factor, "spikes are 0 or 1 here (factor 1, not learned)")
        if not reset_delay:
            _refuse("reset_delay", reset_delay, "only snnTorch's default delayed reset (reset_delay=True) maps exactly")
        if reset_mechanism not in RESETS:
            raise ValueError("reset_mechanism must be set to either 'subtract', 'zero', or 'none'.")
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        self.surrogate, self.surrogate_alpha = surrogate_of(spike_grad)
        self.init_hidden, self.output, self.backend = bool(init_hidden), bool(output), backend
        self.reset_mechanism = reset_mechanism
        # snnTorch's buffers (its state_dict entries), so its trained models load
        self.register_buffer("threshold", torch.as_tensor(_one_value("threshold", threshold)
                                                          if not isinstance(threshold, torch.Tensor) else threshold))
        _one_value("threshold", self.threshold)
        self.register_buffer("graded_spikes_factor", torch.as_tensor(1.0))
        self.register_buffer("reset_mechanism_val", torch.as_tensor(RESETS.index(reset_mechanism)))
        for name in self.STATE:
            self.register_buffer(name, torch.zeros(0), False)

    def _threshold(self, dtype) -> float:
        """The threshold the kernels take: snnTorch's `>` is spikefuse's "subtract"; the other
        resets fire at `>=`, so they get the next float up."""
        threshold = self.threshold.item()
        return threshold if self.reset_mechanism == "subtract" else next_up(threshold, dtype)

    def _state(self, given, input_shape, names):
        """snnTorch's rules: a given state replaces the module's (refused with init_hidden);
        a state of another shape than one input step starts from zeros."""
        if self.init_hidden and any(g is not None for g in given):
            raise TypeError(f"{' or '.join(f'`{n}`' for n in names)} should not be passed as an argument while "
                            f"`init_hidden=True`")
        for name, value in zip(names, given):
            if value is not None:
                setattr(self, name, value)
        states = []
        for name in names:
            state = getattr(self, name)
            states.append(state if state.shape == input_shape else torch.zeros(input_shape, dtype=state.dtype,
                                                                               device=state.device))
        return states

    def reset_mem(self):
        """Zero the state (snnTorch's reset_mem): returns it (mem; Synaptic: syn, mem)."""
        for name in self.STATE:
            setattr(self, name, torch.zeros_like(getattr(self, name)))
        states = tuple(getattr(self, name) for name in self.STATE)
        return states[0] if len(states) == 1 else states

    def reset_hidden(self):
        """Zero this module's state (snnTorch's class-wide reset_hidden, for this module)."""
        self.reset_mem()

    def detach_hidden(self):
        """Detach this module's state from the graph, keeping its values (snnTorch's
        detach_hidden, for this module)."""
        for name in self.STATE:  # not detach_(): the kept mem is a view of the call's trace
            setattr(self, name, getattr(self, name).detach())

    # spikefuse.nn.reset(model) / detach_state(model) reach these modules too
    def reset_state(self):
        self.reset_mem()

    def detach_state_(self):
        self.detach_hidden()

    def extra_repr(self):
        return (f"threshold={self.threshold.item()}, reset_mechanism={self.reset_mechanism!r}, "
                f"surrogate={self.surrogate!r} (alpha {self.surrogate_alpha}), init_hidden={self.init_hidden}")


class Leaky(_SnnTorchNeuron):
    """snnTorch's `Leaky` (first-order LIF) on spikefuse.functional.lif: the same arguments,
    calling styles and results (see the module docstring for the subset that maps and the
    `sequence` fast path)."""
    STATE = ("mem",)

    def __init__(self, beta, threshold=1.0, spike_grad=None, surrogate_disable=False, init_hidden=False,
                 inhibition=False, learn_beta=False, learn_threshold=False, reset_mechanism="subtract",
                 state_quant=False, output=False, graded_spikes_factor=1.0, learn_graded_spikes_factor=False,
                 reset_delay=True, *, backend="auto"):
        super().__init__()
        self._common(beta, threshold, spike_grad, surrogate_disable, init_hidden, inhibition, learn_threshold,
                     reset_mechanism, state_quant, output, graded_spikes_factor, learn_graded_spikes_factor,
                     reset_delay, backend)
        beta = beta if isinstance(beta, torch.Tensor) else torch.as_tensor(beta)
        if not beta.is_floating_point():
            beta = beta.float()
        if not torch.isfinite(beta).all():
            raise ValueError(f"beta must be finite, got {beta}")
        if learn_beta:
            self.beta = nn.Parameter(beta)
        else:
            self.register_buffer("beta", beta)

    def init_leaky(self):
        """The zero state (deprecated in snnTorch for reset_mem, kept as it)."""
        return self.reset_mem()

    def forward(self, input_, mem=None):
        """One step: `spk, mem` (init_hidden=True: `spk`; with output=True `spk, mem`)."""
        (mem,) = self._state((mem,), input_.shape, ("mem",))
        spk, h = self._run(input_.unsqueeze(0), mem)
        self.mem = h[0]
        if self.output or not self.init_hidden:
            return spk[0], self.mem
        return spk[0]

    def sequence(self, x, mem=None):
        """All T steps of x [T, ...] in one fused call: (spk_rec, mem_rec), both [T, ...] (the
        stacked per-step outputs). Starts from `mem` (or the module's state, as a per-step call
        does) and leaves the last step's mem in the module."""
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            raise ValueError(f"x must be a tensor [T, ...], got {type(x).__name__}")
        (mem,) = self._state((mem,), x.shape[1:], ("mem",))
        spk, h = self._run(x, mem)
        self.mem = h[-1]
        return spk, h

    def _run(self, x, mem):
        """spikes and snnTorch's mem trace for x [T, *S] from snnTorch's state mem [*S]."""
        threshold, shape = self._threshold(x.dtype), x.shape
        if self.reset_mechanism == "zero":  # snnTorch zeroes the carried mem where it fired (mem > threshold)
            mem = (1 - (mem - self.threshold.item() > 0).to(mem.dtype)) * mem
        beta = self.beta.clamp(0, 1)
        if beta.numel() == 1 and not beta.requires_grad:
            decay = beta.item()
        else:  # a tensor decay: one value per neuron along dim 2, so x goes flat as [T, 1, neurons]
            decay, x, mem = per_neuron(beta, x, mem, "beta")
        reset = {"subtract": "subtract", "zero": "hard", "none": "none"}[self.reset_mechanism]
        spk, h = F.lif(x, decay=decay, threshold=threshold, reset=reset, v_reset=0.0, detach_reset=True,
                       surrogate=self.surrogate, alpha=self.surrogate_alpha, v0=mem, return_potential=True,
                       backend=self.backend)
        return spk.reshape(shape), h.reshape(shape)

    def extra_repr(self):
        beta = self.beta.item() if self.beta.numel() == 1 else f"tensor{list(self.beta.shape)}"
        return f"beta={beta}, " + super().extra_repr()


class Synaptic(_SnnTorchNeuron):
    """snnTorch's `Synaptic` (a synaptic current, then the membrane) on
    spikefuse.functional.cuba: the same arguments, calling styles and results (see the module
    docstring). reset_mechanism "subtract" and "none"; alpha and beta fixed numbers."""
    STATE = ("syn", "mem")

    def __init__(self, alpha, beta, threshold=1.0, spike_grad=None, surrogate_disable=False, init_hidden=False,
                 inhibition=False, learn_alpha=False, learn_beta=False, learn_threshold=False,
                 reset_mechanism="subtract", state_quant=False, output=False, reset_delay=True, *, backend="auto"):
        super().__init__()
        self._common(beta, threshold, spike_grad, surrogate_disable, init_hidden, inhibition, learn_threshold,
                     reset_mechanism, state_quant, output, 1.0, False, reset_delay, backend)
        if reset_mechanism == "zero":
            _refuse("reset_mechanism", reset_mechanism, "Synaptic's zero reset zeroes the whole next membrane value "
                    "(input included), which no spikefuse reset computes; use 'subtract' or 'none'")
        for name, learn in (("learn_alpha", learn_alpha), ("learn_beta", learn_beta)):
            if learn:
                _refuse(name, learn, "spikefuse's CUBA takes fixed float decays")
        for name, value in (("alpha", alpha), ("beta", beta)):
            self.register_buffer(name, torch.as_tensor(_one_value(name, value)) if not isinstance(value, torch.Tensor)
                                 else value)
            _one_value(name, getattr(self, name))
        if self.beta.clamp(0, 1).item() == 0:
            _refuse("beta", beta, "spikefuse's CUBA needs a membrane decay in (0, 1] (after snnTorch's clamp)")

    def init_synaptic(self):
        """The zero state (syn, mem) (deprecated in snnTorch for reset_mem, kept as it)."""
        return self.reset_mem()

    def forward(self, input_, syn=None, mem=None):
        """One step: `spk, syn, mem` (init_hidden=True: `spk`; with output=True `spk, syn, mem`)."""
        syn, mem = self._state((syn, mem), input_.shape, ("syn", "mem"))
        spk, syn, h = self._run(input_.unsqueeze(0), syn, mem)
        self.syn, self.mem = syn, h[0]
        if self.output or not self.init_hidden:
            return spk[0], self.syn, self.mem
        return spk[0]

    def sequence(self, x, syn=None, mem=None):
        """All T steps of x [T, ...] in one fused call: (spk_rec, mem_rec), both [T, ...]. Starts
        from (`syn`, `mem`) or the module's state and leaves the last step's syn and mem in the
        module (`self.syn`, `self.mem`)."""
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            raise ValueError(f"x must be a tensor [T, ...], got {type(x).__name__}")
        syn, mem = self._state((syn, mem), x.shape[1:], ("syn", "mem"))
        spk, self.syn, h = self._run(x, syn, mem)
        self.mem = h[-1]
        return spk, h

    def _run(self, x, syn, mem):
        """spikes, the last syn and snnTorch's mem trace for x [T, *S] from (syn, mem)."""
        reset = "subtract" if self.reset_mechanism == "subtract" else "none"
        spk, h, (_, syn) = F.cuba(x, decay=self.beta.clamp(0, 1).item(), syn_decay=self.alpha.clamp(0, 1).item(),
                                  threshold=self._threshold(x.dtype), reset=reset, detach_reset=True,
                                  surrogate=self.surrogate, alpha=self.surrogate_alpha, return_state=True,
                                  return_potential=True, state0=(mem, syn), backend=self.backend)
        return spk, syn, h

    def extra_repr(self):
        return f"alpha={self.alpha.item()}, beta={self.beta.item()}, " + super().extra_repr()
