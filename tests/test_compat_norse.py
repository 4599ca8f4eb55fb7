"""spikefuse.compat.norse against Norse 1.1.0 itself: the cells (LIFBoxCell, LIFCell, IAFCell)
called step by step give Norse's spikes and states bit for bit and input (and parameter)
gradients equal up to rounding; the sequence modules (LIFBox, LIF, IAF) give the same on the
PyTorch path, and on the fused kernels (through Triton's interpreter here) the same spikes on
inputs whose potential stays away from the threshold (asserted: the fold's other float32
order may flip a spike only within a few ulps of it; benchmarks/compat_norse_rounding.py
measures how often), states to float32 rounding; surrogates; refusals; a small Norse network
ported by its import line. A missing Norse skips these tests, and fails them under CI
(tests/peers.py)."""
import pytest
import torch
from torch import nn

import spikefuse.compat.norse as compat
from helpers import DEVICE, one_thread, rel_err  # noqa: F401  (one_thread: the fixture)
from peers import require

norse = require("norse.torch")
require("norse.torch.functional.reset")
pytestmark = pytest.mark.usefixtures("one_thread")  # helpers.one_thread, for every test here: tiny per-step ops


@pytest.fixture(autouse=True)
def norse_default_v_reset_left_alone():
    """Norse's IAF (and IAFCell on the CPU) marks the v_reset it starts from as requiring grad,
    and that is IAFParameters' one shared default tensor: a later IAFCell on CUDA then fails
    inside Norse (its `.to(device)` copy is no leaf). Each test starts with the default clean."""
    yield
    norse.IAFParameters._field_defaults["v_reset"].requires_grad_(False)

# (T, one step's shape, seed): T = 1, odd sizes, a step without a batch dim, a conv-like step
SHAPES = [(1, (3, 5), 0), (9, (4, 7), 1), (7, (2, 3, 5), 2), (6, (11,), 3)]
KINDS = {  # kind: (parameters, cell, sequence module, input mean, input std)
    "box": ("LIFBoxParameters", "LIFBoxCell", "LIFBox", 2.0, 1.5),
    "lif": ("LIFParameters", "LIFCell", "LIF", 0.6, 1.0),
    "iaf": ("IAFParameters", "IAFCell", "IAF", 0.3, 0.5),
}
t = torch.tensor


def other(kind):
    """Parameters besides Norse's defaults (fresh tensors: Norse's IAFCell marks its p.v_reset
    as requiring grad when it starts a state)."""
    return {"box": dict(tau_mem_inv=t(1 / 3.7e-3), v_leak=t(-0.3), v_th=t(0.75), v_reset=t(-0.1)),
            "lif": dict(tau_syn_inv=t(300.0), tau_mem_inv=t(150.0), v_leak=t(-0.3), v_th=t(0.75), v_reset=t(-0.1)),
            "iaf": dict(v_th=t(0.8), v_reset=t(-0.2))}[kind]


def inputs(seed, shape, mean, std):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * std + mean).to(DEVICE)


def make(module, kind, fields=None, **kwargs):
    """(parameters, cell, sequence module) of `module` (Norse or compat; Norse 1.1.0 has no
    LIFBox: None)."""
    params, cell, seq, _, _ = KINDS[kind]
    p = getattr(module, params)(**(fields or {}))
    seq = getattr(module, seq, None)
    return p, getattr(module, cell)(p, **kwargs), seq and seq(p, **kwargs)


def stepped(cell, x, state=None):
    """The cell over x [T, ...] one step a call, Norse style: spikes, every step's states (each
    field stacked [T, ...]), and dL/dx for a fixed random loss on the spikes and the last v."""
    x = x.clone().requires_grad_()
    spikes, states = [], []
    for step in x:
        z, state = cell(step, state)
        spikes.append(z)
        states.append(state)
    spikes = torch.stack(spikes)
    g = torch.Generator().manual_seed(9)
    loss = (spikes * torch.randn(spikes.shape, generator=g).to(spikes.device)).sum() + 0.1 * state.v.pow(2).sum()
    grad = torch.autograd.grad(loss, x)[0]
    records = [torch.stack([s[k] for s in states]).detach() for k in range(len(states[0]))]
    return spikes.detach(), records, grad


def whole(module, x, state=None):
    """The sequence module over x [T, ...] in one call: spikes, the last state, dL/dx for the
    loss of `stepped`."""
    x = x.clone().requires_grad_()
    spikes, last = module(x, state)
    g = torch.Generator().manual_seed(9)
    loss = (spikes * torch.randn(spikes.shape, generator=g).to(spikes.device)).sum() + 0.1 * last.v.pow(2).sum()
    return spikes.detach(), [s.detach() for s in last], torch.autograd.grad(loss, x)[0]


def pre_reset_margin(kind, p, dt, x, records, state0=None):
    """The least |v - v_th| of Norse's pre-reset potential over x's steps, from Norse's state
    records (the potential the threshold compares; computed as Norse's step does)."""
    v = records[0]
    prev = [torch.as_tensor(p.v_leak if kind != "iaf" else p.v_reset, device=x.device).expand_as(x[0])
            if state0 is None else state0.v] + list(v[:-1])
    margins = []
    for step, (xt, vt) in enumerate(zip(x, prev)):
        if kind == "box":
            h = vt + dt * p.tau_mem_inv * (xt + p.v_leak - vt)
        elif kind == "iaf":
            h = vt + xt
        else:
            i_prev = (torch.zeros_like(xt) if state0 is None else state0.i) if step == 0 else records[1][step - 1]
            h = vt + dt * p.tau_mem_inv * ((p.v_leak - vt) + (i_prev + xt))
        margins.append((h - p.v_th).abs().min())
    return torch.stack(margins).min().item()


def assert_exact(theirs, mine, what, last_only=False):
    assert torch.equal(mine[0], theirs[0]), f"{what}: spikes differ at {(mine[0] != theirs[0]).sum().item()} places"
    for k, (a, b) in enumerate(zip(theirs[1], mine[1])):
        a = a[-1] if last_only else a
        assert torch.equal(b, a), f"{what}: state field {k} differs, max {(a - b).abs().max().item()}"
    assert rel_err(mine[2], theirs[2]) < 1e-5, f"{what}: dL/dx rel err {rel_err(mine[2], theirs[2])}"


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("params", ["defaults", "other"])
@pytest.mark.parametrize("T,shape,seed", SHAPES)
def test_equals_norse_step_by_step_and_on_the_pytorch_path(kind, params, T, shape, seed):
    """The cells, per step from Norse's initial state and from a given one, and the sequence
    module on the PyTorch path (backend="reference"): Norse's operations, bit for bit."""
    fields = other(kind) if params == "other" else {}
    if params == "other" and kind != "iaf":
        g = torch.Generator().manual_seed(seed + 50)
        fields["v_leak"] = (torch.rand(shape[-1], generator=g) - 0.5).to(DEVICE)  # one per neuron (last dim)
    mean, std = KINDS[kind][3:]
    x = inputs(seed, (T, *shape), mean, std)
    _, theirs_cell, _ = make(norse, kind, fields)
    _, mine_cell, _ = make(compat, kind, fields)
    _, _, mine_seq = make(compat, kind, fields, backend="reference")
    theirs = stepped(theirs_cell, x)
    assert 0 < theirs[0].sum() < theirs[0].numel() or T == 1, "degenerate case"
    assert_exact(theirs, stepped(mine_cell, x), f"{kind} {params} cell")
    assert_exact(theirs, whole(mine_seq, x), f"{kind} {params} sequence", last_only=True)
    # from a given state (Norse's own state tuple, passed to ours): the last one of the run
    state0 = type(theirs_cell(x[0])[1])(*(r[-1] for r in theirs[1]))
    theirs = stepped(theirs_cell, x, state0)
    assert_exact(theirs, stepped(mine_cell, x, state0), f"{kind} {params} cell from a state")
    assert_exact(theirs, whole(mine_seq, x, state0), f"{kind} {params} sequence from a state", last_only=True)


def test_norse_sequence_modules_and_record_states():
    """Norse's own LIF and IAF modules (its SNN loop): the same spikes and last state; LIF's
    record_states=True: every step's state, stacked."""
    x = inputs(4, (8, 3, 6), 0.4, 1.0)
    for record in (False, True):
        z, s = norse.LIF(norse.LIFParameters(), record_states=record)(x)
        z2, s2 = compat.LIF(compat.LIFParameters(), record_states=record, backend="reference")(x)
        assert torch.equal(z, z2) and all(torch.equal(a, b) for a, b in zip(s, s2))
        assert isinstance(s2, compat.LIFFeedForwardState) and s2.v.shape == ((8, 3, 6) if record else (3, 6))
    z, s = norse.IAF(norse.IAFParameters())(x)
    z2, s2 = compat.IAF(compat.IAFParameters())(x)
    assert torch.equal(z, z2) and torch.equal(s.v, s2.v)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("method,alpha", [("super", 100.0), ("super", 3.0), ("tanh", 2.0), ("triangle", 1.0),
                                          ("heaviside", 100.0)])
def test_surrogates_give_norses_gradients(kind, method, alpha):
    x = inputs(7, (8, 4, 9), *KINDS[kind][3:])
    fields = dict(method=method, alpha=torch.tensor(alpha))
    _, theirs_cell, _ = make(norse, kind, fields)
    _, mine_cell, _ = make(compat, kind, fields)
    theirs, mine = stepped(theirs_cell, x), stepped(mine_cell, x)
    assert_exact(theirs, mine, f"{kind} {method} {alpha}")
    if method == "heaviside":  # no gradient through the spikes: only the membrane's
        assert compat.surrogate_of(method, alpha)[1] is None
    else:
        assert compat.surrogate_of(method, alpha) == {"super": ("fast_sigmoid", 1.0), "tanh": ("sigmoid", 4.0),
                                                      "triangle": ("triangle", 1.0)}[method]


def parameter_grads(cell_or_seq, x, params):
    """d(loss)/d(params) for a loss on the spikes and the last v: a cell stepped over x [T, ...]
    or a sequence module called once."""
    if isinstance(cell_or_seq, compat._Sequence):
        z, state = cell_or_seq(x)
    else:
        state, zs = None, []
        for step in x:
            z, state = cell_or_seq(step, state)
            zs.append(z)
        z = torch.stack(zs)
    return torch.autograd.grad(z.sum() + 0.1 * state.v.pow(2).sum(), params)


@pytest.mark.parametrize("per_neuron", [False, True])
def test_learnable_parameters_get_norses_gradients(per_neuron):
    """tau_mem_inv and v_leak requiring grad (LIFBox; LIF's v_leak): their gradients equal
    Norse's, step by step and over the whole sequence."""
    x = inputs(11, (10, 4, 6), 1.2, 1.0)
    n = 6 if per_neuron else 1
    tau = (torch.full((n,), 100.0) + torch.arange(n) * 30).to(DEVICE)
    leak = torch.linspace(-0.2, 0.3, n).to(DEVICE)
    tau, leak = (tau if per_neuron else tau[0]).requires_grad_(), (leak if per_neuron else leak[0]).requires_grad_()
    theirs = parameter_grads(norse.LIFBoxCell(norse.LIFBoxParameters(tau_mem_inv=tau, v_leak=leak)), x, (tau, leak))
    p = compat.LIFBoxParameters(tau_mem_inv=tau, v_leak=leak)
    for mine in (compat.LIFBoxCell(p), compat.LIFBox(p, backend="reference")):
        for a, b in zip(parameter_grads(mine, x, (tau, leak)), theirs):
            assert rel_err(a, b) < 1e-5, rel_err(a, b)
    theirs = parameter_grads(norse.LIFCell(norse.LIFParameters(v_leak=leak)), x * 0.3, leak)
    for mine in (compat.LIFCell(compat.LIFParameters(v_leak=leak)),
                 compat.LIF(compat.LIFParameters(v_leak=leak), backend="reference")):
        assert rel_err(parameter_grads(mine, x * 0.3, leak)[0], theirs[0]) < 1e-5


@pytest.mark.interpreter  # the fused kernels, on CPU tensors through Triton's interpreter
def test_fused_backend():
    """backend="fused": a cell stays Norse's bit for bit; the sequence modules fold the step
    into the kernels' order of float32 operations: on this input (every pre-reset potential at
    least 1e-4 from v_th, asserted) Norse's spikes exactly, states to a few ulps, gradients
    (input; a learned tau_mem_inv per neuron and v_leak) to 1e-5; and the fold gives the
    PyTorch reference's bits (the kernels run without FMA)."""
    x = inputs(5, (6, 3, 5), 0.0, 1.0)
    tau, leak = torch.linspace(80.0, 300.0, 5, device=DEVICE).requires_grad_(), t(0.1, requires_grad=True)
    per_neuron = dict(tau_mem_inv=tau, v_leak=leak)
    for kind, fields in [("box", {}), ("box", per_neuron), ("lif", other("lif")), ("iaf", {})]:
        mean, std = KINDS[kind][3:]
        xk = x * std + mean
        p, theirs_cell, _ = make(norse, kind, fields)
        _, mine_cell, mine_seq = make(compat, kind, fields, backend="fused")
        theirs = stepped(theirs_cell, xk)
        assert 0 < theirs[0].sum() < theirs[0].numel()
        assert pre_reset_margin(kind, p, 0.001, xk, theirs[1]) > 1e-4, "the data must keep v away from v_th"
        mine = whole(mine_seq, xk)
        assert torch.equal(mine[0], theirs[0]), f"fused {kind} sequence: spikes differ"
        for a, b in zip(theirs[1], mine[1]):
            assert torch.allclose(b, a[-1], rtol=1e-6, atol=1e-6), (kind, (a[-1] - b).abs().max().item())
        assert rel_err(mine[2], theirs[2]) < 1e-5, rel_err(mine[2], theirs[2])
        if kind == "box" and not fields or kind == "lif":  # LIFBox's scalar-decay fold, LIF's on CUBA
            _, _, reference = make(compat, kind, fields, backend="reference")
            with torch.no_grad():
                folded = reference._sequence(xk, reference._initial(xk.shape[1:], xk), False)
                fused = mine_seq(xk)
            assert torch.equal(fused[0], folded[0]) and all(torch.equal(a, b) for a, b in zip(fused[1], folded[1]))
        if fields is per_neuron:
            theirs_grads = parameter_grads(norse.LIFBoxCell(p), xk, (tau, leak))
            for a, b in zip(parameter_grads(mine_seq, xk, (tau, leak)), theirs_grads):
                assert rel_err(a, b) < 1e-5, rel_err(a, b)
        if kind == "box" and not fields:  # a cell's step on the kernels: Norse's bits (two steps)
            theirs = stepped(theirs_cell, xk[:2])
            assert_exact(theirs, stepped(mine_cell, xk[:2]), "fused box cell")


def test_float64_input():
    """Norse computes a float64 input in float64 (its float32 parameters promoted): the same
    values here, step by step and on the PyTorch path."""
    x = inputs(8, (9, 3, 5), 0.4, 1.0).double()
    for kind in KINDS:
        _, theirs_cell, _ = make(norse, kind)
        _, mine_cell, mine_seq = make(compat, kind, backend="reference")
        theirs = stepped(theirs_cell, x)
        assert theirs[0].dtype == torch.float64
        assert_exact(theirs, stepped(mine_cell, x), f"float64 {kind}")
        assert_exact(theirs, whole(mine_seq, x), f"float64 {kind} sequence", last_only=True)


def test_initial_states_are_norses():
    x = inputs(3, (2, 5), 0.4, 1.0)
    leak = torch.tensor(-0.25)
    z, s = compat.LIFCell(compat.LIFParameters(v_leak=leak))(torch.zeros_like(x))
    z0, s0 = norse.LIFCell(norse.LIFParameters(v_leak=leak))(torch.zeros_like(x))
    assert torch.equal(s.v, s0.v) and torch.equal(s.i, s0.i) and s.v.shape == x.shape
    for module in (compat, norse):  # Norse's params work in ours and ours in Norse's
        other = norse if module is compat else compat
        z, s = module.LIFBoxCell(other.LIFBoxParameters(v_leak=leak))(x)
        assert s.v.shape == x.shape
    assert compat.IAFCell()(torch.zeros(3))[1].v.abs().sum() == 0  # IAF starts at v_reset


@pytest.mark.parametrize("build,argument", [
    (lambda: compat.LIFBoxCell(compat.LIFBoxParameters(method="circ")), "p.method"),
    (lambda: compat.LIFBoxCell(compat.LIFBoxParameters(method="heavi_erfc")), "p.method"),
    (lambda: compat.LIFCell(compat.LIFParameters(method="adjoint")), "p.method"),
    (lambda: compat.LIFBoxCell(compat.LIFBoxParameters(method="tanh")), "p.alpha"),  # Norse's default alpha 100
    (lambda: compat.LIFCell(compat.LIFParameters(method="triangle", alpha=0.3)), "p.alpha"),
    (lambda: compat.IAFCell(compat.IAFParameters(v_th=torch.ones(3))), "p.v_th"),
    (lambda: compat.LIFBoxCell(compat.LIFBoxParameters(v_th=torch.tensor(1.0, requires_grad=True))), "p.v_th"),
    (lambda: compat.LIFBoxCell(compat.LIFBoxParameters(v_reset=torch.zeros(2))), "p.v_reset"),
    (lambda: compat.LIFCell(compat.LIFParameters(tau_mem_inv=torch.full((3,), 100.0))), "p.tau_mem_inv"),
    (lambda: compat.LIF(compat.LIFParameters(tau_syn_inv=torch.tensor(200.0, requires_grad=True))),
     "p.tau_syn_inv"),
    (lambda: compat.LIFBoxCell(compat.LIFBoxParameters(tau_mem_inv=torch.tensor(2000.0))), "p.tau_mem_inv"),
    (lambda: compat.LIFCell(compat.LIFParameters(tau_syn_inv=torch.tensor(300.0)), dt=0.005), "p.tau_syn_inv"),
    (lambda: compat.LIFBoxCell(compat.LIFBoxParameters(), dt=0.0), "dt"),
    (lambda: compat.LIFBoxCell(norse.LIFBoxParameters(
        reset_method=__import__("norse.torch.functional.reset", fromlist=["x"]).reset_subtract)), "p.reset_method"),
    (lambda: compat.LIFBoxCell(compat.LIFBoxParameters(method="heaviside"), backend="fused"), "p.method"),
    (lambda: compat.LIFBoxCell(backend="cupy"), "backend"),
    (lambda: compat.LIFCell(compat.LIFBoxParameters()), "p must be"),
])
def test_unsupported_arguments_are_refused_by_name(build, argument):
    with pytest.raises(ValueError, match=rf"^{argument}"):
        build()


def test_bad_shapes_are_refused_at_the_call():
    x = torch.ones(4, 5)
    with pytest.raises(ValueError, match=r"^state.v"):
        compat.LIFBoxCell()(x, compat.LIFBoxFeedForwardState(v=torch.zeros(3)))
    with pytest.raises(ValueError, match=r"^state.i"):
        compat.LIF()(x[None], compat.LIFFeedForwardState(v=torch.zeros(5), i=torch.zeros(2, 4, 5)))
    with pytest.raises(ValueError, match=r"^p.v_leak"):
        compat.LIFBoxCell(compat.LIFBoxParameters(v_leak=torch.zeros(3)))(x)
    with pytest.raises(ValueError, match=r"^input_tensor"):
        compat.LIFCell()(x.to_sparse())


class ConvNet(nn.Module):
    """Norse's ConvNet (norse/torch/models/conv.py), its code as written there with `snn` the
    imported module (`import norse.torch as snn`, or `import spikefuse.compat.norse as snn`:
    the port), at a small size; its LILinearCell readout (a leaky integrator, not in
    spikefuse.compat.norse) is a Linear layer here, in both."""

    def __init__(self, snn, num_channels=1, feature_size=16, method="super", dtype=torch.float):
        super(ConvNet, self).__init__()
        self.features = int(((feature_size - 4) / 2 - 4) / 2)
        self.conv1 = torch.nn.Conv2d(num_channels, 4, 5, 1)
        self.conv2 = torch.nn.Conv2d(4, 6, 5, 1)
        self.fc1 = torch.nn.Linear(self.features * self.features * 6, 20)
        self.out = torch.nn.Linear(20, 10)
        self.lif0 = snn.LIFCell(
            p=snn.LIFParameters(method=method, alpha=torch.tensor(100.0)),
        )
        self.lif1 = snn.LIFCell(
            p=snn.LIFParameters(method=method, alpha=torch.tensor(100.0)),
        )
        self.lif2 = snn.LIFCell(p=snn.LIFParameters(method=method, alpha=torch.tensor(100.0)))
        self.dtype = dtype

    def forward(self, x):
        seq_length = x.shape[0]
        batch_size = x.shape[1]

        # specify the initial states
        s0, s1, s2 = None, None, None

        voltages = torch.zeros(
            seq_length, batch_size, 10, device=x.device, dtype=self.dtype
        )

        for ts in range(seq_length):
            z = self.conv1(x[ts, :])
            z, s0 = self.lif0(z, s0)
            z = torch.nn.functional.max_pool2d(z, 2, 2)
            z = 10 * self.conv2(z)
            z, s1 = self.lif1(z, s1)
            z = torch.nn.functional.max_pool2d(z, 2, 2)
            z = z.view(-1, self.features**2 * 6)
            z = self.fc1(z)
            z, s2 = self.lif2(z, s2)
            v = self.out(torch.nn.functional.relu(z))
            voltages[ts, :, :] = v
        return voltages


def test_norse_convnet_ported_by_its_import_line():
    """Norse's ConvNet (small) and a SequentialState network in Norse's style: the same
    outputs and loss bit for bit, weight gradients equal up to rounding."""
    torch.manual_seed(0)
    theirs, mine = ConvNet(norse).to(DEVICE), ConvNet(compat).to(DEVICE)
    mine.load_state_dict(theirs.state_dict())  # Norse's cells have no entries: the same weights
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(10, 2, 1, 16, 16, generator=g) * 40).to(DEVICE)
    targets = torch.randint(0, 10, (2,), generator=g).to(DEVICE)
    results = []
    for net in (theirs, mine):
        voltages = net(x)
        loss = nn.functional.cross_entropy(voltages.max(0).values, targets)
        loss.backward()
        results.append((voltages.detach(), loss.detach(), net.conv1.weight.grad))
    (v1, l1, g1), (v2, l2, g2) = results
    assert torch.equal(v1, v2) and torch.equal(l1, l2)
    assert rel_err(g2, g1) < 1e-5, rel_err(g2, g1)
    assert (v1 != mine.out.bias).any(), "degenerate case: no spikes reached the readout"

    def sequential(snn):
        torch.manual_seed(2)
        model = snn.SequentialState(nn.Linear(8, 16), snn.LIFCell(), nn.Linear(16, 4), snn.LIFBoxCell()).to(DEVICE)
        with torch.no_grad():
            model[2].weight.mul_(20)  # enough drive for the box cells to fire in 10 steps
        return model

    x = inputs(3, (10, 2, 8), 5.0, 5.0)
    outs = []
    for snn in (norse, compat):
        model, state, spikes = sequential(snn), None, []
        for step in x:
            z, state = model(step, state)
            spikes.append(z)
        outs.append((torch.stack(spikes), state))
    (z1, s1), (z2, s2) = outs
    assert 0 < z1.sum() < z1.numel() and torch.equal(z1, z2)
    assert s1[0] is None and s2[0] is None and torch.equal(s1[1].v, s2[1].v) and torch.equal(s1[3].v, s2[3].v)
