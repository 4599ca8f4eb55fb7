"""reset="subtract" against snnTorch, whose default reset it is: `Leaky` and `Synaptic`
stepped over time give our lif's and cuba's spikes exactly, on every backend, and the same
gradients (snnTorch detaches its reset: detach_reset=True; its default surrogate is our
"atan" at alpha 2). snnTorch is a test dependency (pyproject's `test` extra): where it is
missing these tests fail, they do not skip. The neurons without the delayed reset refuse it."""
import pytest
import torch

import spikefuse.functional as F
from spikefuse.nn import BNLIF
from helpers import DEVICE, rel_err

# decay 0 and 1 included; threshold 1 and one that is no power of 2
CASES = [(0.0, 1.0, 0), (0.5, 0.7, 1), (0.9, 1.0, 2), (1.0, 0.7, 3), (0.95, 1.3, 4)]
BACKENDS = ("fused", "reference", "auto")  # auto: the loop path on the CPU


def inputs(seed, shape=(25, 4, 19)):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 0.8 + 0.35).to(DEVICE)


def stepped(neuron, x, state):
    """snnTorch's neuron over x [T, *] one step a call from `state`: spikes, dL/dx for a
    fixed random loss on them."""
    x = x.clone().requires_grad_()
    spikes = []
    for step in x:
        spk, *state = neuron(step, *state)
        spikes.append(spk)
    spikes = torch.stack(spikes)
    return spikes.detach(), torch.autograd.grad((spikes * loss_weights(spikes)).sum(), x)[0]


def ours(fn, x, **kw):
    x = x.clone().requires_grad_()
    spikes = fn(x, reset="subtract", detach_reset=True, surrogate="atan", alpha=2.0, **kw)
    return spikes.detach(), torch.autograd.grad((spikes * loss_weights(spikes)).sum(), x)[0]


def loss_weights(spikes):
    return torch.randn(spikes.shape, generator=torch.Generator().manual_seed(9)).to(spikes.device)


def assert_same(theirs, mine, what):
    assert 0.02 < theirs[0].mean() < 0.9, "degenerate case"
    assert torch.equal(mine[0], theirs[0]), f"{what}: spikes differ at {(mine[0] != theirs[0]).sum().item()} places"
    assert rel_err(mine[1], theirs[1]) < 1e-5, f"{what}: dL/dx {rel_err(mine[1], theirs[1])}"


@pytest.mark.parametrize("decay,threshold,seed", CASES)
def test_leaky_spikes_and_gradients(decay, threshold, seed):
    import snntorch

    x = inputs(seed)
    v0 = inputs(seed + 10, x.shape[1:])  # some above the threshold: snnTorch resets step 0 from them
    leaky = snntorch.Leaky(beta=decay, threshold=threshold).to(DEVICE)
    for state0 in (None, v0):
        theirs = stepped(leaky, x, [torch.zeros_like(x[0]) if state0 is None else state0])
        for backend in BACKENDS:
            mine = ours(F.lif, x, decay=decay, threshold=threshold, v0=state0, backend=backend)
            assert_same(theirs, mine, f"{backend}, v0 {'given' if state0 is not None else 'zeros'}")


@pytest.mark.parametrize("decay,threshold,seed", CASES[1:])  # cuba's decay is in (0, 1]
def test_synaptic_spikes_and_gradients(decay, threshold, seed):
    import snntorch

    x = inputs(seed)
    syn_decay = 0.6
    i0, v0 = inputs(seed + 10, x.shape[1:]), inputs(seed + 20, x.shape[1:])
    synaptic = snntorch.Synaptic(alpha=syn_decay, beta=decay, threshold=threshold).to(DEVICE)
    theirs = stepped(synaptic, x, [i0, v0])  # snnTorch's state order: (syn, mem)
    for backend in ("fused", "reference"):
        mine = ours(F.cuba, x, decay=decay, syn_decay=syn_decay, threshold=threshold, state0=(v0, i0),
                    backend=backend)
        assert_same(theirs, mine, backend)


@pytest.mark.parametrize("call", [
    lambda x, **kw: F.alif(x, **kw),
    lambda x, **kw: F.rlif(x, torch.eye(x.shape[-1], device=x.device), **kw),
    lambda x, **kw: F.ralif(x, torch.eye(x.shape[-1], device=x.device), **kw),
], ids=["alif", "rlif", "ralif"])
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_neurons_without_it_refuse_it_naming_reset(call, backend):
    with pytest.raises(ValueError, match=r"^reset: .*'subtract'"):
        call(inputs(0, (3, 2, 5)), reset="subtract", backend=backend)


def test_bnlif_refuses_it_naming_reset():
    with pytest.raises(ValueError, match=r"^reset: BNLIF .*'subtract'"):
        BNLIF(4, reset="subtract")


# found by the property fuzzer's longer run (plif, seed 2): the fused backward added the delayed
# reset's threshold term -dL/dh[t] * s[t-1] at padded steps past T too, where s[t-1] is NaN
# after a NaN input (0 * NaN): a NaN threshold gradient where the reference's is 0
@pytest.mark.parametrize("T", [1, 2, 5])
def test_nan_input_threshold_gradient_as_reference(T):
    results = []
    for backend in ("fused", "reference"):
        x = torch.full((T, 1, 1), 0.4, device=DEVICE)
        x[0] = float("nan")
        x.requires_grad_()
        decay = torch.tensor([0.3], device=DEVICE, requires_grad=True)
        threshold = torch.tensor([1.0], device=DEVICE, requires_grad=True)
        s = F.plif(x, decay, threshold=threshold, reset="subtract", surrogate="rectangular", backend=backend)
        results.append(torch.autograd.grad(s.sum(), [x, decay, threshold]))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, equal_nan=True)
