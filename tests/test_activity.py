"""The rate regulariser (spikefuse.train.activity, issue 32): its penalty is the formula on the
spikes the layers emit (the upper bound's squared excess and the L1 term), only training
forwards with gradients add to it, it lowers the hidden rates of a short training run, and bad
options are refused naming them (fit and CLI). The cheap reductions it and the spike monitor
use equal torch's."""
import pytest
import torch

import spikefuse.nn as snn
from spikefuse.cli import main
from spikefuse.data import load
from spikefuse.models import build_model
from spikefuse.train import fit
from spikefuse.train.activity import LOG_SCALE, RateRegularizer
from spikefuse.train.spikes import EXACT_IN_FLOAT32, SpikeMonitor
from helpers import one_thread  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def two_layers():
    """Two spiking layers after linear maps: [T, B, 6] -> [T, B, 4]."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), snn.LIF(threshold=0.3, backend="reference"),
                               torch.nn.Linear(5, 4), snn.LIF(threshold=0.3, backend="reference"))


def test_penalty_is_the_squared_excess_of_each_neurons_rate():
    model = two_layers()
    x = torch.randn(7, 3, 6)
    spikes = {}
    model[1].register_forward_hook(lambda m, i, out: spikes.__setitem__(1, out.detach()))
    model[3].register_forward_hook(lambda m, i, out: spikes.__setitem__(3, out.detach()))
    with RateRegularizer(model, max_rate=0.2, weight=3.0) as reg:
        model(x)
        penalty = reg.take()
    expected = 3.0 * sum(torch.relu(spikes[i].mean(dim=(0, 1)) - 0.2).square().mean() for i in (1, 3))
    assert spikes[1].sum() > 0 and spikes[3].sum() > 0  # the case tests something
    torch.testing.assert_close(penalty, expected)
    assert reg.take() == 0  # taken: the next step starts from nothing


def test_l1_term_is_the_weighted_mean_rate_and_adds_to_the_bound():
    model = two_layers()
    x = torch.randn(7, 3, 6)
    spikes = {}
    for i in (1, 3):
        model[i].register_forward_hook(lambda m, inp, out, i=i: spikes.__setitem__(i, out.detach()))
    rates = lambda: [spikes[i].mean(dim=(0, 1)) for i in (1, 3)]  # noqa: E731
    with RateRegularizer(model, max_rate=None, l1=2.5) as reg:
        model(x)
        penalty = reg.take()
    torch.testing.assert_close(penalty, 2.5 * sum(r.mean() for r in rates()))
    with RateRegularizer(model, max_rate=0.2, weight=3.0, l1=2.5) as reg:
        model(x)
        both = reg.take()
    torch.testing.assert_close(both, sum(3.0 * torch.relu(r - 0.2).square().mean() + 2.5 * r.mean() for r in rates()))


def test_l1_term_lowers_a_neuron_near_threshold_that_never_fires():
    """Under the sparse cut such a neuron carries gradient; the squared excess leaves it alone
    (its rate is 0, under any bound), the L1 term pushes its potential down."""
    lif = snn.LIF(threshold=1.0, backend="reference", surrogate="sigmoid")
    x = torch.full((5, 2, 1), 0.15, requires_grad=True)  # h stays below threshold: no spike, a nonzero slope
    grads = {}
    for name, options in (("bound", dict(max_rate=0.0)), ("l1", dict(max_rate=None, l1=1.0))):
        with RateRegularizer(lif, **options) as reg:
            assert lif(x).sum() == 0
            grads[name], = torch.autograd.grad(reg.take(), x)
    assert grads["bound"].abs().sum() == 0
    assert (grads["l1"] > 0).all()  # more input, more rate: descent lowers the potential


def reference_penalty(spikes, max_rate, weight, l1, log):
    """The formula through autograd (the twin of the penalty's own derivative)."""
    rates = spikes.float().mean(dim=(0, 1))
    penalty = l1 * rates.mean() + log * torch.log1p(rates / LOG_SCALE).mean()
    if max_rate is not None:
        penalty = penalty + weight * torch.relu(rates - max_rate).square().mean()
    return penalty


@pytest.mark.parametrize("shape", [(7, 3, 5), (4, 2, 3, 2, 2), (1, 1, 1), (5, 6)])
@pytest.mark.parametrize("options", [dict(max_rate=0.2, weight=3.0), dict(max_rate=None, l1=2.5),
                                     dict(max_rate=None, log=0.3), dict(max_rate=0.1, weight=7.0, l1=1.5, log=0.05)])
def test_each_layers_penalty_and_gradient_equal_the_formula_through_autograd(shape, options):
    torch.manual_seed(0)
    lif = snn.LIF(threshold=0.3, backend="reference")
    spikes = (torch.rand(shape) < 0.4).float()
    spikes.view(-1)[0] = 1  # a neuron over every bound here
    grads = []
    for view in (spikes.clone(), spikes.transpose(0, 1).contiguous().transpose(0, 1)):  # and not contiguous
        view.requires_grad_()
        with RateRegularizer(lif, **options) as reg:
            reg._hook(lif, (), view)
            ours = reg.take()
        theirs = reference_penalty(view, options["max_rate"], options.get("weight", 100.0),
                                   options.get("l1", 0.0), options.get("log", 0.0))
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
        g_ours, = torch.autograd.grad(ours, view)
        g_theirs, = torch.autograd.grad(theirs, view)
        torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-12)
        grads.append(g_ours)
    assert grads[0].abs().sum() > 0  # the case tests something


def test_log_term_pulls_hardest_on_the_rarely_firing_neurons():
    """Its slope falls with the rate (halved at LOG_SCALE): a silent neuron is pulled 1/LOG_SCALE
    times log's weight, one at rate 10 x LOG_SCALE eleven times less."""
    lif = snn.LIF(threshold=0.3, backend="reference")
    rates = torch.tensor([0.0, LOG_SCALE, 10 * LOG_SCALE])
    _, slope = RateRegularizer(lif, max_rate=None, log=2.0).penalty_and_slope(rates)
    torch.testing.assert_close(slope * 3, 2.0 / (rates + LOG_SCALE))


def test_monitor_counts_exactly_past_float32s_integers():
    lif = snn.LIF(threshold=0.5, backend="reference")
    x = torch.ones(2, 1, EXACT_IN_FLOAT32 // 2 + 3)  # every neuron fires: 2^24 + 6 spikes
    with SpikeMonitor(lif) as monitor:
        lif(x)
    assert monitor.counts[0].tolist() == [EXACT_IN_FLOAT32 + 6] * 2


def test_penalty_reaches_the_inputs_through_the_surrogate():
    model = two_layers()
    x = torch.randn(7, 3, 6, requires_grad=True)
    with RateRegularizer(model, max_rate=0.0) as reg:
        model(x)
        reg.take().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_evaluation_and_no_grad_forwards_add_nothing():
    model = two_layers()
    x = torch.randn(7, 3, 6) + 1.0
    with RateRegularizer(model, max_rate=0.0) as reg:
        model.eval()
        model(x)
        assert reg.take() == 0
        model.train()
        with torch.no_grad():
            model(x)
        assert reg.take() == 0
        model(x)
        assert reg.take() > 0
    model(x)  # detached: no hooks left
    assert reg.terms == []


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_rate=1.0), "max_rate: expected a firing rate in \\[0, 1\\)"),
    (dict(max_rate=-0.1), "max_rate"),
    (dict(max_rate=float("nan")), "max_rate"),
    (dict(max_rate=True), "max_rate"),
    (dict(max_rate=0.05, rate_weight=0.0), "rate_weight: expected a finite number > 0"),
    (dict(max_rate=0.05, rate_weight=float("inf")), "rate_weight"),
    (dict(rate_l1=-1.0), "rate_l1: expected a finite number >= 0"),
    (dict(max_rate=0.05, rate_l1=float("nan")), "rate_l1"),
    (dict(max_rate=0.05, rate_l1=1e300), "rate_l1: .*at most 3.4e\\+38, float32's range"),  # inf in the penalty
    (dict(rate_log=-0.1), "rate_log: expected a finite number >= 0"),
    (dict(max_rate=0.05, rate_log=1e37), "rate_log: .*at most 1.7e\\+36"),  # its slope on a silent neuron: inf
    (dict(max_rate=0.05, rate_weight=1e39), "rate_weight: .*at most float32's"),
])
def test_bad_options_are_refused_naming_them(kwargs, message):
    splits = load("digits")
    model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps)
    with pytest.raises(ValueError, match=message):
        fit(model, splits, torch.optim.Adam(model.parameters()), epochs=1, progress=False, **kwargs)


def test_a_model_without_spiking_layers_is_refused():
    with pytest.raises(ValueError, match="^model: it has no spiking layers"):
        RateRegularizer(torch.nn.Linear(3, 2), max_rate=0.1)


@pytest.mark.parametrize("option, value, message", [
    ("--max-rate", "1.5", "max-rate: expected a firing rate in [0, 1)"),
    ("--rate-weight", "0", "rate-weight: expected a finite number > 0"),
    ("--rate-l1", "-1", "rate-l1: expected a finite number >= 0"),
    ("--rate-log", "1e37", "rate-log: expected a finite number >= 0 (at most 1.7e+36, float32's range), got 1e+37"),
    ("--rate-weight", "1e300", "rate-weight: expected a finite number > 0 (at most float32's 3.4e+38), got 1e+300"),
])
def test_cli_refuses_bad_rate_options_in_one_line(option, value, message, tmp_path, capsys):
    assert main(["train", option, value, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def test_training_with_a_bound_keeps_hidden_rates_low():
    """The CLI's default network on digits, 2 epochs, the same seed with and without a 3% bound:
    the bounded run's hidden rates end lower, near the bound, and it still learns."""
    splits = load("digits")
    runs = {}
    for max_rate in (None, 0.03):
        torch.manual_seed(0)
        model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps)
        runs[max_rate] = fit(model, splits, torch.optim.Adam(model.parameters(), lr=2e-3), epochs=2,
                             batch_size=64, progress=False, max_rate=max_rate)[-1]
    free, bounded = runs[None], runs[0.03]
    assert bounded["train_rate"] < 0.6 * free["train_rate"], (free["train_firing_rates"], bounded["train_firing_rates"])
    assert max(bounded["train_firing_rates"].values()) < 0.06, bounded["train_firing_rates"]
    assert bounded["rate_penalty"] > 0 and "rate_penalty" not in free
    assert bounded["test_acc"] > 0.6


@pytest.mark.gpu
def test_the_penalty_is_inside_the_captured_step():
    """On CUDA the step is one CUDA graph: the penalty's terms are recorded at capture and
    recomputed at each replay (the epoch mean of a replayed penalty is not the capture's)."""
    splits = load("shd-synthetic", device="cuda")
    torch.manual_seed(0)
    model = build_model("ipu-shd", splits.input_shape, splits.num_classes, splits.time_steps, width=0.25)
    history = fit(model, splits, torch.optim.Adam(model.parameters(), lr=2e-3, capturable=True), epochs=2,
                  batch_size=64, device="cuda", progress=False, max_rate=0.02)
    assert all(r["rate_penalty"] > 0 for r in history)
    assert history[-1]["rate_penalty"] < history[0]["rate_penalty"]
    assert max(history[-1]["train_firing_rates"].values()) < 0.08, history[-1]["train_firing_rates"]


@pytest.mark.parametrize("given, expected", [
    ({}, (0.05, 0.0, 0.05)),                              # the measured default
    ({"max_rate": 0.1}, (0.1, 0.0, 0.0)),                 # any option given: only what was given
    ({"rate_log": 0.2}, (None, 0.0, 0.2)),
    ({"rate_l1": 0.0}, (None, 0.0, 0.0)),                 # --rate-l1 0 alone: no regulariser
])
def test_sparse_training_takes_the_measured_regulariser_unless_one_is_given(given, expected):
    from spikefuse.train.config import SPARSE_REGULARISER, make
    cfg = make({"model": "ipu-shd", "sparse": True}, given)
    assert (cfg.max_rate, cfg.rate_l1, cfg.rate_log) == expected
    dense = make({"model": "ipu-shd"})
    assert (dense.max_rate, dense.rate_l1, dense.rate_log) == (None, 0.0, 0.0)  # dense: off
    assert SPARSE_REGULARISER == {"max_rate": 0.05, "rate_log": 0.05}
