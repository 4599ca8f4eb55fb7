"""Checks shared by the two-state neurons' tests (ALIF: (v, a); CUBA: (v, i)): the fused
path against the reference, given the neuron's function, module and parameters."""
import torch

from helpers import DEVICE, rel_err


def check_potential_only_and_double_backward(neuron, x, **params):
    """dL/dh alone reaches x; a penalty on that gradient (create_graph) matches the reference."""
    grads, penalties = [], []
    for backend in ("fused", "reference"):
        xi = x.clone().requires_grad_(True)
        spikes, h = neuron(xi, backend=backend, return_potential=True, surrogate="sigmoid", **params)
        (g,) = torch.autograd.grad(h.pow(2).sum() + spikes.sum(), xi, create_graph=True)
        grads.append(g.detach())
        penalties.append(torch.autograd.grad(g.pow(2).sum(), xi)[0])
    assert rel_err(*grads) < 1e-5 and rel_err(*penalties) < 1e-5


def check_module_record_potential(module, neuron, x, **params):
    assert module(**params).potential is None
    outs = []
    for backend in ("fused", "reference"):
        layer = module(backend=backend, record_potential=True, **params)
        s = layer(x)
        assert isinstance(s, torch.Tensor) and layer.potential.shape == x.shape
        outs.append((s, layer.potential))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(outs[0][0], neuron(x, **params))


def run_from_state(neuron, x, state0, backend, **kw):
    """Spikes, h, the final state, and the gradients of x and of each given state0 tensor for
    a fixed random loss on the spikes, h and the final state."""
    xi = x.detach().clone().requires_grad_(True)
    state = [None if t is None else t.detach().clone().requires_grad_(True) for t in state0]
    s, h, (v, w) = neuron(xi, backend=backend, state0=tuple(state), return_state=True, return_potential=True, **kw)
    g = torch.Generator().manual_seed(2)
    weights = [torch.randn(t.shape, generator=g).to(DEVICE) for t in (s, h, v, w)]
    loss = (s * weights[0]).sum() + (h * weights[1]).sum() + (v * weights[2]).sum() - (w * weights[3]).sum()
    inputs = [xi] + [t for t in state if t is not None]
    return s, h, (v, w), torch.autograd.grad(loss, inputs)


def assert_state_match(neuron, names, x, state0, **kw):
    """Fused and reference from the same state0: spikes and h exact, the final state and the
    gradients (of x and of the state0 tensors, `names`) within 1e-5."""
    (s1, h1, st1, g1), (s2, h2, st2, g2) = (run_from_state(neuron, x, state0, b, **kw)
                                            for b in ("fused", "reference"))
    assert torch.equal(s1, s2) and 0 < s2.mean() < 1
    assert torch.equal(h1, h2)
    for fused, ref in zip(st1, st2):
        torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-6)
    for name, fused, ref in zip(("x", *names), g1, g2):
        assert fused.shape == ref.shape and rel_err(fused, ref) < 1e-5, f"grad {name}: {rel_err(fused, ref)}"
