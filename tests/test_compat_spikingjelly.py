"""spikefuse.compat.spikingjelly against SpikingJelly 2.0 itself: LIFNode and IFNode with the
same arguments give SpikingJelly's spikes exactly (hard and soft reset, decay_input either way,
step modes "m" and "s", T = 1 and odd shapes, inputs that land on the threshold), its v and
v_seq (bit for bit where the arithmetic is the same, else to rounding) and its input gradients
up to rounding; state, reset_net and detach_net behave as SpikingJelly's; SpikingJelly's
lif_fc_mnist example network, ported by its import line, gives SpikingJelly's spikes on the
same weights. A missing SpikingJelly skips these tests, and fails them under CI
(tests/peers.py)."""
import ast
import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

import spikefuse.nn
from spikefuse.compat.spikingjelly import functional, layer, neuron, surrogate
from spikefuse.data.embedded import digits_split
from helpers import DEVICE, rel_err
from peers import require

sj = require("spikingjelly.activation_based")
from spikingjelly.activation_based import functional as sj_functional  # noqa: E402
from spikingjelly.activation_based import layer as sj_layer  # noqa: E402
from spikingjelly.activation_based import neuron as sj_neuron  # noqa: E402
from spikingjelly.activation_based import surrogate as sj_surrogate  # noqa: E402

# (class, its own arguments, whether SpikingJelly's float32 operations are spikefuse's: v bit for bit)
NODES = {
    "lif": ("LIFNode", dict(tau=2.0), False),  # SpikingJelly's default: decay_input=True
    "lif_tau3.7": ("LIFNode", dict(tau=3.7), False),
    "lif_no_decay_input": ("LIFNode", dict(tau=2.0, decay_input=False), True),
    "lif_no_decay_input_tau3.7": ("LIFNode", dict(tau=3.7, decay_input=False), False),
    "if": ("IFNode", dict(), True),
}
# (T, one step's shape, seed): T = 1, odd sizes, a conv-like step
SHAPES = [(1, (3, 5), 0), (9, (4, 7), 1), (6, (2, 3, 5), 2)]


def inputs(seed, shape, quarters=False):
    g = torch.Generator().manual_seed(seed)
    if quarters:  # multiples of 1/4: h lands on the threshold exactly, often
        return (torch.randint(-1, 5, shape, generator=g).float() / 4).to(DEVICE)
    return (torch.randn(shape, generator=g) * 0.8 + 0.4).to(DEVICE)


def run(node, x):
    """The node over x [T, ...] (one call in step mode "m", a step a call in "s"): spikes, v_seq,
    the last v, and dL/dx for a fixed random loss on the spikes, v_seq and v."""
    x = x.clone().requires_grad_()
    spikes = node(x) if node.step_mode == "m" else torch.stack([node(step) for step in x])
    g = torch.Generator().manual_seed(9)
    loss = (spikes * torch.randn(spikes.shape, generator=g).to(spikes.device)).sum() + \
        0.1 * node.v_seq.pow(2).sum() + node.v.sum()
    return spikes.detach(), node.v_seq.detach(), node.v.detach(), torch.autograd.grad(loss, x)[0]


def assert_same(theirs, mine, exact, what):
    assert torch.equal(mine[0], theirs[0]), f"{what}: spikes differ at {(mine[0] != theirs[0]).sum().item()} places"
    for name, a, b in (("v_seq", theirs[1], mine[1]), ("v", theirs[2], mine[2])):
        if exact:
            assert torch.equal(b, a), f"{what}: {name} differs, max {(a - b).abs().max().item()}"
        else:  # SpikingJelly's order of float32 operations: a few units in the last place
            assert torch.allclose(b, a, rtol=1e-6, atol=1e-6), f"{what}: {name} differs, max {(a - b).abs().max()}"
    assert rel_err(mine[3], theirs[3]) < 1e-5, f"{what}: dL/dx rel err {rel_err(mine[3], theirs[3])}"


@pytest.mark.parametrize("v_reset", [0.0, None, -0.25], ids=["hard", "soft", "hard_to_-0.25"])
@pytest.mark.parametrize("node", list(NODES))
@pytest.mark.parametrize("T,shape,seed", SHAPES)
def test_nodes_equal_spikingjelly(node, v_reset, T, shape, seed):
    cls, kw, exact = NODES[node]
    exact = exact and v_reset in (0.0, None)  # SpikingJelly's v_reset / tau is another rounding
    for quarters in (False, True):
        x = inputs(seed, (T, *shape), quarters)
        for step_mode in ("m", "s"):
            args = dict(kw, v_reset=v_reset, v_threshold=0.75 if seed % 2 else 1.0, step_mode=step_mode,
                        detach_reset=seed == 2, store_v_seq=True)
            theirs_node, mine_node = getattr(sj_neuron, cls)(**args).to(DEVICE), getattr(neuron, cls)(**args)
            what = f"{node}, v_reset {v_reset}, {step_mode}, {'quarters' if quarters else 'randn'}"
            assert_same(run(theirs_node, x), run(mine_node, x), exact, what)
            # a second sequence continues from the kept v, as SpikingJelly's does
            assert_same(run(theirs_node, x.flip(0)), run(mine_node, x.flip(0)), exact, what + ", continued")


def test_float64_input():
    x = inputs(3, (7, 4, 5)).double()
    for cls, kw, exact in NODES.values():
        theirs, mine = run(getattr(sj_neuron, cls)(**kw, step_mode="m", store_v_seq=True), x), \
            run(getattr(neuron, cls)(**kw, step_mode="m", store_v_seq=True), x)
        assert mine[0].dtype == torch.float64
        assert_same(theirs, mine, exact, f"{cls} {kw} float64")


@pytest.mark.interpreter  # the fused kernels, on CPU tensors through Triton's interpreter
@pytest.mark.parametrize("step_mode", ["m", "s"])
@pytest.mark.parametrize("v_reset", [0.0, None], ids=["hard", "soft"])
@pytest.mark.parametrize("node", ["lif", "if"])
def test_fused_backend_equals_spikingjelly(node, v_reset, step_mode):
    cls, kw, exact = NODES[node]
    x = inputs(5, (5, 3, 6), quarters=True)
    args = dict(kw, v_reset=v_reset, step_mode=step_mode, store_v_seq=True)
    assert_same(run(getattr(sj_neuron, cls)(**args), x), run(getattr(neuron, cls)(**args, backend="fused"), x),
                exact, f"fused {node} {v_reset} {step_mode}")


@pytest.mark.parametrize("theirs,mine,expected", [
    (None, None, ("sigmoid", 4.0)),
    (sj_surrogate.Sigmoid(alpha=2.5), surrogate.Sigmoid(alpha=2.5), ("sigmoid", 2.5)),
    (sj_surrogate.ATan(), surrogate.ATan(), ("atan", 2.0)),
    (sj_surrogate.ATan(alpha=3.0), surrogate.ATan(alpha=3.0), ("atan", 3.0)),
    (sj_surrogate.PiecewiseQuadratic(alpha=0.8), surrogate.PiecewiseQuadratic(alpha=0.8), ("triangle", 1.25)),
    (sj_surrogate.Rect(alpha=2.0), surrogate.Rect(alpha=2.0), ("rectangular", 0.5)),
], ids=["default", "sigmoid", "atan", "atan3", "piecewise_quadratic", "rect"])
def test_surrogates_map_to_the_same_formula(theirs, mine, expected):
    assert surrogate.surrogate_of(theirs) == expected and surrogate.surrogate_of(mine) == expected
    x = inputs(7, (8, 4, 9))
    theirs_run = run(sj_neuron.LIFNode(surrogate_function=theirs, step_mode="m", store_v_seq=True), x)
    for function in (theirs, mine):  # SpikingJelly's object or ours
        assert_same(theirs_run, run(neuron.LIFNode(surrogate_function=function, step_mode="m", store_v_seq=True), x),
                    False, str(expected))
    if mine is not None:  # called on a tensor: SpikingJelly's Heaviside with the surrogate gradient
        u = x.clone().requires_grad_()
        mine(u).sum().backward()
        v = x.clone().requires_grad_()
        theirs(v).sum().backward()
        assert torch.equal(mine(x), theirs(x)) and rel_err(u.grad, v.grad) < 1e-6


def test_state_reset_and_detach():
    x = inputs(4, (6, 3, 5)) + 0.3
    mine, theirs = neuron.LIFNode(store_v_seq=True), sj_neuron.LIFNode(store_v_seq=True)
    assert isinstance(mine.v, float) and mine.state_dict() == {}  # as SpikingJelly's: v is no state_dict entry
    for node in (mine, theirs):
        for step in x:
            node(step)
    assert mine.v_seq.shape == (6, 3, 5) and torch.allclose(mine.v_seq, theirs.v_seq, atol=1e-6)
    functional.detach_net(mine)  # keeps the values, cuts the graph
    assert not mine.v.requires_grad and not mine.v_seq.requires_grad
    y = mine(x[0][:2])  # another shape: SpikingJelly starts again from v_reset, and its v_seq
    assert torch.equal(y, theirs(x[0][:2])) and torch.equal(y, sj_neuron.LIFNode()(x[0][:2]))
    assert mine.v_seq.shape == theirs.v_seq.shape == (1, 2, 5)
    functional.reset_net(nn.Sequential(mine))
    assert mine.v == 0.0 and mine.v_seq is None
    hard_to = neuron.IFNode(v_reset=-0.5)
    assert hard_to.v == -0.5
    hard_to(x[0])
    sj_functional.reset_net(nn.Sequential(hard_to))  # SpikingJelly's own reset_net reaches these nodes
    assert hard_to.v == -0.5
    hard_to(x[0])
    spikefuse.nn.reset(hard_to)  # and spikefuse's
    assert hard_to.v == -0.5
    functional.set_step_mode(nn.Sequential(hard_to), "m")
    assert hard_to.step_mode == "m" and torch.equal(hard_to(x), sj_neuron.IFNode(v_reset=-0.5, step_mode="m")(x))


def test_layers_equal_spikingjellys_in_both_step_modes():
    def net(lib, node):
        return nn.Sequential(lib.Conv2d(2, 4, 3, padding=1, bias=False), lib.BatchNorm2d(4), node, lib.MaxPool2d(2),
                             lib.AdaptiveAvgPool2d(1), lib.Flatten(), lib.Linear(4, 3))
    torch.manual_seed(0)
    theirs = net(sj_layer, sj_neuron.IFNode(v_threshold=0.5))
    mine = net(layer, neuron.IFNode(v_threshold=0.5))
    mine.load_state_dict(theirs.state_dict())  # torch's entries, BatchNorm's running statistics included
    x_seq = torch.rand(5, 3, 2, 6, 6)  # [T, N, C, H, W]
    out = [torch.stack([m(x) for x in x_seq]) for m in (theirs, mine)]  # step mode "s": BatchNorm per step
    assert torch.allclose(out[0], out[1], atol=1e-6)
    for ex, m in ((sj_functional, theirs), (functional, mine)):
        ex.reset_net(m)
        ex.set_step_mode(m, "m")  # BatchNorm over T*N, one neuron call over [T, N, ...]
    out = [m(x_seq) for m in (theirs, mine)]
    assert out[1].shape == (5, 3, 3) and torch.allclose(out[0], out[1], atol=1e-6)
    assert torch.allclose(mine[1].running_mean, theirs[1].running_mean)


@pytest.mark.parametrize("make,argument", [
    (lambda: neuron.LIFNode(tau=1.0), "tau"),
    (lambda: neuron.LIFNode(tau="2"), "tau"),
    (lambda: neuron.LIFNode(v_threshold=float("nan")), "v_threshold"),
    (lambda: neuron.IFNode(v_reset="0"), "v_reset"),
    (lambda: neuron.IFNode(detach_reset=1), "detach_reset"),
    (lambda: neuron.IFNode(step_mode="multi"), "step_mode"),
    (lambda: neuron.IFNode(backend="cuda"), "backend"),
    (lambda: neuron.LIFNode(surrogate_function=sj_surrogate.SoftSign()), "surrogate_function"),
    (lambda: neuron.LIFNode(surrogate_function=sj_surrogate.Sigmoid(spiking=False)), "surrogate_function"),
    (lambda: neuron.LIFNode(surrogate_function=lambda u: u), "surrogate_function"),
    (lambda: surrogate.ATan(alpha=-1.0), "alpha"),
    (lambda: surrogate.Sigmoid(spiking=False), "spiking"),
    (lambda: functional.set_step_mode(nn.Sequential(), "x"), "step_mode"),
    (lambda: layer.Linear(2, 3, step_mode="x"), "step_mode"),
])
def test_bad_arguments_are_refused_by_name(make, argument):
    with pytest.raises(ValueError, match=rf"^{argument}"):
        make()


def lif_fc_mnist_source():
    """SpikingJelly's lif_fc_mnist example, as installed: its source, its SpikingJelly import
    line and its network class `SNN`."""
    source = Path(importlib.util.find_spec("spikingjelly.activation_based.examples.lif_fc_mnist").origin).read_text()
    tree = ast.parse(source)
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "spikingjelly.activation_based"]
    network = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SNN"]
    assert len(imports) == 1 and len(network) == 1, "the example has changed shape"
    return ast.get_source_segment(source, imports[0]), ast.get_source_segment(source, network[0])


def lif_fc_mnist(package):
    """The example's import line (its package replaced by `package`) and network class, run:
    the names it defines (SNN, neuron, encoding, functional, surrogate, layer)."""
    import_line, network = lif_fc_mnist_source()
    namespace = {}
    exec("import torch\nimport torch.nn as nn\n" + import_line.replace("spikingjelly.activation_based", package)
         + "\n\n" + network, namespace)
    return namespace


def digit_images(n):
    """n of spikefuse's embedded digits (8x8) scaled up to MNIST's [n, 1, 28, 28] in [0, 1]."""
    x, y, _, _ = digits_split()
    images = torch.tensor(x[:n], dtype=torch.float32).reshape(n, 1, 8, 8)
    return nn.functional.interpolate(images, size=(28, 28), mode="bilinear").clamp(0, 1), torch.tensor(y[:n])


def train_batch(ex, net, img, label, T, seed):
    """One batch of the example's training loop (its lines, T steps of Poisson input)."""
    torch.manual_seed(seed)  # the Poisson encoder draws from torch's generator, the same in both runs
    encoder = ex["encoding"].PoissonEncoder()
    label_onehot = nn.functional.one_hot(label, 10).float()
    out_fr, spikes = 0.0, []
    for t in range(T):
        encoded_img = encoder(img)
        out = net(encoded_img)
        spikes.append(out.detach())
        out_fr += out
    out_fr = out_fr / T
    loss = nn.functional.mse_loss(out_fr, label_onehot)
    loss.backward()
    ex["functional"].reset_net(net)
    return torch.stack(spikes), loss.detach()


def test_lif_fc_mnist_ported_by_its_import_line():
    theirs_ex, mine_ex = lif_fc_mnist("spikingjelly.activation_based"), lif_fc_mnist("spikefuse.compat.spikingjelly")
    assert mine_ex["neuron"] is neuron
    torch.manual_seed(0)
    theirs, mine = theirs_ex["SNN"](tau=2.0), mine_ex["SNN"](tau=2.0)
    with torch.no_grad():  # the default init is too small for the output layer to fire in a few steps
        theirs.layer[1].weight.mul_(6)
    mine.load_state_dict(theirs.state_dict())  # SpikingJelly's checkpoints load as they are
    img, label = digit_images(12)
    for batch, seed in ((slice(0, 6), 1), (slice(6, 12), 2)):  # two batches: reset_net between them
        s1, l1 = train_batch(theirs_ex, theirs, img[batch], label[batch], 12, seed)
        s2, l2 = train_batch(mine_ex, mine, img[batch], label[batch], 12, seed)
        assert 0 < s1.sum() < s1.numel(), "degenerate case"
        assert torch.equal(s1, s2) and torch.allclose(l1, l2, rtol=1e-6)
    assert rel_err(mine.layer[1].weight.grad, theirs.layer[1].weight.grad) < 1e-5

    # the same network in step mode "m": one call over [T, N, ...], one fused kernel on CUDA
    for ex, net in ((theirs_ex, theirs), (mine_ex, mine)):
        ex["functional"].set_step_mode(net, "m")
    torch.manual_seed(3)
    x_seq = mine_ex["encoding"].PoissonEncoder()(img.expand(10, *img.shape))
    s1, s2 = theirs(x_seq), mine(x_seq)
    assert 0 < s1.sum() < s1.numel() and torch.equal(s1, s2)
