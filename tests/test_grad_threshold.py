"""Sparse backward (grad_threshold): the surrogate gradient is zeroed where h[t] < grad_threshold.
Fused kernels (through the Triton interpreter on CPU) against the PyTorch reference."""
import itertools
import math

import pytest
import torch
import torch._dynamo

import spikefuse.functional as F
import spikefuse.nn as snn
from spikefuse.surrogates import SURROGATES, resolve, surrogate_grad
from helpers import DEVICE, every_value_once, rel_err

INF = float("inf")


def rand(*shape, seed=0, scale=0.8, shift=0.4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + shift).to(DEVICE)


def run(x, backend, decay=0.7, v0=None, return_state=False, fn=F.lif, **kw):
    """Spikes and the gradients of a fixed random loss w.r.t. x, a tensor decay and v0."""
    leaves = [t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) else None for t in (x, decay, v0)]
    xi, di, vi = leaves
    args = {} if fn is F.if_ else {"decay": di if di is not None else decay}
    out = fn(xi, v0=vi, return_state=return_state, backend=backend, **args, **kw)
    spikes, v = out if return_state else (out, None)
    g = torch.randn(spikes.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    loss = (spikes * g).sum()
    if v is not None:
        loss = loss + (v * torch.linspace(-1, 1, v.numel(), device=DEVICE).view(v.shape)).sum()
    wrt = [t for t in leaves if t is not None]
    return spikes, dict(zip(["x", "decay", "v0"], torch.autograd.grad(loss, wrt)))


def assert_match(x, backend="fused", **kw):
    (s1, g1), (s2, g2) = run(x, backend, **kw), run(x, "reference", **kw)
    assert torch.equal(s1, s2), f"spikes differ at {(s1 != s2).sum().item()} places"
    for name in g2:
        assert rel_err(g1[name], g2[name]) < 1e-5, f"grad {name}: {rel_err(g1[name], g2[name])}"
    return g1


CASES = list(itertools.product(sorted(SURROGATES), ["hard", "soft"], [False, True]))


@pytest.mark.parametrize("surrogate,reset,detach", every_value_once(CASES))
def test_fused_matches_reference(surrogate, reset, detach):
    """Per-channel PLIF decay, v0 and the final state: every gradient the kernel makes."""
    x = rand(9, 2, 5, 3, seed=len(surrogate) + detach)
    kw = dict(decay=torch.linspace(0.3, 0.9, 5).to(DEVICE), v0=rand(2, 5, 3, seed=2, scale=0.3),
              return_state=True, reset=reset, detach_reset=detach, surrogate=surrogate)
    grads = {gt: assert_match(x, grad_threshold=gt, **kw) for gt in (0.9, 0.5, -INF)}
    assert not torch.equal(grads[0.9]["x"], grads[-INF]["x"])  # the cut did cut


@pytest.mark.parametrize("shape", [(1, 5), (1, 2, 3), (9, 1), (17, 2, 3, 5), (8, 2, 70)])
def test_odd_shapes(shape):
    """T = 1, a partial last time chunk, several programs, 1-D and 4-D trailing shapes."""
    assert_match(rand(*shape, seed=len(shape)), surrogate="sigmoid", grad_threshold=0.9)


def test_non_contiguous_input():
    x = rand(6, 9, 4, 5, seed=4).transpose(1, 3)[..., ::2]
    assert not x.is_contiguous()
    assert_match(x, reset="soft", surrogate="triangle", grad_threshold=0.9)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf * 0
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_minus_inf_is_bit_identical_to_the_default(backend):
    """Also where h is NaN or infinite: no cut means the default's gradients, NaN for NaN."""
    x = rand(7, 3, 11, seed=5)
    x[2, 0, 3], x[4, 1, 0], x[1, 2, 5] = math.nan, INF, -INF
    for reset, surrogate in [("hard", "atan"), ("soft", "rectangular"), ("none", "fast_sigmoid")]:
        kw = dict(decay=torch.tensor(0.6, device=DEVICE), v0=rand(3, 11, seed=6, scale=0.3),
                  return_state=True, reset=reset, surrogate=surrogate)
        (s1, g1), (s2, g2) = run(x, backend, **kw), run(x, backend, grad_threshold=-INF, **kw)
        torch.testing.assert_close(s1, s2, rtol=0, atol=0, equal_nan=True)
        for name in g1:
            torch.testing.assert_close(g1[name], g2[name], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_hand_check_single_step(backend):
    """T = 1: grad_x = sg(x - threshold) where x >= grad_threshold (equal is kept), exactly 0 below."""
    x = torch.tensor([[0.95, 0.9, 0.89, 0.5, 1.2, -3.0, 2.0]], device=DEVICE).requires_grad_()
    spikes = F.lif(x, threshold=1.0, surrogate="fast_sigmoid", grad_threshold=0.9, backend=backend)
    (gx,) = torch.autograd.grad(spikes.sum(), x)
    kept = x.detach() >= 0.9
    assert torch.equal(gx[~kept], torch.zeros_like(gx[~kept]))
    name, alpha = resolve("fast_sigmoid", None)
    torch.testing.assert_close(gx[kept], surrogate_grad(x.detach() - 1.0, name, alpha)[kept], rtol=1e-6, atol=0)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_reset_path_is_not_cut(backend):
    """A threshold no potential reaches cuts every surrogate: through the spikes nothing is left,
    through the final state (soft reset, detached) exactly what flows without a cut."""
    x = rand(6, 2, 9, seed=7)
    kw = dict(decay=0.8, reset="soft", detach_reset=True, surrogate="atan", backend=backend)
    xi = x.clone().requires_grad_()
    (g_spikes,) = torch.autograd.grad(F.lif(xi, grad_threshold=1e30, **kw).sum(), xi)
    assert torch.equal(g_spikes, torch.zeros_like(g_spikes))
    grads = []
    for gt in (1e30, -INF):
        _, v = F.lif(xi, grad_threshold=gt, return_state=True, **kw)
        grads.append(torch.autograd.grad(v.sum(), xi)[0])
    assert torch.equal(*grads)


@pytest.mark.parametrize("value", [math.nan, INF, "0.9", None, True, torch.tensor(0.9), 10**400])
def test_bad_values_are_refused(value):
    x = rand(3, 2, 4)
    for call in (lambda: F.lif(x, grad_threshold=value), lambda: F.if_(x, grad_threshold=value),
                 lambda: F.plif(x, torch.tensor(0.5, device=DEVICE), grad_threshold=value),
                 lambda: F.lif(x, grad_threshold=value, backend="fused"),
                 lambda: snn.LIF(grad_threshold=value), lambda: snn.PLIF(grad_threshold=value)):
        with pytest.raises(ValueError, match="grad_threshold"):
            call()


def test_if_and_plif_pass_it_through():
    x = rand(8, 2, 3, 5, seed=8, scale=0.5)
    assert_match(x, fn=F.if_, reset="soft", grad_threshold=0.9)
    assert_match(x, fn=F.plif, decay=torch.linspace(0.2, 0.9, 3).to(DEVICE), grad_threshold=0.9)


def test_modules_pass_it_through():
    x = rand(8, 2, 3, 5, seed=9)
    assert "grad_threshold" not in repr(snn.LIF()) + repr(snn.IF()) + repr(snn.PLIF())
    for make in (lambda **kw: snn.LIF(decay=0.6, **kw), lambda **kw: snn.IF(**kw),
                 lambda **kw: snn.PLIF(channels=3, surrogate="atan", **kw)):
        grads = []
        for backend in ("fused", "reference"):
            layer = make(grad_threshold=0.9, backend=backend).to(DEVICE)
            assert layer.grad_threshold == 0.9 and "grad_threshold=0.9" in repr(layer)
            xi = x.clone().requires_grad_()
            loss = (layer(xi) * torch.linspace(-1, 1, x.numel(), device=DEVICE).view(x.shape)).sum()
            grads.append(torch.autograd.grad(loss, [xi, *layer.parameters()]))
        for a, b in zip(*grads):
            assert rel_err(a, b) < 1e-5
        plain = make(backend="reference").to(DEVICE)
        xi = x.clone().requires_grad_()
        loss = (plain(xi) * torch.linspace(-1, 1, x.numel(), device=DEVICE).view(x.shape)).sum()
        assert not torch.equal(torch.autograd.grad(loss, xi)[0], grads[1][0])


def test_double_backward_takes_the_cut():
    """create_graph=True differentiates the reference: its first derivative keeps the cut."""
    x0 = rand(5, 2, 7, seed=10)
    results = []
    for backend in ("fused", "reference"):
        x = x0.clone().requires_grad_()
        s = F.lif(x, decay=0.7, surrogate="sigmoid", grad_threshold=0.9, backend=backend)
        g = torch.linspace(-1, 1, s.numel(), device=DEVICE).view(s.shape)
        (gx,) = torch.autograd.grad((s * g).sum(), x,
                                    create_graph=True)
        results.append((gx, *torch.autograd.grad(gx.pow(2).sum(), x)))
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("grad_threshold", [0.9, -INF])
def test_torch_compile_matches_eager(grad_threshold):
    """The torch.library ops carry grad_threshold into the traced backward kernel."""
    torch._dynamo.reset()
    inputs = (rand(7, 2, 3, 4, seed=11), torch.tensor([0.5, 0.7, 0.9], device=DEVICE),
              rand(2, 3, 4, seed=12, scale=0.3))

    def step(backend, x, decay, v0):
        spikes, v = F.lif(x, decay=decay, v0=v0, return_state=True, surrogate="atan",
                          grad_threshold=grad_threshold, backend=backend)
        g = torch.linspace(-1, 1, spikes.numel(), device=DEVICE).view(spikes.shape)
        return (spikes * g).sum() + v.sum()

    compiled = torch.compile(lambda *a: step("fused", *a), backend="aot_eager", fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in inputs]
    got = torch.autograd.grad(compiled(*leaves), leaves)
    eager = [t.clone().requires_grad_() for t in leaves]
    want = torch.autograd.grad(step("fused", *eager), eager)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-6
    ref = [t.clone().requires_grad_() for t in leaves]
    for a, b in zip(got, torch.autograd.grad(step("reference", *ref), ref)):
        assert rel_err(a, b) < 1e-5
    torch._dynamo.reset()
