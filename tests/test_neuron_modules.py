"""nn.LIF / IF / PLIF: backends agree, streaming in chunks equals one call, torch.compile."""
import pytest
import torch

from spikefuse import nn

pytestmark = pytest.mark.interpreter  # fused kernels on CPU tensors


def test_modules_match_reference_backend():
    x = torch.randn(8, 4, 6, 3)
    for make in (lambda b: nn.LIF(decay=0.6, backend=b), lambda b: nn.IF(backend=b),
                 lambda b: nn.PLIF(channels=6, backend=b)):
        assert torch.equal(make("fused")(x), make("reference")(x))


def test_plif_learns_its_decay():
    layer = nn.PLIF(init_decay=0.5, channels=3, backend="fused")
    x = torch.randn(6, 2, 3) + 0.5
    layer(x).sum().backward()
    assert layer.w.grad is not None and layer.w.grad.shape == (3,)
    ref = nn.PLIF(init_decay=0.5, channels=3, backend="reference")
    ref(x).sum().backward()
    torch.testing.assert_close(layer.w.grad, ref.w.grad, rtol=1e-5, atol=1e-7)


def test_stateful_chunks_equal_one_call():
    x = torch.randn(12, 3, 5) + 0.4
    whole = nn.LIF(decay=0.7, backend="fused")(x)
    stream = nn.LIF(decay=0.7, stateful=True, backend="fused")
    parts = torch.cat([stream(c) for c in x.split([5, 4, 3])])
    assert torch.equal(parts, whole)
    stream.reset_state()
    assert torch.equal(stream(x), whole)


def test_torch_compile_gives_same_outputs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 9), nn.LIF(decay=0.5, backend="fused"),
                                torch.nn.Linear(9, 3), nn.LIF(decay=0.8, backend="fused"))
    x = torch.randn(5, 2, 7)
    eager = model(x)
    # on the CPU the ops stay whole (inductor cannot build Triton kernels for CPU tensors;
    # on a GPU it launches them itself: tests/test_compile_gpu.py)
    with torch._functorch.config.patch(decompose_custom_triton_ops=False):
        compiled = torch.compile(model, fullgraph=True)(x)
        torch.testing.assert_close(compiled, eager)
        compiled.sum().backward()  # the backward of the custom op runs under compile too
    assert model[0].weight.grad is not None
