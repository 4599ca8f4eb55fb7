"""The CPU loop LIF (spikefuse.ops.lif_loop, what backend="auto" runs on a float32/float64 CPU
tensor) against the oracle spikefuse.reference.lif: spikes and v[T-1] exactly equal (NaN
where NaN), gradients to 1e-5 (norm-wise), and the reference's non-finite policy."""
import itertools

import pytest
import torch

import spikefuse.functional as F
from spikefuse import NeuronOptions
from spikefuse.ops.lif_loop import lif_loop
from spikefuse.surrogates import SURROGATES
from helpers import rel_err

nan, inf = float("nan"), float("inf")
RESETS = ["hard", "soft", "none", "subtract"]


def run(backend, x, decay=0.7, v0=None, return_state=False, loss_on_spikes=True, **options):
    """Spikes, v[T-1] and the gradients of a random linear loss w.r.t. x, a tensor decay, v0."""
    leaves = [t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) else None for t in (x, decay, v0)]
    xi, di, vi = leaves
    if x.dim() >= 3 and not x.is_contiguous():  # keep the caller's strides
        xi = x.detach().clone().requires_grad_()
        leaves[0] = xi
    out = F.lif(xi, decay=di if di is not None else decay, v0=vi, return_state=return_state,
                backend=backend, **options)
    spikes, v = out if return_state else (out, None)
    g = torch.randn(spikes.shape, generator=torch.Generator().manual_seed(1), dtype=spikes.dtype)
    loss = (spikes * g).nan_to_num(0.0, 0.0, 0.0).sum() if loss_on_spikes else 0.0
    if v is not None:
        w = torch.linspace(-1, 1, max(v.numel(), 1), dtype=v.dtype)[:v.numel()].view(v.shape)
        loss = loss + (v * w).nan_to_num(0.0, 0.0, 0.0).sum()
    wrt = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(loss, wrt))
    return spikes, v, [next(grads) if t is not None else None for t in leaves], out


def same_values(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.25, inf, -inf),
                                                             b.nan_to_num(0.25, inf, -inf))


def assert_match(x, rtol=1e-5, finite_only=False, **kw):
    loop = run("auto", x, **kw)
    ref = run("reference", x, **kw)
    assert "LIFLoop" in type(loop[0].grad_fn).__name__  # auto took the loop
    assert loop[0].shape == ref[0].shape and loop[0].dtype == ref[0].dtype
    assert same_values(loop[0], ref[0]), "spikes differ"
    if ref[1] is not None:
        assert same_values(loop[1], ref[1]), "v[T-1] differs"
    for name, g1, g2 in zip(("x", "decay", "v0"), loop[2], ref[2]):
        if g2 is None:
            assert g1 is None
            continue
        if finite_only:  # the policy: never finite where the reference is NaN; agree where both are finite
            assert not (g2.isnan() & g1.isfinite()).any(), f"grad {name}: finite where the reference is NaN"
            both = g1.isfinite() & g2.isfinite()
            g1, g2 = g1[both], g2[both]
        tol = rtol * max(1.0, x.shape[0] / 16) if name == "decay" else rtol
        assert rel_err(g1, g2) < tol or (g1 - g2).abs().max() < 1e-30, f"grad {name}: {rel_err(g1, g2)}"


def rand(*shape, seed=0, scale=0.8, shift=0.35, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)


@pytest.mark.parametrize("reset,surrogate,detach", list(itertools.product(RESETS, SURROGATES,
                                                                          [False, True])))
def test_every_reset_surrogate_and_detach(reset, surrogate, detach):
    assert_match(rand(11, 3, 5, 7), reset=reset, surrogate=surrogate, detach_reset=detach,
                 v_reset=-0.1, threshold=0.9)


@pytest.mark.parametrize("reset,detach", list(itertools.product(RESETS, [False, True])))
@pytest.mark.parametrize("per_channel", [False, True])
def test_plif_decay_v0_state_and_grad_threshold(reset, detach, per_channel):
    x = rand(13, 4, 5, 3, seed=2)
    decay = torch.rand(5, generator=torch.Generator().manual_seed(3)) if per_channel else torch.tensor(0.8)
    v0 = rand(4, 5, 3, seed=4, shift=0.0)
    assert_match(x, decay=decay, v0=v0, return_state=True, reset=reset, detach_reset=detach,
                 surrogate="triangle", alpha=1.3, grad_threshold=0.6)


@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("grad_scope", ["sequence", "batch"])
def test_subtract_float64_decay_zero_and_per_neuron_cut(detach, grad_scope):
    """reset="subtract" at decay 0 (h = x - threshold * s[t-1]), in float64, with a per-neuron cut
    (which also decides v0's spike s[-1])."""
    x = rand(12, 3, 11, seed=6, dtype=torch.float64)
    assert_match(x, decay=0.0, v0=rand(3, 11, seed=7, dtype=torch.float64), return_state=True, reset="subtract",
                 detach_reset=detach, surrogate="atan", grad_threshold=0.5, grad_scope=grad_scope)


@pytest.mark.parametrize("grad_threshold", [0.9, -0.2, float("-inf")])
def test_grad_threshold(grad_threshold):
    assert_match(rand(9, 6, 17, seed=5), surrogate="sigmoid", grad_threshold=grad_threshold, return_state=True)


@pytest.mark.parametrize("shape", [(1, 5, 3), (1,), (7,), (6, 1), (5, 2, 3, 2, 3), (3, 0, 4), (17, 1, 1)])
def test_odd_shapes_and_t1(shape):
    assert_match(rand(*shape, seed=6), return_state=True, surrogate="fast_sigmoid")


def test_only_final_state_used():
    assert_match(rand(8, 3, 4, seed=7), return_state=True, loss_on_spikes=False, v0=rand(3, 4, seed=8))


def test_non_contiguous_input():
    x = rand(9, 7, 5, 3, seed=9).transpose(1, 3)  # [9, 3, 5, 7], strided
    assert not x.is_contiguous()
    assert_match(x, decay=torch.rand(5, generator=torch.Generator().manual_seed(1)), return_state=True)
    assert_match(rand(18, 4, 6, seed=10)[::2], reset="soft")


def test_float64():
    assert_match(rand(10, 3, 5, seed=11, dtype=torch.float64), decay=torch.rand(5, dtype=torch.float64),
                 v0=rand(3, 5, seed=12, dtype=torch.float64), return_state=True, surrogate="atan")


@pytest.mark.parametrize("reset,detach", list(itertools.product(RESETS, [False, True])))
@pytest.mark.parametrize("surrogate", ["rectangular", "sigmoid"])
def test_nan_and_inf_follow_the_reference_policy(reset, detach, surrogate):
    g = torch.Generator().manual_seed(13)
    x = rand(9, 4, 6, seed=14)
    pick = torch.rand(x.shape, generator=g) < 0.1
    specials = torch.tensor([nan, inf, -inf, 3e38, -3e38, 1e-40])[torch.randint(6, x.shape, generator=g)]
    x = torch.where(pick, specials, x)
    decay = torch.rand(6, generator=g)
    decay[2] = nan
    v0 = rand(4, 6, seed=15)
    v0[0, 0] = nan
    assert_match(x, decay=decay, v0=v0, return_state=True, reset=reset, detach_reset=detach,
                 surrogate=surrogate, finite_only=True)
    assert_match(x, decay=0.0, return_state=True, reset=reset, detach_reset=detach, finite_only=True)
    spikes = F.lif(x, decay=decay)
    assert spikes[:, :, 2].isnan().all()  # a NaN decay: NaN spikes from the first step, never zeros


def test_double_backward_falls_back_to_the_reference():
    x0 = rand(7, 3, 5, seed=16)
    decay0 = torch.rand(5, generator=torch.Generator().manual_seed(17))
    results = []
    for backend in ("auto", "reference"):
        x = x0.clone().requires_grad_()
        decay = decay0.clone().requires_grad_()
        spikes = F.lif(x, decay=decay, surrogate="sigmoid", reset="soft", backend=backend)
        if backend == "auto":
            assert "LIFLoop" in type(spikes.grad_fn).__name__
        gx, gd = torch.autograd.grad((spikes * torch.linspace(-1, 1, 5)).sum(), (x, decay), create_graph=True)
        penalty = gx.pow(2).sum() + gd.pow(2).sum()
        results.append(torch.autograd.grad(penalty, (x, decay)))
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-5


def test_auto_takes_the_loop_only_where_it_is_exact():
    x = rand(4, 2, 3).requires_grad_()
    assert "LIFLoop" in type(F.lif(x).grad_fn).__name__
    assert "LIFLoop" not in type(F.lif(x, backend="reference").grad_fn).__name__
    assert "LIFLoop" not in type(F.lif(x.bfloat16()).grad_fn).__name__  # reference in bfloat16
    # a decay tensor of another dtype is cast to x's where it enters (every path alike): exact on the loop
    assert "LIFLoop" in type(F.lif(x, decay=torch.tensor(0.5, dtype=torch.float64)).grad_fn).__name__


def test_inference_saves_nothing_and_direct_call():
    x = rand(5, 2, 3)
    with torch.no_grad():
        assert torch.equal(F.lif(x), F.lif(x, backend="reference"))
    spikes, v = lif_loop(x, 0.5, None, NeuronOptions(), None, True)
    ref, v_ref = F.lif(x, decay=0.5, return_state=True, backend="reference")
    assert torch.equal(spikes, ref) and torch.equal(v, v_ref)


def test_exact_threshold_fires_and_final_state_is_not_aliased():
    x = torch.tensor([[1.0], [0.2], [0.5]])
    spikes, v = F.lif(x, decay=1.0, reset="none", return_state=True)
    assert spikes.flatten().tolist() == [1.0, 1.0, 1.0]
    v.add_(100.0)  # v[T-1] is its own tensor
    assert torch.equal(F.lif(x, decay=1.0, reset="none"), spikes)
