"""A backward that will itself be differentiated (create_graph=True).

The fused kernels' gradients carry no autograd graph, so every fused op answers such a
backward by running its forward again through spikefuse.reference (in float32, spike for
spike the kernel's) and differentiating that with create_graph: second derivatives are the
reference's. This is the step they share, after each has rebuilt its reference forward.
"""
from __future__ import annotations

import torch


def grads_with_graph(outputs, grad_outputs, inputs, needs) -> tuple:
    """The vector-Jacobian product of `outputs` (with `grad_outputs`, None where an output
    got no gradient) for each of `inputs`, keeping its graph: one entry per input, None where
    it is not needed (or is None itself), zeros where it is needed but not reached."""
    pairs = [(out, g.to(out.dtype)) for out, g in zip(outputs, grad_outputs) if g is not None]
    wanted = [bool(need) and t is not None for t, need in zip(inputs, needs)]
    grads = iter(torch.autograd.grad([out for out, _ in pairs], [t for t, w in zip(inputs, wanted) if w],
                                     [g for _, g in pairs], create_graph=True, allow_unused=True)
                 if pairs and any(wanted) else ())
    result = []
    for t, w in zip(inputs, wanted):
        g = next(grads) if w else None
        result.append(torch.zeros_like(t) if w and g is None else g)
    return tuple(result)
