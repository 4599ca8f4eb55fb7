"""Fused CUBA (synaptic LIF) kernels (through the Triton interpreter) against the PyTorch reference."""
import itertools
import math

import pytest
import torch
from torch import nn

import spikefuse.functional as F
import spikefuse.nn as snn
from spikefuse import reference
from two_state_neurons import assert_state_match as shared_assert_state_match
from two_state_neurons import (check_module_record_potential, check_potential_only_and_double_backward,
                               rel_err)
from helpers import DEVICE

PARAMS = dict(decay=0.8, syn_decay=0.6, threshold=0.9, v_reset=-0.2)


def rand(*shape, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + 0.3).to(dtype).to(DEVICE)


def run(x, backend, **kw):
    """Spikes, final (v, i) or None, and dL/dx for a fixed random loss on both outputs."""
    xi = x.detach().clone().requires_grad_(True)
    out = F.cuba(xi, backend=backend, **kw)
    spikes, state = out if isinstance(out, tuple) else (out, None)
    g = torch.randn(spikes.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    loss = (spikes.float() * g).sum()
    if state is not None:
        v, i = state
        weights = torch.linspace(-1, 1, v.numel(), device=DEVICE).view(v.shape)
        loss = loss + (v * weights).sum() + (i * weights.flip(-1)).sum()
    (gx,) = torch.autograd.grad(loss, xi)
    return spikes.float(), state, gx


def assert_match(x, rtol=1e-5, check_rate=True, **kw):
    (s1, st1, g1), (s2, st2, g2) = run(x, "fused", **kw), run(x, "reference", **kw)
    assert torch.equal(s1, s2), f"spikes differ at {(s1 != s2).sum().item()} places"
    if check_rate:
        assert 0 < s2.mean() < 1, "degenerate case: no spikes or all spikes"
    if st1 is not None:
        for fused, ref in zip(st1, st2):
            torch.testing.assert_close(fused, ref, rtol=rtol, atol=1e-6)
    assert g1.dtype == x.dtype and g1.shape == x.shape
    assert rel_err(g1, g2) < rtol, f"grad x: {rel_err(g1, g2)}"


def small_chunks(monkeypatch, BLOCK=32, K=4):
    """Short time chunks and a narrow block: few steps cover several chunks, few neurons
    several programs (cheap in the interpreter)."""
    from spikefuse.ops import kernel_base
    monkeypatch.setattr(kernel_base, "launch_config", lambda num_neurons, dtype: (BLOCK, K, 1))


# every reset x detach, the surrogates spread over them (not the full product: interpreter time)
SURR = ["rectangular", "triangle", "fast_sigmoid", "sigmoid", "atan", "sigmoid"]
CASES = [(r, d, SURR[n]) for n, (r, d) in enumerate(itertools.product(["hard", "soft", "none"],
                                                                       [False, True]))]
CASES += [("subtract", False, "atan"), ("subtract", True, "triangle")]  # snnTorch's Synaptic reset


@pytest.mark.parametrize("reset,detach,surrogate", CASES)
def test_cuba_resets_detach_surrogates(reset, detach, surrogate, monkeypatch):
    small_chunks(monkeypatch)
    x = rand(9, 3, 13, seed=len(reset) + detach)
    assert_match(x, reset=reset, surrogate=surrogate, detach_reset=detach, return_state=True, **PARAMS)


@pytest.mark.parametrize("shape", [(1, 5), (1, 2, 3), (6, 2, 3, 5), (11, 33)])
def test_cuba_shapes(shape, monkeypatch):
    """T = 1, odd trailing shapes, partial chunks and programs (K = 4, BLOCK = 32)."""
    small_chunks(monkeypatch)
    x = rand(*shape, seed=len(shape) + shape[0], scale=1.5)
    assert_match(x, check_rate=x.numel() >= 20, surrogate="triangle", return_state=True, **PARAMS)


def test_cuba_default_launch_config_several_chunks():
    """The tuned launch configuration with more steps than one chunk (K = 16)."""
    assert_match(rand(35, 2, 5, seed=12), reset="soft", surrogate="fast_sigmoid", return_state=True,
                 **PARAMS)


@pytest.mark.parametrize("reset", ["soft", "subtract"])
def test_cuba_non_contiguous_input(reset, monkeypatch):
    small_chunks(monkeypatch)
    base = rand(6, 9, 4, 5, seed=4)
    x = base.transpose(1, 3)[..., ::2]  # [6, 5, 4, 5] strided view
    assert not x.is_contiguous()
    assert_match(x, reset=reset, **PARAMS)


@pytest.mark.parametrize("detach", [False, True])
def test_cuba_subtract_t1_and_decay_one(detach):
    """T = 1 from a state above the threshold (s[-1] = 1 resets step 0), and decay 1."""
    x = rand(1, 3, 11, seed=14)
    assert_state_match(x, state0_for(x), reset="subtract", detach_reset=detach, surrogate="atan", **PARAMS)
    x = rand(12, 3, 11, seed=15)
    assert_state_match(x, state0_for(x), reset="subtract", detach_reset=detach, surrogate="atan",
                       **{**PARAMS, "decay": 1.0})


@pytest.mark.parametrize("reset", ["hard", "soft"])
def test_syn_decay_zero_is_lif(reset):
    """syn_decay = 0 feeds x straight through: CUBA is LIF exactly, both backends."""
    x = rand(9, 3, 13, seed=20)
    kw = dict(decay=0.8, threshold=0.9, reset=reset, v_reset=-0.2, surrogate="atan")
    grads = []
    for fn, extra in ((F.cuba, dict(syn_decay=0.0)), (F.lif, {})):
        for backend in ("fused", "reference"):
            xi = x.clone().requires_grad_(True)
            spikes = fn(xi, backend=backend, **kw, **extra)
            g = torch.randn(spikes.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
            grads.append((spikes, torch.autograd.grad((spikes * g).sum(), xi)[0]))
    (sc, gc), (scr, gcr), (sl, gl), (slr, glr) = grads
    assert torch.equal(sc, sl) and torch.equal(scr, slr) and torch.equal(sc, slr)
    assert torch.equal(gc, gl), "fused CUBA with syn_decay = 0 must be the fused LIF"
    assert torch.equal(gcr, glr), "reference CUBA with syn_decay = 0 must be the reference LIF"


def test_synaptic_current_integrates():
    """A single input pulse keeps driving the membrane through the decaying current."""
    x = torch.zeros(6, 1, 1, device=DEVICE)
    x[0] = 1.0
    _, (v, i) = F.cuba(x, decay=1.0, syn_decay=0.5, threshold=10.0, return_state=True,
                       backend="fused")
    assert torch.allclose(i.cpu(), torch.tensor([[0.5 ** 5]])) and torch.allclose(v.cpu(), torch.tensor([[2 - 0.5 ** 5]]))


def test_only_final_state_used():
    x = rand(5, 2, 8, seed=10)
    grads = []
    for backend in ("fused", "reference"):
        xi = x.detach().clone().requires_grad_(True)
        _, (v, i) = F.cuba(xi, backend=backend, return_state=True, reset="soft", **PARAMS)
        grads.append(torch.autograd.grad(v.sum() + 2 * i.sum(), xi)[0])
    assert rel_err(*grads) < 1e-5


def test_inference_saves_nothing():
    x = rand(4, 3, 5, seed=11)
    with torch.no_grad():
        s = F.cuba(x, backend="fused", **PARAMS)
    assert torch.equal(s, F.cuba(x, backend="reference", **PARAMS))


@pytest.mark.parametrize("reset", ["hard", "subtract"])
def test_double_backward_matches_reference(reset):
    x = rand(6, 2, 7, seed=13)
    penalties = []
    for backend in ("fused", "reference"):
        xi = x.clone().requires_grad_(True)
        s = F.cuba(xi, backend=backend, surrogate="sigmoid", reset=reset, **PARAMS)
        (gx,) = torch.autograd.grad((s * torch.linspace(-1, 1, s.shape[-1], device=s.device)).sum(), xi, create_graph=True)
        penalties.append(torch.autograd.grad(gx.pow(2).sum(), xi)[0])
    assert rel_err(*penalties) < 1e-5


BAD = [
    (dict(decay=0.0), "decay"), (dict(decay=1.5), "decay"), (dict(decay=float("nan")), "decay"),
    (dict(decay="0.5"), "decay"), (dict(syn_decay=-0.1), "syn_decay"),
    (dict(syn_decay=1.01), "syn_decay"), (dict(syn_decay=float("nan")), "syn_decay"),
    (dict(syn_decay=True), "syn_decay"), (dict(threshold=float("nan")), "threshold"),
    (dict(v_reset=float("inf")), "v_reset"), (dict(reset="bogus"), "reset"),
    (dict(surrogate="bogus"), "surrogate"), (dict(alpha=-1.0), "alpha"), (dict(backend="gpu"), "backend"),
]


@pytest.mark.parametrize("kw,name", BAD, ids=[f"{name}-{i}" for i, (_, name) in enumerate(BAD)])
def test_bad_arguments_raise_value_error_naming_them(kw, name):
    with pytest.raises(ValueError, match=name):
        F.cuba(rand(3, 2, 4), **kw)


@pytest.mark.parametrize("x,name", [
    (torch.zeros(0, 2, 3), "T == 0"), (torch.zeros(3, 2, dtype=torch.int64), "x must be a floating"),
    (torch.tensor(1.0), "x must have"),
])
def test_bad_input_raises_value_error(x, name):
    with pytest.raises(ValueError, match=name):
        F.cuba(x)


def test_module_bad_arguments():
    with pytest.raises(ValueError, match="syn_decay"):
        snn.CUBA(syn_decay=2.0)
    with pytest.raises(ValueError, match="decay"):
        snn.CUBA(decay=0.0)
    with pytest.raises(ValueError, match="3 or more dims"):
        snn.CUBA()(torch.zeros(3, 4))


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_module_trains_in_sequential(backend):
    torch.manual_seed(0)
    neuron = snn.CUBA(decay=0.9, syn_decay=0.7, threshold=0.5, surrogate="atan", backend=backend)
    assert "syn_decay=0.7" in repr(neuron)
    model = nn.Sequential(nn.Linear(6, 10), neuron, nn.Linear(10, 3)).to(DEVICE)
    x = torch.randn(8, 4, 6, device=DEVICE) * 2
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(x).mean(0).pow(2).sum()
    loss.backward()
    assert model[0].weight.grad.abs().sum() > 0, "no gradient reached the layer before the neuron"
    opt.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_module_matches_functional():
    x = rand(5, 2, 7, seed=14)
    module = snn.CUBA(reset="soft", backend="reference", **PARAMS)
    assert torch.equal(module(x), reference.cuba(x, reset="soft", **PARAMS))


def test_compile_uses_the_fused_ops():
    """torch.compile (aot_eager on CPU) traces the triton_ops in one graph, with eager's outputs."""
    import torch._dynamo
    torch._dynamo.reset()

    def f(x):
        s, (v, i) = F.cuba(x, backend="fused", return_state=True, reset="soft", **PARAMS)
        return s.sum() * 0.5 + (s * x).sum() + v.sum() + i.sum()

    targets = []

    def aot_eager_recording(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    x = rand(6, 2, 5, seed=15)
    results = []
    for fn in (f, torch.compile(f, backend=aot_eager_recording, fullgraph=True)):
        xi = x.clone().requires_grad_(True)
        out = fn(xi)
        results.append((out, torch.autograd.grad(out, xi)[0]))
    torch._dynamo.reset()
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2) and rel_err(g2, g1) < 1e-6
    assert math.isfinite(o1.item())
    assert "spikefuse.cuba_forward.default" in targets, targets


# ---- return_potential / record_potential (h: the membrane's pre-reset potential) ----

def run_potential(x, backend, **kw):
    """Spikes, h, and dL/dx for a loss on the spikes, on h and on the final state."""
    xi = x.detach().clone().requires_grad_(True)
    s, h, (v, i) = F.cuba(xi, backend=backend, return_potential=True, return_state=True, **kw)
    g = torch.Generator().manual_seed(1)
    loss = (s * torch.randn(s.shape, generator=g).to(DEVICE)).sum() + 0.1 * (h ** 2).sum()
    loss = loss + (h * torch.randn(h.shape, generator=g).to(DEVICE)).sum() + v.sum() - i.sum()
    return s, h, torch.autograd.grad(loss, xi)[0]


@pytest.mark.parametrize("reset,detach", list(itertools.product(["hard", "soft", "none"], [False, True])))
def test_potential_matches_reference(reset, detach, monkeypatch):
    small_chunks(monkeypatch)
    x = rand(9, 2, 37, seed=len(reset) + detach)
    (s1, h1, g1), (s2, h2, g2) = (run_potential(x, b, reset=reset, detach_reset=detach, surrogate="atan", **PARAMS)
                                  for b in ("fused", "reference"))
    assert torch.equal(s1, s2) and 0 < s2.mean() < 1
    assert h1.dtype == x.dtype and torch.equal(h1, h2), "fused h must be the reference's exactly"
    assert rel_err(g1, g2) < 1e-5, rel_err(g1, g2)


@pytest.mark.parametrize("make_x", [lambda: rand(1, 3, 7, seed=21),
                                    lambda: rand(6, 9, 4, 5, seed=22).transpose(1, 3)[..., ::2]],
                         ids=["T=1", "non-contiguous"])
def test_potential_t1_and_non_contiguous(make_x):
    x = make_x()
    (s1, h1, g1), (s2, h2, g2) = (run_potential(x, b, reset="soft", **PARAMS) for b in ("fused", "reference"))
    assert torch.equal(s1, s2) and torch.equal(h1, h2) and rel_err(g1, g2) < 1e-5


def test_potential_is_the_membrane_not_the_current():
    """One pulse: i decays geometrically, h = decay * v + i accumulates it."""
    x = torch.zeros(4, 1, 1, device=DEVICE)
    x[0] = 1.0
    for backend in ("fused", "reference"):
        _, h = F.cuba(x, decay=1.0, syn_decay=0.5, threshold=10.0, backend=backend, return_potential=True)
        torch.testing.assert_close(h.flatten(), torch.tensor([1.0, 1.5, 1.75, 1.875], device=DEVICE))


def test_potential_only_and_double_backward():
    """dL/dh alone reaches x; a penalty on that gradient (create_graph) matches the reference."""
    check_potential_only_and_double_backward(F.cuba, rand(7, 2, 9, seed=23), **PARAMS)


def test_module_record_potential():
    check_module_record_potential(snn.CUBA, F.cuba, rand(8, 3, 4, 2, seed=24), **PARAMS)


# ---- initial state (state0 = (v0, i0)) ----

def assert_state_match(x, state0, **kw):
    shared_assert_state_match(F.cuba, ("v0", "i0"), x, state0, **kw)


def state0_for(x, seed=30):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(x.shape[1:], generator=g).to(DEVICE) for _ in range(2))


@pytest.mark.parametrize("reset,detach", list(itertools.product(["hard", "soft", "none", "subtract"], [False, True])))
def test_initial_state_matches_reference(reset, detach, monkeypatch):
    """Nonzero (v0, i0) over several chunks and programs: spikes and h exact, dL/dx, dL/dv0, dL/di0."""
    small_chunks(monkeypatch)
    x = rand(9, 2, 37, seed=31 + detach)
    assert_state_match(x, state0_for(x), reset=reset, detach_reset=detach, surrogate="atan", **PARAMS)


@pytest.mark.parametrize("which", ["v0", "i0"])
def test_initial_state_either_may_be_none(which, monkeypatch):
    small_chunks(monkeypatch)
    x = rand(6, 3, 13, seed=32)
    v0, i0 = state0_for(x)
    assert_state_match(x, (v0, None) if which == "v0" else (None, i0), reset="soft", **PARAMS)
    for backend in ("fused", "reference"):  # (None, None) is no state at all
        assert torch.equal(F.cuba(x, backend=backend, state0=(None, None), **PARAMS),
                           F.cuba(x, backend=backend, **PARAMS))


@pytest.mark.parametrize("make_x", [lambda: rand(1, 3, 7, seed=33),
                                    lambda: rand(6, 9, 4, 5, seed=34).transpose(1, 3)[..., ::2]],
                         ids=["T=1", "non-contiguous"])
def test_initial_state_t1_and_non_contiguous(make_x):
    x = make_x()
    v0, i0 = (t.transpose(-1, -2) for t in state0_for(x.transpose(-1, -2)))
    assert not v0.is_contiguous() and not i0.is_contiguous()
    assert_state_match(x, (v0, i0), reset="soft", **PARAMS)


def test_initial_state_double_backward_matches_reference():
    x = rand(6, 2, 7, seed=35)
    penalties = []
    for backend in ("fused", "reference"):
        xi, vi, ii = (t.clone().requires_grad_(True) for t in (x, *state0_for(x)))
        s = F.cuba(xi, backend=backend, surrogate="sigmoid", state0=(vi, ii), **PARAMS)
        gv, gi = torch.autograd.grad((s * torch.linspace(-1, 1, s.shape[-1], device=s.device)).sum(), (vi, ii), create_graph=True)
        penalties.append(torch.autograd.grad(gv.pow(2).sum() + gi.pow(2).sum(), (xi, vi, ii)))
    for fused, ref in zip(*penalties):
        assert rel_err(fused, ref) < 1e-5


def test_initial_state_compiles_with_the_fused_ops():
    """torch.compile carries (v0, i0) through the triton_ops, their gradients included."""
    import torch._dynamo
    torch._dynamo.reset()

    def f(x, v0, i0):
        s, (v, i) = F.cuba(x, backend="fused", return_state=True, state0=(v0, i0), **PARAMS)
        return (s * x).sum() + v.sum() - i.sum()

    targets = []

    def aot_eager_recording(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    x = rand(6, 2, 5, seed=36)
    results = []
    for fn in (f, torch.compile(f, backend=aot_eager_recording, fullgraph=True)):
        inputs = [t.clone().requires_grad_(True) for t in (x, *state0_for(x))]
        out = fn(*inputs)
        results.append((out, torch.autograd.grad(out, inputs)))
    torch._dynamo.reset()
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert rel_err(b, a) < 1e-6
    assert "spikefuse.cuba_forward.default" in targets, targets


@pytest.mark.parametrize("state0,message", [
    ([torch.zeros(2, 4)] * 3, "state0 must be None or a pair"),
    ((None, torch.zeros(4)), r"i0 must have shape \(2, 4\)"),
    ((torch.zeros(2, 4, dtype=torch.bool, device=DEVICE), None), "v0 must be floating point"),
    ((None, torch.zeros(2, 4, device="meta")), "i0 is on meta"),
])
def test_bad_initial_state_raises_value_error_naming_it(state0, message):
    with pytest.raises(ValueError, match=message):
        F.cuba(rand(3, 2, 4), state0=state0)
