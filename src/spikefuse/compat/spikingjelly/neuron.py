"""SpikingJelly 2.0's `LIFNode` and `IFNode` on spikefuse.functional.lif (the package
docstring says what maps and how exactly)."""
from __future__ import annotations

import torch
from torch import nn

from ... import functional as F
from ...neuron_options import check_number
from .surrogate import Sigmoid, surrogate_of

__all__ = ["LIFNode", "IFNode"]

STEP_MODES = ("s", "m")
# SpikingJelly 0.0.0.0.14's backends: accepted for old code, spikefuse chooses its own ("auto")
OLD_BACKENDS = ("torch", "cupy", "triton")


class _Node(nn.Module):
    """What LIFNode and IFNode share: SpikingJelly's arguments, the potential `v` kept on the
    module between calls (SpikingJelly's memory: no state_dict entry), `v_seq`, the step modes,
    reset() and detach()."""

    def __init__(self, v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, backend):
        super().__init__()
        self.v_threshold = check_number("v_threshold", v_threshold)
        self.v_reset = None if v_reset is None else check_number("v_reset", v_reset)
        surrogate_of(surrogate_function)  # refused here, not at the first call
        self.surrogate_function = Sigmoid() if surrogate_function is None else surrogate_function
        if not isinstance(detach_reset, bool):
            raise ValueError(f"detach_reset must be a bool, got {detach_reset!r}")
        self.detach_reset = detach_reset
        self.step_mode = step_mode
        if backend not in F.BACKENDS + OLD_BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)} (spikefuse's) or "
                             f"{list(OLD_BACKENDS)} (SpikingJelly's, taken as 'auto')")
        self.backend = "auto" if backend in OLD_BACKENDS else backend
        self.store_v_seq = store_v_seq
        self.reset()

    @property
    def step_mode(self) -> str:
        return self._step_mode

    @step_mode.setter
    def step_mode(self, value):
        if value not in STEP_MODES:
            raise ValueError(f"step_mode must be 's' (one step a call) or 'm' (x of [T, N, ...]), got {value!r}")
        self._step_mode = value

    @property
    def store_v_seq(self) -> bool:
        return self._store_v_seq

    @store_v_seq.setter
    def store_v_seq(self, value):
        self._store_v_seq = bool(value)
        self.v_seq = None

    def reset(self):
        """SpikingJelly's reset: v back to v_reset (0 for the soft reset), v_seq cleared."""
        self.v = 0.0 if self.v_reset is None else self.v_reset
        self.v_seq = None

    def detach(self):
        """Keep v's (and v_seq's) values, cut their graph (SpikingJelly's detach, for TBPTT)."""
        if isinstance(self.v, torch.Tensor):
            self.v = self.v.detach()
        if isinstance(self.v_seq, torch.Tensor):
            self.v_seq = self.v_seq.detach()

    # spikefuse.nn.reset(model) / detach_state(model) reach these modules too
    def reset_state(self):
        self.reset()

    def detach_state_(self):
        self.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        return self.single_step_forward(x) if self.step_mode == "s" else self.multi_step_forward(x)

    def single_step_forward(self, x: torch.Tensor) -> torch.Tensor:
        """One step, x [N, ...]: the spikes, v kept (and appended to v_seq with store_v_seq)."""
        spikes, v_seq = self._run(x.unsqueeze(0), self.store_v_seq)
        if self.store_v_seq:  # SpikingJelly restarts the record when a step's shape, dtype or device changes
            same = isinstance(self.v_seq, torch.Tensor) and self.v_seq.shape[1:] == x.shape and \
                self.v_seq.dtype == v_seq.dtype and self.v_seq.device == v_seq.device
            self.v_seq = torch.cat((self.v_seq, v_seq)) if same else v_seq
        return spikes[0]

    def multi_step_forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        """All T steps of x_seq [T, N, ...] in one call (one fused kernel on CUDA): the spikes,
        v after the last step kept, v_seq [T, N, ...] with store_v_seq."""
        if x_seq.dim() < 1 or x_seq.shape[0] == 0:
            raise ValueError(f"x_seq must be [T, N, ...] with T >= 1 in step_mode 'm', got shape {tuple(x_seq.shape)}")
        spikes, self.v_seq = self._run(x_seq, self.store_v_seq)
        return spikes

    def _v0(self, step: torch.Tensor) -> torch.Tensor:
        """SpikingJelly's starting potential for a step like `step`: the kept v, or v_reset (0
        for the soft reset) when there is none or it has another shape."""
        v = self.v
        if isinstance(v, torch.Tensor) and v.shape == step.shape:
            return v.to(dtype=step.dtype, device=step.device)
        return torch.full_like(step, 0.0 if self.v_reset is None else self.v_reset)

    def _run(self, x: torch.Tensor, want_seq: bool):
        """Spikes for x [T, ...] from the kept v; v becomes the last step's. Also SpikingJelly's
        post-reset potential record when want_seq, else None."""
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
        v_reset = 0.0 if self.v_reset is None else self.v_reset
        decay, x_in = self._charge(x, v_reset)
        surrogate, alpha = surrogate_of(self.surrogate_function)
        spikes, h, self.v = F.lif(x_in, decay=decay, threshold=self.v_threshold,
                                  reset="soft" if self.v_reset is None else "hard", v_reset=v_reset,
                                  detach_reset=self.detach_reset, surrogate=surrogate, alpha=alpha, v0=self._v0(x[0]),
                                  return_state=True, return_potential=True, backend=self.backend)
        if not want_seq:
            return spikes, None
        s = spikes.detach() if self.detach_reset else spikes
        # SpikingJelly's reset written out on h: the same values as the kernels' v, and its gradient
        v_seq = h - s * self.v_threshold if self.v_reset is None else s * v_reset + (1.0 - s) * h
        return spikes, v_seq

    def _charge(self, x: torch.Tensor, v_reset: float):
        """(decay, input) such that h = decay * v + input is the node's charge."""
        raise NotImplementedError

    def extra_repr(self):
        surrogate, alpha = surrogate_of(self.surrogate_function)
        return (f"v_threshold={self.v_threshold}, v_reset={self.v_reset}, detach_reset={self.detach_reset}, "
                f"step_mode={self.step_mode}, surrogate={surrogate!r} (alpha {alpha:g}), backend={self.backend!r}")


class LIFNode(_Node):
    """SpikingJelly 2.0's `LIFNode`: its arguments, step modes, state and results, on
    spikefuse.functional.lif (see the package docstring for what is exact).

        H = V + (X - (V - V_reset)) / tau     (decay_input=True, the default)
        H = V - (V - V_reset) / tau + X       (decay_input=False)

    fire at H >= v_threshold, then V = v_reset where fired (v_reset=None: V = H - v_threshold)."""

    def __init__(self, tau=2.0, decay_input=True, v_threshold=1.0, v_reset=0.0, surrogate_function=None,
                 detach_reset=False, step_mode="s", store_v_seq=False, *, backend="auto"):
        tau = check_number("tau", tau, low_open=1.0)
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, backend)
        self.tau, self.decay_input = tau, bool(decay_input)

    def _charge(self, x, v_reset):
        # h = (1 - 1/tau) v + (x + v_reset)/tau, or + x + v_reset/tau: spikefuse's h = decay * v + input
        if self.decay_input:
            return 1.0 - 1.0 / self.tau, (x if v_reset == 0.0 else x + v_reset) / self.tau
        return 1.0 - 1.0 / self.tau, x if v_reset == 0.0 else x + v_reset / self.tau

    def extra_repr(self):
        return super().extra_repr() + f", tau={self.tau}, decay_input={self.decay_input}"


class IFNode(_Node):
    """SpikingJelly 2.0's `IFNode` (H = V + X, fire at H >= v_threshold, hard or soft reset) on
    spikefuse.functional.lif with decay 1: SpikingJelly's values bit for bit."""

    def __init__(self, v_threshold=1.0, v_reset=0.0, surrogate_function=None, detach_reset=False, step_mode="s",
                 store_v_seq=False, *, backend="auto"):
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, backend)

    def _charge(self, x, v_reset):
        return 1.0, x
