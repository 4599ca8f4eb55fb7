"""Current-based synaptic LIF module (CUBA; snnTorch `Synaptic`, Norse's LIF with a
synaptic current); the dynamics live in spikefuse.functional.cuba."""
from __future__ import annotations

import torch

from .. import functional as F
from ..neuron_options import check_number
from .neuron_base import CarriesState, SharedOptions


class CUBA(SharedOptions, CarriesState):
    """Synaptic LIF: i = syn_decay*i + x, h = decay*v + i, fire at h >= threshold, reset v.

    x [T, B, ...] (3 or more dims) -> spikes of x's shape. backend: "auto", "fused" or
    "reference" (see spikefuse.functional.cuba).
    stateful: keep the final (v, i) in `self.v`, `self.i` as the next call's initial state
        (False, the default: every call starts from v = i = 0); detach_state: detach it
        (True, the default) or keep its graph across calls. As spikefuse.nn.LIF's, with
        spikefuse.nn.reset(model) and spikefuse.nn.detach_state(model).
    record_potential: keep each call's trace of the membrane's pre-reset potential h (not the
    current i) in `self.potential` (as spikefuse.nn.LIF).
    """
    STATE = ("v", "i")

    def __init__(self, decay: float = 0.5, syn_decay: float = 0.5, threshold: float = 1.0,
                 reset: str = "hard", v_reset: float = 0.0, detach_reset: bool = False,
                 surrogate: str = "rectangular", alpha: float | None = None,
                 backend: str = "auto", record_potential: bool = False, stateful: bool = False,
                 detach_state: bool = True):
        super().__init__(threshold, reset, v_reset, detach_reset, surrogate, alpha, backend, record_potential)
        self.init_state(stateful, detach_state)
        self.decay = check_number("decay", decay, low_open=0.0, high=1.0)
        self.syn_decay = check_number("syn_decay", syn_decay, low=0.0, high=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_rank(x, "cuba")
        return self.call_stateful(F.cuba, x, "state0", decay=self.decay, syn_decay=self.syn_decay,
                                  **self.keywords())

    def extra_repr(self):
        return f"decay={self.decay}, syn_decay={self.syn_decay}, " + self.options_repr() + self.state_repr()
