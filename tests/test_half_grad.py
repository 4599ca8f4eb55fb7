"""The fp16 twin of a spiking conv's output gradient (spikefuse.ops.half_grad): what the
fused BN+LIF backward offers, and the conv weight gradient taken from it.

On the CPU the twin is switched on by hand (it is CUDA-only) and cuDNN's role is played by
PyTorch's CPU convolution; on a GPU the weight gradient from the twin is checked to be at
least as close to float64 as TF32's own."""
import pytest
import torch

from spikefuse.nn.spiking_layers import ConvBNLIF
from spikefuse.ops import half_grad
from helpers import DEVICE, rel_err


@pytest.fixture
def twin_on(monkeypatch):
    """The twin on, whatever the device; the offers recorded, and how many were taken."""
    offers, taken = [], []
    real_offer, real_take = half_grad.offer, half_grad.take

    def recording(grad, half, scale):
        offers.append((grad.detach().clone(), half.clone(), scale.clone()))
        real_offer(grad, half, scale)

    def taking(grad):
        twin = real_take(grad)
        taken.append(twin is not None)
        return twin
    monkeypatch.setattr(half_grad, "enabled", lambda x: x.dtype == torch.float32)
    monkeypatch.setattr(half_grad, "offer", recording)
    monkeypatch.setattr(half_grad, "take", taking)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
        yield offers, taken


def block_grads(shape, out_channels, stride, channels_last, twin, seed=0, density=0.3):
    """(input grad, conv weight grad, BN weight grad, BN bias grad) of one ConvBNLIF, and its spikes."""
    torch.manual_seed(seed)
    T, B, C, H, W = shape
    blk = ConvBNLIF(C, out_channels, 3, stride, backend="fused", decay=0.5, threshold=0.3).to(DEVICE)
    blk.half_twin = twin
    s = (torch.rand(shape, device=DEVICE) < density).float()
    if channels_last:
        s = s.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, (T, B))
    s.requires_grad_(True)
    out = blk(s)
    (out * torch.randn_like(out)).sum().backward()
    return (s.grad, blk.layer.weight.grad, blk.bn.weight.grad, blk.bn.bias.grad), s.detach()


CASES = [((3, 2, 8, 9, 7), 16, 2, False), ((1, 3, 5, 6, 6), 7, 1, False), ((4, 2, 8, 8, 8), 16, 1, True)]


@pytest.mark.parametrize("shape,out_channels,stride,channels_last", CASES)
def test_twin_gives_the_weight_gradient_and_changes_nothing_else(twin_on, shape, out_channels, stride,
                                                                 channels_last):
    offers, taken = twin_on
    plain = block_grads(shape, out_channels, stride, channels_last, twin=False)[0]
    assert not offers, "no twin without half_twin"
    twinned = block_grads(shape, out_channels, stride, channels_last, twin=True)[0]
    assert len(offers) == 1 and taken == [False, True], "offered once, and the conv took it"
    # BN's gradients: the same kernels; the input gradient: the same convolution, alone
    # (cuDNN may then pick another TF32 algorithm: TF32's rounding differs, 1e-5 on the CPU)
    tol = 1e-5 if DEVICE == "cpu" else 2e-3
    for got, want, what in zip((twinned[0], *twinned[2:]), (plain[0], *plain[2:]), ("input", "BN weight", "BN bias")):
        assert rel_err(got, want) < tol, what
    # the weight gradient: gy rounded to 11 significant bits, as TF32 rounds it
    assert rel_err(twinned[1], plain[1]) < 2e-3


@pytest.mark.parametrize("shape,out_channels,stride,channels_last", CASES[:2])
def test_twin_is_scaled_by_powers_of_two_under_the_sum_limit(twin_on, shape, out_channels, stride,
                                                             channels_last):
    block_grads(shape, out_channels, stride, channels_last, twin=True, seed=3)
    grad, half, scale = twin_on[0][0]
    assert half.dtype == torch.float16 and half.stride() == grad.stride()
    assert torch.equal(torch.exp2(torch.log2(scale).round()), scale), "powers of two"
    per_channel = (-1,) + (1,) * (grad.dim() - 3)
    sums = half.float().abs().sum(dim=[d for d in range(half.dim()) if d != 2])
    assert (sums <= half_grad.SUM_LIMIT * (1 + 2 ** -10)).all()
    assert sums.max() > half_grad.SUM_LIMIT / 64, "the bound is not loose by more than a few bits"
    unscaled = half.float() / scale.view(per_channel)
    torch.testing.assert_close(unscaled, grad, rtol=2 ** -11, atol=float(grad.abs().max()) * 2 ** -20)


def test_twin_is_refused_for_other_or_modified_memory(twin_on):
    grad = torch.randn(2, 3, 4, 4, device=DEVICE)
    half, scale = grad.half(), torch.ones(3, device=DEVICE)
    half_grad.offer(grad, half, scale)
    assert half_grad.take(grad.clone()) is None
    assert half_grad.take(grad) is None, "taking empties the slot"
    half_grad.offer(grad, half, scale)
    grad.mul_(2)
    assert half_grad.take(grad) is None, "modified since it was offered"
    half_grad.offer(grad, half, scale)
    view = grad.flatten(0, 1)
    twin = half_grad.take(view)
    assert twin is not None and torch.equal(half_grad.half_view(twin, view), half.flatten(0, 1))


def test_off_for_fp32_strict_and_other_dtypes():
    x = torch.zeros(2, 2)
    assert not half_grad.enabled(x)  # a CPU tensor
    if DEVICE == "cuda":
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            assert not half_grad.enabled(x.cuda())
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
            assert half_grad.enabled(x.cuda()) and not half_grad.enabled(x.cuda().half())


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="cuDNN's TF32 and fp16 convolutions")
@pytest.mark.parametrize("stride", [1, 2])
def test_gpu_twin_weight_gradient_is_as_close_to_float64_as_tf32(stride):
    """The rule the twin follows (docs/capture.md): no larger error against float64 than TF32's."""
    offers = []
    real_offer = half_grad.offer
    half_grad.offer = lambda grad, half, scale: (offers.append(grad.detach().clone()), real_offer(grad, half, scale))
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):
            shape = (4, 16, 64, 16, 16)
            (_, twinned, _, _), s = block_grads(shape, 128, stride, True, twin=True, density=0.4)
            tf32 = block_grads(shape, 128, stride, True, twin=False, density=0.4)[0][1]
    finally:
        half_grad.offer = real_offer
    s = s.double().flatten(0, 1)
    gy = offers[0].double().flatten(0, 1)
    w = torch.empty(128, 64, 3, 3, device="cuda", dtype=torch.float64)
    exact = torch.ops.aten.convolution_backward(gy, s, w, None, [stride] * 2, [1, 1], [1, 1], False, [0, 0], 1,
                                                [False, True, False])[1]
    assert rel_err(twinned, exact) <= rel_err(tf32, exact) * 1.05


def test_twin_bound_holds_with_statistics_over_several_ranks(monkeypatch):
    """SyncBN: xhat is standardised over every rank's batch, so this rank's sum of |xhat| may pass
    its own count; the bound then takes the global count (sync.scale = count / global count)."""
    from spikefuse.ops.bn_lif import _backward, _forward, _statistics

    offers = []
    monkeypatch.setattr(half_grad, "enabled", lambda x: x.dtype == torch.float32)
    monkeypatch.setattr(half_grad, "offer", lambda g, h, s: offers.append((g.clone(), h.clone(), s.clone())))
    torch.manual_seed(5)
    T, B, C, H, W = 3, 2, 4, 5, 5
    x = torch.randn(T, B, C, H, W, device=DEVICE) * 5.0
    other_rank = torch.randn(T, B, C, H, W, device=DEVICE) * 0.01  # narrow: this rank's |xhat| sum 1.1x its count
    weight, bias = torch.rand(C, device=DEVICE) + 0.5, torch.zeros(C, device=DEVICE)
    stats = _statistics(torch.cat([x, other_rank], 1), weight, bias, None, None, True, 0.1, 1e-5)

    class TwoRanks:  # what spikefuse.parallel.sync_bn's hook offers the backward (the other rank's sums: 0)
        scale = torch.tensor([0.5], device=DEVICE)

        def gradient_sums(self, sums, count):
            return sums * self.scale

    spikes, ckpt = _forward(x, None, stats, 0.5, None, 0.3, "hard", 0.0, T, True)
    _backward(torch.randn_like(spikes) * 1e3, x, None, ckpt, stats, 0.5, None, 0.3, "hard", 0.0, False,
              "rectangular", 1.0, True, False, T, sync=TwoRanks(), half_twin=True)
    grad, half, scale = offers[0]
    sums = half.float().abs().sum(dim=(0, 1, 3, 4))
    assert (sums <= half_grad.SUM_LIMIT * (1 + 2 ** -10)).all() and sums.max() > half_grad.SUM_LIMIT / 64
    torch.testing.assert_close(half.float() / scale.view(-1, 1, 1), grad, rtol=2 ** -11,
                               atol=float(grad.abs().max()) * 2 ** -20)


def test_an_untaken_twin_is_not_kept(twin_on):
    """Only the input's gradient asked for: the conv's backward still empties the slot."""
    offers, taken = twin_on
    torch.manual_seed(0)
    blk = ConvBNLIF(4, 8, 3, 1, backend="fused").to(DEVICE)
    s = (torch.rand(2, 2, 4, 6, 6, device=DEVICE) < 0.3).float().requires_grad_(True)
    out = blk(s)
    (grad_s,) = torch.autograd.grad(out.sum(), [s])
    assert len(offers) == 1 and taken == [True] and grad_s.shape == s.shape
    assert getattr(half_grad._slot, "twin", None) is None or DEVICE == "cuda"  # (CUDA: another thread's slot)
