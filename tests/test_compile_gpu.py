"""torch.compile with its default backend (inductor) on a GPU: inductor launches our Triton
kernels from its own generated code (the ops decomposed, test_compile.py checks the graphs
on the CPU), and the compiled training step gives eager's outputs and gradients, with one
compile per mode, in float32 and under bf16 autocast."""
import copy

import pytest
import torch

from spikefuse.models import build_model

pytestmark = pytest.mark.gpu  # inductor's Triton kernels

# name -> (input shape, T, static image input?): narrow versions of the models
CASES = {
    "ipu-shd": ((40,), 6, False),
    "cifar-small": ((3, 16, 16), 2, True),
    "resnet18": ((3, 16, 16), 2, True),
    "dvs-gesture": ((2, 32, 32), 3, False),
}
KWARGS = {"ipu-shd": dict(hidden=(32, 32)), "cifar-small": dict(width=1 / 8),
          "resnet18": dict(width=1 / 8), "dvs-gesture": dict(width=1 / 8)}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def make(name, batch=4, classes=5):
    torch.manual_seed(0)
    shape, T, static = CASES[name]
    model = build_model(name, shape, classes, T, backend="fused", **KWARGS[name]).cuda()

    def data(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.rand((batch, *shape) if static else (T, batch, *shape), generator=g, device="cuda")
        return (x if static else (x < 0.3).float()), torch.randint(0, classes, (batch,), generator=g, device="cuda")
    return model, data


def loss_of(out, y):
    return torch.nn.functional.cross_entropy((out.mean(0) if out.dim() == 3 else out).float(), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_inductor_training_matches_eager(name, dtype):
    eager, data = make(name)
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(3):
            x, y = data(step)
            optimizer.zero_grad()
            with autocast:
                out = compiled(x)
            loss_of(out, y).backward()
            if step == 0:
                with autocast:
                    out_e = eager(x)
                loss_of(out_e, y).backward()
                assert out.dtype == out_e.dtype
                # inductor fuses the elementwise work around the kernels (other roundings)
                tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
                torch.testing.assert_close(out, out_e, **tol)
                for (n, p), q in zip(model.named_parameters(), eager.parameters()):
                    scale = q.grad.abs().max().clamp_min(1e-6)
                    assert ((p.grad - q.grad).abs().max() / scale) < (5e-3 if dtype == torch.float32 else 5e-2), n
            optimizer.step()
    model.eval()  # a graph for eval without gradients: one more compile, and no other
    with torch.no_grad(), autocast:
        compiled(data(10)[0])
        compiled(data(11)[0])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


def test_generated_code_launches_our_kernels():
    """The code inductor writes for a training step launches the LIF kernels itself, and
    calls no spikefuse op through the dispatcher."""
    from torch._inductor.utils import run_and_get_code

    model, data = make("ipu-shd")
    compiled = torch.compile(model, fullgraph=True)
    x, y = data(0)
    _, codes = run_and_get_code(lambda: loss_of(compiled(x), y).backward())
    code = "\n".join(codes)
    assert "_lif_forward_kernel" in code and "_lif_backward_kernel" in code
    assert "torch.ops.spikefuse" not in code
