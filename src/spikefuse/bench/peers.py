"""The same LIF (decay 0.5, threshold 1, hard reset to 0, no detach) in each peer library.

Each adapter builds its module once (reused across calls, as a user would) and returns a
function x [T, B, N] -> spikes [T, B, N]; `available()` lists those importable here.
The benchmark cross-checks every adapter's spikes against spikefuse before timing it.
`LAYERS` (for `bench on`): the same neuron behind a Linear(N, N), one surrogate for all, so
that gradients compare as well as spikes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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


# ---- Linear(N, N) + LIF, as a user of each library writes it (`spikefuse bench on`) ----
# Every layer gets the same weight, fires at h >= 1 (snnTorch and Norse at h > 1: they differ
# only where h is exactly 1), resets to 0 in the step that fires without detaching the reset,
# and uses one surrogate, SuperSpike ds/dh = 1/(|h - 1| + 1)^2, so gradients compare too.

@dataclass
class Layer:
    """One library's Linear + LIF: run(x [T, B, N]) -> spikes [T, B, N]; `weight` is its
    Linear's weight (gradients are taken with respect to it); `backend()` names the neuron
    implementation that ran, where the library picks one (call it after a run)."""
    run: Callable[[torch.Tensor], torch.Tensor]
    weight: torch.nn.Parameter
    backend: Callable[[], str] = lambda: "-"


def _linear(weight):
    """torch.nn.Linear(N, N, bias=False) holding a copy of `weight` (no random init: N may be 16k)."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = torch.nn.Parameter(weight.detach().clone())
    return linear


def spikefuse_layer(weight):
    import spikefuse.nn as snn
    linear = _linear(weight)
    model = torch.nn.Sequential(linear, snn.LIF(decay=DECAY, threshold=THRESHOLD, reset="hard",
                                                surrogate="fast_sigmoid", alpha=1.0))
    return Layer(model, linear.weight, lambda: "fused Triton kernels" if weight.is_cuda
                 else "CPU path of spikefuse.functional.lif (backend='auto')")


def pytorch_loop_layer(weight):
    """The plain PyTorch loop: spikefuse's step-by-step reference with autograd."""
    from spikefuse import reference
    linear = _linear(weight)
    return Layer(lambda x: reference.lif(linear(x), DECAY, THRESHOLD, "hard", surrogate="fast_sigmoid",
                                         alpha=1.0), linear.weight)


def snntorch_layer(weight):
    import snntorch
    from snntorch import surrogate
    linear = _linear(weight)
    # reset_delay=False: the reset happens in the step that fires, as in our equations
    neuron = snntorch.Leaky(beta=DECAY, threshold=THRESHOLD, spike_grad=surrogate.fast_sigmoid(slope=1),
                            reset_mechanism="zero", reset_delay=False).to(weight.device)

    def run(x):
        y = linear(x)
        mem, out = torch.zeros_like(y[0]), []
        for yt in y:
            spk, mem = neuron(yt, mem)
            out.append(spk)
        return torch.stack(out)
    return Layer(run, linear.weight)


def norse_layer(weight):
    """Norse's multi-step LIF (norse.torch.LIF over the whole sequence, not the one-step cell).
    It is current-based: i += input; v += dt tau_mem_inv (v_leak - v + i); i -= dt tau_syn_inv i.
    With dt = 1, tau_syn_inv = 1 (the current empties every step), tau_mem_inv = 1 - decay and
    the input y / (1 - decay): v = decay v + y. Its "super" backward is 1/(|u| + 1)^2."""
    from norse.torch import LIF, LIFParameters
    keep = 1 - DECAY
    params = LIFParameters(tau_syn_inv=torch.as_tensor(1.0), tau_mem_inv=torch.as_tensor(keep),
                           v_leak=torch.as_tensor(0.0), v_th=torch.as_tensor(THRESHOLD),
                           v_reset=torch.as_tensor(0.0), method="super", alpha=torch.as_tensor(1.0))
    linear, lif = _linear(weight), LIF(params, dt=1.0)
    return Layer(lambda x: lif(linear(x) / keep)[0], linear.weight)


class _SinabsHardReset:
    """v = v (1 - s): sinabs's own MembraneReset masks with (s == 0), a detached reset."""

    def __call__(self, spikes, state, spike_threshold):
        return {**state, "v_mem": state["v_mem"] * (1 - spikes)}


class _SinabsSuperSpike:
    def __call__(self, v_mem, spike_threshold):
        return 1 / ((v_mem - spike_threshold).abs() + 1) ** 2


def sinabs_layer(weight):
    """Sinabs's LIF layer: v = alpha v + x with norm_input=False, SingleSpike fires at v >= threshold.
    Its decay is exp(-1/tau_mem); train_alphas=True stores alpha itself, set to exactly 0.5 (frozen).
    It reads batch-major [B, T, N]: the Linear's output is transposed (a view) in and out."""
    import sinabs.layers as sl
    from sinabs.activation import SingleSpike
    lif = sl.LIF(tau_mem=1.0, spike_threshold=torch.tensor(THRESHOLD), spike_fn=SingleSpike,
                 reset_fn=_SinabsHardReset(), surrogate_grad_fn=_SinabsSuperSpike(), norm_input=False,
                 train_alphas=True).to(weight.device)
    with torch.no_grad():
        lif.alpha_mem.fill_(DECAY)
    lif.alpha_mem.requires_grad_(False)
    linear = _linear(weight)

    def run(x):
        lif.reset_states()  # the layer keeps v between calls: each call is a new sequence
        return lif(linear(x).transpose(0, 1)).transpose(0, 1)
    return Layer(run, linear.weight)


def spikingjelly_layer(weight):
    from spikingjelly.activation_based import functional, layer, neuron, surrogate
    with torch.device("meta"):  # no random init: the weight is replaced
        linear = layer.Linear(weight.shape[1], weight.shape[0], bias=False, step_mode="m")
    linear.weight = torch.nn.Parameter(weight.detach().clone())
    # decay = 1 - 1/tau = 0.5 with decay_input=False: h = 0.5 v + x
    node = neuron.LIFNode(tau=1 / (1 - DECAY), decay_input=False, v_threshold=THRESHOLD, v_reset=0.0,
                          surrogate_function=surrogate.SuperSpike(alpha=1.0), step_mode="m")
    net = torch.nn.Sequential(linear, node).to(weight.device)

    def run(x):
        functional.reset_net(net)  # the node keeps v between calls: each call is a new sequence
        return net(x)

    def backend():
        # its fused operators need a float32 state; any other state takes its PyTorch reference
        if isinstance(node.v, torch.Tensor) and node.v.dtype != torch.float32:
            return f"torch reference (state in {str(node.v.dtype).replace('torch.', '')})"
        if not weight.is_cuda:
            return "torch (CPU)"
        return functional.neuron_implementation("lif", weight.device)["implementation"]
    return Layer(run, linear.weight, backend)


LAYERS = {  # spikefuse first: the others are checked against it
    "spikefuse": spikefuse_layer,
    "pytorch-loop": pytorch_loop_layer,
    "snntorch": snntorch_layer,
    "norse": norse_layer,
    "sinabs": sinabs_layer,
    "spikingjelly": spikingjelly_layer,
}
