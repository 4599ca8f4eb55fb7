"""Aligned buffers behind narrow activations (spikefuse.ops.padded_rows): a SpikingLinear with
padded_output hands a LIF, and the SpikingLinear after it, its output as a view of a
zero-padded buffer; they run on the buffer. The real columns must equal the copying path's
(spikes exactly, gradients to 1e-5), with no copy in between. CUDA pads; PAD_OFF_CUDA turns
the padding on for the CPU (the fused LIF through Triton's interpreter)."""
import pytest
import torch
from torch import nn

from spikefuse.models.ipu import IPUNet
from spikefuse.nn import LIF
from spikefuse.nn.spiking_layers import SpikingLinear
from spikefuse.ops import spike_linear
from spikefuse.ops.padded_rows import padded_full

from helpers import DEVICE


@pytest.fixture
def pad_on_cpu(monkeypatch):
    monkeypatch.setattr(spike_linear, "PAD_OFF_CUDA", True)


def frames(T, B, n, seed=0, rate=0.3):
    return (torch.rand(T, B, n, generator=torch.Generator().manual_seed(seed)) < rate).float().to(DEVICE)


def stack(padded_output, **lif):
    """SpikingLinear(6 -> 11) -> LIF -> SpikingLinear(11 -> 5), weights from seed 0."""
    torch.manual_seed(0)
    net = nn.Sequential(SpikingLinear(6, 11, padded_output=padded_output), LIF(threshold=0.4, backend="fused", **lif),
                        SpikingLinear(11, 5))
    for m in net:
        if isinstance(m, nn.Linear):
            m.weight.data.mul_(2.0)
    return net.to(DEVICE)


def run(net, x, seed=1):
    x = x.clone().requires_grad_(True)
    hidden = net[1](net[0](x))
    y = net[2](hidden)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    (y * g).sum().backward()
    return hidden, y, x.grad, [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize("T,B", [(1, 1), (5, 3)])
def test_padded_chain_equals_the_copying_one(pad_on_cpu, T, B):
    x = frames(T, B, 6)
    hidden, y, gx, grads = run(stack(True), x)
    full = padded_full(hidden)
    assert full is not None and full.shape[-1] == 16 and hidden.data_ptr() == full.data_ptr()
    assert torch.equal(full[..., 11:], torch.zeros_like(full[..., 11:]))  # the pad neurons stay silent
    hidden_ref, y_ref, gx_ref, grads_ref = run(stack(False), x)
    assert padded_full(hidden_ref) is None and hidden_ref.is_contiguous()
    assert 0 < hidden.sum() < hidden.numel()
    assert torch.equal(hidden, hidden_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, grads_ref):
        assert a.shape == b.shape and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_another_consumer_of_the_view_gets_its_gradient(pad_on_cpu):
    """A rate penalty on the hidden spikes' view adds its gradient through autograd's slice."""
    def loss(net):
        x = frames(4, 2, 6).requires_grad_(True)
        h = net[0](x)
        v = net[1](h)
        (net[2](v).sum() + 3.0 * h.square().mean()).backward()
        return x.grad, [p.grad for p in net.parameters()]
    (gx, grads), (gx_ref, grads_ref) = loss(stack(True)), loss(stack(False))
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_what_cannot_run_padded_runs_on_a_copy(pad_on_cpu):
    """An in-place edit, or a per-neuron parameter (a learnable threshold): the LIF reads the view."""
    x = frames(3, 2, 6)
    with torch.no_grad():  # (with a graph, autograd refuses an in-place edit of a Function's view)
        y = stack(True)[0](x)
        assert padded_full(y) is not None
        y.mul_(1.0)  # modified: the attachment no longer holds
    assert padded_full(y) is None
    learnable = stack(True, learn_threshold=True)
    hidden, y_out, gx, grads = run(learnable, x)
    assert padded_full(hidden) is None and hidden.is_contiguous()
    hidden_ref, y_ref, gx_ref, grads_ref = run(stack(False, learn_threshold=True), x)
    assert torch.equal(hidden, hidden_ref)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)


def test_evaluation_runs_padded_without_a_graph(pad_on_cpu):
    net = stack(True)
    x = frames(3, 2, 6)
    with torch.no_grad():
        hidden = net[1](net[0](x))
        y = net[2](hidden)
    assert padded_full(hidden) is not None
    torch.testing.assert_close(y, stack(False)[2](stack(False)[1](stack(False)[0](x))), rtol=1e-5, atol=1e-6)


def test_ipu_net_hands_its_odd_layer_on_padded(pad_on_cpu):
    torch.manual_seed(0)
    net = IPUNet((10,), 3, hidden=(16, 13), backend="fused").to(DEVICE)
    assert [getattr(m, "padded_output", None) for m in net.layers if isinstance(m, SpikingLinear)] == [True, False]
    x = frames(4, 2, 10, rate=0.5)
    outputs = {}
    net.layers[4].register_forward_hook(lambda m, i, o: outputs.update(hidden=o))
    logits = net(x)
    logits.square().sum().backward()
    assert padded_full(outputs["hidden"]) is not None
    grads = [p.grad.clone() for p in net.parameters()]
    plain = IPUNet((10,), 3, hidden=(16, 13), backend="fused").to(DEVICE)
    plain.load_state_dict(net.state_dict())
    plain.layers[3].padded_output = False
    logits_ref = plain(x)
    logits_ref.square().sum().backward()
    torch.testing.assert_close(logits, logits_ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, [p.grad for p in plain.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_queued_weight_gradients_cut_the_padding(pad_on_cpu):
    """The pipeline's split backward (weight_grad_queue) adds the padded products' real rows and
    columns into .grad."""
    from spikefuse.ops import weight_grad_queue
    x = frames(4, 3, 6)
    net, queue = stack(True), []
    with weight_grad_queue.deferring(queue):
        y = net[2](net[1](net[0](x)))
    y.square().sum().backward()
    assert len(queue) == 2
    weight_grad_queue.run(queue)
    ref = stack(False)
    ref[2](ref[1](ref[0](x))).square().sum().backward()
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_a_gradient_penalty_through_the_padded_chain(pad_on_cpu):
    """A backward with create_graph (second derivatives) runs on the padded buffers too: the
    penalty |dL/dx|^2 and its gradients w.r.t. x and the weights equal the copying chain's."""
    def penalty(net):
        x = frames(3, 2, 6).requires_grad_(True)
        y = net[2](net[1](net[0](x)))
        gx, *gw = torch.autograd.grad(y.square().sum(), [x, *net.parameters()], create_graph=True)
        p = gx.square().sum() + sum(g.square().sum() for g in gw)
        return p, torch.autograd.grad(p, [x, *net.parameters()])
    (p, grads), (p_ref, grads_ref) = penalty(stack(True)), penalty(stack(False))
    assert p_ref > 0
    torch.testing.assert_close(p, p_ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
