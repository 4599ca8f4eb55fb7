"""SNN losses: hand-computed values, torch's reduction convention, both input forms,
gradients, bad arguments, and the Trainer's loss_fn contract."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

from spikefuse import loss
from spikefuse.models import build_model
from spikefuse.train import checkpoint
from spikefuse.train.loop import Trainer
from test_train_data import make_splits

LOSSES = (loss.rate_cross_entropy, loss.count_mse, loss.membrane_cross_entropy)


def spikes_and_target(T=6, B=5, C=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(T, B, C, generator=g) < 0.4).float(), torch.randint(C, (B,), generator=g)


def test_hand_computed_values():
    # one sample, T = 5, counts [2, 0] for class 0 and 1, target class 0
    s = torch.tensor([[1, 0], [1, 0], [0, 0], [0, 0], [0, 0]], dtype=torch.float32)[:, None]
    y = torch.tensor([0])
    assert loss.rate_cross_entropy(s, y).item() == pytest.approx(math.log(1 + math.exp(-2)))
    # targets 0.8 * 5 = 4 and 0.2 * 5 = 1: ((2 - 4)**2 + (0 - 1)**2) / 2
    assert loss.count_mse(s, y).item() == pytest.approx(2.5)
    # steps with [1, 0] cost log(1 + e^-1), steps with [0, 0] cost log 2
    expected = (2 * math.log(1 + math.exp(-1)) + 3 * math.log(2)) / 5
    assert loss.membrane_cross_entropy(s, y).item() == pytest.approx(expected)


def test_values_match_torch_ops():
    s, y = spikes_and_target()
    counts = s.sum(0)
    rows = torch.arange(len(y))
    torch.testing.assert_close(loss.rate_cross_entropy(s, y, reduction="none"),
                               -counts.log_softmax(1)[rows, y])
    wanted = torch.full_like(counts, 0.1 * 6)
    wanted[rows, y] = 0.9 * 6
    torch.testing.assert_close(loss.count_mse(s, y, correct_rate=0.9, incorrect_rate=0.1, reduction="none"),
                               ((counts - wanted) ** 2).mean(1))
    mem = torch.randn(6, 5, 4)
    per_step = torch.stack([F.cross_entropy(m, y, reduction="none") for m in mem])
    torch.testing.assert_close(loss.membrane_cross_entropy(mem, y, reduction="none"), per_step.mean(0))


@pytest.mark.parametrize("fn", LOSSES)
def test_reductions_follow_torch(fn):
    s, y = spikes_and_target(B=5)
    none = fn(s, y, reduction="none")
    assert none.shape == (5,)
    torch.testing.assert_close(fn(s, y, reduction="sum"), fn(s, y) * 5)
    torch.testing.assert_close(fn(s, y), none.mean())
    assert fn(s, y).shape == ()


def test_time_reduced_input():
    s, y = spikes_and_target(T=6)
    # [B, C] is used as given: counts give the same cross-entropy as [T, B, C]
    torch.testing.assert_close(loss.rate_cross_entropy(s.sum(0), y), loss.rate_cross_entropy(s, y))
    # [B, C] rates against target rates: the count loss divided by T**2
    torch.testing.assert_close(loss.count_mse(s.mean(0), y), loss.count_mse(s, y) / 36)
    mem = torch.randn(5, 4)
    torch.testing.assert_close(loss.membrane_cross_entropy(mem, y), F.cross_entropy(mem, y))
    torch.testing.assert_close(loss.membrane_cross_entropy(mem[None], y), F.cross_entropy(mem, y))


@pytest.mark.parametrize("fn", LOSSES)
def test_gradients_flow(fn):
    s, y = spikes_and_target()
    out = torch.randn(s.shape).requires_grad_()
    fn(out, y).backward()
    assert out.grad.shape == out.shape and out.grad.abs().sum() > 0
    # gradients of the [B, C] form too, and an int32 target works as int64
    out2 = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    fn(out2, y.int()).backward()
    assert out2.grad.abs().sum() > 0


@pytest.mark.parametrize("fn", LOSSES)
@pytest.mark.parametrize("output, target, error, words", [
    (torch.zeros(3, 2, 4, dtype=torch.long), torch.zeros(2, dtype=torch.long), TypeError,
     "expected a floating-point tensor"),
    (torch.zeros(4), torch.zeros(4, dtype=torch.long), ValueError, "expected [T, B, C] (T >= 1) or [B, C]"),
    (torch.zeros(0, 2, 4), torch.zeros(2, dtype=torch.long), ValueError, "expected [T, B, C]"),
    (torch.zeros(3, 2, 4), torch.zeros(2), TypeError, "target: expected an integer tensor"),
    (torch.zeros(3, 2, 4), torch.zeros(3, dtype=torch.long), ValueError, "target: expected shape [2]"),
    (torch.zeros(3, 2, 4), torch.tensor([0, 4]), ValueError, "target: expected class indices in [0, 4)"),
    (torch.zeros(3, 2, 4), torch.tensor([-1, 0]), ValueError, "target: expected class indices"),
])
def test_bad_arguments_name_the_argument(fn, output, target, error, words):
    with pytest.raises(error, match=re.escape(words)):
        fn(output, target)


def test_bad_reduction_and_rates():
    s, y = spikes_and_target()
    for fn in LOSSES:
        with pytest.raises(ValueError, match=re.escape("reduction: expected one of ['mean', 'sum', 'none']")):
            fn(s, y, reduction="avg")
    with pytest.raises(ValueError, match="correct_rate: expected a number in"):
        loss.count_mse(s, y, correct_rate=1.5)
    with pytest.raises(ValueError, match="incorrect_rate"):
        loss.count_mse(s, y, incorrect_rate=-0.1)


@pytest.mark.parametrize("fn", [loss.rate_cross_entropy, loss.count_mse])
def test_trainer_accepts_the_losses(fn):
    """The Trainer passes the model's [B, C] output (spikefuse models return the mean over
    time) to loss_fn(out, y) in training and loss_fn(out, y, reduction="sum") in evaluation."""
    checkpoint.seed_everything(0)
    splits = make_splits()
    model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps, hidden=(32,))
    trainer = Trainer(model, splits, torch.optim.Adam(model.parameters(), lr=1e-2), epochs=2,
                      batch_size=32, loss_fn=fn, progress=False)
    history = trainer.fit()
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    x, y = next(splits.test.batches(len(splits.test), shuffle=False))
    with torch.no_grad():
        model.eval()
        expected = fn(model(x), y).item()
    assert history[-1]["test_loss"] == pytest.approx(expected, rel=1e-5)
