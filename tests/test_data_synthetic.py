"""The synthetic stand-ins for CIFAR-10, N-MNIST and DVS128 Gesture (no download): shapes,
determinism per (seed, split, index), class structure, the registry, and `spikefuse train`.

The CLI runs train narrowed models (width 1/16, through the model registry), and for the
conv nets fewer samples (through the generators' split sizes): on a small CPU the full
cifar-small takes minutes per epoch, and the conv layers' spike packing runs in Triton's
interpreter. The command, the data path, the trainer, checkpoint, resume and plots are the
same code at any width and size.
"""
from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
import torch

import spikefuse.data as data
from spikefuse import models
from spikefuse.cli import main
from spikefuse.data import synthetic_images
from spikefuse.data.registry import DEFAULT_TIME_STEPS, SYNTHETIC_EVENTS
from spikefuse.data.synthetic_events import SyntheticDVSGesture, SyntheticNMNIST
from spikefuse.data.synthetic_images import SyntheticCIFAR
from spikefuse.data.tonic_sets import TONIC_SETS
from spikefuse.train import checkpoint

GENERATORS = [SyntheticNMNIST, SyntheticDVSGesture]
EVENT_SETS = {"nmnist-synthetic": SyntheticNMNIST, "dvsgesture-synthetic": SyntheticDVSGesture}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One HOME (so one data cache) for the module: each event set is generated once."""
    path = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(path))
        yield path


def nearest_mean_accuracy(x_train, y_train, x_test, y_test, classes: int) -> float:
    """Accuracy of the nearest-class-mean classifier on flattened features."""
    x_train, x_test = (torch.as_tensor(np.asarray(x)).flatten(1).double() for x in (x_train, x_test))
    y_train, y_test = torch.as_tensor(np.asarray(y_train)), torch.as_tensor(np.asarray(y_test))
    means = torch.stack([x_train[y_train == c].mean(0) for c in range(classes)])
    return (torch.cdist(x_test, means).argmin(1) == y_test).double().mean().item()


# ---- the registry ----

def test_registry_describes_every_synthetic_set():
    for name in ("cifar-synthetic", *EVENT_SETS):
        assert "no download" in data.DATASETS[name]
    assert set(DEFAULT_TIME_STEPS) == set(data.DATASETS)
    assert DEFAULT_TIME_STEPS["cifar-synthetic"] == 4
    for name, like in (("nmnist-synthetic", "nmnist"), ("dvsgesture-synthetic", "dvsgesture")):
        generator, copied = SYNTHETIC_EVENTS[name]
        spec = TONIC_SETS[like]
        assert (generator, copied) == (EVENT_SETS[name], like)
        assert generator.sensor_size == spec.sensor_size and len(generator.classes) == spec.num_classes
        assert DEFAULT_TIME_STEPS[name] == spec.time_steps


# ---- cifar-synthetic ----

def test_cifar_images_shapes_and_balanced_labels():
    assert (len(SyntheticCIFAR("train")), len(SyntheticCIFAR("test"))) == (2000, 500)
    x, y = SyntheticCIFAR("train", samples=95).arrays()
    assert x.shape == (95, 3, 32, 32) and x.dtype == np.float32 and y.dtype == np.int64
    assert x.min() >= 0 and x.max() <= 1 and x.std() > 0.1
    assert np.bincount(y[:90], minlength=10).tolist() == [9] * 10  # every run of 10 holds each class once
    assert 0 <= y.min() and y.max() < 10


def test_cifar_sample_depends_only_on_seed_split_and_index():
    a, b = SyntheticCIFAR("train", samples=30, seed=1), SyntheticCIFAR("train", samples=12, seed=1)
    image, label = a[11]
    assert np.array_equal(image, b[11][0]) and label == b[11][1]
    together, _ = a.arrays([3, 11])
    assert np.array_equal(together[1], image)  # rendered with others or alone: the same
    assert not np.array_equal(a[3][0], a[4][0])
    assert not np.array_equal(a[3][0], SyntheticCIFAR("train", samples=30, seed=2)[3][0])
    assert not np.array_equal(a[3][0], SyntheticCIFAR("test", samples=30, seed=1)[3][0])
    negative = SyntheticCIFAR("train", samples=5, seed=-3)[2][0]  # any int seeds it, as load() allows
    assert np.array_equal(negative, SyntheticCIFAR("train", samples=5, seed=-3)[2][0])


def test_cifar_classes_are_learnable_but_not_by_colour_alone():
    (x, y), (xt, yt) = SyntheticCIFAR("train", samples=400).arrays(), SyntheticCIFAR("test", samples=200).arrays()
    pixels = nearest_mean_accuracy(x, y, xt, yt, 10)
    colour = nearest_mean_accuracy(x.mean((2, 3)), y, xt.mean((2, 3)), yt, 10)
    assert pixels > 0.35  # chance: 0.1
    assert colour < 0.45 and pixels > colour + 0.1  # pairs of classes share their colours


def test_cifar_splits_are_static_images():
    splits = data.load("cifar-synthetic", time_steps=3, seed=5)
    assert (splits.num_classes, splits.input_shape, splits.time_steps) == (10, (3, 32, 32), 3)
    assert (len(splits.train), len(splits.test)) == (2000, 500)
    assert not splits.train.time_major and not splits.test.time_major
    batches = list(splits.train.batches(64, shuffle=True, generator=torch.Generator().manual_seed(0)))
    x, y = batches[0]
    assert x.shape == (64, 3, 32, 32) and x.dtype == torch.float32 and x.is_contiguous() and y.dtype == torch.int64
    assert sum(len(b[1]) for b in batches) == 2000 and batches[-1][0].shape[0] == 2000 % 64
    images, labels = SyntheticCIFAR("test", seed=5).arrays([7])
    assert torch.equal(splits.test.get(torch.tensor([7]))[0], torch.from_numpy(images[0]))
    assert splits.test.targets[7].item() == labels[0]


def test_cifar_models_take_the_static_batches():
    splits = data.load("cifar-synthetic", time_steps=2)
    x, _ = next(iter(splits.test.batches(4, shuffle=False)))
    for name in ("cifar-small", "resnet18"):
        model = models.build_model(name, splits.input_shape, splits.num_classes, splits.time_steps, width=1 / 16)
        assert model(x).shape == (4, 10)


# ---- nmnist-synthetic and dvsgesture-synthetic ----

@pytest.mark.parametrize("generator", GENERATORS, ids=lambda g: g.__name__)
def test_event_samples_are_valid_dvs_streams(generator):
    classes = len(generator.classes)
    ds = generator("train", samples=2 * classes)
    width, height, polarities = generator.sensor_size
    assert sorted(ds.targets.tolist()) == sorted(list(range(classes)) * 2)
    for i in range(len(ds)):
        events, target = ds[i]
        assert events.dtype.names == ("t", "x", "y", "p") and target == ds.targets[i]
        assert np.all(np.diff(events["t"]) >= 0) and events["t"][0] >= 0
        assert 0 <= events["x"].min() and events["x"].max() < width
        assert 0 <= events["y"].min() and events["y"].max() < height
        assert set(np.unique(events["p"]).tolist()) == set(range(polarities))
        assert 0.8 * generator.mean_events < len(events) < 1.1 * generator.mean_events


@pytest.mark.parametrize("generator", GENERATORS, ids=lambda g: g.__name__)
def test_event_sample_depends_only_on_seed_split_and_index(generator):
    a, b = generator("test", samples=30, seed=4), generator("test", samples=15, seed=4)
    events, target = a[13]
    assert np.array_equal(events, b[13][0]) and target == b[13][1]
    assert not np.array_equal(events, a[12][0])
    assert not np.array_equal(events, generator("test", samples=30, seed=5)[13][0])
    assert not np.array_equal(events, generator("train", samples=30, seed=4)[13][0])


def test_nmnist_saccades_fire_most_at_full_speed():
    # each of the three moves eases in and out (speed ~ sin(pi u)): its middle third holds
    # half of its edge events, the ends a quarter each
    ds = SyntheticNMNIST("train", samples=20)
    middle = []
    for i in range(len(ds)):
        t = ds[i][0]["t"].astype(float)
        u = (3 * t / t.max()) % 1
        middle.append(np.mean((u > 1 / 3) & (u < 2 / 3)))
    assert 0.42 < np.mean(middle) < 0.55


def counts(ds, n: int, bins: int, pool: int):
    """(features [n, ...], labels) of the first n samples: event counts in `bins` frames, pooled."""
    x, y = next(iter(ds.batches(n, shuffle=False)))
    x = torch.nn.functional.avg_pool2d(x.flatten(0, 1), pool).unflatten(0, (bins, n))
    return x.transpose(0, 1), y


@pytest.mark.parametrize("name, pool, floor", [("nmnist-synthetic", 2, 0.6), ("dvsgesture-synthetic", 8, 0.4)])
def test_event_sets_load_framed_and_learnable(home, name, pool, floor):
    generator = EVENT_SETS[name]
    splits = data.load(name)
    spec = TONIC_SETS[SYNTHETIC_EVENTS[name][1]]
    assert (splits.num_classes, splits.input_shape, splits.time_steps) == (spec.num_classes, spec.input_shape,
                                                                             spec.time_steps)
    assert (len(splits.train), len(splits.test)) == (generator.split_sizes["train"], generator.split_sizes["test"])
    # the packed store holds the generator's samples, in order
    for i in (0, len(splits.test) - 1):
        assert np.array_equal(splits.test.store.sample(i), generator("test")[i][0])
    x, _ = next(iter(splits.train.batches(8, shuffle=False)))
    assert x.shape == (spec.time_steps, 8, *spec.input_shape) and x.dtype == torch.float32
    assert torch.equal(x, x.round()) and x.min() >= 0 and x.sum() > 0  # event counts
    framed = data.load(name, time_steps=4)  # from the cache, framed anew
    x_train, y_train = counts(framed.train, 300, 4, pool)
    x_test, y_test = counts(framed.test, 150, 4, pool)
    assert nearest_mean_accuracy(x_train, y_train, x_test, y_test, splits.num_classes) > floor


# ---- spikefuse train ----

def narrow(monkeypatch, name: str, width: float = 1 / 16):
    builder, description = models.MODELS[name]
    narrowed = functools.partial(builder, width=width)
    narrowed.__dict__.update(vars(builder))  # the builder's flags (static_images, sparse_training)
    monkeypatch.setitem(models.MODELS, name, (narrowed, description))


def train(out, model: str, dataset: str, time_steps: int, *extra: str) -> dict:
    """Run `spikefuse train` for one epoch on the CPU; return its last metrics record."""
    argv = ["train", "--model", model, "--dataset", dataset, "--epochs", "1", "--batch-size", "16",
            "--time-steps", str(time_steps), "--out", str(out), "--quiet", "--device", "cpu", *extra]
    assert main(argv) == 0
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["epoch"] == 1 and math.isfinite(record["train_loss"]) and 0 <= record["test_acc"] <= 1
    return record


def test_train_cifar_model_on_static_images(home, tmp_path, monkeypatch):
    narrow(monkeypatch, "cifar-small")
    monkeypatch.setattr(synthetic_images, "SPLIT_SIZES", {"train": 320, "test": 80})
    out = tmp_path / "run"
    record = train(out, "cifar-small", "cifar-synthetic", 2)
    assert record["train_rate"] > 0  # the images reached the spiking layers
    saved = checkpoint.load(out / checkpoint.FILENAME)["config"]["model"]
    assert (saved["input_shape"], saved["time_steps"]) == ([3, 32, 32], 2)
    pytest.importorskip("matplotlib")
    assert (out / "raster.png").stat().st_size > 0  # the static image, repeated over T, through the model
    assert main(["train", "--resume", str(out), "--quiet", "--device", "cpu"]) == 0  # same data, same model


@pytest.mark.slow  # 7-10 s each through the interpreter: the GPU test command runs them
@pytest.mark.parametrize("model, dataset", [("ipu-nmnist", "nmnist-synthetic"),
                                            ("ipu-dvsgesture", "dvsgesture-synthetic")])
def test_train_dense_event_models(home, tmp_path, monkeypatch, model, dataset):
    narrow(monkeypatch, model)
    record = train(tmp_path / "run", model, dataset, 4)
    assert record["train_rate"] > 0


@pytest.mark.slow  # 11 s on 2 cores; the CIFAR static-image case keeps a conv net trained on synthetic data in CI
def test_train_dvs_gesture_conv_net(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # a cache of its own: the split sizes are not in its key
    monkeypatch.setattr(SyntheticDVSGesture, "split_sizes", {"train": 16, "test": 8})
    narrow(monkeypatch, "dvs-gesture")
    record = train(tmp_path / "run", "dvs-gesture", "dvsgesture-synthetic", 2)
    assert record["train_rate"] > 0
