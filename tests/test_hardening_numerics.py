"""Issue 36, the numerical cases, by class of attack: a parameter the fused BNLIF took and the
reference refused (one check, one message, every backend); an initial state of another dtype
than x (the results in x's dtype on every backend); NaN input (gradients NaN in the same
places on the reference as in the fused kernels: NaN in, NaN out). Fused kernels on CPU
tensors run through Triton's interpreter: tiny shapes."""
import itertools

import pytest
import torch

import spikefuse.functional as F
from spikefuse import nn
from helpers import DEVICE, rel_err

nan, inf = float("nan"), float("inf")
BACKENDS = ("fused", "reference", "auto")


def randn(*shape, seed=0, shift=0.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) + shift).to(DEVICE, dtype)


# ---- 1. BNLIF's LIF options: the fused path took threshold=inf (no spikes, no word) and
# v_reset=nan, which the reference refused at its first forward

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option,value", [("threshold", inf), ("threshold", -inf), ("threshold", nan),
                                          ("v_reset", nan), ("v_reset", inf), ("threshold", "1.0"),
                                          ("v_reset", torch.tensor(0.0))])
def test_bn_lif_refuses_a_non_finite_option_on_every_backend(backend, option, value):
    with pytest.raises(TypeError, match=rf"^{option} must be a finite Python number, got "):
        nn.BNLIF(3, backend=backend, **{option: value})


@pytest.mark.parametrize("backend", BACKENDS)
def test_bn_lif_checks_an_option_set_after_construction(backend):
    layer = nn.BNLIF(3, backend=backend).to(DEVICE)
    with pytest.raises(TypeError, match="^threshold must be a finite Python number, got inf$"):
        layer.threshold = inf  # refused where it is set (its NeuronOptions), not at the next forward
    assert layer.threshold == 1.0 and layer(randn(2, 2, 3, 4)).shape == (2, 2, 3, 4)


@pytest.mark.parametrize("make", [
    lambda b: nn.spiking_layers.ConvBNLIF(2, 3, backend=b, threshold=inf),
    lambda b: nn.spiking_layers.LinearBNLIF(2, 3, backend=b, v_reset=nan),
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_blocks_built_on_bn_lif_refuse_too(make, backend):
    with pytest.raises(TypeError, match="must be a finite Python number"):
        make(backend)


def test_bn_lif_finite_options_give_the_same_spikes_on_both_backends():
    x = randn(4, 2, 3, 5, seed=1)
    out = [nn.BNLIF(3, threshold=0.2, v_reset=-0.3, reset="hard", backend=b).to(DEVICE)(x) for b in ("fused", "reference")]
    assert out[0].sum() > 0 and torch.equal(*out)


# ---- 2. an initial state of another dtype than x: every path gives x's dtype, as the fused
# kernels do (they read the state into float32); its gradient comes in its own dtype

def neuron_with_state(name, x, state, backend, **kw):
    """(spikes, h, final state tuple) of `name` started from `state` (two tensors; lif: v0 only)."""
    if name == "lif":
        s, h, v = F.lif(x, v0=state[0], backend=backend, return_state=True, return_potential=True, **kw)
        return s, h, (v,)
    fn = F.alif if name == "alif" else F.cuba
    return fn(x, state0=tuple(state), backend=backend, return_state=True, return_potential=True, **kw)


@pytest.mark.parametrize("name", ["lif", "alif", "cuba"])
@pytest.mark.parametrize("state_dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_initial_state_of_another_dtype_keeps_x_dtype_on_every_backend(name, state_dtype):
    x = randn(6, 2, 5, seed=2, shift=0.5)
    results = {}
    for backend in BACKENDS:
        state = [randn(2, 5, seed=3 + i).to(state_dtype).requires_grad_() for i in range(2)]
        s, h, final = neuron_with_state(name, x, state, backend, reset="soft", surrogate="atan")
        assert s.dtype == h.dtype == torch.float32 and all(t.dtype == torch.float32 for t in final), backend
        used = state[:len(final)]
        grads = torch.autograd.grad((s * randn(*s.shape, seed=9)).sum() + h.sum(), used)
        assert [g.dtype for g in grads] == [state_dtype] * len(used), backend
        results[backend] = (s, h, final, grads)
    ref = results["reference"]
    for backend in ("fused", "auto"):
        s, h, final, grads = results[backend]
        assert torch.equal(s, ref[0]), backend  # spikes exactly
        assert rel_err(h, ref[1]) < 1e-5
        for a, b in zip((*final, *grads), (*ref[2], *ref[3])):
            assert rel_err(a, b) < (1e-5 if state_dtype == torch.float64 else 1e-2), backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_plif_decay_of_another_dtype_keeps_x_dtype(backend):
    x = randn(5, 2, 3, seed=4, shift=0.6)
    decay = torch.tensor([0.3, 0.5, 0.9], dtype=torch.float64, device=DEVICE, requires_grad=True)
    s, h, v = F.plif(x, decay, backend=backend, return_state=True, return_potential=True)
    assert s.dtype == h.dtype == v.dtype == torch.float32
    (g,) = torch.autograd.grad((s * randn(*s.shape, seed=5)).sum(), decay)
    assert g.dtype == torch.float64


# ---- 3. NaN input: the reference's gradients are NaN where the fused kernels' are (it gave 0
# at the last step of a NaN neuron with the rectangular surrogate: autograd skips the final
# state's unused adjoint, where the kernels multiply its 0 by a NaN)

W = randn(3, 3, seed=6) * 0.6


def gradients(name, backend, x, weight_grad, **kw):
    """dL/dx (and dL/dweight for the recurrent neurons), L = <spikes, g>."""
    x = x.clone().requires_grad_()
    w = W.clone().requires_grad_(weight_grad)
    call = {"lif": lambda: F.lif(x, backend=backend, **kw),
            "alif": lambda: F.alif(x, backend=backend, **kw), "cuba": lambda: F.cuba(x, backend=backend, **kw),
            "rlif": lambda: F.rlif(x, w, backend=backend, **kw), "ralif": lambda: F.ralif(x, w, backend=backend, **kw)}
    s = call[name]()
    leaves = [x, w] if name.startswith("r") and weight_grad else [x]
    return s, torch.autograd.grad((s * randn(*s.shape, seed=7)).sum(), leaves)


PLACEMENTS = {"first step": [(0, 0, 0)], "middle": [(2, 1, 1)], "last step": [(4, 0, 2)],
              "two neurons": [(1, 0, 1), (3, 1, 2)], "a whole step": [(2, slice(None), slice(None))]}


def nan_cases():
    for name, (reset, detach), surrogate in itertools.product(
            ["lif", "alif", "cuba", "rlif", "ralif"], [("hard", False), ("soft", False), ("none", False), ("hard", True)],
            ["rectangular", "triangle"]):
        yield name, reset, detach, surrogate


@pytest.mark.parametrize("name,reset,detach,surrogate", nan_cases())
def test_nan_input_gives_nan_gradients_where_the_fused_kernels_do(name, reset, detach, surrogate):
    """Spikes NaN alike, gradients NaN in the same places, equal elsewhere. With the
    rectangular surrogate (0 at NaN) and no reset slope to multiply (soft with a fixed
    threshold, none, detach_reset) both give no NaN gradient at all."""
    nan_seen = 0
    for where, positions in PLACEMENTS.items():
        x = randn(5, 2, 3, seed=8, shift=0.8)
        for pos in positions:
            x[pos] = nan
        results = [gradients(name, b, x, weight_grad=name.startswith("r"), reset=reset, detach_reset=detach,
                             surrogate=surrogate) for b in ("fused", "reference")]
        (s1, g1), (s2, g2) = results
        assert torch.equal(s1.isnan(), s2.isnan()), where
        for what, a, b in zip(("x", "weight"), g1, g2):
            assert torch.equal(a.isnan(), b.isnan()), f"{where}: dL/d{what} NaN at different places"
            nan_seen += int(a.isnan().sum())
            both = ~a.isnan()
            assert rel_err(a[both], b[both]) < 1e-5, f"{where}: dL/d{what}"
    if surrogate != "rectangular" or (reset == "hard" and not detach):
        assert nan_seen > 0, "degenerate: no NaN gradient anywhere"


@pytest.mark.parametrize("name", ["alif", "cuba", "rlif", "ralif"])
def test_nan_gradient_places_on_auto_follow_the_kernels(name):
    """On the CPU `auto` takes the reference: the issue's case (default options)."""
    x = randn(5, 2, 3, seed=9, shift=0.8)
    x[0, 0, 0] = nan
    g_fused = gradients(name, "fused", x, False)[1][0]
    g_auto = gradients(name, "auto", x, False)[1][0]
    assert g_fused[:, 0, 0].isnan().all() and torch.equal(g_fused.isnan(), g_auto.isnan())


@pytest.mark.parametrize("name", ["alif", "cuba"])
def test_nan_gradients_with_a_loss_on_the_potential_or_the_state(name):
    """The tie that gives the last step its 0 * NaN also runs when only h, or only the final
    state, carries the loss."""
    x = randn(5, 2, 3, seed=10, shift=0.8)
    x[1, 1, 0] = nan
    for loss_on in ("h", "state"):
        grads = []
        for backend in ("fused", "reference"):
            xi = x.clone().requires_grad_()
            fn = F.alif if name == "alif" else F.cuba
            s, h, (v, other) = fn(xi, backend=backend, return_state=True, return_potential=True)
            loss = (h * randn(*h.shape, seed=11)).sum() if loss_on == "h" else (v * 0.5 + other).sum()
            grads.append(torch.autograd.grad(loss, xi)[0])
        assert grads[0].isnan().any() and torch.equal(grads[0].isnan(), grads[1].isnan()), loss_on


def test_finite_gradients_are_unchanged_by_the_tie():
    """Without NaN, the reference's gradients are those of the plain equations (the fused
    kernels' to 1e-5), bit for bit whether or not the last step is tied."""
    x = randn(6, 2, 4, seed=12, shift=0.6)
    for name, kw in itertools.product(["alif", "ralif"], [dict(reset="hard"), dict(reset="soft")]):
        W4 = randn(4, 4, seed=13) * 0.5
        grads = []
        for backend in ("fused", "reference"):
            xi = x.clone().requires_grad_()
            s = F.alif(xi, backend=backend, **kw) if name == "alif" else F.ralif(xi, W4, backend=backend, **kw)
            grads.append(torch.autograd.grad((s * randn(*s.shape, seed=14)).sum(), xi)[0])
        assert rel_err(*grads) < 1e-5, (name, kw)
