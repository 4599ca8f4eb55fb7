"""A user-supplied surrogate: `surrogate=` as a callable sg(u) -> tensor (ds/du for
u = h - threshold) through spikefuse.functional.lif (auto: the loop path; reference),
spikefuse.reference.lif and the nn.LIF/IF/PLIF modules."""
import functools

import pytest
import torch

import spikefuse.functional as F
import spikefuse.nn as snn
from spikefuse import reference
from helpers import DEVICE, rel_err  # DEVICE: where the custom surrogate's fused tests run


def on_device(*tensors):
    return tuple(t.to(DEVICE) for t in tensors)


def fast_sigmoid(u, alpha=10.0):
    """The built-in "fast_sigmoid" written by hand."""
    return 1 / (alpha * u.abs() + 1) ** 2


def gaussian(u, sigma=0.4):
    return torch.exp(-0.5 * (u / sigma) ** 2) / (sigma * (2 * torch.pi) ** 0.5)


def data(dtype=torch.float32, shape=(12, 3, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 0.8 + 0.4).to(dtype)
    v0 = (torch.randn(shape[1:], generator=g) * 0.3).to(dtype)
    w = torch.randn(shape, generator=g).to(dtype)
    return x, v0, w


def grads(surrogate, x, v0, w, decay=0.7, **options):
    """Spikes, v[T-1], and d(loss)/d(x, v0, tensor decay) of a random linear loss."""
    xi, vi = x.clone().requires_grad_(), v0.clone().requires_grad_()
    leaves = [xi, vi]
    if isinstance(decay, torch.Tensor):
        decay = decay.clone().requires_grad_()
        leaves.append(decay)
    s, v = F.lif(xi, decay=decay, v0=vi, surrogate=surrogate, return_state=True, **options)
    loss = (s * w).sum() + (v * torch.linspace(-1, 1, v.numel(), dtype=v.dtype, device=v.device).view(v.shape)).sum()
    return s, v, torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reset,detach", [("hard", False), ("hard", True), ("soft", False), ("none", False)])
def test_callable_equals_named(backend, dtype, reset, detach):
    x, v0, w = data(dtype)
    opts = dict(backend=backend, reset=reset, detach_reset=detach)
    s1, v1, g1 = grads(fast_sigmoid, x, v0, w, **opts)
    s2, v2, g2 = grads("fast_sigmoid", x, v0, w, alpha=10.0, **opts)
    assert torch.equal(s1, s2) and torch.equal(v1, v2)
    assert s1.sum() > 0
    for a, b in zip(g1, g2):
        assert rel_err(a, b) < 1e-6


def test_auto_routes_callable_to_loop_and_reference():
    x = torch.randn(4, 2, 3, requires_grad=True)
    assert "LIFLoop" in type(F.lif(x, surrogate=fast_sigmoid).grad_fn).__name__
    assert "LIFLoop" not in type(F.lif(x, surrogate=fast_sigmoid, backend="reference").grad_fn).__name__
    xb = x.detach().bfloat16().requires_grad_()  # no loop path: the reference
    s = F.lif(xb, surrogate=fast_sigmoid)
    s.sum().backward()
    assert s.dtype == torch.bfloat16 and xb.grad.dtype == torch.bfloat16


def test_plif_decay_gradient_matches_named():
    x, v0, w = data(torch.float64, shape=(10, 2, 3, 2))
    decay = torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64)
    for backend in ("auto", "reference"):
        s1, _, g1 = grads(fast_sigmoid, x, v0, w, decay=decay, backend=backend)
        s2, _, g2 = grads("fast_sigmoid", x, v0, w, decay=decay, backend=backend)
        assert torch.equal(s1, s2)
        for a, b in zip(g1, g2):
            assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("module", ["LIF", "PLIF"])
def test_module_callable_equals_named(module):
    x, _, w = data(torch.float32, shape=(10, 2, 3))
    results = []
    for surrogate in (functools.partial(fast_sigmoid, alpha=5.0), "fast_sigmoid"):
        torch.manual_seed(0)
        kwargs = dict(channels=3) if module == "PLIF" else dict(decay=0.6)
        neuron = getattr(snn, module)(surrogate=surrogate, alpha=5.0, reset="soft", **kwargs)
        xi = x.clone().requires_grad_()
        s = neuron(xi)
        (s * w).sum().backward()
        results.append((s, xi.grad, neuron.w.grad if module == "PLIF" else None))
    (s1, gx1, gw1), (s2, gx2, gw2) = results
    assert torch.equal(s1, s2)
    assert rel_err(gx1, gx2) < 1e-6
    if module == "PLIF":
        assert gw1.abs().sum() > 0 and rel_err(gw1, gw2) < 1e-6


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("reset", ["hard", "soft", "none"])
def test_custom_shape_loop_matches_reference(dtype, tol, reset):
    x, v0, w = data(dtype)
    decay = torch.tensor(0.8, dtype=dtype)
    for gt in (float("-inf"), 0.7):
        opts = dict(reset=reset, grad_threshold=gt, decay=decay)
        s1, v1, g1 = grads(gaussian, x, v0, w, backend="auto", **opts)
        s2, v2, g2 = grads(gaussian, x, v0, w, backend="reference", **opts)
        assert torch.equal(s1, s2) and torch.equal(v1, v2)
        for a, b in zip(g1, g2):
            assert rel_err(a, b) < tol
    assert torch.equal(s1, reference.lif(x, decay, reset=reset, v0=v0, surrogate=gaussian))


def test_loop_calls_without_autograd_and_tolerates_expanded_result():
    seen = []

    def ste(u):  # straight-through: an expanded constant of u's shape
        seen.append(torch.is_grad_enabled())
        return torch.ones(()).expand_as(u)

    x, v0, w = data()
    _, _, g1 = grads(ste, x, v0, w, backend="auto")
    assert seen == [False]
    _, _, g2 = grads(ste, x, v0, w, backend="reference")
    for a, b in zip(g1, g2):
        assert rel_err(a, b) < 1e-5


def test_double_backward_with_callable():
    x = (torch.randn(6, 2, 3, dtype=torch.float64) * 0.5 + 0.5)
    out = []
    for backend in ("auto", "reference"):
        xi = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(F.lif(xi, surrogate=gaussian, backend=backend).sum(), xi, create_graph=True)
        (gg,) = torch.autograd.grad((g ** 2).sum(), xi)
        out.append(gg)
    assert out[0].abs().sum() > 0 and rel_err(out[0], out[1]) < 1e-10


def test_fused_with_callable_raises():
    with pytest.raises(ValueError, match="surrogate"):
        F.lif(torch.zeros(3, 2), surrogate=fast_sigmoid, backend="fused")


@pytest.mark.parametrize("bad", [3, None, ["fast_sigmoid"], 1.5, "gauss"])
def test_bad_surrogate_values_raise(bad):
    with pytest.raises(ValueError, match="surrogate"):
        F.lif(torch.zeros(3, 2), surrogate=bad)
    for module in (snn.LIF, snn.IF, snn.PLIF):
        with pytest.raises(ValueError, match="surrogate"):
            module(surrogate=bad)


@pytest.mark.parametrize("bad_fn", [lambda u: u.sum(), lambda u: u[0], lambda u: 1.0])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_wrong_shape_result_raises(bad_fn, backend):
    x = torch.randn(4, 2, 3, requires_grad=True)
    with pytest.raises(ValueError, match="surrogate"):
        F.lif(x, surrogate=bad_fn, backend=backend).sum().backward()
    neuron = snn.LIF(surrogate=bad_fn, backend=backend)
    with pytest.raises(ValueError, match="surrogate"):
        neuron(x).sum().backward()


def test_extra_repr_names_the_callable():
    assert "surrogate=gaussian" in repr(snn.LIF(surrogate=gaussian))
    assert "surrogate=fast_sigmoid" in repr(snn.IF(surrogate=functools.partial(fast_sigmoid, alpha=2.0)))
    assert "surrogate=gaussian" in repr(snn.PLIF(surrogate=gaussian))
    assert "surrogate='atan'" in repr(snn.LIF(surrogate="atan"))


# ---- spikefuse.surrogates.custom: a surrogate written for Triton (run by the fused backward
# kernel, here through the Triton interpreter) and in torch (the loop and reference paths) ----

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import spikefuse  # noqa: E402
from spikefuse.surrogates import custom  # noqa: E402


@triton.jit
def scaled_fast_sigmoid_triton(u, alpha):
    d = alpha * tl.abs(u) + 1.0
    return 0.7 / (d * d)


def scaled_fast_sigmoid_torch(u, alpha):
    return 0.7 / (alpha * u.abs() + 1) ** 2


@triton.jit
def fast_sigmoid_triton(u, alpha):  # the built-in "fast_sigmoid"
    d = alpha * tl.abs(u) + 1.0
    return 1.0 / (d * d)


SCALED = custom(scaled_fast_sigmoid_triton, scaled_fast_sigmoid_torch, alpha=4.0)


def test_custom_is_exported_and_named():
    assert spikefuse.surrogates.custom is custom
    assert SCALED.name == "scaled_fast_sigmoid_triton" and SCALED.alpha == 4.0
    assert "surrogate=scaled_fast_sigmoid_triton" in repr(snn.LIF(surrogate=SCALED))


@pytest.mark.parametrize("reset,detach", [("hard", False), ("hard", True), ("soft", False), ("soft", True),
                                          ("none", False), ("none", True)])
def test_custom_fused_equals_reference_with_torch_twin(reset, detach):
    x, v0, w = on_device(*data(shape=(7, 2, 3, 5)))
    x = x.transpose(1, 3)  # non-contiguous [7, 5, 3, 2]
    v0, w = v0.transpose(0, 2).contiguous(), w.transpose(1, 3)
    decay = torch.tensor([0.3, 0.6, 0.9], device=DEVICE)  # per channel (dim 2): the PLIF path
    for xs, v0s, ws in ((x, v0, w), (x[:1], v0, w[:1])):  # and T = 1
        opts = dict(reset=reset, detach_reset=detach, decay=decay)
        s1, v1, g1 = grads(SCALED, xs, v0s, ws, backend="fused", **opts)
        s2, v2, g2 = grads(SCALED, xs, v0s, ws, backend="reference", **opts)
        assert torch.equal(s1, s2) and torch.allclose(v1, v2, rtol=1e-6, atol=1e-6)
        for a, b in zip(g1, g2):
            assert rel_err(a, b) < 1e-5
    assert s1.sum() > 0


def test_custom_equal_to_builtin_gives_builtin_gradients():
    sg = custom(fast_sigmoid_triton, fast_sigmoid, alpha=3.0, name="mine")
    x, v0, w = on_device(*data(shape=(9, 2, 5)))
    _, _, g1 = grads(sg, x, v0, w, backend="fused", reset="soft")
    _, _, g2 = grads("fast_sigmoid", x, v0, w, alpha=3.0, backend="fused", reset="soft")
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    # alpha= overrides the custom surrogate's own, as for a name (LIF passes it through)
    results = []
    for surrogate in (sg, "fast_sigmoid"):
        xi = x.clone().requires_grad_()
        (snn.LIF(surrogate=surrogate, alpha=5.0, backend="fused")(xi) * w).sum().backward()
        results.append(xi.grad)
    assert torch.equal(*results)


def test_custom_runs_on_loop_path_on_cpu_auto():
    x, v0, w = data()
    xi = x.clone().requires_grad_()
    assert "LIFLoop" in type(F.lif(xi, surrogate=SCALED).grad_fn).__name__
    _, _, g1 = grads(SCALED, x, v0, w, backend="auto")
    _, _, g2 = grads(SCALED, x, v0, w, backend="reference")
    for a, b in zip(g1, g2):
        assert rel_err(a, b) < 1e-5


def test_custom_double_backward_uses_torch_twin():
    x = torch.randn(5, 2, 3, device=DEVICE) * 0.5 + 0.5
    out = []
    for backend in ("fused", "reference"):
        xi = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(F.lif(xi, surrogate=SCALED, backend=backend).sum(), xi, create_graph=True)
        (gg,) = torch.autograd.grad((g ** 2).sum(), xi)
        out.append(gg)
    assert out[0].abs().sum() > 0 and rel_err(out[0], out[1]) < 1e-5


@triton.jit
def one_argument_triton(u):
    return u


@pytest.mark.parametrize("args,kwargs,error,argument", [
    ((scaled_fast_sigmoid_torch, scaled_fast_sigmoid_torch), {}, TypeError, "triton_fn"),
    ((one_argument_triton, scaled_fast_sigmoid_torch), {}, TypeError, "triton_fn"),
    ((scaled_fast_sigmoid_triton,), {}, TypeError, "torch_fn"),
    ((scaled_fast_sigmoid_triton, None), {}, TypeError, "torch_fn"),
    ((scaled_fast_sigmoid_triton, 2.0), {}, TypeError, "torch_fn"),
    ((scaled_fast_sigmoid_triton, scaled_fast_sigmoid_triton), {}, TypeError, "torch_fn"),
    ((scaled_fast_sigmoid_triton, scaled_fast_sigmoid_torch), dict(alpha=float("nan")), ValueError, "alpha"),
    ((scaled_fast_sigmoid_triton, scaled_fast_sigmoid_torch), dict(alpha="1"), ValueError, "alpha"),
    ((scaled_fast_sigmoid_triton, scaled_fast_sigmoid_torch), dict(alpha=True), ValueError, "alpha"),
    ((scaled_fast_sigmoid_triton, scaled_fast_sigmoid_torch), dict(name=3), TypeError, "name"),
])
def test_bad_custom_surrogate_raises_naming_the_argument(args, kwargs, error, argument):
    with pytest.raises(error, match=argument):
        custom(*args, **kwargs)


def test_bad_alpha_override_raises():
    with pytest.raises(ValueError, match="alpha"):
        F.lif(torch.zeros(3, 2), surrogate=SCALED, alpha=float("inf"))
    with pytest.raises(ValueError, match="alpha"):
        snn.LIF(surrogate=SCALED, alpha="wide")


def test_other_neurons_treat_custom_like_a_callable():
    """ALIF, CUBA, the recurrent neurons and BN+LIF take no custom surrogate into their kernels:
    each refuses it with an error naming `surrogate` wherever it refuses a plain callable."""
    from spikefuse.nn.bn_lif import BNLIF
    x = torch.rand(3, 2, 4)
    neurons = [lambda sg: F.alif(x, surrogate=sg), lambda sg: F.cuba(x, surrogate=sg),
               lambda sg: F.rlif(x, torch.zeros(4, 4), surrogate=sg),
               lambda sg: F.ralif(x, torch.zeros(4, 4), surrogate=sg),
               lambda sg: snn.ALIF(surrogate=sg), lambda sg: snn.CUBA(surrogate=sg),
               lambda sg: BNLIF(4, surrogate=sg)]
    for neuron in neurons:
        try:
            neuron(gaussian)
        except (TypeError, ValueError):
            with pytest.raises((TypeError, ValueError), match="surrogate"):
                neuron(SCALED)
        else:  # it takes callables (on a torch path): then it takes the torch twin too
            neuron(SCALED)


def test_compile_fullgraph_with_custom_matches_eager():
    torch._dynamo.reset()
    x, v0, w = on_device(*data(shape=(6, 2, 4)))

    def step(x, v0):
        s, v = F.lif(x, v0=v0, surrogate=SCALED, reset="soft", return_state=True, backend="fused")
        return (s * w).sum() + v.sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    out = []
    for fn in (step, compiled):
        xi, vi = x.clone().requires_grad_(), v0.clone().requires_grad_()
        loss = fn(xi, vi)
        out.append((loss, *torch.autograd.grad(loss, (xi, vi))))
    for a, b in zip(*out):
        assert rel_err(a, b) < 1e-5


def test_callable_warns_once_where_fused_would_run(monkeypatch):
    monkeypatch.setattr(F, "_use_fused", lambda backend, x: backend != "reference")  # as on CUDA
    monkeypatch.setattr(F, "_warned_unfused", False)
    x = torch.randn(4, 2, 3, device=DEVICE)
    with pytest.warns(UserWarning, match="custom") as record:
        F.lif(x, surrogate=gaussian)
        F.lif(x, surrogate=gaussian)
        F.lif(x, surrogate=SCALED)  # runs fused: no warning
    assert len(record) == 1 and "gaussian" in str(record[0].message)
