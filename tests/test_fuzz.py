"""Seeded random sweep (issue 14): fused against reference LIF, PLIF and BN+LIF over shapes,
parameters and special values (0, -0, +-inf, NaN, subnormals, near-overflow), agreeing under
the non-finite policy of spikefuse.functional.lif: spikes and v[T-1] exactly, NaN where NaN;
gradients to 1e-5 (norm-wise) where both are finite (a decay's, a float32 sum over T steps,
to 1e-5 * T / 16), and never finite where the reference's is NaN. Seeds ending in 0, 1, 2
take huge T with one neuron, N = 1 and B = 0. A failure prints its case; rerun one with
`-k "test_fuzz_lif and 7"`."""
import copy
import math
import random

import pytest
import torch

import spikefuse.functional as F
from spikefuse.nn import BNLIF
from spikefuse.ops.spike_pack import attached_bits, pack
from spikefuse.surrogates import SURROGATES
from helpers import DEVICE

nan, inf = float("nan"), float("inf")
SPECIALS = [0.0, -0.0, inf, -inf, nan, 1e-40, -1e-40, 3e38, -3e38, 1.0]  # 1e-40: subnormal


def shape_for(rng, seed, min_dims=1):
    """[T, *]: seeds ending in 0, 1, 2 take huge T with one neuron, one neuron, B = 0; the
    others small odd sizes."""
    if seed % 10 == 0:  # huge T, tiny N: many time chunks (the interpreter's time grows with T)
        return (65 if min_dims < 2 else 33,) + (1,) * max(min_dims, 1)
    if seed % 10 == 1:
        return (rng.randint(1, 9),) + (1,) * max(min_dims, 1)  # one neuron
    if seed % 10 == 2:
        return (rng.randint(1, 5), 0) + tuple(rng.randint(1, 4) for _ in range(max(min_dims - 1, 0)))  # B = 0
    T = rng.choice([1, 2, 3, 5, 8, 17])  # one time chunk, and two (K = 16 or 8)
    dims = [rng.choice([1, 2, 3, 5, 7, 13, 65]) for _ in range(rng.randint(min_dims, 3))]
    while math.prod(dims) > 150:  # the interpreter runs programs (64 neurons each) one by one
        dims[dims.index(max(dims))] //= 4
    return (T, *dims)


def tensor(shape, rng, scale=1.0, shift=0.3, special=0.0, specials=SPECIALS):
    """Random values with a fraction `special` of the entries replaced by special values."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    x = torch.randn(shape, generator=g) * scale + shift
    if special and x.numel():
        pick = torch.rand(shape, generator=g) < special
        values = torch.tensor(specials)[torch.randint(len(specials), shape, generator=g)]
        x = torch.where(pick, values, x)
    return x.to(DEVICE)


def maybe_strided(x, rng):
    """Sometimes the same values as a non-contiguous view."""
    if x.dim() >= 3 and rng.random() < 0.3:
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    return x


def lif_options(rng):
    surrogate = rng.choice(sorted(SURROGATES))
    return dict(threshold=rng.choice([1.0, 0.0, 0.3, -0.5, 1e-38]), reset=rng.choice(["hard", "soft", "none"]),
                v_reset=rng.choice([0.0, -0.2, 0.1]), detach_reset=rng.random() < 0.3, surrogate=surrogate)


def assert_same_values(a, b, what):
    """Exactly equal, NaN where NaN (-0.0 == 0.0)."""
    assert a.shape == b.shape, what
    a, b = a.float(), b.float()
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN at different places"
    assert torch.equal(a.nan_to_num(0.25, inf, -inf), b.nan_to_num(0.25, inf, -inf)), \
        f"{what}: differ at {(a != b).logical_and(~a.isnan()).sum().item()} places"


def assert_grads_match(g1, g2, what, rtol=1e-5):
    """Norm-wise where both are finite; never finite where the reference's is NaN."""
    assert (g1 is None) == (g2 is None), what
    if g2 is None:
        return
    g1, g2 = g1.double(), g2.double()
    assert not (g2.isnan() & g1.isfinite()).any(), f"{what}: finite where the reference is NaN"
    both = g1.isfinite() & g2.isfinite()
    a, b = g1[both], g2[both]
    err = ((a - b).norm() / b.norm().clamp_min(1e-30)).item() if b.numel() else 0.0
    assert err < rtol or (a - b).abs().max() < 1e-30, f"{what}: relative error {err}"


def run_lif(backend, x, decay, v0, options, return_state):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, decay, v0)]
    xi, di, vi = leaves
    out = F.lif(xi, decay=di if di is not None else options["decay"], v0=vi, return_state=return_state,
                backend=backend, **{k: v for k, v in options.items() if k != "decay"})
    spikes, v = out if return_state else (out, None)
    g = tensor(spikes.shape, random.Random(1), shift=0.0)
    loss = (spikes.float() * g).nan_to_num(0.0, 0.0, 0.0).sum()  # every spike gets a gradient
    if v is not None:
        loss = loss + (v * tensor(v.shape, random.Random(2), shift=0.0)).nan_to_num(0.0, 0.0, 0.0).sum()
    wrt = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(loss, wrt)) if loss.requires_grad else iter([None] * len(wrt))
    return spikes, v, [next(grads) if t is not None else None for t in leaves]


def check_lif(seed, plif):
    rng = random.Random(f"fuzz-{seed}")  # a string seed: consecutive seeds drew alike
    shape = shape_for(rng, seed, min_dims=2 if plif else 1)
    options = lif_options(rng)
    dtype = torch.bfloat16 if rng.random() < 0.15 else torch.float32
    # the Triton interpreter converts bfloat16 subnormals wrongly (1e-39 -> 4.4e-39; a GPU
    # converts them exactly): none in bfloat16 cases on the CPU
    specials = [v for v in SPECIALS if abs(v) != 1e-40] if dtype == torch.bfloat16 and DEVICE == "cpu" else SPECIALS
    x = maybe_strided(tensor(shape, rng, special=rng.choice([0.0, 0.05, 0.3]), specials=specials), rng)
    decay = None
    if plif:
        channels = shape[2] if len(shape) >= 3 else None
        if channels and rng.random() < 0.6:
            decay = torch.rand(channels, generator=torch.Generator().manual_seed(seed))
            decay[rng.randrange(channels)] = rng.choice([0.0, 1.0, nan, 0.5])
        else:
            decay = torch.tensor(rng.choice([0.0, 1.0, nan, 0.7, 0.999]))
        decay = decay.to(DEVICE)
    else:
        options["decay"] = rng.choice([0.0, 1.0, 0.5, 0.9, 0.25])
    v0 = tensor(shape[1:], rng, scale=0.5, special=0.1) if rng.random() < 0.3 else None
    return_state = rng.random() < 0.5
    what = (f"seed {seed}: {'plif' if plif else 'lif'} x{tuple(shape)} {dtype} {options} "
            f"decay={decay if decay is not None else options['decay']} v0={v0 is not None} state={return_state}")
    fused = run_lif("fused", x.to(dtype), decay, v0, options, return_state)
    ref = run_lif("reference", x.to(dtype).float(), decay, v0, options, return_state)  # oracle in float32
    assert_same_values(fused[0], ref[0], f"{what}: spikes")
    if return_state:
        assert_same_values(fused[1], ref[1], f"{what}: v[T-1]")
    for name, g1, g2 in zip(("x", "decay", "v0"), fused[2], ref[2]):
        rtol = 1e-5 if dtype == torch.float32 else 1e-2
        if name == "decay":  # a float32 sum over T steps, in another order: rounding grows with T
            rtol *= max(1.0, shape[0] / 16)
        assert_grads_match(g1, g2, f"{what}: grad {name}", rtol)


@pytest.mark.parametrize("seed", range(16))
def test_fuzz_lif(seed):
    check_lif(seed, plif=False)


@pytest.mark.parametrize("seed", range(100, 110))
def test_fuzz_plif(seed):
    check_lif(seed, plif=True)


def run_bn(module, x, residual):
    x = x.detach().clone().requires_grad_()
    r = residual.detach().clone().requires_grad_() if residual is not None else None
    spikes = module(x, r)
    loss = (spikes.float() * tensor(spikes.shape, random.Random(3), shift=0.0)).nan_to_num(0.0, 0.0, 0.0).sum()
    wrt = [x, *([r] if r is not None else []), *module.parameters()]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True) if spikes.numel() else [None] * len(wrt)
    return spikes, grads, {k: b.clone() for k, b in module.named_buffers()}


@pytest.mark.parametrize("seed", range(200, 211))
def test_fuzz_bn_lif(seed):
    rng = random.Random(f"fuzz-{seed}")  # a string seed: consecutive seeds drew alike
    shape = shape_for(rng, seed, min_dims=2)
    C = shape[2]
    training = rng.random() < 0.7
    options = lif_options(rng)
    options["threshold"] = rng.choice([0.3, 0.0, 0.8, -0.2])
    module = BNLIF(C, decay=rng.choice([0.5, 0.9, 0.2]), learn_decay=rng.random() < 0.5,
                   affine=rng.random() < 0.8, backend="fused", **options).to(DEVICE)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if module.affine:
            module.weight.copy_(torch.rand(C, generator=g) + 0.5)
            module.bias.copy_(torch.rand(C, generator=g) * 0.6 - 0.3)
        module.running_mean.copy_(torch.rand(C, generator=g) * 0.6 - 0.3)
        module.running_var.copy_(torch.rand(C, generator=g) * 1.5 + 0.5)
    module.train(training)
    reference = copy.deepcopy(module)
    reference.backend = "reference"
    # no near-overflow values: batch statistics that overflow float32 are only specified
    # to be non-finite (torch's (x - mean) * invstd can be inf * 0 where x * a + b is not)
    specials = [v for v in SPECIALS if abs(v) != 3e38]
    x = maybe_strided(tensor(shape, rng, special=rng.choice([0.0, 0.0, 0.02, 0.2]), specials=specials), rng)
    residual = tensor(shape, rng, scale=0.3, shift=0.0) if rng.random() < 0.3 else None
    what = f"seed {seed}: BNLIF x{tuple(shape)} training={training} {options} residual={residual is not None}"
    if training and x[0].numel() * x.shape[0] == C:  # one value per channel: refused, as torch
        for m in (module, reference):
            with pytest.raises(ValueError, match="more than 1 value per channel"):
                m(x)
        return
    (s1, g1, b1), (s2, g2, b2) = run_bn(module, x, residual), run_bn(reference, x, residual)
    assert_same_values(s1, s2, f"{what}: spikes")
    bits = attached_bits(s1)  # the kernel's packed copy for the next layer: NaN packs as 1, as pack()
    assert bits is None or torch.equal(bits, pack(s1.detach().contiguous())), f"{what}: spike bits"
    names = ["x", *(["residual"] if residual is not None else []), *dict(module.named_parameters())]
    degenerate = training and x.numel() // C == 2  # BN of two values is +-1 whatever x: dL/dx is rounding noise
    for name, a, b in zip(names, g1, g2):
        if not (degenerate and name == "x"):  # the decay's: a float32 sum over T steps, see check_lif
            assert_grads_match(a, b, f"{what}: grad {name}", 1e-5 * max(1.0, shape[0] / 16 if name == "decay_logit" else 1))
    for name in b2:  # running statistics: finite where finite, and close there
        assert torch.equal(b1[name].isfinite(), b2[name].isfinite()), f"{what}: buffer {name}"
        finite = b2[name].isfinite()
        torch.testing.assert_close(b1[name][finite], b2[name][finite], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{what}: buffer {name}: {m}")
