"""Spike encoders: shapes, 0/1 values, statistics and hand-computed cases."""
import math
import re

import pytest
import torch

from spikefuse import encode


def test_rate_shape_dtype_and_binary_values():
    x = torch.rand(3, 2, 5)
    s = encode.rate(x, 7, generator=torch.Generator().manual_seed(0))
    assert s.shape == (7, 3, 2, 5) and s.dtype == torch.float32
    assert set(s.unique().tolist()) <= {0.0, 1.0}
    assert encode.rate(x.double(), 2).dtype == torch.float64
    assert encode.rate(torch.ones(4, dtype=torch.uint8), 3).dtype == torch.float32


def test_rate_is_reproducible_with_a_generator():
    x = torch.rand(4, 6)
    a = encode.rate(x, 10, generator=torch.Generator().manual_seed(3))
    b = encode.rate(x, 10, generator=torch.Generator().manual_seed(3))
    c = encode.rate(x, 10, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_rate_fires_at_gain_times_x_on_average():
    x = torch.tensor([[0.0, 0.1, 0.25, 0.5, 0.9, 1.0]])
    s = encode.rate(x, 20000, generator=torch.Generator().manual_seed(0))
    # 4 standard deviations of a Bernoulli mean over 20000 draws is at most 0.0142
    torch.testing.assert_close(s.mean(0), x, atol=0.015, rtol=0)
    assert s[:, 0, 0].sum() == 0 and s[:, 0, -1].sum() == 20000  # p = 0 and p = 1 are exact
    doubled = encode.rate(x, 20000, gain=2.0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(doubled.mean(0), (2 * x).clamp(max=1), atol=0.015, rtol=0)


def test_latency_fires_once_brighter_first_and_never_below_threshold():
    x = torch.tensor([[0.0, 0.005, 0.01, 0.02, 0.3, 0.6, 1.0]])
    for linear in (False, True):
        s = encode.latency(x, 50, linear=linear, tau=5.0)
        assert s.shape == (50, 1, 7) and set(s.unique().tolist()) <= {0.0, 1.0}
        assert s[:, 0, :3].sum() == 0  # x <= threshold never fires
        assert s[:, 0, 3:].sum(0).tolist() == [1.0] * 4
        times = s[:, 0, 3:].argmax(0)
        assert times.tolist() == sorted(times.tolist(), reverse=True) and times[0] > times[-1]


def test_latency_linear_matches_the_formula():
    # normalized: t = (1 - x) * (T - 1), rounded
    x = torch.tensor([1.0, 0.7, 0.5, 0.22, 0.02])
    s = encode.latency(x, 11, linear=True)
    assert s.argmax(0).tolist() == [round((1 - v) * 10) for v in x.tolist()] == [0, 3, 5, 8, 10]
    # snnTorch's documented example: times [3.92, 2.0, 0.0] for [0.02, 0.5, 1] at T = 5
    assert encode.latency(torch.tensor([0.02, 0.5, 1.0]), 5, linear=True).argmax(0).tolist() == [4, 2, 0]


def test_latency_rc_matches_the_formula_and_drops_late_spikes():
    # not normalized: t = tau * ln(x / (x - threshold)) steps, rounded; past T - 1 never fires
    x = torch.tensor([0.9, 0.5, 0.3, 0.21])
    tau, thr, T = 4.0, 0.2, 6
    s = encode.latency(x, T, tau=tau, threshold=thr, normalize=False)
    times = [round(tau * math.log(v / (v - thr))) for v in x.tolist()]
    assert times == [1, 2, 4, 12]
    assert s.sum(0).tolist() == [1, 1, 1, 0]
    assert s[:, :3].argmax(0).tolist() == times[:3]


def test_delta_on_a_known_sequence():
    x = torch.tensor([0.5, 0.5, 0.7, 0.65, 0.3, 0.3, 0.45]).view(7, 1)
    on = encode.delta(x, threshold=0.1)
    assert on.shape == (7, 1)
    assert on[:, 0].tolist() == [1, 0, 1, 0, 0, 0, 1]  # the first step rises from 0
    both = encode.delta(x, threshold=0.1, off_spikes=True)
    assert both.shape == (7, 1, 2)
    assert torch.equal(both[:, :, 0], on)
    assert both[:, 0, 1].tolist() == [0, 0, 0, 0, 1, 0, 0]  # only 0.65 -> 0.3 falls by >= 0.1
    # snnTorch's documented example, whose signed output is [1, 1, -1, 1, 0]
    b = encode.delta(torch.tensor([1, 2, 0, 2, 2.9]).view(5, 1), threshold=1, off_spikes=True)
    assert (b[:, 0, 0] - b[:, 0, 1]).tolist() == [1, 1, -1, 1, 0]


def test_delta_off_spikes_add_a_polarity_axis_after_the_batch():
    x = torch.rand(4, 3, 5, 6, dtype=torch.float64)
    s = encode.delta(x, threshold=0.2, off_spikes=True)
    assert s.shape == (4, 3, 2, 5, 6) and s.dtype == torch.float64
    change = torch.diff(x, dim=0, prepend=torch.zeros_like(x[:1]))
    assert torch.equal(s[:, :, 0].bool(), change >= 0.2) and torch.equal(s[:, :, 1].bool(), change <= -0.2)


@pytest.mark.parametrize("call, error, words", [
    (lambda: encode.rate([0.5], 3), TypeError, "x: expected a torch.Tensor"),
    (lambda: encode.rate(torch.rand(2), 0), ValueError, "time_steps: expected a positive int"),
    (lambda: encode.rate(torch.rand(2), 2.0), ValueError, "time_steps"),
    (lambda: encode.rate(torch.rand(2), 2, gain=-1.0), ValueError, "gain: expected a finite number >= 0"),
    (lambda: encode.rate(torch.rand(2), 2, generator=0), TypeError, "generator"),
    (lambda: encode.rate(torch.tensor([float("nan")]), 2), ValueError, "x: contains NaN"),
    (lambda: encode.latency(torch.rand(2), 5, tau=0.0), ValueError, "tau: expected a finite number > 0"),
    (lambda: encode.latency(torch.rand(2), 5, threshold=1.0), ValueError, "threshold: expected a number in (0, 1)"),
    (lambda: encode.latency(torch.rand(2), 5, threshold="low"), TypeError, "threshold: expected a real number"),
    (lambda: encode.delta(torch.rand(5)), ValueError, "x: expected time-major [T, B, ...]"),
    (lambda: encode.delta(torch.rand(0, 2)), ValueError, "T == 0"),
    (lambda: encode.delta(torch.rand(3, 2), threshold=0), ValueError, "threshold: expected a finite number > 0"),
])
def test_bad_arguments_name_the_argument(call, error, words):
    with pytest.raises(error, match=re.escape(words)):
        call()
