"""Fused recurrent ALIF kernels (through the Triton interpreter) against the PyTorch reference.

As in test_recurrent_lif.py, the recurrent weights are multiples of 1/32 in [-1/4, 1/4] and
the spikes are 0/1, so every partial sum of s[t-1] @ W^T is exact in float32: the kernel's
tl.dot and torch's matmul agree bit for bit whatever order they add in, and the spikes can
be compared exactly."""
import itertools
import math

import pytest
import torch
from torch import nn

import spikefuse.functional as F
import spikefuse.nn as snn
from spikefuse import reference
from helpers import DEVICE, rel_err

PARAMS = dict(decay=0.8, adapt_decay=0.7, beta=0.6, threshold=0.9, v_reset=-0.2)


def rand(*shape, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + 0.5).to(dtype).to(DEVICE)


def dyadic_weight(n, seed=0):
    g = torch.Generator().manual_seed(seed + 100)
    return (torch.randint(-8, 9, (n, n), generator=g).float() / 32).to(DEVICE)


def run(x, w, backend, **kw):
    """Spikes, final (v, a) or None, dL/dx and dL/dW for a fixed random loss on every output."""
    xi = x.detach().clone().requires_grad_(True)
    wi = w.detach().clone().requires_grad_(True)
    x_in = xi.float() if backend == "reference" else xi  # the oracle runs in float32
    out = F.ralif(x_in, wi, backend=backend, **kw)
    spikes, state = out if isinstance(out, tuple) else (out, None)
    g = torch.randn(spikes.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    loss = (spikes.float() * g).sum()
    if state is not None:
        v, a = state
        weights = torch.linspace(-1, 1, v.numel(), device=DEVICE).view(v.shape)
        loss = loss + (v * weights).sum() + (a * weights.flip(-1)).sum()
    # materialize: with T = 1 the reference never reaches W (its gradient is zero)
    gx, gw = torch.autograd.grad(loss, [xi, wi], materialize_grads=True)
    return spikes.float(), state, gx, gw


def assert_match(x, w, rtol=1e-5, **kw):
    (s1, st1, gx1, gw1), (s2, st2, gx2, gw2) = run(x, w, "fused", **kw), run(x, w, "reference", **kw)
    assert torch.equal(s1, s2), f"spikes differ at {(s1 != s2).sum().item()} places"
    assert 0 < s2.mean() < 1, "degenerate case: no spikes or all spikes"
    if st1 is not None:
        for fused, ref in zip(st1, st2):
            torch.testing.assert_close(fused, ref, rtol=rtol, atol=1e-6)
    assert gx1.dtype == x.dtype and gx1.shape == x.shape
    assert gw1.dtype == w.dtype and gw1.shape == w.shape
    assert rel_err(gx1, gx2) < rtol, f"grad x: {rel_err(gx1, gx2)}"
    if gw2.any():
        assert rel_err(gw1, gw2) < rtol, f"grad W: {rel_err(gw1, gw2)}"
    else:
        assert not gw1.any()


CASES = list(itertools.product(["hard", "soft", "none"], ["rectangular", "atan"], [False, True]))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_reset_surrogate_and_detach(case):
    reset, surrogate, detach = CASES[case]
    assert_match(rand(7, 3, 13, seed=case), dyadic_weight(13, case), reset=reset, surrogate=surrogate,
                 detach_reset=detach, return_state=case % 2 == 0, **PARAMS)


@pytest.mark.parametrize("shape", [(1, 2, 9), (5, 40), (3, 2, 3, 17), (4, 37, 70)])
def test_shapes(shape):
    """T = 1, [T, N] and [T, B, C, N] inputs, rows and neurons over several tiles (16 x 16)
    and several inner blocks (32), partial tiles."""
    x = rand(*shape, seed=sum(shape), scale=1.5)
    assert_match(x, dyadic_weight(shape[-1], len(shape)), surrogate="fast_sigmoid", return_state=True, **PARAMS)


def test_non_contiguous_input_and_weight():
    x = rand(6, 9, 4, seed=4).transpose(1, 2)[:, :, ::2].transpose(1, 2)  # [6, 5, 4] strided
    w = dyadic_weight(8, 4).t()[:4, :4]  # a transposed slice
    assert not x.is_contiguous() and not w.is_contiguous()
    assert_match(x, w, reset="soft", return_state=True, **PARAMS)


def test_bfloat16_input():
    assert_match(rand(6, 3, 21, seed=3, dtype=torch.bfloat16), dyadic_weight(21, 3), rtol=1e-2,
                 surrogate="sigmoid", **PARAMS)


def test_grad_threshold():
    """The secondary threshold cuts the surrogate where h < grad_threshold, as the reference does."""
    x, w = rand(6, 4, 19, seed=8), dyadic_weight(19, 8)
    assert_match(x, w, surrogate="triangle", grad_threshold=0.6, return_state=True, **PARAMS)
    (_, _, gx_cut, _), (_, _, gx_all, _) = (run(x, w, "fused", grad_threshold=g, surrogate="fast_sigmoid",
                                                **PARAMS) for g in (0.6, float("-inf")))
    assert (gx_cut == 0).sum() > (gx_all == 0).sum()


def test_beta_zero_is_rlif_and_zero_weight_is_alif():
    x, w = rand(9, 3, 13, seed=20), dyadic_weight(13, 20)
    plain = {k: v for k, v in PARAMS.items() if k not in ("beta", "adapt_decay")}
    assert torch.equal(F.ralif(x, w, backend="fused", **{**PARAMS, "beta": 0.0}),
                       F.rlif(x, w, backend="reference", **plain))
    assert torch.equal(F.ralif(x, torch.zeros_like(w), backend="fused", **PARAMS),
                       F.alif(x, backend="reference", **PARAMS))


def test_adaptation_stops_self_excitation():
    """A self-exciting neuron fires for ever as a recurrent LIF; its rising threshold stops it."""
    x = torch.zeros(8, 1, 1, device=DEVICE)
    x[0] = 1.5
    w = torch.full((1, 1), 1.75, device=DEVICE)
    rlif = F.rlif(x, w, decay=0.5, backend="fused").flatten().tolist()
    ralif = F.ralif(x, w, decay=0.5, beta=0.5, adapt_decay=0.9, backend="fused").flatten().tolist()
    assert rlif == [1.0] * 8
    assert ralif == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_only_final_state_used():
    x, w = rand(5, 2, 8, seed=10), dyadic_weight(8, 10)
    grads = []
    for backend in ("fused", "reference"):
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        _, (v, a) = F.ralif(xi, wi, backend=backend, return_state=True, reset="soft", **PARAMS)
        grads.append(torch.autograd.grad(v.sum() + 2 * a.sum(), [xi, wi]))
    assert rel_err(grads[0][0], grads[1][0]) < 1e-5 and rel_err(grads[0][1], grads[1][1]) < 1e-5


def test_weight_only_needs_grad_and_inference():
    x, w = rand(5, 2, 8, seed=16), dyadic_weight(8, 16)
    gws = []
    for backend in ("fused", "reference"):
        wi = w.clone().requires_grad_(True)
        gws.append(torch.autograd.grad(F.ralif(x, wi, backend=backend, **PARAMS).sum(), wi)[0])
    assert rel_err(*gws) < 1e-5
    with torch.no_grad():
        s = F.ralif(x, w, backend="fused", **PARAMS)
    assert torch.equal(s, F.ralif(x, w, backend="reference", **PARAMS))


def test_double_backward_matches_reference():
    x, w = rand(5, 2, 7, seed=13), dyadic_weight(7, 13)
    penalties = []
    for backend in ("fused", "reference"):
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        s = F.ralif(xi, wi, backend=backend, surrogate="sigmoid", **PARAMS)
        gx, gw = torch.autograd.grad((s * torch.linspace(-1, 1, s.shape[-1], device=DEVICE)).sum(), [xi, wi],
                                     create_graph=True)
        penalties.append(torch.autograd.grad(gx.pow(2).sum() + gw.pow(2).sum(), [xi, wi]))
    assert all(rel_err(a, b) < 1e-5 for a, b in zip(*penalties))


BAD = [
    (dict(decay=0.0), "decay"), (dict(decay=1.5), "decay"), (dict(adapt_decay=0.0), "adapt_decay"),
    (dict(adapt_decay=1.01), "adapt_decay"), (dict(beta=-0.1), "beta"), (dict(beta=float("nan")), "beta"),
    (dict(threshold=float("nan")), "threshold"), (dict(v_reset=float("inf")), "v_reset"),
    (dict(reset="bogus"), "reset"), (dict(surrogate="bogus"), "surrogate"), (dict(alpha=-1.0), "alpha"),
    (dict(grad_threshold=float("inf")), "grad_threshold"), (dict(backend="gpu"), "backend"),
    (dict(weight=torch.zeros(4, 3)), r"weight must be \[N, N\] = \[4, 4\]"),
    (dict(weight=torch.zeros(4, 4, dtype=torch.int32)), "weight must be a floating"),
    (dict(weight=[[0.0] * 4] * 4), "weight must be a tensor"),
]


@pytest.mark.parametrize("kw,name", BAD, ids=[f"{name[:14]}-{i}" for i, (_, name) in enumerate(BAD)])
def test_bad_arguments_raise_value_error_naming_them(kw, name):
    kw = dict(kw)
    w = kw.pop("weight", torch.zeros(4, 4))
    with pytest.raises(ValueError, match=name):
        F.ralif(torch.zeros(3, 2, 4), w, **kw)


@pytest.mark.parametrize("x,name", [
    (torch.zeros(3), "2 or more dims"), (torch.zeros(0, 2, 4), "T == 0"),
    (torch.zeros(3, 2, 4, dtype=torch.int64), "x must be a floating"),
])
def test_bad_input_raises_value_error(x, name):
    with pytest.raises(ValueError, match=name):
        F.ralif(x, torch.zeros(x.shape[-1], x.shape[-1]) if x.dim() else torch.zeros(1, 1))


def test_module():
    layer = snn.RecurrentALIF(6, decay=0.9, adapt_decay=0.8, beta=0.3, threshold=0.5, surrogate="atan",
                              grad_threshold=0.2).to(DEVICE)
    assert layer.weight.shape == (6, 6) and layer.weight.abs().max() <= 1 / math.sqrt(6)
    assert "RecurrentALIF(6" in repr(layer) and "beta=0.3" in repr(layer) and "grad_threshold=0.2" in repr(layer)
    x = rand(5, 2, 6, seed=14)
    assert torch.equal(layer(x), reference.ralif(x, layer.weight.detach(), 0.9, 0.8, 0.3, 0.5, surrogate="atan"))
    with pytest.raises(ValueError, match="expected 6 features"):
        layer(torch.zeros(3, 2, 5, device=DEVICE))
    with pytest.raises(ValueError, match="3 or more dims"):
        layer(torch.zeros(3, 6, device=DEVICE))
    for kw, name in ((dict(features=0), "features"), (dict(features=4, beta=-1.0), "beta"),
                     (dict(features=4, adapt_decay=2.0), "adapt_decay")):
        with pytest.raises(ValueError, match=name):
            snn.RecurrentALIF(**kw)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_module_trains_in_sequential(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), snn.RecurrentALIF(10, decay=0.9, threshold=0.5, surrogate="atan",
                                                               backend=backend), nn.Linear(10, 3)).to(DEVICE)
    x = torch.randn(8, 4, 6, device=DEVICE) * 2
    before = [p.detach().clone() for p in model.parameters()]
    model(x).mean(0).pow(2).sum().backward()
    assert model[1].weight.grad.abs().sum() > 0, "no gradient reached the recurrent weight"
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_compile_uses_the_fused_ops():
    """torch.compile (aot_eager on CPU) traces the triton_ops in one graph, with eager's outputs."""
    import torch._dynamo
    torch._dynamo.reset()

    def f(x, w):
        s, (v, a) = F.ralif(x, w, backend="fused", return_state=True, reset="soft", **PARAMS)
        return s.sum() * 0.5 + (s * x).sum() + v.sum() + a.sum()

    targets = []

    def aot_eager_recording(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    x, w = rand(6, 2, 5, seed=15), dyadic_weight(5, 15)
    results = []
    for fn in (f, torch.compile(f, backend=aot_eager_recording, fullgraph=True)):
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        out = fn(xi, wi)
        results.append((out, *torch.autograd.grad(out, [xi, wi])))
    torch._dynamo.reset()
    (o1, gx1, gw1), (o2, gx2, gw2) = results
    assert torch.equal(o1, o2) and rel_err(gx2, gx1) < 1e-6 and rel_err(gw2, gw1) < 1e-6
    assert "spikefuse.ralif_forward.default" in targets, targets


# ---- return_potential / record_potential ----

def run_potential(x, w, backend, **kw):
    """Spikes, h, and the gradients of x and W for a fixed random loss on h alone, then for one
    on h, the spikes and the final state (dL/dx, dL/dW, dL/dx, dL/dW)."""
    xi, wi = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    s, h, (v, a) = F.ralif(xi, wi, backend=backend, return_potential=True, return_state=True, **kw)
    g = torch.Generator().manual_seed(2)
    loss_h = (h * torch.randn(h.shape, generator=g).to(DEVICE)).sum()
    loss_all = loss_h + (s * torch.randn(s.shape, generator=g).to(DEVICE)).sum() + v.sum() - a.sum()
    # materialize: with T = 1 the reference never reaches W (its gradient is zero)
    grads_h = torch.autograd.grad(loss_h, [xi, wi], retain_graph=True, materialize_grads=True)
    return s, h, grads_h + torch.autograd.grad(loss_all, [xi, wi], materialize_grads=True)


def assert_potential_match(x, w, **kw):
    (s1, h1, g1), (s2, h2, g2) = (run_potential(x, w, b, **kw) for b in ("fused", "reference"))
    assert torch.equal(s1, s2) and 0 < s2.mean() < 1
    assert h1.dtype == x.dtype and h1.shape == x.shape
    assert torch.equal(h1, h2), "fused h must be the reference's exactly"
    for name, fused, ref in zip(("x (h)", "W (h)", "x (all)", "W (all)"), g1, g2):
        if ref.any():
            assert rel_err(fused, ref) < 1e-5, f"grad {name}: {rel_err(fused, ref)}"
        else:
            assert not fused.any(), f"grad {name} should be zero"


@pytest.mark.parametrize("reset,detach", list(itertools.product(["hard", "soft", "none"], [False, True])))
def test_potential_matches_reference(reset, detach):
    seed = 30 + len(reset) + detach
    assert_potential_match(rand(7, 3, 13, seed=seed), dyadic_weight(13, seed), reset=reset, detach_reset=detach,
                           surrogate="atan", **PARAMS)


@pytest.mark.parametrize("make_x", [lambda: rand(1, 3, 9, seed=40, scale=1.5),
                                    lambda: rand(6, 9, 4, seed=41).transpose(1, 2)[:, :, ::2].transpose(1, 2)],
                         ids=["T=1", "non-contiguous"])
def test_potential_t1_and_non_contiguous(make_x):
    x = make_x()
    assert_potential_match(x, dyadic_weight(x.shape[-1], 42), reset="soft", **PARAMS)


def test_potential_only_and_double_backward():
    """return_potential alone gives (spikes, h); a penalty on the gradients of a loss on h
    (create_graph) matches the reference's."""
    x, w = rand(6, 2, 9, seed=43), dyadic_weight(9, 43)
    results = []
    for backend in ("fused", "reference"):
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        out = F.ralif(xi, wi, backend=backend, return_potential=True, surrogate="sigmoid", **PARAMS)
        assert isinstance(out, tuple) and len(out) == 2
        spikes, h = out
        gx, gw = torch.autograd.grad(h.pow(2).sum() + spikes.sum(), [xi, wi], create_graph=True)
        penalty = torch.autograd.grad(gx.pow(2).sum() + gw.pow(2).sum(), [xi, wi])
        results.append((gx.detach(), gw.detach(), *penalty))
    assert all(rel_err(a, b) < 1e-5 for a, b in zip(*results))


def test_module_record_potential():
    x, w = rand(6, 2, 3, 7, seed=44), dyadic_weight(7, 44)
    assert snn.RecurrentALIF(7, device=DEVICE).potential is None
    results = []
    for backend in ("fused", "reference"):
        layer = snn.RecurrentALIF(7, backend=backend, record_potential=True, device=DEVICE, **PARAMS)
        with torch.no_grad():
            layer.weight.copy_(w)
        s = layer(x)
        assert isinstance(s, torch.Tensor) and layer.potential.shape == x.shape
        layer.potential.pow(2).sum().backward()
        results.append((s, layer.potential.detach(), layer.weight.grad))
    (s1, h1, gw1), (s2, h2, gw2) = results
    assert torch.equal(s1, s2) and torch.equal(h1, h2) and rel_err(gw1, gw2) < 1e-5
    assert torch.equal(s1, F.ralif(x, w, backend="reference", **PARAMS))
