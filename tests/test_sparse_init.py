"""IPUNet.fluctuation_init_: the data-dependent fluctuation-driven init that puts a sparse
(grad_threshold) network near threshold, so that gradient flows from the first step."""
import math

import pytest
import torch

from spikefuse.models.ipu import FLUCTUATION_SIGMA_U, IPUNet
from spikefuse.nn import LIF

T, B, N_IN, CLASSES = 20, 8, 100, 10
WIDTH = 1 / 16  # hidden 92-92


def randman_like(seed=0, batch=B):
    """Each input channel fires once at a random step: randman's input statistics (rate 1/T)."""
    g = torch.Generator().manual_seed(seed)
    times = torch.randint(0, T, (1, batch, N_IN), generator=g)
    x = torch.zeros(T, batch, N_IN).scatter_(0, times, 1.0)
    return x, torch.randint(0, CLASSES, (batch,), generator=g)


def free_potential_stds(model, x):
    """Per LIF-fed Linear: the std of u[t] = decay u[t-1] + I[t] (no reset) over the batch."""
    out, h = [], x.flatten(2)
    layers = list(model.layers)[1:]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            if isinstance(layer, torch.nn.Linear) and i + 1 < len(layers) and isinstance(layers[i + 1], LIF):
                current, u, us = layer(h), 0.0, []
                for t in range(current.shape[0]):
                    u = layers[i + 1].decay * u + current[t]
                    us.append(u)
                out.append(float(torch.stack(us).std(unbiased=False)))
            h = layer(h)
    return out


def near_threshold_share(model, x, floor=0.9):
    """Share of (t, b, neuron) whose potential h reached `floor`, per hidden LIF."""
    shares, h = [], x.flatten(2)
    with torch.no_grad():
        for layer in list(model.layers)[1:]:
            if isinstance(layer, LIF):
                v, hs = torch.zeros_like(h[0]), []
                for t in range(h.shape[0]):
                    pot = layer.decay * v + h[t]
                    hs.append(pot)
                    v = pot * (pot < layer.threshold)
                shares.append(float((torch.stack(hs) >= floor).float().mean()))
            h = layer(h)
    return shares


@pytest.mark.parametrize("readout", ["mean", "count"])
@pytest.mark.parametrize("sparse", [False, True])
def test_free_potential_hits_the_target(readout, sparse):
    torch.manual_seed(0)
    model = IPUNet((N_IN,), CLASSES, width=WIDTH, readout=readout, sparse=sparse)
    readout_before = model.layers[-1 if readout == "mean" else -2].weight.clone()
    x, _ = randman_like()
    scales = model.fluctuation_init_(x, sigma_u=0.4)
    n_lif_fed = 3 if readout == "count" else 2
    assert len(scales) == n_lif_fed and all(s > 0 and math.isfinite(s) for s in scales)
    for std in free_potential_stds(model, x):
        assert std == pytest.approx(0.4, rel=1e-4)
    if readout == "mean":  # the time-mean readout feeds no LIF: untouched
        assert torch.equal(model.layers[-1].weight, readout_before)


def test_same_batch_same_weights_dense_or_sparse():
    x, _ = randman_like()
    models = []
    for sparse in (False, True):
        torch.manual_seed(3)
        models.append(IPUNet((N_IN,), CLASSES, width=WIDTH, sparse=sparse))
        models[-1].fluctuation_init_(x)
    for a, b in zip(*(m.state_dict().values() for m in models)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


def test_default_sigma_and_scale_only():
    """Only the scale changes (the drawn weights keep their shape); the default target."""
    torch.manual_seed(1)
    model = IPUNet((N_IN,), CLASSES, width=WIDTH)
    before = [m.weight.clone() for m in model.layers if isinstance(m, torch.nn.Linear)]
    x, _ = randman_like(1)
    scales = model.fluctuation_init_(x)
    after = [m.weight for m in model.layers if isinstance(m, torch.nn.Linear)]
    for w0, w1, s in zip(before, after, scales):
        torch.testing.assert_close(w1, w0 * s)
    for std in free_potential_stds(model, x):
        assert std == pytest.approx(FLUCTUATION_SIGMA_U, rel=1e-4)


def test_sparse_network_gets_gradient_after_init():
    """Randman-like input: the study's init leaves the second hidden layer far below 0.9, so
    under grad_threshold = 0.9 no gradient reaches the weights; after the init some
    potentials reach it in every layer and every weight gets gradient."""
    x, y = randman_like(2, batch=32)
    torch.manual_seed(0)
    model = IPUNet((N_IN,), CLASSES, width=WIDTH, sparse=True)
    assert near_threshold_share(model, x)[-1] == 0.0  # silent under the study's init
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert all(m.weight.grad is None or not m.weight.grad.any() for m in model.layers[:-1]
               if isinstance(m, torch.nn.Linear))
    model.zero_grad(set_to_none=True)
    model.fluctuation_init_(x)
    shares = near_threshold_share(model, x)
    assert all(0.001 < s < 0.1 for s in shares), shares  # near threshold, still sparse
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for m in model.layers:
        if isinstance(m, torch.nn.Linear):
            assert m.weight.grad is not None and m.weight.grad.any()


def test_bad_arguments():
    model = IPUNet((N_IN,), CLASSES, width=WIDTH)
    x, _ = randman_like()
    for bad in (0, -1.0, float("nan"), float("inf"), "0.5", True):
        with pytest.raises(ValueError, match="sigma_u"):
            model.fluctuation_init_(x, sigma_u=bad)
    with pytest.raises(ValueError, match="silent"):
        model.fluctuation_init_(torch.zeros(T, B, N_IN))
    with pytest.raises(ValueError):
        model.fluctuation_init_(torch.zeros(T, B, N_IN + 1))  # wrong input shape


def test_recurrent_network_is_scaled_by_its_feed_forward_input():
    """The recurrent IPUNet (RecurrentLIF layers): each feed-forward Linear is rescaled to the
    target (its free potential without the recurrent input), the recurrent weights are
    kept, and the sparse recurrent network then gets gradient in every layer (before this,
    the init skipped recurrent layers and the sparse run of bench sparse --train stayed silent)."""
    x, y = randman_like(2, batch=32)
    torch.manual_seed(0)
    model = IPUNet((N_IN,), CLASSES, width=WIDTH, sparse=True, recurrent=True)
    recurrent_before = [m.weight.clone() for m in model.layers if type(m).__name__ == "RecurrentLIF"]
    scales = model.fluctuation_init_(x)
    assert len(scales) == 2 and all(s > 0 for s in scales)
    assert all(torch.equal(m.weight, w) for m, w in
               zip([m for m in model.layers if type(m).__name__ == "RecurrentLIF"], recurrent_before))
    h = x.flatten(2)
    layers = list(model.layers)[1:]
    with torch.no_grad():
        for i, layer in enumerate(layers[:-1]):
            if isinstance(layer, torch.nn.Linear) and type(layers[i + 1]).__name__ == "RecurrentLIF":
                current = layer(h)
                u, us = torch.zeros_like(current[0]), []
                for t in range(current.shape[0]):
                    u = layers[i + 1].decay * u + current[t]
                    us.append(u)
                assert float(torch.stack(us).std(unbiased=False)) == pytest.approx(FLUCTUATION_SIGMA_U, rel=1e-4)
            h = layer(h)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for m in model.layers:
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "RecurrentLIF":
            assert m.weight.grad is not None and m.weight.grad.any(), type(m).__name__
