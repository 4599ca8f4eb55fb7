"""Foreign inputs: Tonic-like data set objects through load(), DataLoaders through fit()."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import spikefuse.data as data
from spikefuse.models import build_model
from spikefuse.train.loop import Trainer, fit
from helpers import one_thread  # noqa: F401  (the fixture)

AUDIO = np.dtype([("t", np.int64), ("x", np.int64), ("p", np.int64)])
DVS = np.dtype([("x", np.int16), ("y", np.int16), ("t", np.int64), ("p", np.bool_)])


pytestmark = pytest.mark.usefixtures("one_thread")  # helpers.one_thread, for every test here


class FakeTonic:
    """Tonic's data set interface: sensor_size, ordering, classes, [i] -> (events, target), len."""

    def __init__(self, n, seed, dvs=False, sensor=True, item=None):
        self.n, self.seed, self.dvs, self.item = n, seed, dvs, item
        if sensor:
            self.sensor_size = (8, 8, 2) if dvs else (16, 1, 1)
        self.ordering = "xytp" if dvs else "txp"
        self.classes = ["zero", "one", "two"]
        self.calls = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        if self.item is not None:
            return self.item(i)
        rng = np.random.default_rng(self.seed * 1000 + i)
        target = i % 3
        k = int(rng.integers(5, 40))
        ev = np.zeros(k, dtype=DVS if self.dvs else AUDIO)
        ev["t"] = rng.integers(0, 50_000, k)  # unsorted on purpose: packing sorts
        if self.dvs:
            ev["x"], ev["y"], ev["p"] = rng.integers(0, 8, k), rng.integers(0, 8, k), rng.integers(0, 2, k)
        else:
            ev["x"] = rng.integers(0, 5, k) + 5 * target  # the class picks the channels
        return ev, target


def entries(root):
    folder = root / "cache"
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if not p.name.startswith(".")}


def tiny_model(splits):
    torch.manual_seed(0)
    return build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps, hidden=(8,))


def test_tonic_like_set_packs_trains_and_reuses_the_cache(tmp_path):
    train, test = FakeTonic(48, 0), FakeTonic(24, 1)
    splits = data.load(train, test=test, time_steps=6, root=tmp_path)
    assert (splits.name, splits.num_classes, splits.input_shape, splits.time_steps) == ("FakeTonic", 3, (16,), 6)
    assert (len(splits.train), len(splits.test)) == (48, 24)
    assert splits.train.targets.tolist() == [i % 3 for i in range(48)]
    x, y = next(splits.test.batches(24, shuffle=False))
    assert x.shape == (6, 24, 16) and y.shape == (24,)
    # "bins" framing of each sample's own span, as tonic's ToFrame(n_time_bins=6) frames it
    frame = data.ToFrame((16, 1, 1), n_time_bins=6)
    for i in (0, 7, 23):
        ev = np.sort(test[i][0], order="t", kind="stable")
        assert torch.equal(x[:, i], frame(ev).reshape(6, 16))
    before, first_calls = entries(tmp_path), train.calls
    assert len(before) == 2 and first_calls >= 48

    model = tiny_model(splits)
    history = fit(model, splits, torch.optim.Adam(model.parameters(), lr=1e-2), epochs=1, batch_size=16,
                  progress=False)
    assert len(history) == 1 and np.isfinite(history[0]["train_loss"]) and "test_acc" in history[0]

    again = data.load(train, test=test, time_steps=6, root=tmp_path)  # cache hit: no re-pack
    assert train.calls - first_calls <= 16  # only the fingerprint's few samples were read
    assert entries(tmp_path) == before
    assert torch.equal(next(again.test.batches(24, shuffle=False))[0], x)

    other = data.load(FakeTonic(48, 5), test=test, time_steps=6, root=tmp_path)  # other contents: other entry
    assert len(entries(tmp_path)) == 3 and len(other.train) == 48


def test_pair_form_dvs_events_and_explicit_sensor_size(tmp_path):
    train, test = FakeTonic(12, 0, dvs=True, sensor=False), FakeTonic(6, 1, dvs=True, sensor=False)
    splits = data.load((train, test), time_steps=4, sensor_size=(8, 8, 2), num_classes=5, framing="window",
                       root=tmp_path)
    assert splits.input_shape == (2, 8, 8) and splits.num_classes == 5
    x, _ = next(splits.train.batches(12, shuffle=False))
    assert x.shape == (4, 12, 2, 8, 8)


def test_dataloaders_train_with_fit(tmp_path):
    g = torch.Generator().manual_seed(0)
    xs, ys = (torch.rand(40, 5, 12, generator=g) < 0.3).float(), torch.arange(40) % 2
    train = DataLoader(TensorDataset(xs[:30], ys[:30]), batch_size=8, shuffle=True)  # last batch: 6
    test = DataLoader(TensorDataset(xs[30:], ys[30:]), batch_size=8)
    model = build_model("mlp", (12,), 2, 5, hidden=(8,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = fit(model, (train, test), opt, epochs=2, progress=False)  # batch-first [B, T, F]
    assert [r["epoch"] for r in history] == [1, 2] and 0 <= history[-1]["test_acc"] <= 1

    only = Trainer(model, train, opt, epochs=1, progress=False).fit()  # one loader: train only
    assert "train_loss" in only[0] and "test_acc" not in only[0]

    def time_major(batch):
        x, y = torch.utils.data.default_collate(batch)
        return x.transpose(0, 1), y
    tm = DataLoader(TensorDataset(xs, ys), batch_size=8, collate_fn=time_major)
    history = fit(model, data.loader_splits(tm, tm, batch_first=False), opt, epochs=1, progress=False)
    assert history[0]["test_acc"] >= 0
    with pytest.raises(ValueError, match=r"splits\[0\] \(train\): batch 0 has x of shape \[5, 8, 12\].*batch-first"):
        fit(model, (tm, tm), opt, epochs=1, progress=False)  # time-major batches, batch-first expected
    with pytest.raises(TypeError, match="splits: expected a"):
        fit(model, (train, "test"), opt, epochs=1, progress=False)


def test_bad_data_set_objects_raise_clear_errors(tmp_path):
    kw = {"time_steps": 4, "root": tmp_path}
    good = FakeTonic(6, 1)
    with pytest.raises(ValueError, match="sensor_size: FakeTonic has no sensor_size attribute"):
        data.load(FakeTonic(6, 0, sensor=False), test=good, **kw)
    with pytest.raises(ValueError, match=r"sensor_size: expected 3 positive ints"):
        data.load(good, test=good, sensor_size=(16, 1), **kw)
    with pytest.raises(ValueError, match="test: a data set object is one split"):
        data.load(good, **kw)
    with pytest.raises(ValueError, match="time_steps: required"):
        data.load(good, test=good, root=tmp_path)
    with pytest.raises(TypeError, match="train: item 0 is a tuple of 3"):
        data.load(FakeTonic(6, 0, item=lambda i: (np.zeros(2, AUDIO), 0, "extra")), test=good, **kw)
    with pytest.raises(TypeError, match=r"train: item 0 holds events as a plain array of shape \(4, 16\)"):
        data.load(FakeTonic(6, 0, item=lambda i: (np.zeros((4, 16)), 0)), test=good, **kw)
    with pytest.raises(ValueError, match=r"train: item 0's events lack field\(s\) \['p'\]"):
        data.load(FakeTonic(6, 0, item=lambda i: (np.zeros(2, [("t", "i8"), ("x", "i8")]), 0)), test=good, **kw)
    with pytest.raises(TypeError, match="test: item 0 has target array"):
        data.load(good, test=FakeTonic(6, 0, item=lambda i: (np.zeros(2, AUDIO), np.eye(3)[0])), **kw)

    def wide(i):
        ev = np.zeros(3, AUDIO)
        ev["x"] = [0, 1, 99]
        return ev, 0
    with pytest.raises(ValueError, match=r"train: samples: sample 0 has x = 99.*sensor's width 16"):
        data.load(FakeTonic(6, 0, item=wide), test=good, **kw)
    with pytest.raises(TypeError, match="got a DataLoader"):
        data.load(DataLoader(good), test=good, **kw)
    with pytest.raises(ValueError, match="test: only for data set objects"):
        data.load("digits", test=good)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())  # nothing half-written
