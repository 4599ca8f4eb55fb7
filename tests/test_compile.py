"""torch.compile over every model: one graph (no breaks), eager's outputs and gradients,
and no recompiles across training steps. The fused backend is forced everywhere, so the
traced graphs hold the real ops (torch.library triton_ops, their Triton kernels run
interpreted on CPU), and AOT autograd decomposes them into launches of those kernels.

Backends on the CPU: aot_eager runs the decomposed launches (through the interpreter).
Inductor cannot: it compiles each launched kernel with Triton for the tensors' device, and
Triton has no CPU driver ("0 active drivers"); its test keeps the ops whole here, and
tests/test_compile_gpu.py runs inductor's own launches on a GPU."""
import copy

import pytest
import torch
import torch._dynamo
from torch import nn

import spikefuse.nn as snn
from spikefuse.models import MODELS, build_model
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_functional
from spikefuse.nn.spiking_layers import SpikingConv2d, SpikingLinear, without_onednn

pytestmark = pytest.mark.interpreter  # fused kernels on CPU tensors

# name -> (input_shape, classes, T, builder kwargs, static image input?): tiny on purpose
CONFIGS = {
    "mlp": ((2, 3, 3), 3, 2, dict(hidden=(8, 8)), False),
    "cifar-small": ((3, 8, 8), 3, 2, dict(width=1 / 32), True),
    "cifar-medium": ((3, 8, 8), 3, 2, dict(width=1 / 32), True),
    "cifar-large": ((3, 8, 8), 3, 2, dict(width=1 / 32), True),
    "resnet18": ((3, 8, 8), 3, 2, dict(width=1 / 16), True),
    "resnet34": ((3, 8, 8), 3, 2, dict(width=1 / 16), True),
    "shd": ((20,), 3, 3, dict(hidden=(8,)), False),
    "dvs-gesture": ((2, 8, 8), 3, 3, dict(width=1 / 32), False),
    "ipu-shd": ((20,), 3, 3, dict(hidden=(8, 8)), False),
    "ipu-nmnist": ((2, 4, 4), 3, 3, dict(hidden=(8, 8)), False),
    "ipu-dvsgesture": ((2, 4, 4), 3, 3, dict(hidden=(8, 8), readout="count"), False),
    "ipu-shd-recurrent": ((20,), 3, 3, dict(hidden=(8, 8)), False),
    "ipu-nmnist-recurrent": ((2, 4, 4), 3, 3, dict(hidden=(8, 8)), False),
    "ipu-dvsgesture-recurrent": ((2, 4, 4), 3, 3, dict(hidden=(8, 8), readout="count"), False),
    "deep-lif": ((20,), 3, 3, dict(depth=2, hidden=8), False),
}
TAKES_BACKEND = set(CONFIGS) - {"mlp"}
NAMES = sorted(CONFIGS) + ["sequential"]
# Compiled training by default: "sequential" (every spiking module), shd (an MLP) and
# ipu-shd-recurrent (the recurrent layer); the other models are built from the same blocks and
# are `slow` (tens of seconds of interpreted kernels each on a CPU; -m slow runs them).
# The graph-break test traces the small ones whole by default, the deep or wide ones are `slow`.
TRAINED_BY_DEFAULT = {"sequential", "shd"}  # the others (ipu-shd-recurrent: 13 s on 2 cores) with -m slow
TRAINED = [name if name in TRAINED_BY_DEFAULT else pytest.param(name, marks=pytest.mark.slow) for name in NAMES]
TRACED = [pytest.param(name, marks=pytest.mark.slow) if name in ("resnet18", "resnet34", "cifar-medium", "cifar-large")
          else name for name in NAMES]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, with PyTorch's CPU convolutions: oneDNN's weight
    gradient of strided convs is wrong now and then (PyTorch 2.13), on either side."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with without_onednn():
        yield
    torch._dynamo.reset()


def test_every_registered_model_is_covered():
    assert set(MODELS) <= set(CONFIGS), f"add a tiny config for {sorted(set(MODELS) - set(CONFIGS))}"


def sequential():
    """Every spiking module of spikefuse.nn in one stack: [T, B, 2, 6, 6] -> [T, B, 3]."""
    return nn.Sequential(
        snn.BNLIF(2, threshold=0.3, learn_decay=True, backend="fused"),
        SpikingConv2d(2, 4, 3, stride=2, padding=1),
        snn.LIF(threshold=0.2, backend="fused"),
        nn.Flatten(2),
        SpikingLinear(36, 16),
        snn.PLIF(channels=16, threshold=0.2, surrogate="atan", backend="fused"),
        nn.Linear(16, 8),
        snn.IF(threshold=0.5, reset="soft", backend="fused"),
        SpikingLinear(8, 3),
    )


def make(name):
    """(model, batch(seed) -> (x, y)) for a model name or "sequential"."""
    torch.manual_seed(0)
    if name == "sequential":
        model, (shape, classes, T, static) = sequential(), ((2, 6, 6), 3, 3, False)
    else:
        shape, classes, T, kwargs, static = CONFIGS[name]
        if name in TAKES_BACKEND:
            kwargs = {**kwargs, "backend": "fused"}
        model = build_model(name, shape, classes, T, **kwargs)
    for module in model.modules():  # the MLP's LIFs take no backend from its builder
        if isinstance(module, (snn.LIF, snn.BNLIF)):
            module.backend = "fused"

    def batch(seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.rand((2, *shape) if static else (T, 2, *shape), generator=g)
        return (x if static else (x < 0.4).float() * 2), torch.randint(0, classes, (2,), generator=g)
    return model, batch


def loss_of(out, y):
    return nn.functional.cross_entropy(out.mean(0) if out.dim() == 3 else out, y)


def compiled_frames():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("name", TRACED)
def test_no_graph_breaks(name):
    model, batch = make(name)
    x, _ = batch(0)
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize("name", TRAINED)
def test_compiled_training_matches_eager_and_compiles_once_per_mode(name):
    """One fullgraph compile serves three training steps (forward, backward, SGD step) on
    fresh fixed-shape batches; the first step gives eager's spikes/logits and parameter
    gradients. Switching to eval compiles once more (eager's output again), and no more."""
    eager, batch = make(name)
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch._dynamo.config.patch(error_on_recompile=True):  # names the failed guard
        train_three_steps(name, eager, model, compiled, optimizer, batch)
    assert compiled_frames() == 1, "recompiled during training"
    model.eval()
    with torch.no_grad():
        x, _ = batch(10)
        outs = [compiled(x), compiled(batch(11)[0])]
        eager.load_state_dict(model.state_dict())
        torch.testing.assert_close(outs[0], eager.eval()(x), rtol=1e-6, atol=1e-6)
    assert compiled_frames() == 2, "eval mode should compile exactly once"


def train_three_steps(name, eager, model, compiled, optimizer, batch):
    """Three compiled SGD steps of `model`; the first one also runs eager (not stepped)."""
    for step in range(3):
        x, y = batch(step)
        model.train()
        optimizer.zero_grad()
        out = compiled(x)
        loss_of(out, y).backward()
        if step == 0:  # the same step in eager
            out_e = eager(x)
            loss_of(out_e, y).backward()
            torch.testing.assert_close(out, out_e, rtol=1e-6, atol=1e-6, msg=f"{name} output")
            grads = [(n, p.grad, q.grad) for (n, p), q in zip(model.named_parameters(), eager.parameters())]
            assert all((g is None) == (g_e is None) for _, g, g_e in grads)
            for n, g, g_e in grads:
                if g_e is not None:
                    torch.testing.assert_close(g, g_e, rtol=1e-5, atol=1e-6, msg=f"grad of {n}")
            for a, b in zip(eager.buffers(), model.buffers()):  # running statistics
                torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
        optimizer.step()


@pytest.mark.parametrize("name", ["sequential", pytest.param("cifar-small", marks=pytest.mark.slow)])
def test_compiled_under_bf16_autocast_matches_eager(name):
    """Autocast does not reach inside a torch.library op: the traced spike Linear/Conv2d
    cast their arguments as autocast would, or the bf16 spikes meet a float32 weight."""
    eager, batch = make(name)
    model = copy.deepcopy(eager)
    x, y = batch(0)
    # (compiled first, whole: on the CPU, where Triton cannot tell which arguments a kernel
    # writes, the compiled graph writes its inputs back, which bumps their versions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    loss_of(out.float(), y).backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_e = eager(x)
    loss_of(out_e.float(), y).backward()
    assert out.dtype == out_e.dtype == torch.bfloat16
    torch.testing.assert_close(out, out_e, rtol=0, atol=0)
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        assert p.grad.dtype == torch.float32, n
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-2, atol=1e-3, msg=f"grad of {n}")


def test_first_fused_call_under_compile_does_not_recompile(monkeypatch):
    """A lazily imported kernel entry (functional._fused_lif) first reached inside a traced
    frame must not leave a guard that the first eager call then breaks."""
    import spikefuse.functional as F
    monkeypatch.setattr(F, "_LIF_FUSED", None)
    lif = snn.LIF(backend="fused")
    compiled = torch.compile(lif, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 2, 5)
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(x)
        lif(x)  # eager: fills the global
        compiled(x)
    assert compiled_frames() == 1


@pytest.mark.parametrize("channels", [None, 4])
def test_learnable_threshold_lif_compiles_fused(channels):
    """A learned threshold (one, or one per channel) traces into the fused op, not the
    reference: one graph, no breaks, eager's spikes and gradients (the threshold's from the
    backward kernel)."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(3, 4), snn.LIF(decay=0.6, threshold=0.5, learn_threshold=True,
                                                   threshold_channels=channels, reset="soft", backend="fused"))
    model = copy.deepcopy(eager)
    x = torch.rand(5, 2, 4, 3)  # [T, B, C=4, 3]: the LIF's channels are dim 2
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    targets = []

    def aot_eager_recording(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)
    out = torch.compile(model, backend=aot_eager_recording, fullgraph=True)(x)
    out_e = eager(x)
    assert "spikefuse.lif_forward.default" in targets, targets
    torch.testing.assert_close(out, out_e, rtol=0, atol=0)
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape)
    (out * weights).sum().backward()
    (out_e * weights).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    assert model[1].threshold.grad.abs().sum() > 0


@pytest.mark.slow  # ~22 s on a 2-core CPU: inductor builds C++ kernels
def test_inductor_on_mlp():
    """The default backend (inductor: C++ on CPU) around the ops, one training step. Here
    the ops stay whole (decompose_custom_triton_ops off: inductor cannot build Triton
    kernels for CPU tensors) and their bodies run through the dispatcher; on a GPU inductor
    launches the kernels itself (test_compile_gpu.py). Caches off: a graph cached before
    an op changed would be served stale."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        get_cpp_compiler()
    except Exception as e:  # noqa: BLE001 (any failure here means: no toolchain)
        pytest.skip(f"inductor needs a C++ compiler: {e}")
    eager, batch = make("mlp")
    model = copy.deepcopy(eager)
    x, y = batch(0)
    with torch._functorch.config.patch(decompose_custom_triton_ops=False), \
            torch._inductor.config.patch(force_disable_caches=True):
        out = torch.compile(model, fullgraph=True)(x)
        out_e = eager(x)
        torch.testing.assert_close(out, out_e, rtol=1e-5, atol=1e-6)
        loss_of(out, y).backward()
    loss_of(out_e, y).backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


def aot_graphs(model, x, y):
    """The forward and backward graphs AOT autograd hands a backend (inductor lowers them)
    for one training step of `model` (the aot_eager backend, which runs them as they are)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.debugging import aot_eager

    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return aot_eager(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    loss_of(compiled(x), y).backward()
    return graphs


def launched_kernels(gm):
    """Names of the Triton kernels a graph launches, and the spikefuse ops it still calls."""
    kernels, ops = [], []
    for node in gm.graph.nodes:
        if node.target is triton_kernel_wrapper_functional:
            kernels.append(kernel_side_table.get_kernel(node.kwargs["kernel_idx"]).fn.__name__)
        elif "spikefuse" in str(node.target):
            ops.append(str(node.target))
    return kernels, ops


@pytest.mark.parametrize("name", ["mlp", "sequential"])
def test_compiled_graphs_launch_the_kernels_not_the_ops(name):
    """What inductor receives holds no spikefuse op (which it would call through the
    dispatcher into Python at every step), only launches of our Triton kernels, which it
    turns into launches from its generated code (on a GPU: test_compile_gpu.py)."""
    model, batch = make(name)
    forward, backward = aot_graphs(model, *batch(0))
    (fw_kernels, fw_ops), (bw_kernels, bw_ops) = launched_kernels(forward), launched_kernels(backward)
    assert fw_ops == bw_ops == []
    if name == "mlp":  # two Linear-LIF blocks
        assert fw_kernels == ["_lif_forward_kernel"] * 2 and bw_kernels == ["_lif_backward_kernel"] * 2
    else:  # BNLIF, conv, LIF, linear, PLIF, IF, linear (their bits packed for the backward)
        assert sorted(set(fw_kernels)) == ["_bn_lif_forward_kernel", "_lif_forward_kernel", "_pack_kernel",
                                           "_stats_finalize_kernel", "_stats_partial_kernel"]
        assert fw_kernels.count("_lif_forward_kernel") == 3 and fw_kernels.count("_pack_kernel") == 3
        # the conv's spikes unpacked as they were, the two linears' (float32) transposed
        assert sorted(set(bw_kernels)) == ["_bn_grad_x_kernel", "_bn_lif_backward_kernel", "_lif_backward_kernel",
                                           "_unpack_kernel", "_unpack_transposed_kernel"]
        assert bw_kernels.count("_unpack_transposed_kernel") == 2


def test_custom_ops_pass_opcheck():
    """Schema, fake kernels (shapes and strides), autograd registration and AOT dispatch of
    the spike Linear/Conv2d ops, the conv with channels-last spikes and weight."""
    g = torch.Generator().manual_seed(0)
    s = (torch.rand(3, 2, 13, generator=g) < 0.3).float().requires_grad_()
    torch.library.opcheck(torch.ops.spikefuse.spike_linear_forward.default,
                          (s, torch.randn(5, 13, requires_grad=True), torch.randn(5, requires_grad=True), True))
    s = (torch.rand(4, 3, 5, 6, generator=g) < 0.3).float().contiguous(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(torch.ops.spikefuse.spike_conv2d_forward.default,
                          (s.requires_grad_(), w.requires_grad_(), None, [2, 2], [1, 1], [1, 1], 1, True, True))
