"""spikefuse.nir: to_nir -> from_nir round trips (spikes and parameters equal), graphs that
snnTorch and Norse load and run to our spikes, their graphs loaded here, bad graphs refused.
snnTorch and Norse are test dependencies: the peer tests fail, not skip, without them (their
cells in docs/nir.md's conformance table rest on it). CUBA, RecurrentLIF and per-channel
thresholds: tests/test_nir_zoo.py."""
from __future__ import annotations

import nir
import numpy as np
import pytest
import torch
from torch import nn

from spikefuse.models import build_model
from spikefuse.nir import from_nir, to_nir
from spikefuse.nn import IF, LIF, PLIF, TimeFolded
from peers import quiet, stepped  # noqa: F401  (quiet: the fixture)


def trace(seq: nn.Sequential, x: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's output of a time-major Sequential."""
    outs = []
    with torch.no_grad():
        for layer in seq:
            x = layer(x)
            outs.append(x)
    return outs


def spike_layers(outs, seq):
    return [o for o, layer in zip(outs, seq) if isinstance(layer, LIF)]


def scramble_bn(model):
    """Eval statistics that are not the identity, so folding is exercised."""
    g = torch.Generator().manual_seed(3)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 0.4 - 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) * 1.5 + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(m.num_features, generator=g) * 0.3)
    return model.eval()


def kinds(graph) -> list[str]:
    """Node types along the chain from Input to Output (a file read back sorts the nodes)."""
    following, key, out = dict(graph.edges), "input", ["Input"]
    while key in following:
        key = following[key]
        out.append(type(graph.nodes[key]).__name__)
    return out


def through_file(graph, tmp_path):
    nir.write(tmp_path / "g.nir", graph)
    return nir.read(tmp_path / "g.nir")


def ipu(readout="mean"):
    torch.manual_seed(0)
    model = build_model("ipu-shd", (40,), 5, hidden=(48, 32), readout=readout)
    for p in model.parameters():  # more activity than the init's
        p.data.mul_(2.0)
    return model.eval()


def conv_sequential():
    torch.manual_seed(1)
    return nn.Sequential(TimeFolded(nn.Conv2d(2, 4, 3, padding=1)), LIF(decay=0.6, threshold=0.3),
                         TimeFolded(nn.Conv2d(4, 6, 3, stride=2, bias=False)), LIF(decay=0.8, threshold=0.2),
                         nn.Flatten(2), nn.Linear(6 * 2 * 2, 5), LIF(decay=0.5, threshold=0.2)).eval()


# ---- round trips ----

@pytest.mark.parametrize("form", ["peers", "nir"])
def test_round_trip_of_the_ipu_model_is_exact(tmp_path, form):
    model = ipu()
    graph = through_file(to_nir(model, (40,), time_steps=10, form=form), tmp_path)
    assert {type(n).__name__ for n in graph.nodes.values()} == {"Input", "Linear", "LIF", "Output"}
    back = from_nir(graph)
    assert back.readout == "mean" and back.dt == 1e-4
    linears = [m for m in model.layers if isinstance(m, nn.Linear)]
    for a, b in zip([m for m in back if isinstance(m, nn.Linear)], linears, strict=True):
        assert a.bias is None and torch.equal(a.weight, b.weight)
    for a in (m for m in back if isinstance(m, LIF)):
        assert (a.decay, a.threshold, a.v_reset, a.reset) == (0.95, 1.0, 0.0, "hard")
    x = (torch.rand(10, 3, 40, generator=torch.Generator().manual_seed(2)) < 0.3).float()
    ours, theirs = trace(model.layers, x), trace(back, x)
    spikes = spike_layers(ours, model.layers)
    assert all(0.02 < s.mean() < 0.9 for s in spikes)
    for a, b in zip(spike_layers(theirs, back), spikes, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(theirs[-1], ours[-1])
    assert torch.equal(back(x).mean(0), model(x))


def test_round_trip_of_the_shd_model_folds_batch_norm(tmp_path):
    torch.manual_seed(0)
    model = scramble_bn(build_model("shd", (30,), 4, hidden=(24, 16)))
    for p in model.parameters():
        p.data.mul_(2.0)
    graph = through_file(to_nir(model), tmp_path)
    assert kinds(graph) == ["Input", "Affine", "LIF", "Affine", "LIF", "Affine", "Output"]
    back = from_nir(graph)
    x = (torch.rand(8, 3, 30, generator=torch.Generator().manual_seed(4)) < 0.4).float()
    ours = [model.hidden[0](x)]
    ours.append(model.hidden[1](ours[0]))
    theirs = spike_layers(trace(back, x), back)
    assert all(0.02 < s.mean() < 0.9 for s in ours)
    for a, b in zip(theirs, ours, strict=True):  # BN folded: equal spikes (rounding-level potentials)
        assert torch.equal(a, b)
    torch.testing.assert_close(back(x).mean(0), model(x), rtol=1e-5, atol=1e-5)
    # the imported model (no BN left) round-trips exactly
    again = from_nir(to_nir(back, (30,)))
    for a, b in zip(again.parameters(), back.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(again(x), back(x))


def test_round_trip_of_conv_models(tmp_path):
    model = conv_sequential()
    graph = through_file(to_nir(model, (2, 6, 6)), tmp_path)
    assert kinds(graph) == ["Input", "Conv2d", "LIF", "Conv2d", "LIF", "Flatten", "Affine", "LIF", "Output"]
    back = from_nir(graph)
    assert back.readout == "none"
    theirs = dict(back.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(theirs[name], p), name
    x = (torch.rand(6, 2, 2, 6, 6, generator=torch.Generator().manual_seed(5)) < 0.5).float()
    ours = spike_layers(trace(model, x), model)
    assert all(0.02 < s.mean() < 0.95 for s in ours)
    for a, b in zip(spike_layers(trace(back, x), back), ours, strict=True):
        assert torch.equal(a, b)

    torch.manual_seed(0)  # the CIFAR net: ConvBNLIF blocks, stride-2 convs, BN folded
    cifar = scramble_bn(build_model("cifar-small", (2, 8, 8), 5, 4, width=1 / 32))
    back = from_nir(through_file(to_nir(cifar), tmp_path))
    x = (torch.rand(4, 2, 2, 8, 8, generator=torch.Generator().manual_seed(6)) < 0.5).float()
    with torch.no_grad():
        first = cifar.features[0](x)
    assert torch.equal(trace(back, x)[1], first) and 0.02 < first.mean() < 0.9
    torch.testing.assert_close(back(x).mean(0), cifar(x), rtol=1e-5, atol=1e-5)


def test_plif_if_and_integrator_readout():
    plif = PLIF(init_decay=0.6, channels=4)
    with torch.no_grad():
        plif.w.copy_(torch.tensor([-1.0, 0.0, 0.5, 2.0]))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), plif, nn.Linear(4, 4), IF(threshold=0.7), nn.Linear(4, 2))
    net.readout = "mean"
    graph = to_nir(net, (3,), time_steps=5, dt=1e-3, readout="integrator")
    assert type(graph.nodes["i"]).__name__ == "I"
    back = from_nir(graph)
    assert isinstance(back[3], IF) and back[3].threshold == pytest.approx(0.7, rel=1e-7)
    torch.testing.assert_close(back[1].decay, torch.sigmoid(plif.w).detach())
    x = torch.rand(5, 2, 3) * 3
    out = back(x)
    torch.testing.assert_close(out[-1], net(x).mean(0), rtol=1e-5, atol=1e-6)  # I after T steps = the mean
    with pytest.raises(ValueError, match="readout='integrator' needs the number of steps"):
        to_nir(net, (3,), readout="integrator")


def test_threshold_equality_fires_as_ours():
    """We fire at h >= threshold, NIR at v > v_threshold: written one float32 ulp below."""
    net = nn.Sequential(nn.Linear(2, 1, bias=False), LIF(decay=0.5, threshold=1.0))
    with torch.no_grad():
        net[0].weight.fill_(0.5)
    graph = to_nir(net, (2,))
    assert graph.nodes["lif"].v_threshold[0] == np.nextafter(np.float32(1), np.float32(0))
    x = torch.ones(3, 1, 2)  # h = 1.0 exactly at the first step
    assert net(x)[0, 0, 0] == 1 and torch.equal(from_nir(graph)(x), net(x))


# ---- what is refused, clearly ----

def test_bad_graphs_name_the_node():
    lif = nir.LIF(tau=np.full(2, 1e-3), r=np.ones(2), v_leak=np.zeros(2), v_threshold=np.ones(2), v_reset=np.zeros(2))
    g = nir.NIRGraph.from_list(nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), nir.Scale(scale=np.ones(2)))
    with pytest.raises(ValueError, match=r"node 'scale' \(Scale\): not supported by spikefuse.nir.from_nir"):
        from_nir(g)
    g = nir.NIRGraph.from_list(nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), lif)
    with pytest.raises(ValueError, match=r"node 'lif': the graph does not say its time step.*pass dt="):
        from_nir(g)
    assert isinstance(from_nir(g, dt=1e-4)[1], LIF)
    g.edges.append(("affine", "output"))
    with pytest.raises(ValueError, match="node 'affine' has 1 inputs and 2 outputs"):
        from_nir(g, dt=1e-4)
    with pytest.raises(TypeError, match="graph: expected a nir.NIRGraph"):
        from_nir({"nodes": {}})


def _lif(n=2, **fields):
    values = dict(tau=np.full(n, 1e-3), r=np.ones(n), v_leak=np.zeros(n), v_threshold=np.ones(n), v_reset=np.zeros(n))
    return nir.LIF(**{**values, **fields})


def _with(array, index, value):
    array = np.array(array, np.float64)
    array[index] = value
    return array


# Every float parameter of every node kind, with NaN, +inf or -inf: refused naming node and field.
NON_FINITE = {
    "affine-weight-nan": (lambda: [nir.Affine(weight=_with(np.ones((2, 3)), (1, 2), np.nan), bias=np.zeros(2)),
                                   _lif()], "affine", "Affine", "weight"),
    "affine-bias-inf": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=_with(np.zeros(2), 0, np.inf)), _lif()],
                        "affine", "Affine", "bias"),
    "linear-weight-neg-inf": (lambda: [nir.Linear(weight=_with(np.ones((2, 3)), (0, 0), -np.inf)), _lif()],
                              "linear", "Linear", "weight"),
    "conv-weight-nan": (lambda: [nir.Conv2d(input_shape=(4, 4), weight=_with(np.ones((2, 1, 3, 3)), (0, 0, 1, 1), np.nan),
                                            stride=1, padding=0, dilation=1, groups=1, bias=np.zeros(2))],
                        "conv2d", "Conv2d", "weight"),
    "conv-bias-inf": (lambda: [nir.Conv2d(input_shape=(4, 4), weight=np.ones((2, 1, 3, 3)), stride=1, padding=0,
                                          dilation=1, groups=1, bias=_with(np.zeros(2), 1, np.inf))],
                      "conv2d", "Conv2d", "bias"),
    "lif-tau-nan": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), _lif(tau=_with(np.full(2, 1e-3), 0, np.nan))],
                    "lif", "LIF", "tau"),
    "lif-threshold-inf": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)),
                                   _lif(v_threshold=np.full(2, np.inf))], "lif", "LIF", "v_threshold"),
    "lif-v-leak-nan": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)),
                                _lif(v_leak=_with(np.zeros(2), 1, np.nan))], "lif", "LIF", "v_leak"),
    "lif-v-reset-neg-inf": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)),
                                     _lif(v_reset=np.full(2, -np.inf))], "lif", "LIF", "v_reset"),
    "if-r-nan": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)),
                          nir.IF(r=_with(np.ones(2), 0, np.nan), v_threshold=np.ones(2), v_reset=np.zeros(2))],
                 "if", "IF", "r"),
    "li-tau-inf": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)),
                            nir.LI(tau=np.full(2, np.inf), r=np.ones(2), v_leak=np.zeros(2))], "li", "LI", "tau"),
    "i-r-nan": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), nir.I(r=np.full(2, np.nan))],
                "i", "I", "r"),
    "cubalif-tau-syn-inf": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)),
                                     nir.CubaLIF(tau_syn=np.full(2, np.inf), tau_mem=np.full(2, 1e-3), r=np.ones(2),
                                                 v_leak=np.zeros(2), v_threshold=np.ones(2))],
                            "cubalif", "CubaLIF", "tau_syn"),
    "recurrent-weight-nan": (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), nir.NIRGraph(
        nodes={"input": nir.Input(np.array([2])), "lif": _lif(), "w_rec": nir.Linear(weight=_with(np.eye(2), 0, np.nan)),
               "output": nir.Output(np.array([2]))},
        edges=[("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")])],
        "nirgraph.w_rec", "Linear", "weight"),
}


@pytest.mark.parametrize("case", list(NON_FINITE))
@pytest.mark.parametrize("via", ["graph", "file"])
def test_non_finite_parameters_are_refused_naming_node_and_field(case, via, tmp_path):
    nodes, key, kind, field = NON_FINITE[case]
    graph = nir.NIRGraph.from_list(*nodes())
    if via == "file":
        nir.write(tmp_path / "g.nir", graph)
        graph = tmp_path / "g.nir"
    with pytest.raises(ValueError, match=rf"^node '{key}' \({kind}\): {field} is not finite \((nan|-?inf) at index"):
        from_nir(graph, dt=1e-4)


@pytest.mark.parametrize("node, message", [
    (lambda: nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(3)),
     r"node 'affine': bias has 3 values \(shape \(3,\)\); expected 2, one per output of weight \(2, 3\)"),
    (lambda: nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(1)), r"node 'affine': bias has 1 values.*expected 2"),
    (lambda: nir.Conv2d(input_shape=(4, 4), weight=np.ones((2, 1, 3, 3)), stride=1, padding=0, dilation=1, groups=1,
                        bias=np.zeros(5)), r"node 'conv2d': bias has 5 values.*expected 2"),
    (lambda: nir.Conv2d(input_shape=(4, 4), weight=np.ones((2, 1, 3)), stride=1, padding=0, dilation=1, groups=1,
                        bias=np.zeros(2)), r"node 'conv2d': Conv2d weight must be 4-D"),
], ids=["affine-bias-long", "affine-bias-short", "conv-bias-long", "conv-weight-3d"])
def test_parameters_of_the_wrong_shape_name_the_node_and_expected_size(node, message):
    with pytest.raises(ValueError, match=message):
        from_nir(nir.NIRGraph.from_list(node()), dt=1e-4)


@pytest.mark.parametrize("nodes, message", [
    (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), _lif(3)],
     r"node 'lif' \(LIF\): tau has 3 values \(shape \(3,\)\); expected 2, one per output of the nodes before it"),
    (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), _lif(2), nir.Linear(weight=np.ones((4, 5)))],
     r"node 'linear': weight \(4, 5\) takes 5 inputs, but the nodes before it give 2"),
    (lambda: [nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), nir.NIRGraph(
        nodes={"input": nir.Input(np.array([3])), "lif": _lif(1), "w_rec": nir.Linear(weight=np.eye(3)),
               "output": nir.Output(np.array([3]))},
        edges=[("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")], type_check=False)],
     r"node 'nirgraph.w_rec': recurrent weight \(3, 3\); expected \(2, 2\)"),
], ids=["neurons-wider", "next-weight-wider", "recurrent-wider"])
def test_layers_that_disagree_in_size_name_the_node(nodes, message):
    """A graph built with type_check=False (nir.read checks its files): a 3-neuron LIF after 2
    outputs loaded as 2 neurons, a Linear of the wrong width failed at the first forward."""
    with pytest.raises(ValueError, match=message):
        from_nir(nir.NIRGraph.from_list(*nodes(), type_check=False), dt=1e-4)


def _h5_without_nir(path):
    import h5py
    with h5py.File(path, "w") as f:
        f["something"] = 1


BAD_FILES = {
    "not-hdf5": lambda p, good: p.write_bytes(b"this is not an HDF5 file\n"),
    "empty": lambda p, good: p.write_bytes(b""),
    "truncated": lambda p, good: p.write_bytes(good.read_bytes()[: good.stat().st_size // 2]),
    "hdf5-not-nir": lambda p, good: _h5_without_nir(p),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_unreadable_files_are_one_line_with_the_cause_chained(case, tmp_path):
    good = tmp_path / "good.nir"
    nir.write(good, nir.NIRGraph.from_list(nir.Affine(weight=np.ones((2, 3)), bias=np.zeros(2)), _lif()))
    bad = tmp_path / "bad.nir"
    BAD_FILES[case](bad, good)
    with pytest.raises(ValueError, match=r"^graph: .*bad.nir is not a readable NIR file \(\w+") as info:
        from_nir(bad, dt=1e-4)
    assert "\n" not in str(info.value) and info.value.__cause__ is not None
    for missing in (tmp_path / "nosuch.nir", tmp_path):  # absent, or a directory
        with pytest.raises(FileNotFoundError, match="graph: no such NIR file"):
            from_nir(missing)
    assert isinstance(from_nir(good, dt=1e-4)[0], nn.Linear)


def test_models_that_are_not_sequential_are_refused():
    with pytest.raises(ValueError, match=r"cannot export DVSGestureNet to NIR: its max pooling"):
        to_nir(build_model("dvs-gesture", (2, 8, 8), 3, width=1 / 32))
    with pytest.raises(ValueError, match="cannot export SpikingResNet to NIR: its residual connections"):
        to_nir(build_model("resnet18", (3, 8, 8), 3, width=1 / 16))
    bn = nn.BatchNorm1d(4, track_running_stats=False)
    with pytest.raises(ValueError, match=r"^1: track_running_stats=False uses batch statistics"):
        to_nir(nn.Sequential(nn.Linear(3, 4), bn, LIF()), (3,))
    with pytest.raises(ValueError, match="form='peers' folds the neuron's input gain"):
        to_nir(nn.Sequential(LIF(decay=0.5)), (3,))
    assert isinstance(to_nir(nn.Sequential(LIF(decay=0.5)), (3,), form="nir"), nir.NIRGraph)


def test_cli_exports_a_batch_norm_model(tmp_path, capsys):
    from spikefuse.cli import main
    from spikefuse.train import checkpoint

    spec = {"name": "shd", "input_shape": [12], "num_classes": 3, "time_steps": 5, "kwargs": {"hidden": [8]}}
    model = build_model(spec["name"], spec["input_shape"], spec["num_classes"], **spec["kwargs"])
    checkpoint.save({"config": {"model": spec}, "model": model.state_dict()}, tmp_path / "checkpoint.pt")
    assert main(["export", "--nir", str(tmp_path)]) == 0
    assert "form peers, readout mean (affine)" in capsys.readouterr().out
    assert isinstance(from_nir(tmp_path / "model.nir")[0], nn.Linear)


# ---- peers: snnTorch and Norse (test dependencies) ----

def run_snntorch(graph, x):
    """snnTorch's import of `graph` over x [T, *] (one step per call; fresh state)."""
    from snntorch.import_nir import import_from_nir

    module = import_from_nir(graph)
    with torch.no_grad():
        outs = [module(step) for step in x]
    return torch.stack([o[0] if isinstance(o, tuple) else o for o in outs])


def run_norse(graph, x):
    import norse.torch as norse

    module, state, outs = norse.from_nir(graph, dt=graph.metadata["dt"]), None, []
    with torch.no_grad():
        for step in x:
            out, state = module(step, state)
            outs.append(out)
    return torch.stack(outs)


PEERS = {"snntorch": run_snntorch, "norse": run_norse}


@pytest.mark.parametrize("peer", list(PEERS))
def test_peers_run_our_default_export_to_our_spikes(peer, quiet):
    model = ipu(readout="count")  # the graph's output is the last layer's spikes
    x = (torch.rand(10, 3, 40, generator=torch.Generator().manual_seed(2)) < 0.3).float()
    with torch.no_grad():
        ours = model.layers(x)
    assert 0.02 < ours.mean() < 0.9
    assert torch.equal(PEERS[peer](to_nir(model), x), ours)

    model = conv_sequential()  # a Flatten: peers fold their batch into it, so one unbatched sample at a time
    x = (torch.rand(6, 2, 2, 6, 6, generator=torch.Generator().manual_seed(5)) < 0.5).float()
    with torch.no_grad():
        ours = model(x)
    graph = to_nir(model, (2, 6, 6))
    for b in range(x.shape[1]):
        assert torch.equal(PEERS[peer](graph, x[:, b]), ours[:, b])


def test_snntorch_graphs_import_to_snntorch_spikes(quiet):
    import snntorch as snn
    from snntorch.export_nir import export_to_nir

    torch.manual_seed(0)
    # What snnTorch's exporter writes is a Leaky that resets to 0 at once: reset_mechanism="zero",
    # reset_delay=False (its defaults, subtract and delayed reset, are not what the NIR LIF says).
    leaky = dict(reset_mechanism="zero", reset_delay=False, init_hidden=True)
    net = nn.Sequential(nn.Linear(12, 16),
                        snn.Leaky(beta=torch.full((16,), 0.9), threshold=torch.full((16,), 0.5), **leaky),
                        nn.Linear(16, 6, bias=False),
                        snn.Leaky(beta=torch.full((6,), 0.8), threshold=torch.full((6,), 0.4), output=True, **leaky))
    graph = export_to_nir(net, torch.randn(1, 12), ignore_dims=[0])
    x = (torch.rand(15, 4, 12) < 0.4).float()
    with torch.no_grad():
        theirs = torch.stack([net(step)[0] for step in x])
    back = from_nir(graph, dt=1e-4)  # snnTorch writes tau = 1e-4 / (1 - beta)
    assert back[1].decay == 0.9 and back[3].decay == 0.8 and back[1].threshold > 0.5  # > 0.5 is >= 0.5 + 1 ulp
    assert 0.02 < theirs.mean() < 0.9
    assert torch.equal(back(x), theirs)


def test_snntorch_default_leaky_imports_with_the_snntorch_convention(quiet):
    """snnTorch's default Leaky (subtract reset, a step late, detached) exported to NIR loads
    with convention="snntorch" as reset="subtract" and gives its spikes exactly; read as NIR
    says (reset at once) the spikes differ. snnTorch is a test dependency: this fails, not
    skips, without it."""
    import snntorch as snn
    from snntorch.export_nir import export_to_nir

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(12, 16), snn.Leaky(beta=torch.full((16,), 0.9), threshold=torch.full((16,), 0.5),
                                                     init_hidden=True),
                        nn.Linear(16, 6, bias=False),
                        snn.Leaky(beta=torch.full((6,), 0.8), threshold=torch.full((6,), 0.4), init_hidden=True,
                                  output=True))
    graph = export_to_nir(net, torch.randn(1, 12), ignore_dims=[0])
    x = (torch.rand(15, 4, 12) < 0.4).float()
    with torch.no_grad():
        theirs = torch.stack([net(step)[0] for step in x])
    back = from_nir(graph, dt=1e-4, convention="snntorch")
    assert back[1].reset == "subtract" and back[1].detach_reset and back[1].threshold == 0.5
    assert 0.02 < theirs.mean() < 0.9
    assert torch.equal(back(x), theirs)
    assert not torch.equal(from_nir(graph, dt=1e-4)(x), theirs)
    with pytest.raises(ValueError, match="convention"):
        from_nir(graph, dt=1e-4, convention="lava")


def test_norse_graphs_import_to_norse_spikes(quiet):
    import norse.torch as norse

    torch.manual_seed(0)
    p1 = norse.LIFBoxParameters(tau_mem_inv=torch.tensor(200.0), v_th=torch.tensor(0.3))
    p2 = norse.LIFBoxParameters(tau_mem_inv=torch.tensor(100.0), v_th=torch.tensor(0.2))
    net = norse.SequentialState(nn.Linear(12, 16), norse.LIFBoxCell(p1), nn.Linear(16, 6), norse.LIFBoxCell(p2))
    for p in net.parameters():
        p.data.mul_(4.0)  # so that both layers fire
    # Norse 1.1's to_nir writes tau = dt / tau_mem_inv: dt=1 makes that NIR's tau in seconds
    # (the cells themselves step with their own dt, 1e-3 s)
    graph = norse.to_nir(net, torch.randn(1, 12), dt=1.0)
    x = (torch.rand(15, 4, 12) < 0.5).float() * 2
    state, outs = None, []
    with torch.no_grad():
        for step in x:
            out, state = net(step, state)
            outs.append(out)
    theirs = torch.stack(outs)
    back = from_nir(graph, dt=1e-3)  # Norse writes no dt: the cells' dt
    assert back[1].decay == pytest.approx(0.8) and back[3].decay == pytest.approx(0.9)
    assert 0.02 < theirs.mean() < 0.9
    assert torch.equal(back(x), theirs)


@pytest.mark.parametrize("v_leak", [0.0, 0.1, -0.2])
def test_norse_lifbox_graphs_load_with_the_norse_convention(v_leak, quiet):
    """Linear + LIFBoxCell exported by Norse's to_nir (dt=1.0: tau = 1/tau_mem_inv) loads with
    convention="norse" (dt 1e-3, the cells', and the potential starting at v_leak) to Norse's
    spikes exactly. Norse is a test dependency: this fails, not skips, without it."""
    import norse.torch as norse

    from spikefuse.nir import RestingLIF

    torch.manual_seed(0)
    p1 = norse.LIFBoxParameters(tau_mem_inv=torch.tensor(200.0), v_th=torch.tensor(0.3), v_leak=torch.tensor(v_leak))
    p2 = norse.LIFBoxParameters(tau_mem_inv=torch.full((6,), 100.0), v_th=torch.full((6,), 0.2),
                                v_leak=torch.full((6,), v_leak / 2))
    net = norse.SequentialState(nn.Linear(12, 16), norse.LIFBoxCell(p1), nn.Linear(16, 6), norse.LIFBoxCell(p2))
    for p in net.parameters():
        p.data.mul_(4.0)  # so that both layers fire
    graph = norse.to_nir(net, torch.randn(1, 12), dt=1.0)
    x = (torch.rand(30, 4, 12, generator=torch.Generator().manual_seed(7)) < 0.5).float() * 2
    theirs = stepped(net, x)
    back = from_nir(graph, convention="norse")  # no dt: Norse's 1e-3
    assert isinstance(back[1], RestingLIF) and back[1].decay == pytest.approx(0.8)
    assert back[3].decay == pytest.approx(0.9)
    assert 0.02 < theirs.mean() < 0.9
    assert torch.equal(back(x), theirs)
    assert torch.equal(from_nir(graph, dt=1e-3, convention="norse")(x), theirs)
    if v_leak:  # read as NIR says, the potential starts at 0: some spikes differ
        assert not torch.equal(from_nir(graph, dt=1e-3)(x), theirs)


def test_norse_iaf_graphs_load_with_the_norse_convention(quiet):
    """IAFCell adds its input unscaled (its dt is unused): convention="norse" reads its IF
    nodes with dt = 1, whatever dt is passed; with dt = 1e-3 they would barely fire."""
    import norse.torch as norse

    torch.manual_seed(1)
    net = norse.SequentialState(nn.Linear(12, 16), norse.IAFCell(norse.IAFParameters(v_th=torch.tensor(0.5))),
                                nn.Linear(16, 6), norse.IAFCell(norse.IAFParameters(v_th=torch.tensor(0.3))))
    graph = norse.to_nir(net, torch.randn(1, 12))
    x = (torch.rand(30, 4, 12, generator=torch.Generator().manual_seed(8)) < 0.5).float()
    theirs = stepped(net, x)
    assert 0.02 < theirs.mean() < 0.9
    assert torch.equal(from_nir(graph, convention="norse")(x), theirs)
    assert torch.equal(from_nir(graph, dt=1e-3, convention="norse")(x), theirs)
    assert not torch.equal(from_nir(graph, dt=1e-3)(x), theirs)
