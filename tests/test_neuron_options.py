"""spikefuse.NeuronOptions: the options every neuron shares, checked once at construction
(issue 33): frozen, each refusal names its field, equal options compare equal, and one
options object gives the same spikes on the reference and the fused kernels (on CPU tensors
through Triton's interpreter: a tiny odd shape)."""
import dataclasses

import pytest
import torch

import spikefuse.functional as F
from spikefuse import NeuronOptions
from helpers import DEVICE

nan, inf = float("nan"), float("inf")


def test_frozen():
    options = NeuronOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.threshold = 2.0


@pytest.mark.parametrize("field,value,error", [
    ("threshold", inf, TypeError), ("threshold", nan, ValueError), ("threshold", "1", TypeError),
    ("threshold", True, TypeError), ("threshold", torch.tensor(1.0), TypeError),
    ("reset", "zero", ValueError),
    ("v_reset", nan, TypeError), ("v_reset", -inf, ValueError),
    ("surrogate", "gauss", ValueError), ("surrogate", 3, ValueError),
    ("alpha", -1.0, ValueError), ("alpha", inf, ValueError),
    ("grad_threshold", inf, ValueError), ("grad_threshold", nan, ValueError), ("grad_threshold", "0.5", ValueError),
    ("grad_scope", "epoch", ValueError),
])
def test_each_refusal_names_its_field(field, value, error):
    with pytest.raises(error, match=field):
        NeuronOptions(**{field: value})


def test_a_name_only_neuron_refuses_a_callable_surrogate():
    assert NeuronOptions(surrogate=torch.sigmoid).resolved_alpha is None  # LIF runs it unfused
    with pytest.raises(TypeError, match="surrogate must be a string"):
        NeuronOptions(surrogate=torch.sigmoid, callable_surrogate=False)


def test_values_are_normalised_and_resolved():
    options = NeuronOptions(threshold=2, v_reset=-1, detach_reset=1, surrogate="superspike")
    assert options.threshold == 2.0 and isinstance(options.threshold, float) and options.detach_reset is True
    assert options.surrogate == "superspike" and options.alpha is None  # as given
    assert options.common() == (2.0, "hard", -1.0, True, "fast_sigmoid", 10.0)  # what the backends run


def test_equal_options_compare_equal():
    a = NeuronOptions(threshold=0.5, reset="soft", surrogate="atan", alpha=3.0, grad_threshold=0.2)
    b = NeuronOptions(threshold=0.5, reset="soft", surrogate="atan", alpha=3.0, grad_threshold=0.2)
    assert a == b and hash(a) == hash(b)
    assert a != dataclasses.replace(b, reset="hard")


def test_one_options_object_same_spikes_on_reference_and_fused():
    options = NeuronOptions(threshold=0.7, reset="soft", v_reset=0.0, surrogate="sigmoid", alpha=3.0)
    x = (torch.randn(5, 3, 7, generator=torch.Generator().manual_seed(0)) + 0.3).to(DEVICE)
    spikes = [F.lif(x, decay=0.6, backend=backend, **options.keywords()) for backend in ("reference", "fused")]
    assert 0 < spikes[0].mean() < 1 and torch.equal(*spikes)
