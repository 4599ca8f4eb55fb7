"""Fused LIF kernels (through the Triton interpreter) against the PyTorch reference."""
import itertools

import pytest
import torch

import spikefuse.functional as F
from spikefuse.surrogates import SURROGATES
from helpers import DEVICE, every_value_once, rel_err


def run_both(x, **kw):
    """Spikes and input/parameter gradients from both backends for the same inputs."""
    results = []
    for backend in ("fused", "reference"):
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in kw.items()
                  if isinstance(v, torch.Tensor)}
        xi = x.detach().clone().requires_grad_(True)
        options = {**kw, **leaves}
        if backend == "reference" and x.dtype != torch.float32:  # oracle in float32
            xi_ref = xi.float()
        else:
            xi_ref = xi
        out = F.lif(xi_ref, backend=backend, **options)
        spikes, state = out if isinstance(out, tuple) else (out, None)
        g = torch.randn(spikes.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
        loss = (spikes * g.to(spikes.dtype)).float().sum()
        if state is not None:
            weights = torch.linspace(-1, 1, state.numel(), device=DEVICE).view(state.shape)
            loss = loss + (state.float() * weights).sum()
        grads = torch.autograd.grad(loss, [xi, *leaves.values()])
        results.append((spikes.float(), state, dict(zip(["x", *leaves], grads))))
    return results


def assert_match(fused, ref, rtol=1e-5):
    (s1, v1, g1), (s2, v2, g2) = fused, ref
    assert torch.equal(s1, s2), f"spikes differ at {(s1 != s2).sum().item()} places"
    if v1 is not None:
        torch.testing.assert_close(v1.float(), v2.float(), rtol=rtol, atol=1e-6)
    for name in g2:
        # norm-wise relative error: elementwise ratios blow up where a gradient cancels
        # to nearly zero, and the GPU's exp differs from the CPU's in the last bits
        assert rel_err(g1[name], g2[name]) < rtol, f"grad {name}: {rel_err(g1[name], g2[name])}"


def rand(*shape, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + 0.3).to(dtype).to(DEVICE)


CASES = list(itertools.product(["hard", "soft", "none"], SURROGATES, [False, True]))


@pytest.mark.parametrize("case", every_value_once(CASES, range(len(CASES))))
def test_lif_float32_every_reset_and_surrogate(case):
    reset, surrogate, detach = CASES[case]
    x = rand(13, 3, 37, seed=case)
    kw = dict(decay=0.8, threshold=0.9, reset=reset, v_reset=-0.2, detach_reset=detach,
              surrogate=surrogate)
    assert_match(*run_both(x, **kw))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reset", ["hard", "soft"])
def test_lif_half_precision(dtype, reset):
    x = rand(11, 4, 33, seed=3, dtype=dtype)
    assert_match(*run_both(x, decay=0.6, reset=reset, surrogate="atan"), rtol=1e-2)


@pytest.mark.parametrize("shape", [(1, 5), (1, 2, 3), (9, 1), (17, 2, 3, 5), (8, 2, 300)])
def test_lif_shapes(shape):
    """T = 1, a partial last time chunk, several programs, 1-D and 4-D trailing shapes."""
    assert_match(*run_both(rand(*shape, seed=len(shape)), decay=0.5, surrogate="sigmoid"))


def chunk_boundary_cases():
    """Shapes at the kernels' chunk edges for every tuned launch configuration: T a
    multiple of K (no partial chunk) or not, N a multiple of BLOCK (unmasked loads)."""
    from spikefuse.ops.kernel_base import LAUNCH_RULES
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for _, BLOCK, K, warps in LAUNCH_RULES[str(dtype).replace("torch.", "")]:
            for T, N in [(K, BLOCK), (2 * K, 2 * BLOCK), (2 * K + 3, BLOCK), (3 * K, BLOCK + 1)]:
                cases.append((dtype, (BLOCK, K, warps), T, N))
    return cases


@pytest.mark.parametrize("dtype,config,T,N", chunk_boundary_cases())
def test_lif_chunk_boundaries(dtype, config, T, N, monkeypatch):
    from spikefuse.ops import kernel_base
    monkeypatch.setattr(kernel_base, "launch_config", lambda num_neurons, dtype: config)
    x = rand(T, 1, N, seed=T + N, dtype=dtype)
    decay = torch.linspace(0.3, 0.9, N).to(DEVICE)  # per-channel PLIF: the decay gradient too
    v0 = rand(1, N, seed=N, scale=0.3)
    assert_match(*run_both(x, decay=decay, v0=v0, return_state=True, surrogate="triangle"),
                 rtol=1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("T,N", [(1, 8), (5, 24), (19, 40), (3, 1048)])
def test_spike_bits_come_with_the_spikes(T, N):
    """With gradients on, the LIF's forward kernel also writes its spikes packed as pack()
    would (what a following spiking conv or linear saves), partial chunks and blocks
    included; an in-place change drops them, and N % 8 != 0 or no_grad writes none."""
    from spikefuse.ops.spike_pack import attached_bits, pack
    x = rand(T, N, seed=T * N).requires_grad_()
    for out in (F.lif(x, backend="fused"), F.lif(x, backend="fused", return_state=True)[0]):
        bits = attached_bits(out)
        assert bits is not None and torch.equal(bits, pack(out.detach()))
    with torch.no_grad():
        out.mul_(1.0)
        assert attached_bits(out) is None and attached_bits(F.lif(x, backend="fused")) is None
    assert attached_bits(F.lif(rand(T, N + 1).requires_grad_(), backend="fused")) is None


def test_lif_non_contiguous_input():
    base = rand(6, 9, 4, 5, seed=4)
    x = base.transpose(1, 3)[..., ::2]  # [6, 5, 4, 5] strided view
    assert not x.is_contiguous()
    assert_match(*run_both(x, decay=0.7, reset="soft"))


def test_lif_initial_and_final_state():
    x = rand(10, 3, 7, seed=5)
    v0 = rand(3, 7, seed=6, scale=0.5)
    assert_match(*run_both(x, decay=0.9, v0=v0, return_state=True, surrogate="triangle"))


def test_if_is_lif_without_decay():
    x = rand(12, 2, 19, seed=7, scale=0.4)
    assert torch.equal(F.if_(x, backend="fused"), F.lif(x, decay=1.0, backend="reference"))
    assert_match(*run_both(x, decay=1.0, reset="soft"))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("reset", ["hard", "soft", "none"])
def test_plif_decay_gradient(per_channel, reset):
    x = rand(9, 3, 6, 4, seed=8)
    decay = (torch.linspace(0.2, 0.95, 6) if per_channel else torch.tensor(0.7)).to(DEVICE)
    v0 = rand(3, 6, 4, seed=9, scale=0.3)
    assert_match(*run_both(x, decay=decay, v0=v0, reset=reset, surrogate="fast_sigmoid"))


def test_only_final_state_used():
    x = rand(5, 2, 8, seed=10).requires_grad_(True)
    _, v = F.lif(x, backend="fused", return_state=True, reset="none")
    (gf,) = torch.autograd.grad(v.sum(), x)
    x2 = x.detach().clone().requires_grad_(True)
    _, v2 = F.lif(x2, backend="reference", return_state=True, reset="none")
    (gr,) = torch.autograd.grad(v2.sum(), x2)
    torch.testing.assert_close(gf, gr, rtol=1e-5, atol=1e-6)


def test_inference_saves_nothing():
    x = rand(4, 3, 5, seed=11)
    with torch.no_grad():
        s = F.lif(x, backend="fused")
    assert torch.equal(s, F.lif(x, backend="reference"))


def test_spike_at_exact_threshold():
    """h == threshold fires in both backends, also for threshold 0 and negative zero inputs."""
    x = torch.tensor([[1.0, 0.5, -0.0], [0.0, 0.5, -0.0]], device=DEVICE).unsqueeze(1)
    for threshold in (1.0, 0.0):
        kw = dict(decay=1.0, threshold=threshold, reset="none")
        assert_match(*run_both(x, **kw))


# ---- reset="subtract": snnTorch's reset, a step late, firing at h > threshold ----
# decay 0 and 1 among them: no soft-reset setting gives snnTorch's spikes at decay 0
SUBTRACT = [(0.0, "atan", False), (0.8, "triangle", True), (1.0, "sigmoid", False), (0.6, "rectangular", True),
            (0.9, "fast_sigmoid", False)]


@pytest.mark.parametrize("decay,surrogate,detach", SUBTRACT)
def test_lif_subtract_reset(decay, surrogate, detach):
    """Spikes exact, v[T-1] and the gradients of x and v0 (also through s[-1] = H(v0 -
    threshold) without detach_reset) within 1e-5; some v0 start above the threshold."""
    x = rand(13, 3, 37, seed=40)
    v0 = rand(3, 37, seed=41)
    assert_match(*run_both(x, decay=decay, threshold=0.9, reset="subtract", detach_reset=detach,
                           surrogate=surrogate, v0=v0, return_state=True))


@pytest.mark.parametrize("grad_scope", ["step", "sequence"])
def test_plif_subtract_learnable_threshold_and_cut(grad_scope, monkeypatch):
    """Per-channel decay and threshold tensors (their gradients include the delayed reset's
    -dL/dh[t] * s[t-1]) and the sparse cut, over several chunks and programs."""
    from spikefuse.ops import kernel_base
    monkeypatch.setattr(kernel_base, "launch_config", lambda num_neurons, dtype: (32, 4, 1))
    x = rand(10, 3, 4, 5, seed=42)
    decay = torch.linspace(0.3, 0.9, 4).to(DEVICE)
    threshold = torch.linspace(0.6, 1.1, 4).to(DEVICE)
    assert_match(*run_both(x, decay=decay, threshold=threshold, v0=rand(3, 4, 5, seed=43), reset="subtract",
                           surrogate="atan", grad_threshold=0.2, grad_scope=grad_scope, return_state=True))


@pytest.mark.parametrize("make_x", [lambda: rand(1, 2, 5, seed=44),
                                    lambda: rand(6, 9, 4, 5, seed=45).transpose(1, 3)[..., ::2]])
def test_lif_subtract_t1_and_non_contiguous(make_x):
    x = make_x()
    v0 = rand(*x.shape[1:], seed=46)
    assert_match(*run_both(x, decay=0.7, threshold=0.8, reset="subtract", v0=v0, return_state=True))


def test_subtract_fires_above_the_threshold_and_resets_the_next_step():
    """h == threshold does not fire (snnTorch's strict test); a spike's threshold comes off
    the next step's potential: h = 1, 2.5, 2.5 - 1, 1.5 - 1 fires 0, 1, 1, 0."""
    x = torch.tensor([1.0, 1.5, 0.0, 0.0], device=DEVICE).view(4, 1, 1)
    for backend in ("fused", "reference", "auto"):
        s, h = F.lif(x, decay=1.0, threshold=1.0, reset="subtract", return_potential=True, backend=backend)
        assert s.flatten().tolist() == [0.0, 1.0, 1.0, 0.0], backend
        assert h.flatten().tolist() == [1.0, 2.5, 1.5, 0.5], backend


def test_lif_subtract_continues_across_calls():
    """Two calls, the first's v[T-1] the second's v0, give one call's spikes and dL/dx: s[-1]
    from v0 is the spike the first call ended with, gradient included."""
    x = rand(10, 2, 9, seed=47)
    kw = dict(decay=0.7, threshold=0.8, reset="subtract", surrogate="atan", backend="fused")
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    whole = F.lif(xs[0], **kw)
    first, v = F.lif(xs[1][:4], return_state=True, **kw)
    split = torch.cat([first, F.lif(xs[1][4:], v0=v, **kw)])
    assert torch.equal(split, whole) and 0 < whole.mean() < 1
    grads = [torch.autograd.grad((s * w).sum(), xi)[0] for s, xi in ((whole, xs[0]), (split, xs[1]))]
    assert rel_err(*grads) < 1e-5


def test_no_grad_saves_nothing_for_a_backward(monkeypatch):
    """Under no_grad no graph is recorded: the fused forward writes no checkpoints, even where
    an input requires grad (an autograd.Function's needs_input_grad ignores no_grad: a PLIF's
    decay parameter made every evaluation write them). Same spikes either way."""
    from spikefuse.ops import lif as lif_ops
    saved = []
    forward = lif_ops._forward

    def record(*args, **kwargs):
        saved.append(args[7])  # `save`
        return forward(*args, **kwargs)
    monkeypatch.setattr(lif_ops, "_forward", record)
    x = rand(9, 2, 3, seed=5).requires_grad_()
    decay = torch.tensor([0.7, 0.8, 0.9], device=DEVICE, requires_grad=True)
    with torch.no_grad():
        evaluated = F.plif(x, decay, backend="fused")
    trained = F.plif(x, decay, backend="fused")
    assert saved == [False, True] and torch.equal(evaluated, trained)
