"""RecurrentCUBA / spikefuse.functional.rcuba (snnTorch's RSynaptic): CUBA whose synaptic
current also takes the layer's spikes of the step before through a square weight. No fused
kernel: the reference (torch ops step by step) is the implementation, checked here against the
equations written out, against CUBA, and against snnTorch's RSynaptic."""
from __future__ import annotations

import pytest
import torch

from spikefuse import functional as F
from spikefuse.nn import CUBA, RecurrentCUBA
from spikefuse.train.spikes import SpikeMonitor


def drive(seed, shape=(12, 3, 8), scale=1.2):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * scale


def written_out(x, weight, decay, syn_decay, threshold):
    """The equations step by step, hard reset to 0 (the docstring's)."""
    v = i = torch.zeros_like(x[0])
    s, out = torch.zeros_like(x[0]), []
    for t in range(x.shape[0]):
        i = syn_decay * i + x[t] + s @ weight.T
        h = decay * v + i
        s = (h >= threshold).to(x.dtype)
        v = torch.where(s > 0, torch.zeros_like(h), h)
        out.append(s)
    return torch.stack(out)


def test_the_equations_and_cuba_at_a_zero_weight():
    torch.manual_seed(0)
    x, weight = drive(0), torch.randn(8, 8) * 0.5
    spikes = F.rcuba(x, weight, decay=0.8, syn_decay=0.6, threshold=0.7)
    assert 0.05 < spikes.mean() < 0.9
    assert torch.equal(spikes, written_out(x, weight, 0.8, 0.6, 0.7))
    assert not torch.equal(spikes, F.cuba(x, decay=0.8, syn_decay=0.6, threshold=0.7))
    layer = RecurrentCUBA(8, decay=0.8, syn_decay=0.6, threshold=0.7)
    with torch.no_grad():
        layer.weight.zero_()
    assert torch.equal(layer(x), CUBA(decay=0.8, syn_decay=0.6, threshold=0.7)(x))


def test_rsynaptic_spikes_and_gradients():
    """snnTorch's default RSynaptic (subtract reset a step late, detached; strict firing) stepped
    by hand, against RecurrentCUBA(reset="subtract", detach_reset=True) with its weight and its
    recurrent bias added to the input: equal spikes, and input and weight gradients to 1e-5."""
    snn = pytest.importorskip("snntorch")
    from snntorch import surrogate

    torch.manual_seed(3)
    x = drive(1, scale=0.9)
    theirs_layer = snn.RSynaptic(alpha=0.6, beta=0.85, threshold=0.6, linear_features=8,
                                 spike_grad=surrogate.fast_sigmoid(slope=1))
    ours_layer = RecurrentCUBA(8, decay=0.85, syn_decay=0.6, threshold=0.6, reset="subtract", detach_reset=True,
                               surrogate="fast_sigmoid", alpha=1.0)
    with torch.no_grad():
        ours_layer.weight.copy_(theirs_layer.recurrent.weight)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    spk, syn, mem = theirs_layer.init_rsynaptic()
    steps = []
    for t in range(x.shape[0]):
        spk, syn, mem = theirs_layer(x1[t], spk, syn, mem)
        steps.append(spk)
    theirs = torch.stack(steps)
    ours = ours_layer(x2 + theirs_layer.recurrent.bias)
    assert 0.05 < theirs.mean() < 0.9 and torch.equal(ours, theirs)
    probe = torch.randn_like(theirs)
    (theirs * probe).sum().backward()
    (ours * probe).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_layer.weight.grad, theirs_layer.recurrent.weight.grad, rtol=1e-5, atol=1e-6)


def test_record_potential_the_monitor_and_repr():
    layer = RecurrentCUBA(8, decay=0.8, syn_decay=0.5, threshold=0.7, record_potential=True)
    x = drive(2)
    with SpikeMonitor(torch.nn.Sequential(layer), keep=True) as monitor:
        spikes = layer(x)
    assert layer.potential.shape == x.shape and torch.equal(spikes, (layer.potential >= 0.7).float())
    assert torch.equal(next(iter(monitor.trains.values())), spikes)
    assert repr(layer).startswith("RecurrentCUBA(8, decay=0.8, syn_decay=0.5, threshold=0.7")


@pytest.mark.parametrize("call, message", [
    (lambda: RecurrentCUBA(8, backend="fused"), r"backend: RecurrentCUBA has no fused kernel"),
    (lambda: F.rcuba(drive(0), torch.zeros(8, 8), backend="fused"), r"backend: 'fused'; rcuba has no fused kernel"),
    (lambda: F.rcuba(drive(0), torch.zeros(8, 8), backend="gpu"), r"backend: 'gpu'"),
    (lambda: F.rcuba(drive(0), torch.zeros(8, 7)), r"weight must be \[N, N\] = \[8, 8\]"),
    (lambda: F.rcuba(drive(0), torch.zeros(8, 8), syn_decay=1.5), r"syn_decay"),
    (lambda: RecurrentCUBA(8)(drive(0, (4, 2, 7))), r"expected 8 features in x's last dim"),
    (lambda: RecurrentCUBA(0), r"features must be a positive int"),
], ids=["module-fused", "fused", "unknown-backend", "weight-shape", "syn-decay", "features", "zero-features"])
def test_bad_arguments_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()
