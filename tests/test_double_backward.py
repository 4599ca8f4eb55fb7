"""Double backward through the fused LIF, PLIF and BN+LIF (issue 14): a gradient penalty on
the input and a Hessian-vector product w.r.t. the parameters equal the reference's (they
used to be silently 0: the kernels' backward carries no graph)."""
import copy

import pytest
import torch

import spikefuse.functional as F
from spikefuse.nn import BNLIF
from helpers import DEVICE, rel_err


def randn(*shape, seed=0, scale=1.0, shift=0.4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + shift).to(DEVICE)


def weights_like(t, seed=1):
    return randn(*t.shape, seed=seed, shift=0.0)


def penalty_and_hvp(forward, x, params):
    """(gradient penalty |dL/dx|^2, its gradients w.r.t. x and params, and the Hessian of L
    w.r.t. params times a fixed vector), L = <spikes, w>."""
    x = x.detach().clone().requires_grad_(True)
    spikes = forward(x)
    loss = (spikes.float() * weights_like(spikes)).sum()
    gx, *gp = torch.autograd.grad(loss, [x, *params], create_graph=True)
    penalty = (gx.float() ** 2).sum()
    second = torch.autograd.grad(penalty, [x, *params], allow_unused=True, retain_graph=True)
    vec = [weights_like(p, seed=7 + i) for i, p in enumerate(params)]
    hvp = torch.autograd.grad(sum((g * v).sum() for g, v in zip(gp, vec)), params) if params else []
    return penalty, second, hvp


def flat(tensors):
    return torch.cat([t.flatten().double() for t in tensors if t is not None]) if tensors else None


def assert_same(fused, ref, rtol=1e-5, zero_ok=()):
    """Norm-wise over x's second derivative, over all parameters' (one vector) and over the
    Hessian-vector product: a single entry can cancel to far below the others (the decay's
    HVP entry is 1/300 of the largest in one case), where both sides' float32 roundings
    (~3e-5 of that entry, measured against float64) exceed 1e-5 of it."""
    (p1, s1, h1), (p2, s2, h2) = fused, ref
    assert p2.item() > 0, "degenerate test: no gradient"
    torch.testing.assert_close(p1, p2, rtol=rtol, atol=0)
    for name, a, b in (("d2/dx", s1[0], s2[0]), ("d2/dparams", flat(s1[1:]), flat(s2[1:])),
                       ("hvp", flat(h1), flat(h2))):
        if b is None:
            continue
        if name in zero_ok and b.abs().max() == 0:  # 0 by the model (the caller says why)
            assert a.abs().max() == 0, f"{name}: {a.abs().max()} where the reference has 0"
            continue
        assert b.abs().max() > 0, f"degenerate test: {name} is 0"
        assert rel_err(a, b) < rtol, f"{name}: {rel_err(a, b)}"


@pytest.mark.parametrize("reset,surrogate,detach", [("hard", "atan", False), ("soft", "sigmoid", False),
                                                    ("hard", "fast_sigmoid", True), ("none", "triangle", False),
                                                    ("subtract", "atan", False)])
def test_lif_gradient_penalty(reset, surrogate, detach):
    x = randn(9, 2, 13, seed=1)
    kw = dict(decay=0.7, threshold=0.8, reset=reset, v_reset=-0.1, detach_reset=detach, surrogate=surrogate)
    fused = penalty_and_hvp(lambda x: F.lif(x, backend="fused", **kw), x, [])
    ref = penalty_and_hvp(lambda x: F.lif(x, backend="reference", **kw), x, [])
    assert_same(fused, ref)


@pytest.mark.parametrize("per_channel", [False, True])
def test_plif_penalty_and_hessian_vector_product(per_channel):
    """Learnable decay and v0 (with the final state in the loss), non-contiguous input."""
    x = randn(7, 5, 3, 4, seed=2).transpose(1, 3)  # [7, 4, 3, 5] strided view
    assert not x.is_contiguous()
    results = []
    for backend in ("fused", "reference"):
        decay = (torch.linspace(0.3, 0.9, 3) if per_channel else torch.tensor(0.6)).to(DEVICE).requires_grad_()
        v0 = randn(4, 3, 5, seed=3, scale=0.3).requires_grad_()

        def forward(x):
            spikes, v = F.plif(x, decay, v0=v0, return_state=True, reset="soft", surrogate="atan", backend=backend)
            return torch.cat([spikes.flatten(), v.flatten()])
        results.append(penalty_and_hvp(forward, x, [decay, v0]))
    assert_same(*results)


def test_learnable_threshold_penalty_and_hessian_vector_product():
    """A per-channel tensor threshold (fused since it runs on the kernels) next to a learned decay."""
    x = randn(7, 2, 3, 5, seed=5)
    results = []
    for backend in ("fused", "reference"):
        decay = torch.tensor(0.6, device=DEVICE).requires_grad_()
        threshold = torch.linspace(0.6, 1.0, 3).to(DEVICE).requires_grad_()
        forward = lambda x: F.plif(x, decay, threshold=threshold, reset="soft", surrogate="atan",  # noqa: E731
                                   backend=backend)
        results.append(penalty_and_hvp(forward, x, [decay, threshold]))
    assert_same(*results)


def test_lif_half_precision_input():
    """bfloat16 x: the fused backward differentiates the float32 reference; gradients come back in bf16."""
    x = randn(6, 3, 11, seed=4).bfloat16()
    fused = penalty_and_hvp(lambda x: F.lif(x, decay=0.5, surrogate="sigmoid", backend="fused"), x, [])
    ref = penalty_and_hvp(lambda x: F.lif(x.float(), decay=0.5, surrogate="sigmoid", backend="reference"), x, [])
    assert fused[1][0].dtype == torch.bfloat16
    assert_same(fused, ref, rtol=1e-2)


def test_torch_library_op_path():
    """The registered op (what torch.compile traces) has the same double backward."""
    x0 = randn(8, 2, 6, seed=5)
    decay = torch.full((1,), 0.6, device=DEVICE, requires_grad=True)

    def op(x):
        return torch.ops.spikefuse.lif_forward(x, 1.0, decay, None, 0.9, "hard", 0.0, False, "atan", 2.0, True)[0]
    fused = penalty_and_hvp(op, x0, [decay])
    ref = penalty_and_hvp(lambda x: F.plif(x, decay, threshold=0.9, surrogate="atan", backend="reference"), x0, [decay])
    assert_same(fused, ref)


def bn_pair(learn_decay=True, **kw):
    torch.manual_seed(0)
    fused = BNLIF(3, decay=0.6, threshold=0.3, learn_decay=learn_decay, backend="fused", **kw).to(DEVICE)
    with torch.no_grad():
        fused.weight.uniform_(0.5, 1.5)
        fused.bias.uniform_(-0.3, 0.3)
        fused.running_var.uniform_(0.5, 2.0)
    ref = copy.deepcopy(fused)
    ref.backend = "reference"
    return fused, ref


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("reset,surrogate", [("hard", "sigmoid"), ("soft", "atan")])
def test_bn_lif_penalty_and_hessian_vector_product(training, reset, surrogate):
    x = randn(5, 4, 3, 2, 3, seed=6, shift=0.0)
    results = []
    for module in bn_pair(reset=reset, surrogate=surrogate):
        module.train(training)
        results.append(penalty_and_hvp(module, x, list(module.parameters())))
    assert_same(*results)


def test_bn_lif_residual_channels_last_and_static_input():
    x = randn(6, 2, 3, 4, 3, seed=7, shift=0.0).movedim(2, -1).contiguous().movedim(-1, 2)  # channels-last
    r = randn(6, 2, 3, 4, 3, seed=8, scale=0.3, shift=0.0)
    static = randn(1, 2, 3, 4, 3, seed=9, shift=0.0)
    for inputs in ((x, r), (static, None)):
        results = []
        for module in bn_pair(surrogate="atan"):
            if inputs[1] is not None:
                residual = inputs[1].detach().clone().requires_grad_()
                results.append(penalty_and_hvp(lambda x: module(x, residual), inputs[0],
                                               [residual, *module.parameters()]))
            else:
                results.append(penalty_and_hvp(lambda x: module(x[0], time_steps=5), inputs[0],
                                               list(module.parameters())))
        assert_same(*results)


def test_first_order_backward_is_unchanged():
    """Without create_graph the kernels' backward runs, and gives the reference's gradient."""
    x = randn(9, 3, 7, seed=10).requires_grad_()
    (g1,) = torch.autograd.grad(F.lif(x, backend="fused", surrogate="atan").sum(), x)
    (g2,) = torch.autograd.grad(F.lif(x, backend="reference", surrogate="atan").sum(), x)
    assert not g1.requires_grad and rel_err(g1, g2) < 1e-5


def test_under_torch_compile_a_double_backward_is_refused_not_zero():
    """AOT autograd traces the op's backward with create_graph off (the kernels'), and PyTorch
    itself refuses a double backward through a compiled graph: a clear error, never 0."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: F.lif(x, decay=0.7, surrogate="atan", backend="fused"),
                             backend="aot_eager", fullgraph=True)
    x = randn(4, 2, 3, seed=11).requires_grad_()
    spikes = compiled(x)
    (gx,) = torch.autograd.grad((spikes * weights_like(spikes)).sum(), x, create_graph=True)
    (eager,) = torch.autograd.grad((F.lif(x, decay=0.7, surrogate="atan", backend="reference")
                                    * weights_like(spikes)).sum(), x)
    assert rel_err(gx, eager) < 1e-5  # the first derivative is the kernels'
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(gx.pow(2).sum(), x)
    torch._dynamo.reset()


# ---- the layers that save their spike input as bits (issue 36): second derivatives equal
# torch's own nn.Linear / nn.Conv2d with the same weights (the term through the input was lost)

def spikes(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) > 0.5).float().to(DEVICE)


def torch_twin(layer, cls):
    """A plain torch layer with the same parameters, applied to [T, B, ...] as `layer` is."""
    twin = copy.deepcopy(layer)
    twin.__class__ = cls
    if cls is torch.nn.Linear:
        return twin, twin
    return twin, lambda s: twin(s.flatten(0, 1)).unflatten(0, s.shape[:2])


def second_order(forward, params, s, penalise):
    """Gradients w.r.t. the input and every parameter of a penalty on first-order gradients
    (those named by `penalise`: "x", "weight" and/or "bias"), taken with create_graph."""
    x = s.clone().requires_grad_()
    y = forward(x)
    loss = (y ** 2 * weights_like(y)).sum()
    inputs = {"x": x, **params}
    first = dict(zip(inputs, torch.autograd.grad(loss, list(inputs.values()), create_graph=True)))
    penalty = sum((first[name] ** 2).sum() for name in penalise if name in first)
    return first, dict(zip(inputs, torch.autograd.grad(penalty, list(inputs.values()), allow_unused=True)))


def assert_like_torch(layer, cls, s, penalise=("x", "weight", "bias")):
    twin, twin_forward = torch_twin(layer, cls)
    ours = second_order(layer, dict(layer.named_parameters()), s, penalise)
    theirs = second_order(twin_forward, dict(twin.named_parameters()), s, penalise)
    for order, (a, b) in enumerate(zip(ours, theirs), 1):
        for name in b:
            assert b[name] is not None and b[name].abs().max() > 0, f"degenerate: d{order}/d{name} is 0"
            assert a[name] is not None, f"d{order}/d{name} missing"
            assert rel_err(a[name], b[name]) < 1e-5, f"d{order}/d{name}: {rel_err(a[name], b[name])}"


def test_spiking_linear_weight_gradient_penalty_reaches_the_input():
    """The issue's case: |d/dx sum(gW^2)| was 443.6 against nn.Linear's 1097.8."""
    from spikefuse.nn.spiking_layers import SpikingLinear
    torch.manual_seed(0)
    layer = SpikingLinear(20, 10).to(DEVICE)
    assert_like_torch(layer, torch.nn.Linear, spikes(4, 3, 20, seed=1), penalise=("weight",))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("contiguous", [True, False])
def test_spiking_linear_second_derivatives_equal_nn_linear(bias, contiguous):
    from spikefuse.nn.spiking_layers import SpikingLinear
    torch.manual_seed(1)
    layer = SpikingLinear(13, 7, bias=bias).to(DEVICE)
    s = spikes(5, 3, 2, 13, seed=2)  # odd sizes, an extra dimension
    if not contiguous:
        s = spikes(5, 2, 3, 13, seed=2).transpose(1, 2)
        assert not s.is_contiguous()
    assert_like_torch(layer, torch.nn.Linear, s)


def test_spiking_conv_weight_gradient_penalty_reaches_the_input():
    """The issue's case: 44253 against nn.Conv2d's 82817."""
    from spikefuse.nn.spiking_layers import SpikingConv2d
    torch.manual_seed(0)
    layer = SpikingConv2d(3, 4, 3, padding=1).to(DEVICE)
    assert_like_torch(layer, torch.nn.Conv2d, spikes(3, 2, 3, 6, 6, seed=3), penalise=("weight",))


@pytest.mark.parametrize("conv,layout", [
    (dict(kernel_size=3, padding=1), "contiguous"),
    (dict(kernel_size=3, stride=2, padding=1, bias=False), "strided"),
    (dict(kernel_size=(3, 1), dilation=(2, 1), groups=2), "channels_last"),
    (dict(kernel_size=1, stride=2), "channels_last_weight"),
])
def test_spiking_conv_second_derivatives_equal_nn_conv2d(conv, layout):
    from spikefuse.nn.spiking_layers import SpikingConv2d, channels_last_conv
    torch.manual_seed(2)
    layer = SpikingConv2d(4, 6, **conv).to(DEVICE)
    s = spikes(3, 2, 4, 7, 5, seed=4)  # odd spatial sizes
    if layout == "strided":
        s = spikes(3, 2, 4, 5, 7, seed=4).transpose(3, 4)
        assert not s.is_contiguous()
    elif layout == "channels_last":
        s = s.movedim(2, -1).contiguous().movedim(-1, 2)
    elif layout == "channels_last_weight":
        layer = channels_last_conv(layer)
    assert_like_torch(layer, torch.nn.Conv2d, s)


def test_spiking_layers_first_order_backward_keeps_no_graph():
    """Without create_graph the bits path runs as before: gradients without a graph, equal to
    torch's, and the input's graph edge costs one element."""
    from spikefuse.nn.spiking_layers import SpikingLinear
    torch.manual_seed(3)
    layer = SpikingLinear(9, 5).to(DEVICE)
    twin, _ = torch_twin(layer, torch.nn.Linear)
    s = spikes(4, 2, 9, seed=5)
    grads = []
    for m in (layer, twin):
        x = s.clone().requires_grad_()
        grads.append(torch.autograd.grad(m(x).pow(2).sum(), [x, m.weight, m.bias]))
    for a, b in zip(*grads):
        assert not a.requires_grad and rel_err(a, b) < 1e-5


@pytest.mark.parametrize("shape", [(1, 2, 13), (1, 1, 3, 5)])
def test_spiking_linear_second_derivatives_one_step(shape):
    """T=1, a batch of one, odd feature counts."""
    from spikefuse.nn.spiking_layers import SpikingLinear
    torch.manual_seed(4)
    layer = SpikingLinear(shape[-1], 3).to(DEVICE)
    assert_like_torch(layer, torch.nn.Linear, spikes(*shape, seed=6))


def test_spiking_conv_second_derivatives_one_step():
    from spikefuse.nn.spiking_layers import SpikingConv2d
    torch.manual_seed(5)
    layer = SpikingConv2d(3, 5, 3, padding=1).to(DEVICE)
    assert_like_torch(layer, torch.nn.Conv2d, spikes(1, 1, 3, 5, 3, seed=7))


# ---- the sparse-backward Linear (issue 36): its kernels' gradients carry no graph, and its
# dense branch lost the term through the input, like SpikingLinear did

@pytest.mark.parametrize("backward", ["sparse", "dense", "auto"])
@pytest.mark.parametrize("shape", [(5, 3, 13), (1, 2, 2, 13)])
def test_sparse_linear_second_derivatives_equal_nn_linear(backward, shape):
    from spikefuse.nn import SparseSpikingLinear
    torch.manual_seed(6)
    layer = SparseSpikingLinear(13, 7, backward=backward).to(DEVICE)
    assert_like_torch(layer, torch.nn.Linear, spikes(*shape, seed=8))
    assert_like_torch(layer, torch.nn.Linear, spikes(*shape, seed=9), penalise=("weight",))


def test_sparse_linear_first_order_backward_stays_sparse():
    """Without create_graph the sparse kernels still run (the weight's carrying rows are
    noted for LazyAdam) and the gradients carry no graph."""
    from spikefuse.nn import SparseSpikingLinear
    from spikefuse.ops import grad_rows
    torch.manual_seed(7)
    layer = SparseSpikingLinear(16, 6, backward="sparse").to(DEVICE)
    twin, _ = torch_twin(layer, torch.nn.Linear)
    s = spikes(3, 2, 16, seed=10)
    mask = torch.tensor([1.0, 0, 0, 1, 0, 1], device=DEVICE)  # three outputs carry gradient
    grads = []
    for m in (layer, twin):
        x = s.clone().requires_grad_()
        grads.append(torch.autograd.grad((m(x) * mask).pow(2).sum(), [x, m.weight, m.bias]))
    for a, b in zip(*grads):
        assert not a.requires_grad and rel_err(a, b) < 1e-5
    note = getattr(layer.weight, grad_rows.ATTRIBUTE, None)
    assert note is not None and note.count.item() == 3  # the sparse kernels ran


# ---- BN+LIF inside the blocks the models are built from: bit-saved conv/linear -> fused
# BN+LIF against the papers' per-step torch form (nn layers, torch batch norm, reference LIF)

@pytest.mark.parametrize("block", ["conv", "linear"])
def test_bn_lif_blocks_second_derivatives_equal_torch(block):
    from spikefuse.nn.spiking_layers import ConvBNLIF, LinearBNLIF
    torch.manual_seed(8)
    if block == "conv":
        make = lambda fused: ConvBNLIF(3, 4, fused=fused, surrogate="atan", threshold=0.3)  # noqa: E731
        s = spikes(3, 2, 3, 5, 3, seed=11)
    else:
        make = lambda fused: LinearBNLIF(11, 5, fused=fused, surrogate="atan", threshold=0.3)  # noqa: E731
        s = spikes(3, 2, 11, seed=11)
    fused = make(True).to(DEVICE)
    vanilla = make(False).to(DEVICE)
    vanilla.load_state_dict(fused.state_dict())
    results = []
    for module in (fused, vanilla):
        out = module(s)
        results.append((out, penalty_and_hvp(module, s, list(module.parameters()))))
    assert torch.equal(results[0][0], results[1][0]), "the spikes differ: the comparison would be meaningless"
    assert_same(results[0][1], results[1][1], rtol=1e-4)


# ---- every neuron module: fused double backward equals the reference's

def neuron(name):
    from spikefuse import nn as snn
    surrogate = dict(surrogate="atan")
    return {
        "LIF": lambda: snn.LIF(decay=0.7, threshold=0.8, **surrogate),
        "LIF-learned-threshold": lambda: snn.LIF(threshold=0.8, learn_threshold=True, threshold_channels=5,
                                                 reset="soft", **surrogate),
        "LIF-stateful": lambda: snn.LIF(decay=0.6, stateful=True, detach_state=False, **surrogate),
        "IF": lambda: snn.IF(threshold=1.2, surrogate="sigmoid"),
        "PLIF": lambda: snn.PLIF(init_decay=0.6, channels=5, **surrogate),
        "ALIF": lambda: snn.ALIF(decay=0.7, threshold=0.8, **surrogate),
        "CUBA": lambda: snn.CUBA(decay=0.7, syn_decay=0.6, threshold=0.5, **surrogate),
        "RecurrentLIF": lambda: snn.RecurrentLIF(5, threshold=0.8, **surrogate),
        "RecurrentLIF-sparse": lambda: snn.RecurrentLIF(5, threshold=0.8, path="sparse", **surrogate),
        "RecurrentALIF": lambda: snn.RecurrentALIF(5, threshold=0.8, **surrogate),
    }[name]()


@pytest.mark.parametrize("name", ["LIF", "LIF-learned-threshold", "LIF-stateful", "IF", "PLIF", "ALIF", "CUBA",
                                  "RecurrentLIF", "RecurrentLIF-sparse", "RecurrentALIF"])
@pytest.mark.parametrize("T", [1, 7])
def test_neuron_modules_second_derivatives_equal_reference(name, T):
    torch.manual_seed(9)
    fused = neuron(name).to(DEVICE)
    fused.backend = "fused"
    ref = copy.deepcopy(fused)
    ref.backend = "reference"
    x = randn(T, 3, 5, seed=12)
    # at T=1 the recurrent weight acts on no spike (it reads step t-1's): no parameter to check
    inert = T == 1 and name.startswith("Recurrent")
    results = [penalty_and_hvp(m, x, [] if inert else list(m.parameters())) for m in (fused, ref)]
    # at T=1 the decay acts on v0 = 0 only: PLIF's parameter has no gradient to differentiate
    assert_same(*results, zero_ok=("d2/dparams", "hvp") if name == "PLIF" and T == 1 else ())
