"""SpikingJelly 2.0's `LIFNode` and `IFNode` with SpikingJelly's own arguments and semantics,
on spikefuse's kernels: port a model by changing its import line:

    from spikingjelly.activation_based import neuron, surrogate, functional, layer, encoding  # before
    from spikefuse.compat.spikingjelly import neuron, surrogate, functional, layer, encoding  # after

`neuron.LIFNode(tau=2.0, decay_input=True, v_threshold=1.0, v_reset=0.0,
surrogate_function=surrogate.Sigmoid(), detach_reset=False, step_mode="s",
store_v_seq=False)` and `neuron.IFNode(...)` (the same less tau and decay_input) take
SpikingJelly 2.0's arguments and calling styles:
  - step_mode "s": one step x [N, ...] a call, the potential `v` kept on the module;
    `functional.reset_net(net)` (or `node.reset()`) between batches, `functional.detach_net`
    for truncated BPTT, as in SpikingJelly;
  - step_mode "m": x [T, N, ...], all T steps in one call (one fused kernel forward and one
    backward on CUDA: where spikefuse's speed is), from the kept `v`, leaving the last step's;
  - store_v_seq=True: `node.v_seq`, the post-reset potential of every step ([T, N, ...]; in
    "s" mode appended each step until reset()).
The charge is SpikingJelly's, written as spikefuse's h = decay * v + input with
decay = 1 - 1/tau and input (x + v_reset)/tau (decay_input=True) or x + v_reset/tau; firing
at h >= v_threshold, the hard reset to v_reset (v_reset=None: the soft reset, subtracting
v_threshold), detach_reset and the starting potential (v_reset, or 0) are SpikingJelly's.
How exact:
  - IFNode, and LIFNode with decay_input=False, v_reset 0 or None and tau a power of two
    (2, 4, ...): the same float32 operations, so spikes and v are SpikingJelly's bit for bit.
  - Otherwise SpikingJelly's order of float32 operations differs from h = decay * v + input:
    v agrees to rounding (a few units in the last place), and spikes agree except where h
    lies within that rounding of v_threshold: 8 of 360 million random neuron-steps differed
    (benchmarks/compat_spikingjelly_rounding.py), none in the tests, whose inputs include
    ones that land on the threshold exactly.
  - Gradients equal SpikingJelly's up to rounding (relative 1e-5).
Surrogates: SpikingJelly's default Sigmoid(alpha=4) and ATan, PiecewiseQuadratic and Rect
(this package's `surrogate` classes, or SpikingJelly's own objects) run spikefuse's surrogate
of the same formula; others are refused with a ValueError naming surrogate_function, as are
bad constructor values (naming the argument). Spikes come in the input's dtype, as
SpikingJelly's do. `backend` (keyword only): spikefuse's "auto", "fused" or "reference"
(spikefuse.functional's); SpikingJelly 0.0.0.0.14's "torch", "cupy" and "triton" are
accepted and mean "auto". Not here: SpikingJelly's other neurons, its neuron precision
settings and its stateful layers (Dropout, the containers); `layer` has its stateless ones
(Linear, Flatten, convolutions, batch norm, pooling) and `encoding` its PoissonEncoder.
spikefuse.nn.reset(model) / detach_state(model) reach these neurons too.
"""
from . import encoding, functional, layer, neuron, surrogate
from .functional import reset_net
from .neuron import IFNode, LIFNode

__all__ = ["LIFNode", "IFNode", "reset_net"]  # and the modules neuron, surrogate, functional, layer, encoding
