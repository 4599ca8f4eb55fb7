"""ops.weight_grad_queue with spike_linear: inside `deferring`, backward gives the input
gradient at once and the weight and bias gradients only when the queue runs, then equal to
autograd's own, accumulated into existing .grad as autograd would."""
import pytest
import torch

from spikefuse.ops import weight_grad_queue
from spikefuse.ops.spike_linear import spike_linear

pytestmark = pytest.mark.interpreter  # fused kernels on CPU tensors


def layer(seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(5, 7, generator=g).requires_grad_()
    b = torch.randn(5, generator=g).requires_grad_() if bias else None
    s = (torch.rand(3, 4, 7, generator=g) < 0.3).float().requires_grad_()
    gy = torch.randn(3, 4, 5, generator=g)
    return w, b, s, gy


def params(w, b):
    return [p for p in (w, b) if p is not None]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("passes", [1, 2])  # 2: the second adds into the .grad of the first
def test_queued_gradients_equal_autograd(bias, passes):
    w, b, s, gy = layer(bias=bias)
    for _ in range(passes):
        spike_linear(s, w, b).backward(gy)
    expected = [p.grad.clone() for p in params(w, b)] + [s.grad.clone()]
    for p in params(w, b) + [s]:
        p.grad = None

    queue = []
    for i in range(passes):
        before = [None if p.grad is None else p.grad.clone() for p in params(w, b)]
        with weight_grad_queue.deferring(queue):
            y = spike_linear(s, w, b)
        y.backward(gy)
        assert len(queue) == 1 and all((p.grad is None) if g is None else torch.equal(p.grad, g)
                                       for p, g in zip(params(w, b), before))  # not yet
        weight_grad_queue.run(queue)
        assert queue == []
    for got, want in zip([p.grad for p in params(w, b)] + [s.grad], expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_outside_deferring_nothing_is_queued():
    w, b, s, gy = layer()
    queue = []
    with weight_grad_queue.deferring(queue):
        pass
    spike_linear(s, w, b).backward(gy)
    assert queue == [] and w.grad is not None and weight_grad_queue.active() is None


def test_autocast_products_are_summed_in_the_parameter_dtype():
    w, b, s, gy = layer()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = spike_linear(s, w, b)
    y.backward(gy.bfloat16())
    expected = w.grad.clone()
    queue = []
    w.grad = torch.zeros_like(w)  # an existing float32 .grad: the bfloat16 product is added to it
    with torch.autocast("cpu", dtype=torch.bfloat16), weight_grad_queue.deferring(queue):
        y = spike_linear(s, w, b)
    y.backward(gy.bfloat16())
    weight_grad_queue.run(queue)
    assert w.grad.dtype == torch.float32
    torch.testing.assert_close(w.grad, expected)
