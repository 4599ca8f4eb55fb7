"""Time-folded layers, temporal batch norm, and the bit-saving spiking Linear/Conv2d."""
import pytest
import torch
from torch import nn

from spikefuse.nn import Dropout, TemporalBatchNorm1d, TemporalBatchNorm2d, TimeFolded, per_step
from spikefuse.nn.layers import name_layers
from spikefuse.nn.spiking_layers import SpikingConv2d, SpikingLinear


def spikes(*shape, seed=0):
    return (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.3).float()


@pytest.mark.parametrize("module", [nn.Conv2d(3, 5, 3, padding=1), nn.AvgPool2d(2), nn.Linear(6, 4),
                                    nn.MaxPool2d(2)])
def test_time_folded_equals_per_step(module):
    x = torch.randn(3, 2, 3, 6, 6) if not isinstance(module, nn.Linear) else torch.randn(3, 2, 5, 6)
    torch.testing.assert_close(TimeFolded(module)(x), per_step(module, x))


def test_temporal_batchnorm_uses_time_and_batch_statistics():
    x = torch.randn(4, 3, 5, 2, 2) * 2 + 1
    bn = TemporalBatchNorm2d(5)
    y = bn(x)
    ref = nn.functional.batch_norm(x.flatten(0, 1), None, None, training=True)
    torch.testing.assert_close(y, ref.view_as(x))
    torch.testing.assert_close(bn.running_mean, 0.1 * x.mean(dim=(0, 1, 3, 4)))
    bn.eval()
    torch.testing.assert_close(bn(x), nn.functional.batch_norm(
        x.flatten(0, 1), bn.running_mean, bn.running_var).view_as(x))
    assert TemporalBatchNorm1d(5)(torch.randn(4, 3, 5)).shape == (4, 3, 5)
    assert TemporalBatchNorm1d(5)(torch.randn(4, 3, 5, 7)).shape == (4, 3, 5, 7)


def test_dropout_shares_mask_across_time():
    x = torch.ones(6, 4, 50)
    y = Dropout(0.5)(x)
    assert torch.equal(y, y[:1].expand_as(y)) and 0 < (y == 0).float().mean() < 1
    z = Dropout(0.5, shared_across_time=False)(x)
    assert not torch.equal(z, z[:1].expand_as(z))
    assert torch.equal(Dropout(0.5).eval()(x), x)


def reference_grads(layer, plain, s, seed=1):
    """Outputs and gradients of a spiking layer and of the plain torch layer on the same input."""
    results = []
    for module, fold in ((layer, False), (plain, True)):
        si = s.clone().requires_grad_(True)
        y = module(si.flatten(0, 1)).unflatten(0, s.shape[:2]) if fold else module(si)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed))
        (y * g).sum().backward()
        results.append((y, si.grad, module.weight.grad, module.bias.grad))
        module.zero_grad()
    return results


def test_spiking_conv2d_matches_conv2d_and_saves_bits():
    torch.manual_seed(0)
    layer = SpikingConv2d(3, 4, 3, stride=2, padding=1)
    plain = nn.Conv2d(3, 4, 3, stride=2, padding=1)
    plain.load_state_dict(layer.state_dict())
    s = spikes(3, 2, 3, 7, 5)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(s.requires_grad_(True))
    assert [t.dtype for t in saved if t.dim() == 1] == [torch.uint8]
    # the spikes' place in the graph (ops.spike_linear.GraphEdge) is saved too: s's shape, one element of memory
    copies = [t for t in saved if t.shape == s.flatten(0, 1).shape and t.untyped_storage().nbytes() > t.element_size()]
    assert not copies, "a float copy of the spikes was saved"
    for a, b in zip(*reference_grads(layer, plain, s.detach())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.interpreter  # fused kernels on CPU tensors
@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_layer_after_fused_bn_lif_reuses_its_bits(kind, monkeypatch):
    """A ConvBNLIF (LinearBNLIF) after another saves the bits the first block's BN+LIF
    kernel wrote, not a second packing of the same spikes, and its gradients match a
    block that packs."""
    import spikefuse.nn.spiking_layers as layers
    from spikefuse.nn.spiking_layers import ConvBNLIF, LinearBNLIF
    from spikefuse.ops.spike_pack import pack as pack_original

    torch.manual_seed(0)
    if kind == "conv":
        first = ConvBNLIF(3, 8, 3, spike_input=False, backend="fused", threshold=0.3)
        second = ConvBNLIF(8, 8, 3, backend="fused", threshold=0.3)
        x = torch.randn(4, 2, 3, 6, 5)
    else:
        first = LinearBNLIF(5, 16, spike_input=False, backend="fused", threshold=0.3)
        second = LinearBNLIF(16, 8, backend="fused", threshold=0.3)
        x = torch.randn(4, 3, 5)
    packed = []
    monkeypatch.setattr(layers, "pack", lambda t: packed.append(t) or pack_original(t))
    s = first(x)
    second(s).sum().backward()
    assert packed == [], "the spikes were packed again"
    grads_with_bits = [p.grad.clone() for p in second.parameters()]
    second.zero_grad()
    s = first(x).clone()  # a copy carries no bits: this conv packs for itself
    second(s).sum().backward()
    assert len(packed) == 1
    for a, b in zip(grads_with_bits, [p.grad for p in second.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_strided_channels_last_weight_gradient_is_exact_on_cpu():
    """oneDNN's CPU weight gradient of a 1x1 stride-2 conv is wrong about 1 call in 10
    (PyTorch 2.13); SpikingConv2d sidesteps it. Checked against a float64 sum."""
    from spikefuse.nn.spiking_layers import channels_last_conv
    layer = channels_last_conv(SpikingConv2d(4, 8, 1, stride=2, bias=False))
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        s = (torch.rand(2, 2, 4, 16, 16, generator=g) < 0.3).float()
        gy = torch.randn(2, 2, 8, 8, 8, generator=g)
        layer.weight.grad = None
        layer(s).backward(gy)
        expected = torch.einsum("tbohw,tbihw->oi", gy.double(), s[..., ::2, ::2].double())
        torch.testing.assert_close(layer.weight.grad.view(8, 4).double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_spiking_linear_matches_linear(padded, monkeypatch):
    """padded: the path CUDA takes for 5 outputs (products padded to 8 rows, spike_linear.ALIGN)."""
    from spikefuse.ops import spike_linear
    monkeypatch.setattr(spike_linear, "PAD_OFF_CUDA", padded)
    torch.manual_seed(0)
    layer, plain = SpikingLinear(13, 5), nn.Linear(13, 5)
    plain.load_state_dict(layer.state_dict())
    for a, b in zip(*reference_grads(layer, plain, spikes(4, 3, 13))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert layer(spikes(2, 2, 13)).is_contiguous()


def test_frozen_weights_save_nothing():
    layer = SpikingConv2d(2, 3, 3, padding=1).requires_grad_(False)
    s = spikes(2, 1, 2, 4, 4).requires_grad_(True)
    layer(s).sum().backward()
    assert s.grad.shape == s.shape


def test_shape_errors_name_the_layer():
    net = name_layers(nn.Sequential(SpikingConv2d(3, 4, 3), SpikingLinear(8, 2),
                                    TemporalBatchNorm2d(4), TimeFolded(nn.Conv2d(3, 4, 1))))
    with pytest.raises(ValueError, match=r"Sequential\.0.*3 channels.*\(2, 1, 5, 6, 6\)"):
        net[0](torch.zeros(2, 1, 5, 6, 6))
    with pytest.raises(ValueError, match=r"Sequential\.0.*5 dims.*\(1, 3, 6, 6\)"):
        net[0](torch.zeros(1, 3, 6, 6))
    with pytest.raises(ValueError, match=r"Sequential\.1.*8 features.*\(2, 1, 9\)"):
        net[1](torch.zeros(2, 1, 9))
    with pytest.raises(ValueError, match=r"Sequential\.2.*4 channels.*\(2, 1, 3, 2, 2\)"):
        net[2](torch.zeros(2, 1, 3, 2, 2))
    with pytest.raises(ValueError, match=r"Sequential\.3.*3 channels"):
        net[3](torch.zeros(2, 1, 2, 2, 2))
    with pytest.raises(ValueError, match="padding"):
        SpikingConv2d(3, 4, 3, padding="same")
