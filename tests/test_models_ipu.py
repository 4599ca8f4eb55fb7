"""The IPU study's dense networks: shapes, input errors, fused == reference, registry."""
import math
import numpy as np
import pytest
import torch

from spikefuse.models import MODELS, build_model
from spikefuse.models.ipu import NETWORKS, TIME_STEPS, IPUNet
from spikefuse.nn import LIF
from spikefuse.nn.spiking_layers import SpikingLinear

NAMES = sorted(NETWORKS)
WIDTH = 1 / 64  # hidden 23-23: tiny, every code path
T, B = 3, 2


def tiny(name, seed=0, **kw):
    net = NETWORKS[name]
    torch.manual_seed(seed)
    return build_model(name, net.input_shape, net.num_classes, T, width=WIDTH, **kw)


def batch(name, seed=0):
    net = NETWORKS[name]
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand((T, B, *net.input_shape), generator=g) < 0.3).float() * 2  # event counts, not only 0/1
    return x, torch.randint(0, net.num_classes, (B,), generator=g)


def test_registry_builds_the_study_networks():
    expected = {"ipu-shd": ((700,), 20, 100), "ipu-nmnist": ((2, 34, 34), 10, 100),
                "ipu-dvsgesture": ((2, 48, 48), 11, 50)}
    for name, (shape, classes, steps) in expected.items():
        assert MODELS[name][1] and TIME_STEPS[name] == steps
        net = NETWORKS[name]
        assert (net.input_shape, net.num_classes, net.time_steps) == (shape, classes, steps)
        model = build_model(name, shape, classes, steps)
        assert isinstance(model, IPUNet) and model.input_shape == shape
        assert model.hidden_sizes == (1472, 1470) and model.readout == "mean"
        linears = [m for m in model.layers if isinstance(m, torch.nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linears] == \
               [(torch.Size(shape).numel(), 1472), (1472, 1470), (1470, classes)]
        assert type(linears[0]) is torch.nn.Linear and all(type(m) is SpikingLinear for m in linears[1:])
        assert all(m.bias is None for m in linears)
        lifs = [m for m in model.layers if isinstance(m, LIF)]
        assert len(lifs) == 2 and all((m.decay, m.threshold, m.reset, m.surrogate, m.alpha)
                                      == (0.95, 1.0, "hard", "fast_sigmoid", 10.0) for m in lifs)
    builder = MODELS["ipu-nmnist"][0]
    assert builder().input_shape == (2, 34, 34)  # the builders' own defaults


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_logits(name):
    model = tiny(name)
    x, _ = batch(name)
    logits = model(x)
    assert logits.shape == (B, NETWORKS[name].num_classes) and torch.isfinite(logits).all()
    torch.testing.assert_close(model(x.flatten(2)), logits)  # an already flattened input reads the same
    assert model(x.to(torch.uint8)).shape == logits.shape  # integer counts are accepted
    # the readout is the time-mean of the last Linear over the hidden spikes
    hidden = model.layers[:-1](x)
    torch.testing.assert_close(logits, model.layers[-1](hidden).mean(0))


def test_count_readout_sums_output_spikes():
    model = tiny("ipu-shd", readout="count", threshold=0.1)
    assert isinstance(model.layers[-1], LIF)
    x, _ = batch("ipu-shd")
    logits = model(x)
    assert logits.shape == (B, 20)
    torch.testing.assert_close(logits, model.layers(x).sum(0))
    assert (logits == logits.round()).all() and (0 <= logits).all() and (logits <= T).all()
    assert logits.sum() > 0  # some output neuron spiked


@pytest.mark.parametrize("name", NAMES)
def test_input_errors_name_the_layer(name):
    model = tiny(name)
    shape = NETWORKS[name].input_shape
    with pytest.raises(ValueError, match=r"IPUNet: expected input \[T, B, .*got shape \(2, 5\)"):
        model(torch.rand(2, 5))
    bad = (T, B, *shape[:-1], shape[-1] + 1)
    with pytest.raises(ValueError, match=r"IPUNet: expected input \[T, B, .*" + str(bad).replace("(", r"\(")
                       .replace(")", r"\)")):
        model(torch.rand(bad))
    with pytest.raises(TypeError, match="IPUNet"):
        model([1.0])


def test_bad_options():
    with pytest.raises(ValueError, match="readout"):
        IPUNet((700,), 20, readout="max")
    with pytest.raises(ValueError, match="width"):
        IPUNet((700,), 20, width=0)
    with pytest.raises(ValueError, match="fused=False"):
        IPUNet((700,), 20, fused=False, backend="fused")
    with pytest.raises(ValueError, match="reset"):
        IPUNet((700,), 20, width=WIDTH, reset="bogus")


def _loss_and_grads(model, x, y):
    logits = model(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    return logits.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.interpreter  # fused kernels on CPU tensors
@pytest.mark.parametrize("readout", ["mean", "count"])
@pytest.mark.parametrize("name", NAMES)
def test_fused_matches_reference(name, readout):
    # a low threshold so the tiny layers spike and every weight gets a gradient
    kw = dict(readout=readout, threshold=0.2)
    fused = tiny(name, backend="fused", **kw)
    reference = tiny(name, backend="reference", **kw)
    vanilla = tiny(name, fused=False, **kw)  # plain Linear layers, float spikes saved
    reference.load_state_dict(fused.state_dict())
    vanilla.load_state_dict(fused.state_dict())
    x, y = batch(name, seed=1)
    a, ga = _loss_and_grads(fused, x, y)
    for other in (reference, vanilla):
        b, gb = _loss_and_grads(other, x, y)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert ga.keys() == gb.keys()
        for key in ga:
            torch.testing.assert_close(ga[key], gb[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_gradient_reaches_every_parameter(name):
    model = tiny(name, threshold=0.2)
    x, y = batch(name, seed=2)
    _, grads = _loss_and_grads(model, x, y)
    assert set(grads) == {k for k, _ in model.named_parameters()} and len(grads) == 3
    for key, g in grads.items():
        assert torch.isfinite(g).all() and g.abs().sum() > 0, key


def test_init_matches_the_authors_scale():
    model = IPUNet((700,), 20)
    w = model.layers[1].weight
    bound = 0.5 * (6 / 700) ** 0.5
    assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound


def test_exports_to_nir_like_the_mlp():
    """`spikefuse export` reads model.layers and readout == "mean": the NIR graph of an
    IPU net, simulated with NIR's equations, gives the model's logits."""
    nir = pytest.importorskip("nir")
    from test_export import simulate

    from spikefuse.train.export import to_nir

    steps, dt = 8, 1e-3
    model = tiny("ipu-nmnist", threshold=0.3)
    graph = to_nir(model, NETWORKS["ipu-nmnist"].input_shape, steps, dt=dt, form="nir", readout="integrator")
    kinds = [type(n).__name__ for n in graph.nodes.values()]
    assert sorted(kinds) == sorted(["Input", "Flatten", "Linear", "LIF", "Linear", "LIF", "Linear", "I", "Output"])
    np.testing.assert_allclose(graph.nodes["lif"].tau, dt / 0.05, rtol=1e-6)
    torch.manual_seed(3)
    x = (torch.rand(steps, 2, 2, 34, 34) < 0.2).float()
    with torch.no_grad():
        logits = model(x).numpy()
    for b in range(2):
        np.testing.assert_allclose(simulate(graph, x[:, b].double().numpy(), dt), logits[b], rtol=1e-4, atol=1e-4)


def test_recurrent_variants_train_and_refuse_the_unfused_baseline():
    from spikefuse.nn import RecurrentLIF
    torch.manual_seed(0)
    model = MODELS["ipu-shd-recurrent"][0](width=0.02, backend="reference", threshold=0.3)
    recurrent = [m for m in model.modules() if isinstance(m, RecurrentLIF)]
    assert len(recurrent) == 2 and all(m.weight.shape == (29, 29) for m in recurrent)
    bound = 0.5 * math.sqrt(6 / 29)
    assert all(0.5 * bound < m.weight.abs().max() <= bound for m in recurrent), "the authors' init"
    x = (torch.rand(12, 3, 700) < 0.05).float()
    model(x).logsumexp(-1).sum().backward()
    assert all(m.weight.grad.abs().sum() > 0 for m in recurrent)
    with pytest.raises(ValueError, match="recurrent=True needs fused=True"):
        IPUNet((700,), 20, width=0.02, fused=False, recurrent=True)
