"""Embedded and synthetic sets (deterministic per seed), the load() API, the Tonic error path."""
import urllib.error

import numpy as np
import pytest
import torch

import spikefuse.data as data
from spikefuse.data import embedded
from spikefuse.data.synthetic import NUM_CLASSES, SPLIT_SIZES, SyntheticSHD


def test_registry_names():
    assert list(data.DATASETS) == ["digits", "digits-latency", "randman", "shd-synthetic",
                                   "shd", "ssc", "nmnist", "dvsgesture", "cifar-synthetic",
                                   "nmnist-synthetic", "dvsgesture-synthetic"]
    assert all(isinstance(v, str) and v for v in data.DATASETS.values())


def test_digits_splits_and_batches():
    s = data.load("digits")
    assert (s.name, s.num_classes, s.input_shape, s.time_steps) == ("digits", 10, (64,), 20)
    assert (len(s.train), len(s.test)) == (1437, 360)
    assert s.train.targets.dtype == torch.int64
    assert torch.bincount(s.test.targets).tolist() == torch.bincount(data.load("digits", seed=5).test.targets).tolist()
    batches = list(s.train.batches(128, shuffle=True, generator=torch.Generator().manual_seed(1)))
    x, y = batches[0]
    assert x.shape == (20, 128, 64) and x.dtype == torch.float32 and y.shape == (128,)
    assert set(x.unique().tolist()) <= {0.0, 1.0}
    assert sum(len(b[1]) for b in batches) == 1437
    assert len(list(s.train.batches(128, shuffle=False, drop_last=True))) == 1437 // 128
    again = list(s.train.batches(128, shuffle=True, generator=torch.Generator().manual_seed(1)))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))


def test_rate_coding_follows_intensity():
    x_tr, y_tr, *_ = embedded.digits(time_steps=200, seed=0)
    intensity = torch.from_numpy(embedded.digits_split()[0])
    rate = x_tr.float().mean(0)
    assert (rate - intensity).abs().max() < 0.15
    assert rate[intensity == 0].sum() == 0


def test_latency_coding_one_spike_brighter_earlier():
    x, *_ = embedded.digits(time_steps=20, coding="latency")
    intensity = torch.from_numpy(embedded.digits_split()[0])
    assert torch.equal(x.sum(0), (intensity > 0).to(torch.uint8))
    first = x.float().argmax(0)
    bright, dim = intensity == 1.0, (intensity > 0) & (intensity < 0.5)
    assert (first[bright] == 0).all() and (first[dim] > 9).all()


def test_digits_deterministic_per_seed():
    a, b, c = data.load("digits", seed=3), data.load("digits", seed=3), data.load("digits", seed=4)
    for split in ("train", "test"):
        da, db, dc = getattr(a, split), getattr(b, split), getattr(c, split)
        assert torch.equal(da.data, db.data) and torch.equal(da.targets, db.targets)
        assert not torch.equal(da.data, dc.data)


def test_randman_deterministic_per_seed():
    a, b, c = (embedded.randman(samples_per_class=40, seed=s) for s in (3, 3, 4))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_randman_shape_and_one_spike_per_unit():
    s = data.load("randman", time_steps=30)
    assert s.input_shape == (100,) and s.num_classes == 10 and s.time_steps == 30
    x, y = next(s.test.batches(50, shuffle=False))
    assert x.shape == (30, 50, 100) and (x.sum(0) == 1).all()
    assert len(s.train) + len(s.test) == 5000 and len(torch.unique(s.train.targets)) == 10


def test_randman_is_learnable_by_nearest_class_mean():
    """Spike times carry the class: a nearest-mean classifier on spike times beats chance by far."""
    tr_x, tr_y, te_x, te_y = embedded.randman(samples_per_class=100, seed=0)
    def times(x):
        return x.float().argmax(0)  # [N, units]
    means = torch.stack([times(tr_x)[tr_y == c].float().mean(0) for c in range(10)])
    pred = torch.cdist(times(te_x).float(), means).argmin(1)
    assert (pred == te_y).float().mean() > 0.5


def test_synthetic_shd_shapes_and_determinism():
    train = SyntheticSHD("train")
    assert len(train) == SPLIT_SIZES["train"] == 8156 and len(SyntheticSHD("test")) == 2264
    assert set(np.unique(train.targets)) == set(range(NUM_CLASSES))
    ev, target = train[17]
    assert ev.dtype.names == ("t", "x", "p") and ev["t"].dtype == np.int64
    assert (np.diff(ev["t"]) >= 0).all() and 0 <= ev["x"].min() and ev["x"].max() < 700
    assert 0.5e6 < ev["t"].max() <= 1.2e6 and len(ev) > 1000
    again, _ = SyntheticSHD("train")[17]
    other, _ = SyntheticSHD("train", seed=1)[17]
    assert np.array_equal(ev, again) and not np.array_equal(ev, other)


def test_synthetic_shd_classes_differ():
    """Channel histograms of one class are closer to each other than to other classes."""
    ds = SyntheticSHD("train", samples=200)
    hist = np.stack([np.bincount(ds[i][0]["x"] // 20, minlength=35) / len(ds[i][0]) for i in range(200)])
    y = ds.targets
    means = np.stack([hist[y == c].mean(0) for c in range(NUM_CLASSES)])
    pred = ((hist[:, None] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == y).mean() > 0.8


def test_tonic_set_without_network_says_what_to_do(tmp_path, monkeypatch):
    tonic_dataset = pytest.importorskip("tonic.dataset")  # the data extra

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(tonic_dataset, "download_and_extract_archive", offline)
    with pytest.raises(data.DatasetUnavailable) as err:
        data.load("shd", root=str(tmp_path))
    msg = str(err.value)
    assert "shd (train split) is not available" in msg and "no network" in msg
    assert str(tmp_path / "SHD") in msg and "shd_train.h5.zip" in msg and "https://" in msg
    with pytest.raises(data.DatasetUnavailable, match="nmnist"):
        data.load("nmnist", root=str(tmp_path))


def test_data_command(capsys, tmp_path, monkeypatch):
    import argparse

    from spikefuse.data import command

    parser = argparse.ArgumentParser()
    command.configure(parser)
    assert command.run(parser.parse_args(["list"])) == 0
    assert "shd-synthetic" in capsys.readouterr().out
    assert command.run(parser.parse_args(["cache", "nope"])) == 2
    assert command.run(parser.parse_args(["cache", "digits", "--root", str(tmp_path)])) == 0
    assert "1437 train / 360 test" in capsys.readouterr().out
