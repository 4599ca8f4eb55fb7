"""Fused recurrent LIF kernels (through the Triton interpreter) against the PyTorch reference.

The recurrent weights are multiples of 1/32 in [-1/4, 1/4] and the spikes are 0/1, so every
partial sum of s[t-1] @ W^T is exact in float32: the kernel's tl.dot and torch's matmul
agree bit for bit whatever order they add in, and the spikes can be compared exactly."""
import itertools
import math

import pytest
import torch
from torch import nn

import spikefuse.functional as F
import spikefuse.nn as snn
from spikefuse import reference
from spikefuse.surrogates import SURROGATES
from helpers import DEVICE, every_value_once, rel_err

PARAMS = dict(decay=0.8, threshold=0.9, v_reset=-0.2)


def rand(*shape, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + 0.4).to(dtype).to(DEVICE)


def dyadic_weight(n, seed=0):
    g = torch.Generator().manual_seed(seed + 100)
    return (torch.randint(-8, 9, (n, n), generator=g).float() / 32).to(DEVICE)


def run(x, w, backend, **kw):
    """Spikes, final v or None, dL/dx and dL/dW for a fixed random loss on both outputs."""
    xi = x.detach().clone().requires_grad_(True)
    wi = w.detach().clone().requires_grad_(True)
    x_in = xi.float() if backend == "reference" else xi  # the oracle runs in float32
    out = F.rlif(x_in, wi, backend=backend, **kw)
    spikes, v = out if isinstance(out, tuple) else (out, None)
    g = torch.randn(spikes.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    loss = (spikes.float() * g).sum()
    if v is not None:
        loss = loss + (v * torch.linspace(-1, 1, v.numel(), device=DEVICE).view(v.shape)).sum()
    # materialize: with T = 1 the reference never reaches W (its gradient is zero)
    gx, gw = torch.autograd.grad(loss, [xi, wi], materialize_grads=True)
    return spikes.float(), v, gx, gw


def assert_match(x, w, rtol=1e-5, **kw):
    (s1, v1, gx1, gw1), (s2, v2, gx2, gw2) = run(x, w, "fused", **kw), run(x, w, "reference", **kw)
    assert torch.equal(s1, s2), f"spikes differ at {(s1 != s2).sum().item()} places"
    assert 0 < s2.mean() < 1, "degenerate case: no spikes or all spikes"
    if v1 is not None:
        torch.testing.assert_close(v1, v2, rtol=rtol, atol=1e-6)
    assert gx1.dtype == x.dtype and gx1.shape == x.shape
    assert gw1.dtype == w.dtype and gw1.shape == w.shape
    assert rel_err(gx1, gx2) < rtol, f"grad x: {rel_err(gx1, gx2)}"
    if gw2.any():
        assert rel_err(gw1, gw2) < rtol, f"grad W: {rel_err(gw1, gw2)}"
    else:
        assert not gw1.any()


CASES = list(itertools.product(["hard", "soft", "none"], SURROGATES, [False, True]))


@pytest.mark.parametrize("case", every_value_once(CASES, range(len(CASES))))
def test_every_reset_surrogate_and_detach(case):
    reset, surrogate, detach = CASES[case]
    assert_match(rand(7, 3, 13, seed=case), dyadic_weight(13, case), reset=reset, surrogate=surrogate,
                 detach_reset=detach, return_state=case % 2 == 0, **PARAMS)


@pytest.mark.parametrize("shape", [(1, 2, 9), (1, 40), (5, 40), (3, 2, 3, 17), (4, 37, 70)])
def test_shapes(shape):
    """T = 1, [T, N] and [T, B, C, N] inputs, rows and neurons over several tiles (16 x 32)
    and several inner blocks (32), partial tiles."""
    x = rand(*shape, seed=sum(shape), scale=1.5)
    assert_match(x, dyadic_weight(shape[-1], len(shape)), return_state=True, **PARAMS)


def test_non_contiguous_input_and_weight():
    x = rand(6, 9, 4, seed=4).transpose(1, 2)[:, :, ::2].transpose(1, 2)  # [6, 5, 4] strided
    w = dyadic_weight(8, 4).t()[:4, :4]  # a transposed slice
    assert not x.is_contiguous() and not w.is_contiguous()
    assert_match(x, w, reset="soft", **PARAMS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs(dtype):
    assert_match(rand(6, 3, 21, seed=3, dtype=dtype), dyadic_weight(21, 3), rtol=1e-2, surrogate="atan",
                 **PARAMS)


def test_grad_threshold():
    """The secondary threshold cuts the surrogate where h < grad_threshold, as the reference does,
    and -inf is the plain backward."""
    x, w = rand(6, 4, 19, seed=8), dyadic_weight(19, 8)
    assert_match(x, w, surrogate="fast_sigmoid", grad_threshold=0.6, **PARAMS)
    (_, _, gx_cut, _), (_, _, gx_all, _) = (run(x, w, "fused", grad_threshold=g, surrogate="fast_sigmoid",
                                                **PARAMS) for g in (0.6, float("-inf")))
    assert (gx_cut == 0).sum() > (gx_all == 0).sum()


def test_zero_weight_is_lif():
    x = rand(9, 3, 13, seed=20)
    w = torch.zeros(13, 13, device=DEVICE)
    for backend in ("fused", "reference"):
        assert torch.equal(F.rlif(x, w, backend=backend, **PARAMS), F.lif(x, backend="reference", **PARAMS))


def test_recurrence_excites():
    """A strong positive self-weight keeps a neuron firing after its input stops."""
    x = torch.zeros(6, 1, 2, device=DEVICE)
    x[0] = 1.5
    w = torch.tensor([[2.0, 0.0], [0.0, 0.0]], device=DEVICE)
    s = F.rlif(x, w, decay=0.5, backend="fused")
    assert s[:, 0, 0].tolist() == [1.0] * 6 and s[:, 0, 1].tolist() == [1.0] + [0.0] * 5


def test_only_final_state_used():
    x, w = rand(5, 2, 8, seed=10), dyadic_weight(8, 10)
    grads = []
    for backend in ("fused", "reference"):
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        _, v = F.rlif(xi, wi, backend=backend, return_state=True, reset="soft", **PARAMS)
        grads.append(torch.autograd.grad(v.sum(), [xi, wi]))
    assert rel_err(grads[0][0], grads[1][0]) < 1e-5 and rel_err(grads[0][1], grads[1][1]) < 1e-5


def test_weight_only_or_input_only_needs_grad():
    x, w = rand(5, 2, 8, seed=16), dyadic_weight(8, 16)
    wi = w.clone().requires_grad_(True)
    (gw,) = torch.autograd.grad(F.rlif(x, wi, backend="fused", **PARAMS).sum(), wi)
    wr = w.clone().requires_grad_(True)
    (gw_ref,) = torch.autograd.grad(F.rlif(x, wr, backend="reference", **PARAMS).sum(), wr)
    assert rel_err(gw, gw_ref) < 1e-5
    xi = x.clone().requires_grad_(True)
    assert F.rlif(xi, w, backend="fused", **PARAMS).requires_grad


def test_inference_saves_nothing():
    x, w = rand(4, 3, 5, seed=11), dyadic_weight(5, 11)
    with torch.no_grad():
        s = F.rlif(x, w, backend="fused", **PARAMS)
    assert torch.equal(s, F.rlif(x, w, backend="reference", **PARAMS))


def test_double_backward_matches_reference():
    x, w = rand(5, 2, 7, seed=13), dyadic_weight(7, 13)
    penalties = []
    for backend in ("fused", "reference"):
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        s = F.rlif(xi, wi, backend=backend, surrogate="sigmoid", **PARAMS)
        gx, gw = torch.autograd.grad((s * torch.linspace(-1, 1, s.shape[-1], device=DEVICE)).sum(), [xi, wi],
                                      create_graph=True)
        penalties.append(torch.autograd.grad(gx.pow(2).sum() + gw.pow(2).sum(), [xi, wi]))
    assert all(rel_err(a, b) < 1e-5 for a, b in zip(*penalties))


BAD = [
    (dict(decay=0.0), "decay"), (dict(decay=1.5), "decay"), (dict(threshold=float("nan")), "threshold"),
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
        F.rlif(torch.zeros(3, 2, 4), w, **kw)


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="2 or more dims"):
        F.rlif(torch.zeros(3), torch.zeros(1, 1))
    with pytest.raises(ValueError, match="floating"):
        F.rlif(torch.zeros(3, 2, 4, dtype=torch.int64), torch.zeros(4, 4))


def test_module():
    layer = snn.RecurrentLIF(6, decay=0.9, threshold=0.5, surrogate="atan", grad_threshold=0.2)
    assert layer.weight.shape == (6, 6) and layer.weight.abs().max() <= 1 / math.sqrt(6)
    assert "grad_threshold=0.2" in repr(layer) and "RecurrentLIF(6" in repr(layer)
    with pytest.raises(ValueError, match="expected 6 features"):
        layer(torch.zeros(3, 2, 5))
    with pytest.raises(ValueError, match="3 or more dims"):
        layer(torch.zeros(3, 6))
    with pytest.raises(ValueError, match="features"):
        snn.RecurrentLIF(0)


@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_module_record_potential(path):
    x, w = rand(6, 2, 3, 7, seed=44), dyadic_weight(7, 44)
    assert snn.RecurrentLIF(7, device=DEVICE).potential is None
    results = []
    for backend in ("fused", "reference"):
        layer = snn.RecurrentLIF(7, backend=backend, path=path, record_potential=True, device=DEVICE, **PARAMS)
        with torch.no_grad():
            layer.weight.copy_(w)
        s = layer(x)
        assert isinstance(s, torch.Tensor) and layer.potential.shape == x.shape
        layer.potential.pow(2).sum().backward()
        results.append((s, layer.potential.detach(), layer.weight.grad))
    (s1, h1, gw1), (s2, h2, gw2) = results
    assert torch.equal(s1, s2) and torch.equal(h1, h2) and rel_err(gw1, gw2) < 1e-5
    assert torch.equal(s1, F.rlif(x, w, backend="reference", **PARAMS))

@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_module_trains_in_sequential(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), snn.RecurrentLIF(10, decay=0.9, threshold=0.5, surrogate="atan",
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
        s, v = F.rlif(x, w, backend="fused", return_state=True, reset="soft", **PARAMS)
        return s.sum() * 0.5 + (s * x).sum() + v.sum()

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
    assert "spikefuse.rlif_forward.default" in targets, targets


# ---- the sparse path (spikefuse.ops.sparse_recurrent_lif) ----

def small_segments(monkeypatch):
    """32-column list segments and 48-column backward chunks (rounded up to 64), so that a
    few dozen neurons span several of each."""
    from spikefuse.ops import sparse_recurrent_lif
    monkeypatch.setattr(sparse_recurrent_lif, "SEG", 32)
    monkeypatch.setattr(sparse_recurrent_lif, "CHUNK", 48)


SPARSE_CASES = [("hard", "fast_sigmoid", True, 0.6), ("soft", "rectangular", False, 0.5),
                ("none", "atan", False, float("-inf")), ("hard", "triangle", False, 0.7)]


@pytest.mark.parametrize("case", range(len(SPARSE_CASES)))
def test_sparse_path_matches_reference(case, monkeypatch):
    small_segments(monkeypatch)
    reset, surrogate, detach, floor = SPARSE_CASES[case]
    assert_match(rand(7, 3, 70, seed=30 + case), dyadic_weight(70, 30 + case), reset=reset, surrogate=surrogate,
                 detach_reset=detach, grad_threshold=floor, sparse=True, return_state=case % 2 == 0, **PARAMS)


@pytest.mark.parametrize("shape", [(1, 2, 9), (4, 37, 70), (3, 1, 40), (3, 150, 40)])
def test_sparse_path_shapes(shape, monkeypatch):
    """T = 1, rows over several tiles, a single row (B = 1), several row blocks (whose flags
    the lists combine)."""
    small_segments(monkeypatch)
    assert_match(rand(*shape, seed=sum(shape), scale=1.5), dyadic_weight(shape[-1], 2), grad_threshold=0.5,
                 sparse=True, return_state=True, **PARAMS)


def test_sparse_path_equals_dense_path_bit_for_bit_on_spikes(monkeypatch):
    small_segments(monkeypatch)
    x, w = rand(6, 5, 50, seed=40), dyadic_weight(50, 40)
    dense, sparse = (run(x, w, "fused", sparse=flag, grad_threshold=0.7, **PARAMS) for flag in (False, True))
    assert torch.equal(dense[0], sparse[0])
    assert rel_err(sparse[2], dense[2]) < 1e-6 and rel_err(sparse[3], dense[3]) < 1e-6


def test_column_lists(monkeypatch):
    """The per-step lists name exactly the columns that spiked / reached grad_threshold in some
    row, in increasing order, segment by segment."""
    small_segments(monkeypatch)
    from spikefuse.ops import sparse_recurrent_lif as S
    for rows in (3, 130):  # one row block, three
        x, w = rand(5, rows, 70, seed=41), dyadic_weight(70, 41)
        spikes, _, h, _, carry, carry_count, active_count = S.forward(x, w, 0.8, 0.9, "hard", 0.0, 0.5, True)
        assert_lists(spikes, h, carry, carry_count, active_count)


def assert_lists(spikes, h, carry, carry_count, active_count):
    for t in range(spikes.shape[0]):
        spiking = spikes[t].ne(0).any(0).nonzero().flatten()
        assert active_count[t].sum() == spiking.numel()
        carrying = (h[t] >= 0.5).any(0).nonzero().flatten().tolist()
        listed = [carry[t, seg, j].item() for seg in range(carry.shape[1]) for j in range(carry_count[t, seg])]
        assert listed == carrying


def test_activity_counts_spiking_columns():
    x, w = rand(5, 3, 20, seed=42), dyadic_weight(20, 42)
    for sparse in (False, True):
        activity = torch.zeros(2, dtype=torch.float64, device=DEVICE)
        s = F.rlif(x, w, backend="fused", sparse=sparse, activity=activity, **PARAMS)
        assert activity.tolist() == [s.ne(0).any(1).sum().item(), 5 * 20]
    with pytest.raises(ValueError, match="activity must be"):
        F.rlif(x, w, activity=torch.zeros(2))


def test_module_path_dispatch():
    from spikefuse.nn import update_dispatch
    layer = snn.RecurrentLIF(20, threshold=0.5, grad_threshold=0.4, path="auto", sparse_below=0.3,
                             backend="fused").to(DEVICE)
    assert "path='auto'" in repr(layer) and not layer.sparse
    with torch.no_grad():
        layer(torch.full((4, 2, 20), 0.6, device=DEVICE))  # every column spikes: dense stays
    assert update_dispatch(layer) is False and not layer.sparse
    with torch.no_grad():
        layer(torch.zeros(4, 2, 20, device=DEVICE))  # silent: sparse
    assert update_dispatch(layer) is True and layer.sparse
    assert layer.active_share() is None  # read and reset by the dispatch
    with pytest.raises(ValueError, match="path"):
        snn.RecurrentLIF(4, path="fast")


@pytest.mark.parametrize("sparse", [False, True])
def test_potential_trace(sparse, monkeypatch):
    """return_potential: h equals the reference's, and a loss on h (with and without one on
    the spikes and the final state) gives the reference's gradients."""
    small_segments(monkeypatch)
    x, w = rand(6, 3, 40, seed=50), dyadic_weight(40, 50)
    gh = torch.randn(6, 3, 40, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    results = []
    for backend in ("fused", "reference"):
        xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        s, h, v = F.rlif(xi, wi, backend=backend, sparse=sparse, return_potential=True, return_state=True,
                         grad_threshold=0.5, surrogate="fast_sigmoid", **PARAMS)
        grads_h = torch.autograd.grad((h * gh).sum(), [xi, wi], retain_graph=True)
        grads_all = torch.autograd.grad((h * gh).sum() + s.sum() + v.sum(), [xi, wi])
        results.append((s, h, grads_h, grads_all))
    (s1, h1, gh1, ga1), (s2, h2, gh2, ga2) = results
    assert torch.equal(s1, s2) and torch.equal(h1, h2)
    assert all(rel_err(a, b) < 1e-5 for a, b in zip(gh1 + ga1, gh2 + ga2))
    only = F.rlif(x, w, backend="fused", return_potential=True, **PARAMS)
    assert isinstance(only, tuple) and len(only) == 2 and torch.equal(only[1], h2.detach())


def test_sparse_path_nan_input_spreads_like_the_dense_path(monkeypatch):
    """A NaN potential is a NaN spike on both paths (the column flags list it as active), so
    it reaches the next step through W on the sparse path too: never a silent zero."""
    small_segments(monkeypatch)
    x, w = rand(4, 70, 40, seed=43), dyadic_weight(40, 43)
    x[1, 66, 5] = float("nan")  # in the second row block (rows 64..69)
    with torch.no_grad():
        dense, sparse = (F.rlif(x, w, backend="fused", sparse=flag, grad_threshold=0.5) for flag in (False, True))
    assert dense[1, 66, 5].isnan() and dense[2, 66].isnan().all()
    assert torch.equal(dense.isnan(), sparse.isnan())
    assert torch.equal(torch.nan_to_num(dense, nan=7.0), torch.nan_to_num(sparse, nan=7.0))
