"""The same LIF (decay 0.5, threshold 1, hard reset to 0, no detach) in each peer library.

Each adapter builds its module once (reused across calls, as a user would) and returns a
function x [T, B, N] -> spikes [T, B, N]; `available()` lists those importable here.
The benchmark cross-checks every adapter's spikes against spikefuse before timing it.
"""
from __future__ import annotations

import torch

DECAY, THRESHOLD = 0.5, 1.0


def spikefuse_lif():
    import spikefuse.functional as F
    return lambda x: F.lif(x, decay=DECAY, threshold=THRESHOLD, reset="hard")


def pytorch_loop():
    """The plain PyTorch loop: spikefuse's step-by-step reference with autograd."""
    from spikefuse import reference
    return lambda x: reference.lif(x, DECAY, THRESHOLD, "hard")


def snntorch_leaky():
    import snntorch
    # reset_delay=False: the reset happens in the step that fires, as in our equations
    neuron = snntorch.Leaky(beta=DECAY, threshold=THRESHOLD, reset_mechanism="zero",
                            reset_delay=False, init_hidden=False)

    def run(x):
        mem = torch.zeros_like(x[0])
        out = []
        for t in range(x.shape[0]):
            spk, mem = neuron(x[t], mem)
            out.append(spk)
        return torch.stack(out)
    return run


def norse_lif_box():
    # Norse's box LIF integrates dv = dt/tau (v_leak - v + i); with dt/tau = 0.5 and
    # i = 2x this is h = 0.5 v + x (rounding may differ in the last bit)
    from norse.torch import LIFBoxCell, LIFBoxParameters
    p = LIFBoxParameters(tau_mem_inv=torch.as_tensor(0.5), v_leak=torch.as_tensor(0.0),
                         v_th=torch.as_tensor(THRESHOLD), v_reset=torch.as_tensor(0.0))
    cell = LIFBoxCell(p, dt=1.0)

    def run(x):
        state, out = None, []
        for t in range(x.shape[0]):
            z, state = cell(2 * x[t], state)
            out.append(z)
        return torch.stack(out)
    return run


def spikingjelly_lif():
    from spikingjelly.activation_based import neuron
    # decay = 1 - 1/tau = 0.5 with decay_input=False: h = 0.5 v + x
    node = neuron.LIFNode(tau=2.0, decay_input=False, v_threshold=THRESHOLD, v_reset=0.0,
                          step_mode="m")
    if torch.cuda.is_available():
        node = node.cuda()

    def run(x):
        node.reset()  # the module keeps v between calls: each call is a new sequence
        return node(x)
    return run


ADAPTERS = {
    "spikefuse": spikefuse_lif,
    "pytorch-loop": pytorch_loop,
    "snntorch": snntorch_leaky,
    "norse": norse_lif_box,
    "spikingjelly": spikingjelly_lif,
}


def available() -> dict:
    """name -> run function, for every library that imports."""
    found = {}
    for name, make in ADAPTERS.items():
        try:
            found[name] = make()
        except ImportError:
            pass
    return found
