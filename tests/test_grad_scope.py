"""grad_scope: what the secondary gradient threshold decides on. "step" cuts each step by its
own potential (tests/test_grad_threshold.py); "sequence" keeps a neuron's whole surrogate if
its potential reached grad_threshold at some step; "batch" decides per position over the
whole batch. Fused kernels (through the Triton interpreter on CPU) and the loop path against
the PyTorch reference, spikes exactly and gradients to 1e-5."""
import math

import pytest
import torch
import torch._dynamo

import spikefuse.functional as F
import spikefuse.nn as snn
from spikefuse.surrogates import resolve, surrogate_grad

from test_grad_threshold import DEVICE, assert_match, rel_err, run  # the same fixed random loss and checks

INF = float("inf")
SCOPES = ("sequence", "batch")


def rand(*shape, seed=0, scale=0.8, shift=0.2):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + shift).to(DEVICE)


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("surrogate,reset,detach", [("fast_sigmoid", "hard", False), ("atan", "soft", True),
                                                    ("triangle", "hard", True), ("sigmoid", "none", False)])
def test_fused_matches_reference(scope, surrogate, reset, detach):
    """Per-channel PLIF decay, v0 and the final state: every gradient the kernel makes; and the
    scope changes the gradient against the step cut and against no cut."""
    x = rand(9, 3, 5, 4, seed=len(surrogate) + detach, scale=0.5, shift=-0.3)
    kw = dict(decay=torch.linspace(0.3, 0.9, 5).to(DEVICE), v0=rand(3, 5, 4, seed=2, scale=0.3),
              return_state=True, reset=reset, detach_reset=detach, surrogate=surrogate, grad_threshold=0.9)
    got = assert_match(x, grad_scope=scope, **kw)["x"]
    step = run(x, "reference", grad_scope="step", **kw)[1]["x"]
    dense = run(x, "reference", **{**kw, "grad_threshold": -INF})[1]["x"]
    assert not torch.equal(got, step) and not torch.equal(got, dense)


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("shape", [(1, 5), (1, 2, 3), (9, 1), (17, 2, 3, 5), (8, 3, 70), (5, 1, 4)])
def test_odd_shapes(scope, shape):
    """T = 1, a partial last time chunk, several programs, batch 1, 1-D and 4-D trailing shapes."""
    assert_match(rand(*shape, seed=len(shape)), surrogate="fast_sigmoid", grad_threshold=0.9, grad_scope=scope)


@pytest.mark.parametrize("scope", SCOPES)
def test_non_contiguous_input(scope):
    x = rand(6, 9, 4, 5, seed=4).transpose(1, 3)[..., ::2]
    assert not x.is_contiguous()
    assert_match(x, reset="soft", surrogate="triangle", grad_threshold=0.9, grad_scope=scope)


@pytest.mark.parametrize("scope", SCOPES)
def test_loop_path_matches_reference(scope):
    """backend="auto" on a CPU float32/float64 tensor is the loop path (spikefuse.ops.lif_loop)."""
    if DEVICE != "cpu":
        pytest.skip("the loop path runs on the CPU")
    for dtype in (torch.float32, torch.float64):
        assert_match(rand(11, 3, 6, seed=3).to(dtype), backend="auto", decay=torch.tensor(0.8, dtype=dtype),
                     v0=rand(3, 6, seed=5, scale=0.3).to(dtype), return_state=True, surrogate="atan",
                     grad_threshold=0.9, grad_scope=scope)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_hand_check(backend):
    """Two samples, three neurons, T = 2, decay 0 (h = x): neuron 0 reaches 0.9 in sample 0 at
    step 1 only; neuron 1 never; neuron 2 in sample 1 at step 0. The gradient of sum(s) is the
    surrogate where kept and exactly 0 elsewhere."""
    x = torch.tensor([[[0.1, 0.2, 0.3], [0.5, 0.4, 0.95]],
                      [[0.92, 0.1, 0.2], [0.3, 0.6, 0.1]]], device=DEVICE)
    name, alpha = resolve("fast_sigmoid", None)
    sg = surrogate_grad(x - 1.0, name, alpha)
    kept = {"step": x >= 0.9,
            "sequence": torch.tensor([[True, False, False], [False, False, True]], device=DEVICE).expand(2, 2, 3),
            "batch": torch.tensor([True, False, True], device=DEVICE).expand(2, 2, 3)}
    for scope, keep in kept.items():
        xi = x.clone().requires_grad_()
        spikes = F.lif(xi, decay=0.0, threshold=1.0, surrogate="fast_sigmoid", grad_threshold=0.9,
                       grad_scope=scope, backend=backend)
        (gx,) = torch.autograd.grad(spikes.sum(), xi)
        torch.testing.assert_close(gx, torch.where(keep, sg, 0.0), rtol=1e-6, atol=0)


def test_batch_scope_keeps_the_step_cuts_carrying_columns():
    """Under "batch" the positions that carry any gradient are those of the step cut: a
    following sparse Linear lists the same columns, and gets their whole gradient."""
    x = rand(12, 4, 40, seed=6, scale=0.5, shift=-0.3)
    carrying = {}
    for scope in ("step", "batch"):
        _, g = run(x, "fused", surrogate="fast_sigmoid", grad_threshold=0.9, grad_scope=scope)
        carrying[scope] = (g["x"] != 0).flatten(0, 1).any(0)
    assert 0 < carrying["step"].sum() < 40
    assert torch.equal(carrying["step"], carrying["batch"])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf * 0
@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_nan_is_never_cut(scope, backend):
    """A neuron whose potential is NaN counts as reached: its gradient stays NaN, not 0; under
    "batch" the other sample's neuron at that position keeps its (finite) surrogate too."""
    x = rand(5, 2, 6, seed=7, scale=0.2, shift=-1.0)  # far below the cut
    x[3, 1, 2] = math.nan
    _, g = run(x, backend, surrogate="atan", grad_threshold=0.9, grad_scope=scope)
    assert g["x"][:, 1, 2].isnan().any()
    beside = g["x"][:, 0, 2]
    assert not beside.isnan().any()
    assert (beside != 0).all() if scope == "batch" else torch.equal(beside, torch.zeros_like(beside))
    others = torch.ones_like(g["x"], dtype=torch.bool)
    others[:, :, 2] = False
    assert torch.equal(g["x"][others], torch.zeros_like(g["x"][others]))


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_minus_inf_ignores_the_scope(scope, backend):
    x = rand(7, 3, 11, seed=8)
    (s1, g1), (s2, g2) = run(x, backend, grad_threshold=-INF, grad_scope=scope), run(x, backend)
    assert torch.equal(s1, s2) and torch.equal(g1["x"], g2["x"])


@pytest.mark.parametrize("value", ["neuron", "Step", None, 1, ("step",)])
def test_bad_values_are_refused(value):
    x = rand(3, 2, 4)
    for call in (lambda: F.lif(x, grad_threshold=0.9, grad_scope=value),
                 lambda: F.lif(x, grad_scope=value, backend="fused"),
                 lambda: snn.LIF(grad_threshold=0.9, grad_scope=value)):
        with pytest.raises(ValueError, match="grad_scope"):
            call()


def test_modules_pass_it_through():
    x = rand(8, 2, 3, 5, seed=9)
    assert "grad_scope" not in repr(snn.LIF(grad_threshold=0.9))
    for make in (lambda **kw: snn.LIF(decay=0.6, **kw), lambda **kw: snn.PLIF(channels=3, surrogate="atan", **kw)):
        grads = []
        for backend in ("fused", "reference"):
            layer = make(grad_threshold=0.9, grad_scope="batch", backend=backend).to(DEVICE)
            assert layer.grad_scope == "batch" and "grad_scope='batch'" in repr(layer)
            xi = x.clone().requires_grad_()
            loss = (layer(xi) * torch.linspace(-1, 1, x.numel(), device=DEVICE).view(x.shape)).sum()
            grads.append(torch.autograd.grad(loss, [xi, *layer.parameters()]))
        for a, b in zip(*grads):
            assert rel_err(a, b) < 1e-5
        step = make(grad_threshold=0.9, backend="reference").to(DEVICE)  # the module must pass the scope on
        xi = x.clone().requires_grad_()
        loss = (step(xi) * torch.linspace(-1, 1, x.numel(), device=DEVICE).view(x.shape)).sum()
        assert rel_err(torch.autograd.grad(loss, xi)[0], grads[1][0]) > 1e-3


@pytest.mark.parametrize("scope", SCOPES)
def test_double_backward_takes_the_scope(scope):
    """create_graph=True differentiates the reference: its first derivative keeps the scope's cut."""
    x0 = rand(5, 2, 7, seed=10)
    results = []
    for backend in ("fused", "reference"):
        x = x0.clone().requires_grad_()
        s = F.lif(x, decay=0.7, surrogate="sigmoid", grad_threshold=0.9, grad_scope=scope, backend=backend)
        g = torch.linspace(-1, 1, s.numel(), device=DEVICE).view(s.shape)
        (gx,) = torch.autograd.grad((s * g).sum(), x, create_graph=True)
        results.append((gx, *torch.autograd.grad(gx.pow(2).sum(), x)))
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("scope", SCOPES)
def test_torch_compile_matches_eager(scope):
    """The torch.library ops carry grad_scope: the traced forward writes the flags, the traced
    backward reads them."""
    torch._dynamo.reset()
    inputs = (rand(7, 2, 3, 4, seed=11), torch.tensor([0.5, 0.7, 0.9], device=DEVICE),
              rand(2, 3, 4, seed=12, scale=0.3))

    def step(backend, x, decay, v0):
        spikes, v = F.lif(x, decay=decay, v0=v0, return_state=True, surrogate="atan",
                          grad_threshold=0.9, grad_scope=scope, backend=backend)
        g = torch.linspace(-1, 1, spikes.numel(), device=DEVICE).view(spikes.shape)
        return (spikes * g).sum() + v.sum()

    compiled = torch.compile(lambda *a: step("fused", *a), backend="aot_eager", fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in inputs]
    got = torch.autograd.grad(compiled(*leaves), leaves)
    ref = [t.clone().requires_grad_() for t in leaves]
    for a, b in zip(got, torch.autograd.grad(step("reference", *ref), ref)):
        assert rel_err(a, b) < 1e-5
    torch._dynamo.reset()
