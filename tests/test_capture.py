"""The captured training step on the CPU: its fallback (one warning naming the cause, then
plain eager training), its bookkeeping (warm-up per shape, one graph per shape, the shape
limit) with the CUDA parts stubbed, and its argument checks. The graphs themselves are
tested on a GPU: tests/test_capture_gpu.py."""
import warnings

import pytest
import torch

from spikefuse.data import load
from spikefuse.models import build_model
from spikefuse import capture
from spikefuse.capture import CaptureFallback, CapturedStep, prepare_optimizer
from spikefuse.train.loop import Trainer


def fallback_warnings(record):
    return [w for w in record if issubclass(w.category, CaptureFallback)]


def test_cpu_inputs_fall_back_with_one_warning_and_compute_the_same():
    calls = []

    def step(x):
        calls.append(1)
        return x * 2

    captured = CapturedStep(step)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        outs = [captured(torch.full((2,), float(i))) for i in range(5)]
    messages = [str(w.message) for w in fallback_warnings(record)]
    assert len(messages) == 1 and "CUDA tensors" in messages[0] and "cpu" in messages[0]
    assert captured.fallback_reason is not None and captured.captured == 0
    assert len(calls) == 5 and all(torch.equal(o, torch.full((2,), 2.0 * i)) for i, o in enumerate(outs))


def test_disabled_runs_eagerly_without_warning():
    captured = CapturedStep(lambda x: x + 1, enabled=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(captured(torch.zeros(3)), torch.ones(3))


@pytest.mark.parametrize("kwargs, message", [
    (dict(warmup=0), "warmup"), (dict(warmup=1.5), "warmup"), (dict(max_graphs=0), "max_graphs"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CapturedStep(lambda x: x, **kwargs)
    with pytest.raises(TypeError, match="step_fn"):
        CapturedStep(None)


class FakeGraph:
    """Stands in for a captured graph: replay runs the step on the static inputs."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.replays = fn, inputs, 0

    def replay(self):
        self.replays += 1
        self.out = self.fn(*self.inputs)


@pytest.fixture
def stubbed(monkeypatch):
    """A CapturedStep whose CUDA parts are stubbed: CPU tensors count as capturable."""
    monkeypatch.setattr(CapturedStep, "_unsupported", staticmethod(lambda inputs: None))
    monkeypatch.setattr(CapturedStep, "_warm_up", lambda self, inputs: ("warm", self.step_fn(*inputs)))

    def fake_capture(self, entry, inputs, provisional=False):
        entry.inputs = tuple(t.clone() for t in inputs)
        entry.graph = FakeGraph(self.step_fn, entry.inputs)
        entry.outputs = "static"
        entry.graph.replay()
        return entry.outputs
    monkeypatch.setattr(CapturedStep, "_capture", fake_capture)


def test_warm_up_then_one_graph_per_shape_then_replays(stubbed):
    seen = []
    step = CapturedStep(lambda x: seen.append(x.clone()), warmup=2, max_graphs=2)
    a, b = torch.zeros(4), torch.zeros(3)
    kinds = []
    for i in range(5):
        out = step(a + i)
        kinds.append(out[0] if isinstance(out, tuple) else out)
    assert kinds == ["warm", "warm", "static", "static", "static"]
    # every call ran the step once, on its own inputs (the replays read the static buffer)
    assert [int(x[0]) for x in seen] == [0, 1, 2, 3, 4]
    assert step.captured == 1
    for i in range(3):  # a second shape (the last, shorter batch): its own warm-up and graph
        step(b + 10 + i)
    assert step.captured == 2 and int(seen[-1][0]) == 12
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        step(torch.zeros(7))
        step(torch.zeros(8))
    messages = [str(w.message) for w in fallback_warnings(record)]
    assert len(messages) == 1 and "max_graphs=2" in messages[0] and "[7]" in messages[0]
    assert len(seen) == 10  # the new shapes still ran, eagerly


def test_a_failing_capture_falls_back_once_and_the_step_still_runs(monkeypatch):
    monkeypatch.setattr(CapturedStep, "_unsupported", staticmethod(lambda inputs: None))
    monkeypatch.setattr(CapturedStep, "_warm_up", lambda self, inputs: self.step_fn(*inputs))

    class Refusing:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
    monkeypatch.setattr(capture.torch.cuda, "graph", Refusing)
    monkeypatch.setattr(capture.torch.cuda, "CUDAGraph", lambda: None)
    monkeypatch.setattr(capture.torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(capture.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(capture.torch.cuda, "memory_reserved", lambda device=None: 0)
    streams = []  # torch.cuda.graph leaves its stream current where capture_end raises: set back
    monkeypatch.setattr(capture.torch.cuda, "current_stream", lambda device=None: "the caller's stream")
    monkeypatch.setattr(capture.torch.cuda, "set_stream", streams.append)
    total = torch.zeros(())

    def step(x):
        total.add_(x.sum())
    captured = CapturedStep(step, warmup=1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(4):
            captured(torch.ones(2))
    messages = [str(w.message) for w in fallback_warnings(record)]
    assert len(messages) == 1 and "capturing failed: RuntimeError: operation not permitted" in messages[0]
    assert "more detail" not in messages[0]
    assert float(total) == 8.0  # every step ran exactly once
    assert streams == ["the caller's stream"]


def test_prepare_optimizer_refuses_cpu_parameters_and_unknown_optimizers():
    p = torch.nn.Parameter(torch.zeros(2))
    assert "cpu" in prepare_optimizer(torch.optim.Adam([p]))
    assert "cpu" in prepare_optimizer(torch.optim.SGD([p], lr=0.1))


def small_run(capture_flag, precision="fp32"):
    torch.manual_seed(0)
    splits = load("digits", time_steps=4)
    model = build_model("mlp", splits.input_shape, splits.num_classes, hidden=(16,))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    trainer = Trainer(model, splits, optimizer, epochs=2, batch_size=256, capture=capture_flag,
                      precision=precision, progress=False, clip_grad_norm=1.0)
    return trainer, trainer.fit()


def test_trainer_asked_to_capture_on_cpu_warns_once_and_trains_like_eager():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer, captured = small_run(True)
    messages = [str(w.message) for w in fallback_warnings(record)]
    assert len(messages) == 1 and "CUDA device" in messages[0] and "cpu" in messages[0]
    assert not trainer.step.enabled
    _, eager = small_run(False)
    for a, b in zip(captured, eager):
        assert {k: v for k, v in a.items() if not k.endswith("_s")} == \
               {k: v for k, v in b.items() if not k.endswith("_s")}


def test_trainer_rates_and_sums_cover_every_training_sample():
    trainer, history = small_run(False)
    assert 0.0 < history[-1]["train_rate"] < 1.0 and 0.0 <= history[-1]["train_acc"] <= 1.0
    counts = trainer.monitors["train"].counts  # neuron-steps of the last epoch: T * samples * 16
    assert counts[0, 1].item() == 4 * len(trainer.splits.train) * 16
    assert not trainer.monitors["train"].handles  # fit detaches its hooks


def test_clip_grad_norm_is_checked():
    splits = load("digits", time_steps=2)
    model = build_model("mlp", splits.input_shape, splits.num_classes, hidden=(8,))
    with pytest.raises(ValueError, match="clip_grad_norm"):
        Trainer(model, splits, torch.optim.SGD(model.parameters(), lr=0.1), epochs=1, clip_grad_norm=-1.0)
