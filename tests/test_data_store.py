"""Packed event store and its disk cache: round trip, gather, and rebuilding bad entries."""
import json
import os

import numpy as np
import pytest
import torch

from spikefuse.data import Downsample, EventStore, ToFrame
from spikefuse.data.cache import cache_key, cached_store, entry_path, is_valid
from spikefuse.data.dataset import EventSpikeDataset
from spikefuse.data.events import pack
from spikefuse.data.synthetic import SyntheticSHD

SENSOR = (700, 1, 1)


@pytest.fixture(scope="module")
def source():
    return SyntheticSHD("train", samples=24, seed=1, mean_events=300)


class Builder:
    """Builds a store from the synthetic source after `transform`, counting its calls."""

    def __init__(self, source, transform=None):
        self.source, self.transform, self.calls = source, transform, 0

    def __call__(self):
        self.calls += 1
        src = self.source
        sensor = SENSOR if self.transform is None else self.transform.output_sensor_size(SENSOR)
        return EventStore.from_samples((src[i] for i in range(len(src))), sensor, total=len(src),
                                       transform=self.transform, progress=False)


def test_store_round_trip_and_gather(tmp_path, source):
    store = Builder(source)()
    assert len(store) == 24 and store.targets.dtype == torch.int64
    for i in (0, 5, 23):
        ev, target = source[i]
        np.testing.assert_array_equal(store.sample(i)["t"], ev["t"])
        np.testing.assert_array_equal(store.sample(i)["x"], ev["x"])
        assert store.targets[i] == target
    store.save(tmp_path)
    loaded = EventStore.load(tmp_path)
    assert isinstance(loaded.events, np.memmap)
    idx = torch.tensor([7, 0, 23, 7])
    cols, offsets = loaded.gather(idx)
    ref_cols, ref_offsets = pack([source[i][0] for i in idx.tolist()])
    assert torch.equal(offsets, ref_offsets)
    for k in ref_cols:
        assert torch.equal(cols[k].long(), ref_cols[k].long())
    # the resident copy gathers the same with tensor ops
    resident = loaded.to("cpu", resident=True)
    r_cols, r_offsets = resident.gather(idx)
    assert torch.equal(r_offsets, offsets) and all(torch.equal(r_cols[k], cols[k]) for k in cols)


def test_event_dataset_batches_match_framing(tmp_path, source):
    store = cached_store(tmp_path, "syn", "train", {"v": 1}, Builder(source))
    frame = ToFrame(SENSOR, time_window=10_000, start_time=0, include_incomplete=True)
    ds = EventSpikeDataset(store.to("cpu", resident=True), frame, 100, (700,))
    g = torch.Generator().manual_seed(0)
    xs, ys = zip(*ds.batches(10, shuffle=True, generator=g))
    assert [len(y) for y in ys] == [10, 10, 4]
    order = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.cat(ys), store.targets[order])
    x0 = xs[0]
    assert x0.shape == (100, 10, 700) and x0.dtype == torch.float32
    for b, i in enumerate(order[:10].tolist()):
        ref = frame(source[i][0])[:100, 0]
        assert torch.equal(x0[:len(ref), b], ref)
    # the memory-mapped (non-resident) store gives the same batches
    ds2 = EventSpikeDataset(store, frame, 100, (700,))
    x2, _ = next(ds2.batches(10, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(x2, x0)


def test_cache_reuses_valid_entry(tmp_path, source):
    build = Builder(source)
    a = cached_store(tmp_path, "syn", "train", {"v": 1}, build)
    b = cached_store(tmp_path, "syn", "train", {"v": 1}, build)
    assert build.calls == 1
    assert np.array_equal(a.events, b.events)
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no temp folders left


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "no-manifest", "bad-manifest", "missing-file"])
def test_cache_rebuilds_damaged_entry(tmp_path, source, damage):
    build = Builder(source)
    good = np.array(cached_store(tmp_path, "syn", "train", {"v": 1}, build).events)  # a copy, not the map
    entry = entry_path(tmp_path, "syn", "train", {"v": 1})
    events = entry / "events.npy"
    if damage == "truncate":
        with open(events, "r+b") as f:
            f.truncate(events.stat().st_size - 100)
    elif damage == "corrupt":  # same size, one byte flipped in the data part
        with open(events, "r+b") as f:
            f.seek(events.stat().st_size - 50)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "no-manifest":
        (entry / "manifest.json").unlink()
    elif damage == "bad-manifest":
        (entry / "manifest.json").write_text("{not json")
    else:
        (entry / "offsets.npy").unlink()
    assert not is_valid(entry)
    rebuilt = cached_store(tmp_path, "syn", "train", {"v": 1}, build)
    assert build.calls == 2 and is_valid(entry)
    assert np.array_equal(rebuilt.events, good)


@pytest.mark.parametrize("manifest", ["[1, 2]", "1", "null", '"manifest"', '{"format": 1, "files": []}',
                                      '{"format": 1, "files": {"events.npy": "big"}}'])
def test_cache_rebuilds_a_manifest_that_is_json_but_not_ours(tmp_path, source, manifest):
    # valid JSON of another shape used to end in AttributeError, and the entry was never rebuilt
    build = Builder(source)
    good = np.array(cached_store(tmp_path, "syn", "train", {"v": 1}, build).events)
    entry = entry_path(tmp_path, "syn", "train", {"v": 1})
    (entry / "manifest.json").write_text(manifest)
    assert not is_valid(entry)
    rebuilt = cached_store(tmp_path, "syn", "train", {"v": 1}, build)
    assert build.calls == 2 and is_valid(entry) and np.array_equal(rebuilt.events, good)


class HandMade:
    """A store's files as EventStore.save writes them, contents unchecked (an older release's
    entry, a hand-made one): what the constructor and EventStore.load must refuse."""

    def __init__(self, events, offsets, targets, sensor_size):
        self.events, self.offsets, self.targets, self.sensor_size = events, offsets, targets, sensor_size

    def save(self, directory):
        np.save(directory / "events.npy", self.events)
        np.save(directory / "offsets.npy", self.offsets)
        np.save(directory / "targets.npy", self.targets)
        (directory / "meta.json").write_text(json.dumps({"sensor_size": list(self.sensor_size)}))


def _unsound(store, what):
    """`store`'s contents, wrong in one way the packing checks refuse."""
    events, targets = np.array(store.events), store.targets.numpy().copy()
    if what == "x-outside-sensor":
        events["x"][5] = SENSOR[0] + 3
    elif what == "negative-x":
        events["x"][5] = -1
    elif what == "negative-t":
        events["t"][0] = -7
    elif what == "unsorted-t":
        a, b = store.offsets_host[:2]
        events["t"][a:b] = events["t"][a:b][::-1].copy()
    elif what == "two-polarities":
        events["p"][3] = 1 - events["p"][2]
    elif what == "negative-target":
        targets[2] = -1
    return HandMade(events, store.offsets_host, targets, store.sensor_size)


UNSOUND = [
    ("x-outside-sensor", r"sensor_size: events have x in \[0, 703\] but sensor_size gives x < 700"),
    ("negative-x", r"sensor_size: events have x in \[-1, "),
    ("negative-t", "negative timestamps"),
    ("unsorted-t", "must be sorted within each sample"),
    ("two-polarities", "single polarity sensor"),
    ("negative-target", r"targets: sample 2 has target -1"),
]


@pytest.mark.parametrize("what, message", UNSOUND)
def test_an_entry_with_unsound_contents_is_checked_when_read_and_rebuilt(tmp_path, source, what, message):
    """A manifest proves the files are the ones written, not that what was written is sound (an
    older release, a hand-made entry): the contents are checked when read from disk."""
    from spikefuse.data.cache import write_entry

    build = Builder(source)
    good = cached_store(tmp_path, "syn", "train", {"v": 1}, build)
    entry = entry_path(tmp_path, "syn", "train", {"v": 1})
    write_entry(entry, _unsound(good, what), {"v": 1})
    assert is_valid(entry)  # the manifest agrees with the files
    with pytest.raises(ValueError, match=message):
        EventStore.load(entry)
    rebuilt = cached_store(tmp_path, "syn", "train", {"v": 1}, build)
    assert build.calls == 2 and np.array_equal(rebuilt.events, good.events)
    assert torch.equal(rebuilt.targets, good.targets)


@pytest.mark.parametrize("what, message", UNSOUND)
def test_the_constructor_checks_contents_as_load_does(source, what, message):
    """EventStore(events, offsets, targets, sensor_size) took x = 703 on a 700-wide sensor, and
    framing put its spike into another cell or another sample's frames, without a word."""
    bad = _unsound(Builder(source)(), what)
    with pytest.raises(ValueError, match=message):
        EventStore(bad.events, bad.offsets, bad.targets, bad.sensor_size)


@pytest.mark.parametrize("offsets", [[0, 3, 1, 4], [0, 2, 4, 4.0], [0, 2, 4], [[0, 1, 2, 4]]])
def test_the_constructor_refuses_offsets_that_do_not_cut_the_events(offsets):
    events = np.zeros(4, dtype=[("t", "<i8"), ("x", "<i2"), ("p", "<i1")])
    with pytest.raises(ValueError, match=r"^offsets: expected 4 integers rising from 0 to 4"):
        EventStore(events, np.array(offsets), np.zeros(3, dtype=np.int64), (4, 1, 1))
    with pytest.raises(ValueError, match=r"^events: expected a structured array with fields t, x, p"):
        EventStore(np.zeros(4), np.array([0, 1, 2, 4]), np.zeros(3, dtype=np.int64), (4, 1, 1))


def test_load_checks_a_store_larger_than_one_chunk(tmp_path, monkeypatch):
    """The load check runs over chunks of whole samples: a bad event in a later chunk is found."""
    import spikefuse.data.store as store_module

    samples = [(np.rec.fromarrays([np.arange(10), np.full(10, i % 7), np.ones(10)],
                                  dtype=[("t", "<i8"), ("x", "<i2"), ("p", "<i1")]), i % 3) for i in range(20)]
    store = EventStore.from_samples(samples, (8, 1, 1), progress=False)
    events = np.array(store.events)
    events["x"][-1] = 8
    HandMade(events, store.offsets_host, store.targets.numpy(), (8, 1, 1)).save(tmp_path)
    monkeypatch.setattr(store_module, "CHECK_CHUNK", 25)  # 200 events: 8 chunks, cut at sample edges
    with pytest.raises(ValueError, match=r"events have x in \[\d, 8\]"):
        EventStore.load(tmp_path)
    store.save(tmp_path)
    assert torch.equal(EventStore.load(tmp_path).targets, store.targets)


def test_cache_rebuilds_when_a_parameter_changes(tmp_path, source):
    first = Downsample(spatial_factor=100 / 700)
    b1 = Builder(source, first)
    s1 = cached_store(tmp_path, "syn", "train", {"pre": repr(first)}, b1)
    assert int(s1.events["x"].max()) < 100
    for changed in (Downsample(spatial_factor=0.5), Downsample(spatial_factor=100 / 700, time_factor=0.5)):
        b2 = Builder(source, changed)
        s2 = cached_store(tmp_path, "syn", "train", {"pre": repr(changed)}, b2)
        assert b2.calls == 1 and not np.array_equal(s1.events, s2.events)
    b3 = Builder(source, first)
    cached_store(tmp_path, "syn", "train", {"pre": repr(first)}, b3)
    assert b3.calls == 0  # back to the first parameters: its entry is still there
    keys = {cache_key("syn", s, {"pre": "x"}) for s in ("train", "test")} | {cache_key("other", "train", {"pre": "x"})}
    assert len(keys) == 3


def test_manifest_is_written_with_sizes_and_checksums(tmp_path, source):
    cached_store(tmp_path, "syn", "test", {"v": 1}, Builder(source))
    entry = entry_path(tmp_path, "syn", "test", {"v": 1})
    manifest = json.loads((entry / "manifest.json").read_text())
    for name, info in manifest["files"].items():
        assert (entry / name).stat().st_size == info["size"] and len(info["sha256"]) == 64


def test_cache_build_shows_progress(tmp_path, source, capsys):
    src = source
    EventStore.from_samples((src[i] for i in range(4)), SENSOR, total=4, desc="caching syn")
    assert "caching syn" in capsys.readouterr().err


@pytest.mark.parametrize("meta,message", [("{not json", "not JSON"), ("[1, 2]", "sensor_size list"),
                                          ('{"samples": 24}', "sensor_size list")])
def test_a_meta_file_without_a_sensor_size_is_refused_naming_the_file(tmp_path, source, meta, message):
    """meta.json that is not JSON, not an object, or lacks sensor_size (an older or hand-made
    entry): a ValueError naming the file, not a bare KeyError."""
    Builder(source)().save(tmp_path)
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(ValueError, match=message) as error:
        EventStore.load(tmp_path)
    assert "meta.json" in str(error.value)
