"""Bad input raises a clear error naming the argument."""
import pytest
import torch

import spikefuse.functional as F
from spikefuse import nn


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("call,error,match", [
    (lambda b: F.lif(torch.tensor(1.0), backend=b), ValueError, "time dimension"),
    (lambda b: F.lif(torch.zeros(0, 3), backend=b), ValueError, "T == 0"),
    (lambda b: F.lif(torch.zeros(2, 3, dtype=torch.int32), backend=b), TypeError, "floating"),
    (lambda b: F.lif([[1.0]], backend=b), TypeError, "x must be"),
    (lambda b: F.lif(torch.zeros(2, 3), decay=1.5, backend=b), ValueError, "decay"),
    (lambda b: F.lif(torch.zeros(2, 3), decay=-0.1, backend=b), ValueError, "decay"),
    (lambda b: F.plif(torch.zeros(2, 3, 4), torch.tensor([0.5, 0.2]), backend=b), ValueError, "decay"),
    (lambda b: F.plif(torch.zeros(2, 3, 4), torch.tensor([0.5, 2.0, 0.1, 0.1]), backend=b), ValueError, "decay"),
    (lambda b: F.lif(torch.zeros(2, 3), surrogate="gauss", backend=b), ValueError, "surrogate"),
    (lambda b: F.lif(torch.zeros(2, 3), reset="zero", backend=b), ValueError, "reset"),
    (lambda b: F.lif(torch.zeros(2, 3), v0=torch.zeros(4), backend=b), ValueError, "v0"),
    (lambda b: F.lif(torch.zeros(2, 3), v0=torch.zeros(3, device="meta"), backend=b), ValueError, "v0"),
    (lambda b: F.lif(torch.zeros(2, 3), threshold=float("nan"), backend=b), TypeError, "threshold"),
    (lambda b: F.lif(torch.zeros(2, 3), alpha=-1.0, backend=b), ValueError, "alpha"),
    (lambda b: F.lif(torch.zeros(2, 3), backend="cuda"), ValueError, "backend"),
])
def test_functional_rejects(backend, call, error, match):
    with pytest.raises(error, match=match):
        call(backend)


def test_fused_float64_is_refused_with_a_hint():
    with pytest.raises(TypeError, match="reference"):
        F.lif(torch.zeros(2, 3, dtype=torch.float64), backend="fused")


@pytest.mark.parametrize("make,match", [
    (lambda: nn.LIF(reset="zero"), "reset"),
    (lambda: nn.LIF(surrogate="gauss"), "surrogate"),
    (lambda: nn.LIF(decay=2.0), "decay"),
    (lambda: nn.PLIF(init_decay=1.0), "init_decay"),
])
def test_modules_reject_bad_options_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_module_needs_time_and_batch():
    with pytest.raises(ValueError, match=r"\[T, B"):
        nn.LIF()(torch.zeros(5))


# ---- issue 14: the kernels never give a silent wrong answer ----

@pytest.mark.interpreter  # fused kernels on CPU tensors
def test_double_backward_is_not_silently_zero():
    """grad(create_graph=True) then a second grad through the fused LIF gave 0; now the reference's."""
    results = []
    for backend in ("fused", "reference"):
        x = torch.tensor([[0.6], [0.7], [0.2]], requires_grad=True)
        (gx,) = torch.autograd.grad(F.lif(x, decay=0.9, surrogate="atan", backend=backend).sum(), x,
                                    create_graph=True)
        results.append(torch.autograd.grad(gx.pow(2).sum(), x)[0])
    assert results[1].abs().sum() > 0
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=0)


@pytest.mark.interpreter  # fused kernels on CPU tensors
@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_nan_input_or_decay_gives_nan_spikes_not_zeros(backend):
    nan = float("nan")
    x = torch.tensor([[0.5, nan, 2.0], [0.7, 2.0, 2.0]]).unsqueeze(1)  # [T=2, 1, 3]
    s, v = F.lif(x, decay=0.5, return_state=True, backend=backend)
    assert s[:, 0, 1].isnan().all() and v[0, 1].isnan()  # NaN at t=0 stays in v: NaN at t=1 too
    assert s[:, 0, 2].tolist() == [1.0, 1.0] and not s[:, 0, 0].isnan().any()
    s = F.plif(x.nan_to_num(0.3), torch.tensor([0.5, nan, 0.5]), backend=backend)
    assert s[:, 0, 1].isnan().all() and not s[:, 0, [0, 2]].isnan().any()


@pytest.mark.interpreter  # fused kernels on CPU tensors
@pytest.mark.parametrize("reset,v_after", [("hard", -0.25), ("soft", float("inf")), ("none", float("inf"))])
def test_infinite_input_is_the_same_on_both_backends(reset, v_after):
    """+inf fires; the hard reset gives v_reset (the reference used to give inf * 0 = NaN)."""
    x = torch.tensor([[float("inf"), -float("inf")]]).unsqueeze(1)
    for backend in ("fused", "reference"):
        s, v = F.lif(x, reset=reset, v_reset=-0.25, return_state=True, backend=backend)
        assert s.flatten().tolist() == [1.0, 0.0]
        assert v.flatten().tolist() == [v_after, -float("inf")]


@pytest.mark.interpreter  # fused kernels on CPU tensors
@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("training", [True, False])
def test_bn_lif_batch_zero_gives_empty_spikes(backend, training):
    """Batch 0 (a ZeroDivisionError in the fused op): empty spikes, running statistics unchanged, as torch."""
    layer = nn.BNLIF(3, backend=backend).train(training)
    layer.running_mean.fill_(0.5)
    x = torch.zeros(4, 0, 3, 2, 2, requires_grad=True)
    s = layer(x)
    assert s.shape == (4, 0, 3, 2, 2)
    s.sum().backward()
    assert x.grad.shape == x.shape
    assert layer.running_mean.tolist() == [0.5] * 3 and layer.running_var.tolist() == [1.0] * 3


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_bn_lif_one_value_per_channel_in_training(backend):
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.BNLIF(3, backend=backend)(torch.zeros(1, 1, 3))


@pytest.mark.interpreter  # fused kernels on CPU tensors
def test_empty_per_channel_plif():
    x = torch.zeros(3, 0, 4, requires_grad=True)
    decay = torch.full((4,), 0.5, requires_grad=True)
    F.plif(x, decay, backend="fused").sum().backward()  # reshaping the empty decay gradient failed
    assert decay.grad.tolist() == [0.0] * 4


@pytest.mark.interpreter  # fused kernels on CPU tensors
def test_fused_kernels_refuse_steps_past_32_bit_offsets():
    """Offsets within one time step are 32-bit: more neurons per step are refused by name
    (nothing is allocated: the BN+LIF input is a stride-0 view)."""
    from spikefuse.ops.kernel_base import launch_config
    with pytest.raises(ValueError, match="neurons per time step.*backend='reference'"):
        launch_config(2**31, torch.float32)
    with pytest.raises(ValueError, match="neurons per time step.*backend='reference'"):
        nn.BNLIF(1, backend="fused")(torch.zeros(1, 1, 1).expand(1, 2**31, 1))


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("option,value", [("threshold", float("inf")), ("v_reset", float("nan"))])
def test_bn_lif_refuses_non_finite_options_at_construction_like_functional(backend, option, value):
    """BNLIF builds its NeuronOptions at construction: the functional's check and message."""
    with pytest.raises(TypeError, match=f"^{option} must be a finite Python number") as functional:
        F.lif(torch.zeros(2, 3), backend=backend, **{option: value})
    with pytest.raises(TypeError, match=f"^{option} must be a finite Python number") as module:
        nn.BNLIF(3, backend=backend, **{option: value})
    assert str(module.value) == str(functional.value)
