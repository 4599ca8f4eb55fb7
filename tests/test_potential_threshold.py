"""The pre-reset potential trace (return_potential) and the learnable threshold of the LIF
family: every backend against spikefuse.reference (fused through the Triton interpreter),
module options, bad input. A tensor threshold runs fused (its gradient from the backward
kernel) where a float one would, and on the reference on the CPU's auto path; its gradient
is also checked against a derivation from the LIF equations (docs/neurons.md)."""
import warnings

import pytest
import torch

import spikefuse.functional as F
from spikefuse import nn
from helpers import DEVICE, rel_err

BACKENDS = ("fused", "auto", "reference")


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + 0.3).to(DEVICE)


def run(x, backend, return_state=False, **kw):
    """(spikes, h, v or None, grads by name) of a loss on the spikes, on h and on v[T-1]."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in kw.items() if isinstance(v, torch.Tensor)}
    xi = x.detach().clone().requires_grad_(True)
    out = F.lif(xi, backend=backend, return_potential=True, return_state=return_state, **{**kw, **leaves})
    spikes, h, *v = out
    g = torch.Generator().manual_seed(1)
    loss = (spikes * torch.randn(spikes.shape, generator=g).to(DEVICE)).sum()
    loss = loss + (h * torch.randn(h.shape, generator=g).to(DEVICE)).sum() + 0.1 * (h ** 2).sum()
    if v:
        loss = loss + (v[0] * torch.linspace(-1, 1, v[0].numel(), device=DEVICE).view(v[0].shape)).sum()
    grads = torch.autograd.grad(loss, [xi, *leaves.values()])
    return spikes, h, v[0] if v else None, dict(zip(["x", *leaves], grads))


def assert_backends_match(x, return_state=False, **kw):
    s_ref, h_ref, v_ref, g_ref = run(x, "reference", return_state, **kw)
    for backend in ("fused", "auto"):
        s, h, v, g = run(x, backend, return_state, **kw)
        assert torch.equal(s, s_ref), f"{backend}: spikes differ at {(s != s_ref).sum().item()} places"
        assert h.shape == x.shape and h.dtype == x.dtype
        torch.testing.assert_close(h, h_ref, rtol=1e-6, atol=1e-6)
        if return_state:
            torch.testing.assert_close(v.float(), v_ref.float(), rtol=1e-5, atol=1e-6)
        for name in g_ref:
            assert rel_err(g[name], g_ref[name]) < 1e-5, f"{backend} grad {name}: {rel_err(g[name], g_ref[name])}"


# ---- return_potential ----

@pytest.mark.parametrize("reset", ["hard", "soft", "none"])
@pytest.mark.parametrize("detach", [False, True])
def test_potential_every_reset(reset, detach):
    x = rand(13, 3, 37, seed=hash((reset, detach)) % 100)
    assert_backends_match(x, decay=0.8, threshold=0.9, reset=reset, v_reset=-0.2, detach_reset=detach,
                          surrogate="atan")


@pytest.mark.parametrize("shape", [(1, 5), (1, 2, 3), (9, 1), (17, 2, 3, 5), (20, 2, 70)])
def test_potential_odd_shapes(shape):
    """T = 1, a partial last time chunk (K = 16 in float32), several programs (BLOCK = 64)."""
    assert_backends_match(rand(*shape, seed=len(shape)), decay=0.5, surrogate="sigmoid")


def test_potential_with_state_v0_and_plif_decay():
    x = rand(19, 2, 6, 5, seed=3)
    decay = torch.linspace(0.2, 0.95, 6).to(DEVICE)
    v0 = rand(2, 6, 5, seed=4, scale=0.3)
    assert_backends_match(x, return_state=True, decay=decay, v0=v0, reset="soft", surrogate="triangle")
    assert_backends_match(x, return_state=True, decay=torch.tensor(0.6, device=DEVICE), v0=v0)


def test_potential_non_contiguous_input():
    x = rand(6, 9, 4, 5, seed=5).transpose(1, 3)[..., ::2]
    assert not x.is_contiguous()
    assert_backends_match(x, decay=0.7, reset="soft", grad_threshold=0.2)


def test_potential_is_the_pre_reset_charge():
    x = torch.full((5, 1, 1), 0.6, device=DEVICE)
    for backend in BACKENDS:
        s, h = F.lif(x, decay=0.5, backend=backend, return_potential=True)
        torch.testing.assert_close(h.flatten(), torch.tensor([0.6, 0.9, 1.05, 0.6, 0.9], device=DEVICE))
        assert s.flatten().tolist() == [0, 0, 1, 0, 0]


def test_return_order_and_if_plif():
    x = rand(7, 2, 3, seed=6)
    s, h, v = F.lif(x, return_potential=True, return_state=True, backend="fused")
    s2, v2 = F.lif(x, return_state=True, backend="fused")
    assert torch.equal(s, s2) and torch.equal(v, v2) and torch.equal(h[-1] >= 1.0, s[-1].bool())
    s, h = F.if_(x, return_potential=True, backend="fused")
    torch.testing.assert_close(h, F.lif(x, decay=1.0, return_potential=True, backend="reference")[1])
    decay = torch.tensor([0.3, 0.6, 0.9], device=DEVICE)
    s, h = F.plif(x, decay, return_potential=True, backend="fused")
    torch.testing.assert_close(h, F.plif(x, decay, return_potential=True, backend="reference")[1])


def test_only_potential_used_in_loss():
    """dL/dh alone (no spike loss) reaches x on every backend."""
    x = rand(9, 2, 11, seed=7)
    grads = []
    for backend in BACKENDS:
        xi = x.clone().requires_grad_(True)
        _, h = F.lif(xi, decay=0.9, backend=backend, return_potential=True, reset="soft")
        (g,) = torch.autograd.grad(h.pow(2).sum(), xi)
        grads.append(g)
    for g in grads[:2]:
        assert rel_err(g, grads[2]) < 1e-5


# ---- learnable threshold ----

def threshold_grad_by_hand(x, decay, threshold, reset, v_reset, detach, alpha=1.0):
    """dL/dthreshold for L = sum(s * gs) with the rectangular surrogate, from the equations:
    walking back in time with dL/dv[t] = gv,
        dL/dh[t] = (gs[t] + gv * r[t]) * sg[t] + gv * direct[t]
        dL/dthreshold += -(gs[t] + gv * r[t]) * sg[t]  - (soft: s[t] * gv)
    with r = v_reset - h (hard) / -threshold (soft) / 0 (none, or detach), direct = 1 - s
    (hard) / 1, and gv <- decay * dL/dh[t]."""
    T = x.shape[0]
    hs, ss, v = [], [], torch.zeros_like(x[0])
    for t in range(T):
        h = decay * v + x[t]
        s = (h >= threshold).double()
        v = h * (1 - s) + v_reset * s if reset == "hard" else h - threshold * s if reset == "soft" else h
        hs.append(h)
        ss.append(s)
    gs = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    gv, gthr = torch.zeros_like(x[0]), torch.zeros(())
    for t in range(T - 1, -1, -1):
        h, s = hs[t], ss[t]
        sg = ((h - threshold).abs() < alpha / 2).double() / alpha
        r = torch.zeros_like(h) if detach or reset == "none" else (v_reset - h if reset == "hard" else
                                                                   torch.full_like(h, -threshold))
        direct = 1 - s if reset == "hard" else torch.ones_like(h)
        through = (gs[t] + gv * r) * sg
        gthr = gthr - through.sum() - ((s * gv).sum() if reset == "soft" else 0.0)
        gv = decay * (through + gv * direct)
    return gs, gthr


@pytest.mark.parametrize("reset", ["hard", "soft", "none"])
@pytest.mark.parametrize("detach", [False, True])
def test_threshold_gradient_matches_the_equations(reset, detach):
    x = rand(11, 3, 7, seed=8).double()
    gs, expected = (t.to(x.device) for t in threshold_grad_by_hand(x.cpu(), 0.8, 0.9, reset, -0.2, detach))
    for backend in ("auto", "reference", "fused"):  # fused: in float32, the others float64
        dtype = torch.float32 if backend == "fused" else torch.float64
        thr = torch.tensor(0.9, dtype=dtype, device=x.device, requires_grad=True)
        s = F.lif(x.to(dtype), decay=0.8, threshold=thr, reset=reset, v_reset=-0.2, detach_reset=detach,
                  backend=backend)
        (g,) = torch.autograd.grad((s * gs.to(dtype)).sum(), thr)
        tol = 1e-5 if backend == "fused" else 1e-9
        torch.testing.assert_close(g, expected.to(g.dtype), rtol=tol, atol=tol)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("reset,detach", [("hard", False), ("hard", True), ("soft", False), ("soft", True),
                                          ("none", False)])
def test_tensor_threshold_backends_agree(per_channel, reset, detach):
    """The fused threshold gradient (and those of x, decay, v0 next to it, with losses on the
    spikes, h and v[T-1]) against the reference's autograd, across a full time chunk (K = 16)
    and a partial one; a float tensor threshold equal to a float gives that float's spikes and h."""
    x = rand(19, 2, 5, 3, seed=9 + detach)
    thr = (torch.linspace(0.7, 1.2, 5) if per_channel else torch.tensor(0.9)).to(DEVICE)
    decay = torch.linspace(0.3, 0.9, 5).to(DEVICE)
    v0 = rand(2, 5, 3, seed=4, scale=0.3)
    assert_backends_match(x, return_state=True, decay=decay, threshold=thr, v0=v0, reset=reset, v_reset=-0.2,
                          detach_reset=detach, surrogate="fast_sigmoid")
    s_float, h_float = F.lif(x, decay=decay, threshold=0.9, reset=reset, return_potential=True, backend="fused")
    s_tensor, h_tensor = F.lif(x, decay=decay, threshold=torch.tensor(0.9, device=DEVICE), reset=reset, return_potential=True,
                               backend="fused")
    assert torch.equal(s_float, s_tensor) and torch.equal(h_float, h_tensor)


@pytest.mark.parametrize("make_x", [lambda: rand(1, 3, 4, 2, seed=25),
                                    lambda: rand(6, 9, 4, 5, seed=26).transpose(1, 3)[..., ::2],
                                    lambda: rand(7, 11, seed=27)],
                         ids=["T=1", "non-contiguous", "no-channel-dim"])
def test_tensor_threshold_t1_non_contiguous_and_2d(make_x):
    x = make_x()
    channels = x.shape[2] if x.dim() >= 3 else 1
    thr = torch.linspace(0.6, 1.1, channels).to(DEVICE) if channels > 1 else torch.tensor([0.8], device=DEVICE)
    assert_backends_match(x, decay=0.7, threshold=thr, reset="soft", surrogate="triangle", grad_threshold=0.1)


def test_tensor_threshold_runs_fused_deterministically_and_silently():
    """No routing warning any more; the launch is the fused kernel's; two backwards give the
    same bits (one partial per neuron, reduced by torch: no atomics)."""
    x = rand(9, 4, 6, 5, seed=10)
    grads = []
    for _ in range(2):
        thr = torch.linspace(0.8, 1.2, 6, device=DEVICE).requires_grad_(True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            s = F.lif(x, threshold=thr, backend="fused")
        assert s.grad_fn.name() == "LIFFunctionBackward"
        grads.append(torch.autograd.grad((s * x).sum(), thr)[0])
    assert torch.equal(*grads) and grads[0].abs().sum() > 0


# ---- modules ----

@pytest.mark.parametrize("make", [
    lambda **kw: nn.LIF(decay=0.6, **kw), lambda **kw: nn.IF(**kw), lambda **kw: nn.PLIF(channels=4, **kw)])
def test_module_record_potential(make):
    x = rand(8, 3, 4, 2, seed=11)
    plain = make(backend="reference").to(DEVICE)
    assert plain.potential is None and plain(x) is not None and plain.potential is None
    outs = []
    for backend in ("fused", "reference"):
        layer = make(backend=backend, record_potential=True).to(DEVICE)
        s = layer(x)
        assert isinstance(s, torch.Tensor) and layer.potential.shape == x.shape
        assert layer.potential.requires_grad == isinstance(layer, nn.PLIF)  # through the learned decay
        outs.append((s, layer.potential))
    assert torch.equal(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])


def test_module_record_potential_stateful_chunks():
    x = rand(12, 2, 5, seed=12)
    whole = nn.LIF(decay=0.7, record_potential=True, backend="fused").to(DEVICE)
    whole(x)
    stream = nn.LIF(decay=0.7, stateful=True, record_potential=True, backend="fused").to(DEVICE)
    parts = []
    for c in x.split([5, 7]):
        stream(c)
        parts.append(stream.potential)
    torch.testing.assert_close(torch.cat(parts), whole.potential)


@pytest.mark.parametrize("channels", [None, 4])
def test_module_learns_its_threshold(channels):
    x = rand(9, 3, 4, 2, seed=13)
    grads = []
    for make in (lambda: nn.LIF(decay=0.6, threshold=0.8, learn_threshold=True, threshold_channels=channels,
                                reset="soft", surrogate="triangle"),
                 lambda: nn.PLIF(channels=4, threshold=0.8, learn_threshold=True, threshold_channels=channels),
                 lambda: nn.IF(threshold=0.8, learn_threshold=True, threshold_channels=channels)):
        layer = make().to(DEVICE)
        assert isinstance(layer.threshold, torch.nn.Parameter)
        assert any(p is layer.threshold for p in layer.parameters())
        assert layer.threshold.shape == (() if channels is None else (channels,))
        assert "threshold=learned" in repr(layer)
        s = layer(x)
        fixed = make().__class__  # spikes equal those of the float threshold
        kwargs = dict(threshold=0.8, backend="fused")
        if fixed is nn.LIF:
            kwargs.update(decay=0.6, reset="soft")
        if fixed is nn.PLIF:
            kwargs.update(channels=4)
        assert torch.equal(s, fixed(**kwargs).to(DEVICE)(x))
        s.sum().backward()
        assert layer.threshold.grad is not None and torch.isfinite(layer.threshold.grad).all()
        grads.append(layer.threshold.grad)
    assert any(g.abs().sum() > 0 for g in grads)


# ---- bad input ----

def test_bad_threshold_tensor_shape():
    x = rand(4, 2, 3, seed=14)
    with pytest.raises(ValueError, match="threshold"):
        F.lif(x, threshold=torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="threshold"):
        F.lif(x, threshold=torch.ones(3, 1, device=DEVICE))
    with pytest.raises(ValueError, match="threshold"):
        F.lif(rand(4, 3, seed=15), threshold=torch.ones(3, device=DEVICE))  # no channel dim in [T, N]


def test_bad_threshold_tensor_values_and_dtype():
    x = rand(4, 2, 3, seed=16)
    if DEVICE == "cpu":  # values on a GPU are not checked (it would wait for the device)
        with pytest.raises(ValueError, match="threshold"):
            F.lif(x, threshold=torch.tensor(float("nan")))
        with pytest.raises(ValueError, match="threshold"):
            F.lif(x, threshold=torch.tensor([1.0, float("inf"), 1.0]))
    with pytest.raises(TypeError, match="threshold"):
        F.lif(x, threshold=torch.tensor(1, device=DEVICE))
    with pytest.raises(TypeError, match="threshold"):
        F.lif(x, threshold=float("nan"))


@pytest.mark.parametrize("cls", [nn.LIF, nn.IF, nn.PLIF])
def test_bad_learn_threshold_options(cls):
    for bad in (float("nan"), float("inf"), "1.0"):
        with pytest.raises(ValueError, match="threshold"):
            cls(threshold=bad, learn_threshold=True)
    with pytest.raises(ValueError, match="threshold_channels"):
        cls(threshold_channels=3)
    with pytest.raises(ValueError, match="threshold_channels"):
        cls(learn_threshold=True, threshold_channels=0)
    layer = cls(learn_threshold=True, threshold_channels=5).to(DEVICE)
    with pytest.raises(ValueError, match="threshold"):
        layer(rand(3, 2, 4, seed=17))  # 4 channels, 5 thresholds
