"""One registration for a fused neuron with a two-tensor state: from its two launchers it
builds the eager autograd.Function, the torch.library triton_ops that torch.compile sees (with
their autograd), double backward through the reference, and the entry point that
spikefuse.functional calls. ALIF (state v, a) and CUBA (v, i) are built here; a new neuron of
this shape needs its kernels, a reference in spikefuse.reference, and one `register` call
(docs/architecture.md, "Adding a neuron", runs one in tests/test_neuron_op.py).

A neuron's launchers, as spikefuse.ops.alif's:

    forward(x, s0, t0, *params, threshold, reset, v_reset, save, want_state, launch=EAGER,
            want_h=False) -> (spikes, sT, tT, x_contiguous, checkpoints, h or None)
    backward(grad_s, grad_sT, grad_tT, x, checkpoints, *params, threshold, reset, v_reset,
             detach, surrogate, alpha, need_gs0, need_gt0, launch=EAGER, grad_h=None)
             -> (dL/dx like x, dL/ds0, dL/dt0: float32 or None unless needed)

with (s, t) the state (v then the second variable), `params` the neuron's own float
parameters (ALIF: decay, adapt_decay, beta) and grad_s possibly None (only the state or h
used). The reference is spikefuse.reference.<name>(x, *params, threshold, reset, v_reset,
detach, surrogate, alpha, return_state=, return_potential=, state0=).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from ..neuron_options import NeuronOptions
from .double_backward import grads_with_graph
from .kernel_base import TRACED, or_empty

# after a neuron's own parameters: the options every one of them takes, in this order
# (NeuronOptions.common())
COMMON_OPTIONS = (("threshold", float), ("reset", str), ("v_reset", float), ("detach", bool),
                  ("surrogate", str), ("alpha", float))
FORWARD_OPTIONS = 3  # threshold, reset, v_reset: what the forward launcher takes of them


@dataclass(frozen=True)
class TwoStateNeuron:
    """What `register` needs: the neuron's name, its state's names, its own float parameters'
    names in the launchers' order, the two launchers and the reference (None: the function
    spikefuse.reference.<name>). The ops are <name>_forward and <name>_backward in the
    torch.library namespace "spikefuse", or in the one `name` names ("mylab::my_neuron")."""
    name: str
    state: tuple[str, str]
    params: tuple[str, ...]
    forward: Callable
    backward: Callable
    reference: Callable | None = None

    def oracle(self) -> Callable:
        if self.reference is not None:
            return self.reference
        from .. import reference
        return getattr(reference, self.name)

    def op_name(self, part: str) -> str:
        return f"{self.name}_{part}" if "::" in self.name else f"spikefuse::{self.name}_{part}"


def reference_grads(oracle, x, state0, grad_outputs, options, needs):
    """Gradients for (x, *state0) when the backward is itself differentiated (create_graph):
    the reference neuron `oracle` is run again (on float32 copies of the saved inputs, as the
    kernel's) and differentiated with create_graph, so second derivatives are its.
    grad_outputs: dL/d(spikes, h, final state...), each None where unused; needs: whether
    x and each of state0 need a gradient."""
    inputs = (x, *state0)
    with torch.enable_grad():
        state0 = tuple(None if t is None else t.float() for t in state0)
        spikes, h, state = oracle(x.float(), *options, return_state=True, return_potential=True, state0=state0)
        return grads_with_graph((spikes, h, *state), grad_outputs, inputs, needs)


def grad_like(grad, tensor, needed):
    """A kernel's float32 gradient for an initial-state tensor, in that tensor's dtype
    (None where not needed)."""
    return grad.to(tensor.dtype) if needed else None


def _with_signature(fn, parameters, returns):
    """fn with the typed signature torch.library reads its op's schema from."""
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind) for name, kind in parameters],
        return_annotation=returns)
    return fn


def register(neuron: TwoStateNeuron) -> Callable:
    """Build the neuron's autograd Function and triton_ops; returns its entry point
    fused(x, *params, options, return_state, return_potential=False, state0=(None, None)) ->
    spikes, then h if return_potential, then the final state (a pair) if return_state, with
    `options` a spikefuse.neuron_options.NeuronOptions (its threshold, reset, v_reset,
    detach_reset, surrogate and alpha are used). Arguments are checked by the caller
    (spikefuse.functional) and NeuronOptions itself. return_potential is eager only: under
    torch.compile spikefuse.functional sends it to the reference."""
    s, t = neuron.state
    n_params = len(neuron.params)
    n_forward = n_params + FORWARD_OPTIONS  # what the forward launcher takes after the state
    options = [(p, float) for p in neuron.params] + list(COMMON_OPTIONS)
    n_options = len(options)

    class Function(torch.autograd.Function):
        """The eager path (a plain autograd.Function: less Python per call than a custom op).
        options: the neuron's parameters and COMMON_OPTIONS, then want_state, want_h; the
        outputs are spikes, then h if want_h, then the final state if want_state."""

        @staticmethod
        def forward(ctx, x, s0, t0, opts):
            *opts, want_state, want_h = opts
            save = any(ctx.needs_input_grad[:3])
            spikes, sT, tT, x_saved, ckpt, h = neuron.forward(x, s0, t0, *opts[:n_forward], save, want_state,
                                                              want_h=want_h)
            ctx.set_materialize_grads(False)
            if save:
                ctx.save_for_backward(x_saved, ckpt, s0, t0)
                ctx.options = tuple(opts)
                ctx.want = (want_h, want_state)
            out = (spikes,) + ((h,) if want_h else ()) + ((sT, tT) if want_state else ())
            return out if len(out) > 1 else spikes

        @staticmethod
        def backward(ctx, grad_s, *grads):
            x, ckpt, s0, t0 = ctx.saved_tensors
            grads = iter(grads)
            grad_h = next(grads) if ctx.want[0] else None
            grad_sT, grad_tT = (next(grads), next(grads)) if ctx.want[1] else (None, None)
            if grad_s is None and grad_h is None and grad_sT is None and grad_tT is None:
                return None, None, None, None
            needs = ctx.needs_input_grad[:3]
            if torch.is_grad_enabled():  # create_graph=True: this backward will be differentiated
                return (*reference_grads(neuron.oracle(), x, (s0, t0), (grad_s, grad_h, grad_sT, grad_tT),
                                         ctx.options, needs), None)
            gx, gs0, gt0 = neuron.backward(grad_s, grad_sT, grad_tT, x, ckpt, *ctx.options, needs[1], needs[2],
                                           grad_h=grad_h)
            return gx, grad_like(gs0, s0, needs[1]), grad_like(gt0, t0, needs[2]), None

    short = neuron.name.rsplit("::", 1)[-1]
    Function.__name__ = Function.__qualname__ = f"{short.upper()}Function"

    # ---- torch.library: what torch.compile sees (ops with autograd whose bodies launch the
    # kernels; a triton_op's body is also its fake kernel: only torch ops, launches, shapes) ----
    def forward_body(x, s0, t0, *rest):
        *opts, save = rest
        spikes, sT, tT, _, ckpt, _ = neuron.forward(x, s0, t0, *opts[:n_forward], save, launch=TRACED)
        return spikes, sT, tT, ckpt

    def backward_body(grad_s, grad_sT, grad_tT, x, ckpt, *rest):
        gx, gs0, gt0 = neuron.backward(grad_s, grad_sT, grad_tT, x.contiguous(), ckpt, *rest, launch=TRACED)
        return gx, or_empty(gs0, x), or_empty(gt0, x)

    tensor, maybe = torch.Tensor, torch.Tensor | None
    forward_op = torch.library.triton_op(neuron.op_name("forward"), mutates_args=())(_with_signature(
        forward_body, [("x", tensor), (f"{s}0", maybe), (f"{t}0", maybe), *options, ("save", bool)],
        tuple[tensor, tensor, tensor, tensor]))
    backward_op = torch.library.triton_op(neuron.op_name("backward"), mutates_args=())(_with_signature(
        backward_body, [("grad_s", tensor), (f"grad_{s}T", maybe), (f"grad_{t}T", maybe), ("x", tensor),
                        ("ckpt", tensor), *options, (f"need_g{s}0", bool), (f"need_g{t}0", bool)],
        tuple[tensor, tensor, tensor]))

    def setup_context(ctx, inputs, output):
        x, s0, t0, *opts, _save = inputs
        ctx.save_for_backward(x, output[3], s0, t0)
        ctx.options = tuple(opts)

    def backward_rule(ctx, grad_s, grad_sT, grad_tT, _grad_ckpt):
        x, ckpt, s0, t0 = ctx.saved_tensors
        nones = (None,) * (n_options + 1)  # the options and `save`
        if grad_s is None and grad_sT is None and grad_tT is None:
            return (None, None, None, *nones)
        needs = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # create_graph=True (AOT autograd traces backward without it)
            return (*reference_grads(neuron.oracle(), x, (s0, t0), (grad_s, None, grad_sT, grad_tT), ctx.options,
                                     needs), *nones)
        if grad_s is None:
            grad_s = torch.zeros_like(x)
        gx, gs0, gt0 = backward_op(grad_s, grad_sT, grad_tT, x, ckpt, *ctx.options, needs[1], needs[2])
        return (gx, grad_like(gs0, s0, needs[1]), grad_like(gt0, t0, needs[2]), *nones)

    forward_op.register_autograd(backward_rule, setup_context=setup_context)

    def fused(x, *args, return_potential=False, state0=(None, None)):
        *params, neuron_options, return_state = args
        if len(params) != n_params or not isinstance(neuron_options, NeuronOptions):
            raise TypeError(f"{neuron.name}: expected its {n_params} parameters ({', '.join(neuron.params)}), "
                            f"a NeuronOptions and return_state, got {len(args)} values")
        opts = (*params, *neuron_options.common())  # flat: the ops' schemas take primitives
        s0, t0 = state0 if state0 is not None else (None, None)
        if not torch.compiler.is_dynamo_compiling():
            if not x.is_contiguous():  # copied here, not inside: the x saved for backward keeps its graph
                x = x.contiguous()
            out = Function.apply(x, s0, t0, (*opts, return_state, return_potential))
            if not return_state:
                return out
            *head, sT, tT = out
            return (*head, (sT, tT))
        save = torch.is_grad_enabled() and any(u is not None and u.requires_grad for u in (x, s0, t0))
        spikes, sT, tT, _ = forward_op(x, s0, t0, *opts, save)
        return (spikes, (sT, tT)) if return_state else spikes

    fused.Function, fused.forward_op, fused.backward_op = Function, forward_op, backward_op
    fused.__name__ = fused.__qualname__ = f"{short}_fused"
    fused.__doc__ = f"The fused {short}'s entry point (see spikefuse.ops.neuron_op.register)."
    return fused
