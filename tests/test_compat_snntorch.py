"""spikefuse.compat.snntorch against snnTorch itself: the same arguments, the same per-step
loop code, equal spikes and equal `mem` (and `syn`) at every step, input gradients equal up to
rounding; the whole-sequence path gives the same records; a small two-layer net built with
either gives equal spike recordings and losses; snnTorch tutorial 5's network (784-1000-10,
T=25) ported by its import line gives snnTorch's spikes. A missing snnTorch skips these tests,
and fails them under CI (tests/peers.py)."""
import pytest
import torch
from torch import nn

import spikefuse.compat.snntorch as compat
import spikefuse.nn
from helpers import DEVICE, rel_err
from peers import require

snntorch = require("snntorch")
require("snntorch.surrogate")

LEAKY_RESETS = ("subtract", "zero", "none")
# (T, one step's shape, seed): T = 1, odd sizes, a step without a batch dim, a conv-like step
SHAPES = [(1, (3, 5), 0), (9, (4, 7), 1), (7, (2, 3, 5), 2), (6, (11,), 3)]


def inputs(seed, shape, quarters=False):
    g = torch.Generator().manual_seed(seed)
    if quarters:  # multiples of 1/4: the potential lands on the threshold exactly, often
        return (torch.randint(-1, 5, shape, generator=g).float() / 4).to(DEVICE)
    return (torch.randn(shape, generator=g) * 0.8 + 0.35).to(DEVICE)


def stepped(neuron, x, state, init=None):
    """The neuron over x [T, *] one step a call, snnTorch style, from `state` (a list; None:
    the neuron's init method): spikes, the per-step state records (each [T, *]), and dL/dx
    for a fixed random loss on the spikes and the last state."""
    x = x.clone().requires_grad_()
    if state is None:
        state = init()
        state = list(state) if isinstance(state, tuple) else [state]
    spikes, records = [], []
    for step in x:
        spk, *state = neuron(step, *state)
        spikes.append(spk)
        records.append(state)
    spikes = torch.stack(spikes)
    records = [torch.stack(r) for r in zip(*records)]
    g = torch.Generator().manual_seed(9)
    loss = (spikes * torch.randn(spikes.shape, generator=g).to(spikes.device)).sum() + 0.1 * records[-1].pow(2).sum()
    grad = torch.autograd.grad(loss, x)[0]
    return spikes.detach(), [r.detach() for r in records], grad


def assert_same(theirs, mine, what, tol=1e-5):
    assert torch.equal(mine[0], theirs[0]), f"{what}: spikes differ at {(mine[0] != theirs[0]).sum().item()} places"
    for name, a, b in zip(("first state", "second state"), theirs[1], mine[1]):
        assert torch.equal(b, a), f"{what}: {name} differs, max {(a - b).abs().max().item()}"
    assert rel_err(mine[2], theirs[2]) < tol, f"{what}: dL/dx rel err {rel_err(mine[2], theirs[2])}"


def betas(kind, shape, seed):
    if kind == "scalar":
        return 0.8
    g = torch.Generator().manual_seed(seed + 100)
    return torch.rand(shape[-1], generator=g) * 0.9 + 0.05  # one per neuron (the last dim), as snnTorch broadcasts


@pytest.mark.parametrize("reset", LEAKY_RESETS)
@pytest.mark.parametrize("beta_kind", ["scalar", "per_neuron"])
@pytest.mark.parametrize("T,shape,seed", SHAPES)
def test_leaky_equals_snntorch_step_by_step(reset, beta_kind, T, shape, seed):
    for quarters in (False, True):
        x = inputs(seed, (T, *shape), quarters)
        beta = betas(beta_kind, shape, seed)
        kw = dict(beta=beta, threshold=0.75 if seed % 2 else 1.0, reset_mechanism=reset)
        theirs_neuron, mine_neuron = snntorch.Leaky(**kw).to(DEVICE), compat.Leaky(**kw).to(DEVICE)
        mem0 = inputs(seed + 10, shape)  # some above the threshold: the delayed reset acts at step 0
        for state in (None, [mem0]):
            theirs = stepped(theirs_neuron, x, state, theirs_neuron.init_leaky)
            mine = stepped(mine_neuron, x, state, mine_neuron.init_leaky)
            what = f"{reset}, beta {beta_kind}, {'quarters' if quarters else 'randn'}, mem0 {state is not None}"
            assert_same(theirs, mine, what)
            # the whole sequence in one call: the same records
            spk_rec, mem_rec = compat.Leaky(**kw).to(DEVICE).sequence(x, None if state is None else mem0)
            assert torch.equal(spk_rec, theirs[0]) and torch.equal(mem_rec, theirs[1][0]), what + ", sequence"


@pytest.mark.parametrize("reset", ["subtract", "none"])
@pytest.mark.parametrize("T,shape,seed", SHAPES)
def test_synaptic_equals_snntorch_step_by_step(reset, T, shape, seed):
    for quarters in (False, True):
        x = inputs(seed, (T, *shape), quarters)
        kw = dict(alpha=0.6, beta=0.85, threshold=1.0 if seed % 2 else 1.3, reset_mechanism=reset)
        theirs_neuron, mine_neuron = snntorch.Synaptic(**kw).to(DEVICE), compat.Synaptic(**kw).to(DEVICE)
        syn0, mem0 = inputs(seed + 10, shape), inputs(seed + 20, shape)
        for state in (None, [syn0, mem0]):
            theirs = stepped(theirs_neuron, x, state, theirs_neuron.init_synaptic)
            mine = stepped(mine_neuron, x, state, mine_neuron.init_synaptic)
            what = f"{reset}, {'quarters' if quarters else 'randn'}, state0 {state is not None}"
            assert_same(theirs, mine, what)
            neuron = compat.Synaptic(**kw).to(DEVICE)
            spk_rec, mem_rec = neuron.sequence(x, *(state or [None, None]))
            assert torch.equal(spk_rec, theirs[0]) and torch.equal(mem_rec, theirs[1][1]), what + ", sequence"
            assert torch.equal(neuron.syn, theirs[1][0][-1]), what + ", sequence's last syn"


@pytest.mark.interpreter  # the fused kernels, on CPU tensors through Triton's interpreter
@pytest.mark.parametrize("reset", LEAKY_RESETS)
def test_fused_backend_equals_snntorch(reset):
    x = inputs(5, (5, 3, 6), quarters=True)
    kw = dict(beta=torch.linspace(0.2, 0.95, 6), threshold=0.75, reset_mechanism=reset)
    theirs_neuron = snntorch.Leaky(**kw).to(DEVICE)
    theirs = stepped(theirs_neuron, x, None, theirs_neuron.init_leaky)
    mine_neuron = compat.Leaky(**kw, backend="fused").to(DEVICE)
    assert_same(theirs, stepped(mine_neuron, x, None, mine_neuron.init_leaky), f"fused {reset}")
    spk_rec, mem_rec = compat.Leaky(**kw, backend="fused").to(DEVICE).sequence(x)
    assert torch.equal(spk_rec, theirs[0]) and torch.equal(mem_rec, theirs[1][0])
    if reset != "zero":
        kw = dict(alpha=0.5, beta=0.9, threshold=0.75, reset_mechanism=reset)
        theirs_neuron = snntorch.Synaptic(**kw).to(DEVICE)
        theirs = stepped(theirs_neuron, x, None, theirs_neuron.init_synaptic)
        mine_neuron = compat.Synaptic(**kw, backend="fused").to(DEVICE)
        assert_same(theirs, stepped(mine_neuron, x, None, mine_neuron.init_synaptic), f"fused synaptic {reset}")


@pytest.mark.parametrize("spike_grad,expected", [
    (None, ("atan", 2.0)),
    (snntorch.surrogate.atan(alpha=3.5), ("atan", 3.5)),
    (snntorch.surrogate.fast_sigmoid(slope=5), ("fast_sigmoid", 5.0)),
    (snntorch.surrogate.sigmoid(slope=3), ("sigmoid", 3.0)),
], ids=["default", "atan", "fast_sigmoid", "sigmoid"])
def test_surrogates_map_to_the_same_formula(spike_grad, expected):
    assert compat.surrogate_of(spike_grad) == expected
    x = inputs(7, (8, 4, 9))
    kw = dict(beta=0.7, spike_grad=spike_grad)
    theirs_neuron, mine_neuron = snntorch.Leaky(**kw).to(DEVICE), compat.Leaky(**kw).to(DEVICE)
    assert_same(stepped(theirs_neuron, x, None, theirs_neuron.init_leaky),
                stepped(mine_neuron, x, None, mine_neuron.init_leaky), str(expected))


def test_learn_beta_gradients():
    x = inputs(11, (10, 4, 6))
    grads = []
    for cls in (snntorch.Leaky, compat.Leaky):
        for beta in (0.6, torch.linspace(0.3, 0.9, 6)):
            neuron = cls(beta=beta, learn_beta=True).to(DEVICE)
            assert isinstance(neuron.beta, nn.Parameter)
            mem, spikes, mems = neuron.init_leaky(), [], []
            for step in x:
                spk, mem = neuron(step, mem)
                spikes.append(spk)
                mems.append(mem)
            loss = torch.stack(spikes).sum() + 0.1 * torch.stack(mems).pow(2).sum()
            grads.append(torch.autograd.grad(loss, neuron.beta)[0])
    for theirs, mine in zip(grads[:2], grads[2:]):
        assert rel_err(mine, theirs) < 1e-5, rel_err(mine, theirs)


def test_init_hidden_and_output():
    x = inputs(3, (6, 2, 5)).requires_grad_()
    outs = {}
    for name, cls in (("theirs", snntorch.Leaky), ("mine", compat.Leaky)):
        plain, with_output = (cls(beta=0.8, init_hidden=True).to(DEVICE),
                              cls(beta=0.8, init_hidden=True, output=True).to(DEVICE))
        records = []
        for step in x:
            spk = plain(step)
            spk2, mem = with_output(step)
            assert isinstance(spk, torch.Tensor) and torch.equal(spk, spk2)
            records.append((spk.detach(), mem.detach().clone()))
        assert plain.mem.requires_grad
        plain.detach_hidden()  # keeps the values, cuts the graph
        assert not plain.mem.requires_grad
        with pytest.raises(TypeError, match="`mem` should not be passed"):
            plain(x[0], torch.zeros_like(x[0]))
        plain.reset_mem()
        assert plain.mem.abs().sum() == 0
        outs[name] = records
    for (s1, m1), (s2, m2) in zip(outs["theirs"], outs["mine"]):
        assert torch.equal(s1, s2) and torch.equal(m1, m2)
    syn = compat.Synaptic(alpha=0.5, beta=0.8, init_hidden=True, output=True).to(DEVICE)
    spk, s, m = syn(x[0])
    assert torch.equal(s, x[0]) and torch.equal(m, x[0])
    assert isinstance(compat.Synaptic(alpha=0.5, beta=0.8, init_hidden=True).to(DEVICE)(x[0]), torch.Tensor)


@pytest.mark.parametrize("reset", LEAKY_RESETS)
def test_float64_input(reset):
    """snnTorch computes a float64 input in float64 with its float32 threshold and beta: the
    same values here (its spikes are float32, ours float64)."""
    x = inputs(8, (9, 3, 5), quarters=True).double()
    theirs_neuron, mine_neuron = (cls(beta=0.5, threshold=0.75, reset_mechanism=reset).to(DEVICE)
                                  for cls in (snntorch.Leaky, compat.Leaky))
    theirs = stepped(theirs_neuron, x, None, theirs_neuron.init_leaky)
    mine = stepped(mine_neuron, x, None, mine_neuron.init_leaky)
    assert mine[0].dtype == torch.float64
    assert_same((theirs[0].double(), *theirs[1:]), mine, f"float64 {reset}")


def test_sequence_continues_from_the_module_state():
    """Two sequence() calls over halves equal one call over the whole (and the step loop):
    the module keeps the last step's state, as snnTorch's forward does."""
    x = inputs(4, (10, 3, 5))
    for make in (lambda: compat.Leaky(beta=0.9), lambda: compat.Synaptic(alpha=0.4, beta=0.9)):
        whole, halves = make().to(DEVICE), make().to(DEVICE)
        spk, mem = whole.sequence(x)
        a, ma = halves.sequence(x[:4])
        b, mb = halves.sequence(x[4:])
        assert torch.equal(torch.cat([a, b]), spk) and torch.equal(torch.cat([ma, mb]), mem)
        spikefuse.nn.reset(halves)  # spikefuse's reset reaches the compat modules
        assert all(getattr(halves, n).abs().sum() == 0 for n in halves.STATE)


def test_snntorch_state_dict_loads():
    theirs = snntorch.Leaky(beta=torch.rand(5), learn_beta=True, threshold=0.9)
    mine = compat.Leaky(beta=torch.zeros(5), learn_beta=True, threshold=0.5)
    mine.load_state_dict(theirs.state_dict())
    assert torch.equal(mine.beta, theirs.beta) and mine.threshold.item() == theirs.threshold.item()
    mine_syn = compat.Synaptic(alpha=0.1, beta=0.2)
    mine_syn.load_state_dict(snntorch.Synaptic(alpha=0.3, beta=0.4).state_dict())
    assert mine_syn.alpha.item() == torch.tensor(0.3).item() and mine_syn.beta.item() == torch.tensor(0.4).item()


@pytest.mark.parametrize("cls,kwargs,argument", [
    (compat.Leaky, dict(inhibition=True), "inhibition"),
    (compat.Leaky, dict(state_quant=lambda v: v), "state_quant"),
    (compat.Leaky, dict(learn_threshold=True), "learn_threshold"),
    (compat.Leaky, dict(surrogate_disable=True), "surrogate_disable"),
    (compat.Leaky, dict(graded_spikes_factor=2.0), "graded_spikes_factor"),
    (compat.Leaky, dict(learn_graded_spikes_factor=True), "graded_spikes_factor"),
    (compat.Leaky, dict(reset_delay=False), "reset_delay"),
    (compat.Leaky, dict(threshold=torch.ones(3)), "threshold"),
    (compat.Leaky, dict(spike_grad=snntorch.surrogate.triangular()), "spike_grad"),
    (compat.Leaky, dict(spike_grad=lambda u: u), "spike_grad"),
    (compat.Synaptic, dict(reset_mechanism="zero"), "reset_mechanism"),
    (compat.Synaptic, dict(learn_alpha=True), "learn_alpha"),
    (compat.Synaptic, dict(learn_beta=True), "learn_beta"),
    (compat.Synaptic, dict(beta=torch.rand(3)), "beta"),
    (compat.Synaptic, dict(beta=0.0), "beta"),
    (compat.Synaptic, dict(reset_delay=False), "reset_delay"),
])
def test_unsupported_arguments_are_refused_by_name(cls, kwargs, argument):
    base = dict(beta=0.5) if cls is compat.Leaky else dict(alpha=0.5, beta=0.5)
    with pytest.raises(ValueError, match=rf"^{argument}"):
        cls(**{**base, **kwargs})


def test_unknown_reset_mechanism_is_snntorchs_error():
    with pytest.raises(ValueError, match="reset_mechanism must be set"):
        compat.Leaky(beta=0.5, reset_mechanism="hard")


class Net(nn.Module):
    """snnTorch tutorial 5's network, its code as written there with `snn` the imported module
    (`import snntorch as snn`, or `import spikefuse.compat.snntorch as snn`: the port) and its
    module-level sizes as arguments."""

    def __init__(self, snn, num_inputs=28 * 28, num_hidden=1000, num_outputs=10, num_steps=25, beta=0.95):
        super().__init__()
        self.num_steps = num_steps

        # Initialize layers
        self.fc1 = nn.Linear(num_inputs, num_hidden)
        self.lif1 = snn.Leaky(beta=beta)
        self.fc2 = nn.Linear(num_hidden, num_outputs)
        self.lif2 = snn.Leaky(beta=beta)

    def forward(self, x):

        # Initialize hidden states at t=0
        mem1 = self.lif1.init_leaky()
        mem2 = self.lif2.init_leaky()

        # Record the final layer
        spk2_rec = []
        mem2_rec = []

        for step in range(self.num_steps):
            cur1 = self.fc1(x)
            spk1, mem1 = self.lif1(cur1, mem1)
            cur2 = self.fc2(spk1)
            spk2, mem2 = self.lif2(cur2, mem2)
            spk2_rec.append(spk2)
            mem2_rec.append(mem2)

        return torch.stack(spk2_rec, dim=0), torch.stack(mem2_rec, dim=0)


def digit_batch(n):
    """n of spikefuse's embedded digits (8x8) scaled up to MNIST's 28x28, flattened as the
    tutorial feeds them (`data.view(batch_size, -1)`), and their targets: the data source
    change of the port (no MNIST download here)."""
    from spikefuse.data.embedded import digits_split
    x, y, _, _ = digits_split()
    images = torch.tensor(x[:n], dtype=torch.float32).reshape(n, 1, 8, 8)
    images = nn.functional.interpolate(images, size=(28, 28), mode="bilinear").clamp(0, 1)
    return images.view(n, -1), torch.tensor(y[:n])


@pytest.mark.parametrize("case", ["tutorial", "small0", "small1", "small2"])
def test_tutorial5_net_equals_snntorch(case):
    """The tutorial's network and loss (784-1000-10, beta 0.95, T=25, a batch of 8 digits), and
    a small one on random input (20-30-5, beta 0.9, T=8): equal spike and membrane records,
    equal loss, weight gradients equal up to rounding."""
    seed = 0 if case == "tutorial" else int(case[-1])
    torch.manual_seed(seed)
    if case == "tutorial":
        theirs, mine = Net(snntorch), Net(compat)
        data, targets = digit_batch(8)
    else:
        sizes = dict(num_inputs=20, num_hidden=30, num_outputs=5, num_steps=8, beta=0.9)
        theirs, mine = Net(snntorch, **sizes), Net(compat, **sizes)
        with torch.no_grad():  # PyTorch's default init is too small for the output layer to fire at T=8
            theirs.fc1.weight.mul_(3)
            theirs.fc2.weight.mul_(4)
        g = torch.Generator().manual_seed(seed)
        data, targets = torch.rand(6, 20, generator=g) * 1.5, torch.randint(0, 5, (6,), generator=g)
    theirs, mine = theirs.to(DEVICE), mine.to(DEVICE)
    mine.load_state_dict(theirs.state_dict())  # the same weights (and snnTorch's neuron buffers)
    results = []
    for net in (theirs, mine):
        spk_rec, mem_rec = net(data.to(DEVICE))
        loss = nn.CrossEntropyLoss()
        loss_val = torch.zeros(1, device=DEVICE)  # the tutorial's loss: summed over the time steps
        for step in range(net.num_steps):
            loss_val += loss(mem_rec[step], targets.to(DEVICE))
        loss_val.backward()
        results.append((spk_rec.detach(), mem_rec.detach(), loss_val.detach(), net.fc1.weight.grad))
    (s1, m1, l1, g1), (s2, m2, l2, g2) = results
    assert 0 < s1.sum() < s1.numel(), "degenerate case"
    assert torch.equal(s1, s2) and torch.equal(m1, m2) and torch.equal(l1, l2)
    assert rel_err(g2, g1) < 1e-5, rel_err(g2, g1)
