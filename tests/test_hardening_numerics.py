"""Issue 36, the numerical cases, by class of attack: a parameter the fused BNLIF took and the
reference refused (one check, one message, every backend); an initial state of another dtype
than x (the results in x's dtype on every backend). Fused kernels on CPU tensors run through
Triton's interpreter: tiny shapes."""
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
    layer.threshold = inf
    with pytest.raises(TypeError, match="^threshold must be a finite Python number, got inf$"):
        layer(randn(2, 2, 3, 4))


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
