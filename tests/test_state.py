"""Stateful neurons: spikefuse.nn.reset, state carried across calls, detach_state, shape errors."""
import re

import pytest
import torch

from spikefuse import functional as F
from spikefuse import nn as snn

BACKENDS = (pytest.param("fused", marks=pytest.mark.interpreter), "reference")  # fused: Triton on CPU tensors


def _neurons(model):
    return [m for m in model.modules() if isinstance(m, snn.LIF)]


def _network(backend, stateful, detach_state=True, seed=0):
    torch.manual_seed(seed)
    opts = dict(backend=backend, stateful=stateful, detach_state=detach_state, surrogate="atan")
    return torch.nn.Sequential(
        torch.nn.Linear(4, 6), snn.LIF(decay=0.7, threshold=0.5, **opts),
        torch.nn.Sequential(torch.nn.Linear(6, 5), snn.PLIF(init_decay=0.6, channels=5, reset="soft",
                                                            threshold=0.4, **opts)),
        torch.nn.Linear(5, 3), snn.IF(threshold=0.6, **opts))


class _Counter(torch.nn.Module):
    """A user module following the reset protocol."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        return x

    def reset_state(self):
        self.calls += 1


def test_reset_clears_every_stateful_module_of_a_nested_network():
    model = _network("reference", stateful=True)
    model[2].append(_Counter())
    x = torch.randn(5, 2, 4)
    first = model(x)
    assert all(m.v is not None for m in _neurons(model))
    assert snn.reset(model) is model
    assert all(m.v is None for m in _neurons(model)) and model[2][2].calls == 1
    assert torch.equal(model(x), first)  # starts again from v0 = 0


def test_stateless_neurons_keep_nothing():
    layer = snn.LIF(backend="reference")
    x = torch.randn(4, 2, 3) + 0.8
    assert torch.equal(layer(x), layer(x)) and layer.v is None
    layer(torch.randn(4, 7, 3))  # another batch size: fine, no state
    assert snn.LIF().detach_state is True and snn.LIF().stateful is False


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("detach", [True, False])
def test_chunks_give_the_spikes_of_one_call(backend, detach):
    x = torch.randn(11, 3, 4)
    whole = _network(backend, stateful=False)(x)
    stream = _network(backend, stateful=True, detach_state=detach)
    parts = torch.cat([stream(c) for c in x.split([4, 1, 6])])
    assert torch.equal(parts, whole)
    assert whole.sum() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_through_carried_state_equal_one_call(backend):
    """detach_state=False: backward over the chunks is backward over the concatenated time."""
    torch.manual_seed(1)
    x = torch.randn(9, 3, 4)
    weight = torch.randn(9, 3, 3)
    grads = []
    for chunks in ([9], [3, 2, 4]):
        model = _network(backend, stateful=True, detach_state=False)
        xs = x.clone().requires_grad_(True)
        out = torch.cat([model(c) for c in xs.split(chunks)])
        (out * weight).sum().backward()
        grads.append((out.detach(), xs.grad, *[p.grad for p in model.parameters()]))
    (whole, *g_whole), (parts, *g_parts) = grads
    assert torch.equal(parts, whole)
    for a, b in zip(g_parts, g_whole):
        assert b.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_neurons_alone_carry_state_and_gradient(backend):
    """One neuron module per kind, chunks vs one call: spikes exact, dL/dx (and PLIF's dL/dw)."""
    torch.manual_seed(2)
    x = torch.randn(10, 2, 5) + 0.3
    for make in (lambda **k: snn.LIF(decay=0.8, **k), lambda **k: snn.IF(threshold=1.5, reset="soft", **k),
                 lambda **k: snn.PLIF(channels=5, **k)):
        results = []
        for stateful, chunks in ((False, [10]), (True, [6, 4])):
            layer = make(backend=backend, surrogate="fast_sigmoid", stateful=stateful, detach_state=False)
            xs = x.clone().requires_grad_(True)
            out = torch.cat([layer(c) for c in xs.split(chunks)])
            (out * torch.linspace(-1, 2, out.numel()).view_as(out)).sum().backward()
            results.append((out, xs.grad, *[p.grad for p in layer.parameters()]))
        (whole, *g_whole), (parts, *g_parts) = results
        assert torch.equal(parts, whole)
        for a, b in zip(g_parts, g_whole):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_detach_state_decides_whether_grad_reaches_the_previous_call(backend):
    x1 = (torch.randn(4, 2, 3) + 0.5).requires_grad_(True)
    x2 = torch.randn(3, 2, 3) + 0.5
    # default (detach_state=True): backward stops at the start of the call
    layer = snn.LIF(decay=0.9, surrogate="atan", stateful=True, backend=backend)
    layer(x1)
    assert not layer.v.requires_grad
    out = layer(x2)
    assert not out.requires_grad  # nothing of this call needs a gradient: the state was cut
    # detach_state=False: a loss on the second call reaches the first call's input
    layer = snn.LIF(decay=0.9, surrogate="atan", stateful=True, detach_state=False, backend=backend)
    layer(x1)
    assert layer.v.requires_grad
    layer(x2).sum().backward()
    assert x1.grad is not None and x1.grad.abs().sum() > 0
    # spikefuse.nn.detach_state(model) truncates there, keeping the values
    x1.grad = None
    model = torch.nn.Sequential(snn.LIF(decay=0.9, surrogate="atan", stateful=True, detach_state=False,
                                        backend=backend))
    model(x1)
    v = model[0].v
    assert snn.detach_state(model) is model
    assert torch.equal(model[0].v, v) and not model[0].v.requires_grad
    assert not model(x2).requires_grad and x1.grad is None


def test_batch_size_change_raises_and_keeps_the_state():
    model = snn.name_layers(torch.nn.Sequential(torch.nn.Linear(4, 6), snn.LIF(stateful=True)))
    model(torch.randn(5, 3, 4))
    state = model[1].v.clone()
    message = re.escape("Sequential.1: the carried state has shape (3, 6)") + r".*\[T, 3, 6\].*" + \
        re.escape("got shape (5, 8, 6)") + r".*" + re.escape("spikefuse.nn.reset(model)")
    with pytest.raises(ValueError, match=message):
        model(torch.randn(5, 8, 4))
    assert torch.equal(model[1].v, state)  # never dropped silently
    with pytest.raises(ValueError, match=r"^LIF: the carried state has shape \(2, 3\)"):
        layer = snn.LIF(stateful=True, backend="reference")
        layer(torch.randn(2, 2, 3))
        layer(torch.randn(2, 2, 4))  # another feature shape, same batch


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_then_a_new_batch_size_works(backend):
    model = _network(backend, stateful=True)
    model(torch.randn(3, 4, 4))
    x = torch.randn(5, 2, 4)
    with pytest.raises(ValueError, match="batch size"):
        model(x)
    snn.reset(model)
    assert torch.equal(model(x), _network(backend, stateful=False)(x))
    assert all(m.v.shape[0] == 2 for m in _neurons(model))


@pytest.mark.parametrize("stateful", [False, True])
def test_two_dim_input_is_refused_by_modules(stateful):
    for layer in (snn.LIF(stateful=stateful), snn.IF(stateful=stateful), snn.PLIF(stateful=stateful),
                  snn.ALIF(stateful=stateful), snn.CUBA(stateful=stateful)):
        with pytest.raises(ValueError, match=r"expected time-major input \[T, B, \.\.\.\].*got shape \(6, 4\)"
                                             r".*ambiguous"):
            layer(torch.randn(6, 4))
        assert layer.v is None
    # the functional form documents [T, *]: a 2-D input stays valid there
    x = torch.randn(6, 4) + 0.7
    assert torch.equal(F.lif(x, backend="reference"), snn.LIF(backend="reference")(x.unsqueeze(-1)).squeeze(-1))


# ---- ALIF and CUBA: the same state rules, (v, a) and (v, i) carried ----

STATE_NEURONS = {
    "alif": lambda **k: snn.ALIF(decay=0.8, adapt_decay=0.7, beta=0.4, threshold=0.6, surrogate="atan", **k),
    "cuba": lambda **k: snn.CUBA(decay=0.8, syn_decay=0.6, threshold=0.7, reset="soft", surrogate="atan", **k),
}


def _carried(layer):
    return [getattr(layer, name) for name in layer.STATE]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", STATE_NEURONS)
def test_alif_cuba_chunks_equal_one_call(kind, backend):
    """Linear -> neuron, chunks [4, 1, 6] vs one call: spikes exact; with detach_state=False the
    gradients of x and of the Linear equal too."""
    x = torch.randn(11, 3, 4)
    results = []
    for stateful, chunks in ((False, [11]), (True, [4, 1, 6])):
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(4, 5),
                                    STATE_NEURONS[kind](backend=backend, stateful=stateful, detach_state=False))
        xs = x.clone().requires_grad_(True)
        out = torch.cat([model(c) for c in xs.split(chunks)])
        (out * torch.linspace(-1, 2, out.numel()).view_as(out)).sum().backward()
        results.append((out, xs.grad, *[p.grad for p in model.parameters()]))
    (whole, *g_whole), (parts, *g_parts) = results
    assert torch.equal(parts, whole) and 0 < whole.mean() < 1
    for a, b in zip(g_parts, g_whole):
        assert b.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    detached = STATE_NEURONS[kind](backend=backend, stateful=True)  # default detach_state=True: same spikes
    assert torch.equal(torch.cat([detached(c) for c in model[0](x).split([4, 1, 6])]), whole)


@pytest.mark.parametrize("kind", STATE_NEURONS)
def test_alif_cuba_reset_detach_state_and_repr(kind):
    layer = STATE_NEURONS[kind](backend="reference", stateful=True, detach_state=False)
    assert "stateful=True, detach_state=False" in repr(layer)
    assert "stateful" not in repr(STATE_NEURONS[kind]())
    model = torch.nn.Sequential(layer)
    x = torch.randn(5, 2, 3) + 0.5
    x1 = x.clone().requires_grad_(True)
    first = model(x1)
    assert all(t is not None and t.requires_grad and t.shape == (2, 3) for t in _carried(layer))
    values = [t.detach().clone() for t in _carried(layer)]
    assert snn.detach_state(model) is model  # values kept, graph cut
    assert all(torch.equal(t, v) and not t.requires_grad for t, v in zip(_carried(layer), values))
    assert not model(x).requires_grad
    assert snn.reset(model) is model and _carried(layer) == [None, None]
    assert torch.equal(model(x), first.detach())  # starts again from zeros


@pytest.mark.parametrize("kind", STATE_NEURONS)
def test_alif_cuba_batch_change_raises_and_keeps_the_state(kind):
    model = snn.name_layers(torch.nn.Sequential(torch.nn.Linear(4, 6), STATE_NEURONS[kind](stateful=True)))
    model(torch.randn(5, 3, 4))
    state = [t.clone() for t in _carried(model[1])]
    message = re.escape("Sequential.1: the carried state has shape (3, 6)") + r".*\[T, 3, 6\].*" + \
        re.escape("got shape (5, 8, 6)") + r".*" + re.escape("spikefuse.nn.reset(model)")
    with pytest.raises(ValueError, match=message):
        model(torch.randn(5, 8, 4))
    assert all(torch.equal(t, s) for t, s in zip(_carried(model[1]), state))  # never dropped silently
    snn.reset(model)
    assert model(torch.randn(5, 8, 4)).shape == (5, 8, 6)
