"""A small stand-in for spikefuse.data that the train tests use (fast, no files), and a
check that it offers the same interface as the real data sets."""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

NAME = "standin"


class StandInDataset:
    """SpikeDataset interface over tensors x [N, T, F] (rate-coded spikes), y [N]."""

    def __init__(self, x, y, delay=0.0):
        self.x, self.targets, self.delay = x, y, delay

    def __len__(self):
        return len(self.targets)

    def batches(self, batch_size, *, shuffle, generator=None, drop_last=False):
        n = len(self)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        stop = n - n % batch_size if drop_last else n
        for i in range(0, stop, batch_size):
            idx = order[i:i + batch_size]
            time.sleep(self.delay)  # lets a test catch the run in the middle of an epoch
            yield self.x[idx].transpose(0, 1).contiguous(), self.targets[idx]


@dataclass
class StandInSplits:
    train: StandInDataset
    test: StandInDataset
    num_classes: int
    input_shape: tuple
    time_steps: int
    name: str = NAME


def make_splits(n_train=192, n_test=96, features=16, classes=4, time_steps=8, seed=0, delay=0.0):
    """Each class fires its own random subset of inputs more often: easy to learn."""
    g = torch.Generator().manual_seed(1234)
    rates = 0.1 + 0.7 * (torch.rand(classes, features, generator=g) > 0.5).float()

    def split(n):
        y = torch.randint(classes, (n,), generator=g)
        x = (torch.rand(n, time_steps, features, generator=g) < rates[y][:, None]).float()
        return x, y

    (xa, ya), (xb, yb) = split(n_train), split(n_test)
    return StandInSplits(StandInDataset(xa, ya, delay), StandInDataset(xb, yb), classes, (features,), time_steps)


def install(setattr=setattr, delay=0.0):
    """Make `spikefuse.data` offer the stand-in as data set "standin" (pass
    monkeypatch.setattr to undo it after a test)."""
    import spikefuse.data as data

    datasets = dict(getattr(data, "DATASETS", {}))
    datasets[NAME] = "stand-in for tests"
    real_load = getattr(data, "load", None)

    def load(name, *, time_steps=None, root="~/.cache/spikefuse", seed=0, device="cpu", progress=True):
        if name == NAME:
            return make_splits(time_steps=time_steps or 8, delay=delay)
        if real_load is None:
            raise ValueError(f"unknown data set {name!r}; expected one of {sorted(datasets)}")
        return real_load(name, time_steps=time_steps, root=root, seed=seed, device=device, progress=progress)

    setattr(data, "DATASETS", datasets)
    setattr(data, "load", load)


def _check_interface(splits):
    assert splits.num_classes >= 2 and splits.time_steps >= 1
    for ds in (splits.train, splits.test):
        assert len(ds) == len(ds.targets) > 0
        g = torch.Generator().manual_seed(0)
        x, y = next(iter(ds.batches(5, shuffle=True, generator=g)))
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.shape == (splits.time_steps, 5, *splits.input_shape) and y.shape == (5,)


def test_standin_offers_the_data_interface():
    _check_interface(make_splits())


def test_real_digits_offers_the_same_interface():
    data = pytest.importorskip("spikefuse.data")
    if not hasattr(data, "load"):
        pytest.skip("spikefuse.data.load has not landed yet")
    _check_interface(data.load("digits"))
