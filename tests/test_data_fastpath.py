"""The store fast path of ToFrame (`batch_from_store`): same frames as the general `batch`,
no host sync, and a handful of ops per batch."""
import numpy as np
import pytest
import torch

from spikefuse.data import Downsample, EventStore, ToFrame
from spikefuse.data.dataset import EventSpikeDataset
from spikefuse.data.events import event_dtype

SENSORS = {"1d": (50, 1, 1), "1d-2pol": (50, 1, 2), "2d": (13, 9, 2), "2d-1pol": (13, 9, 1)}


def random_store(rng, sensor, two_d, samples=40, empty_every=5):
    """Samples on a coarse time grid (many events exactly on window edges), some empty."""
    w, h, p = sensor
    dtype = event_dtype(two_d, sensor)
    parts = []
    for i in range(samples):
        n = 0 if i % empty_every == 0 else int(rng.integers(1, 200))
        ev = np.zeros(n, dtype=dtype)
        ev["t"] = np.sort(int(rng.integers(0, 500)) + rng.integers(0, int(rng.integers(1, 300)), n) * 10)
        ev["x"] = rng.integers(0, w, n)
        if two_d:
            ev["y"] = rng.integers(0, h, n)
        ev["p"] = rng.integers(0, p, n)
        parts.append(ev)
    offsets = np.zeros(samples + 1, dtype=np.int64)
    np.cumsum([len(e) for e in parts], out=offsets[1:])
    store = EventStore(np.concatenate(parts), offsets, np.arange(samples) % 3, sensor)
    return store.to("cpu", resident=True)


FAST = [
    dict(time_window=100),
    dict(time_window=100, include_incomplete=True),
    dict(time_window=70.0, start_time=0, include_incomplete=True),
    dict(time_window=100, start_time=250),
    dict(time_window=50, start_time=30, end_time=900, include_incomplete=True),
    dict(time_window=100, end_time=1200),
    dict(n_time_bins=7),
    dict(n_time_bins=1),
    dict(n_time_bins=40, overlap=0.0),
]
SLOW = [
    dict(time_window=33.3),
    dict(time_window=120, overlap=40),
    dict(n_time_bins=7, overlap=0.3),
    dict(event_count=10),
    dict(n_event_bins=5),
]


def reference(frame, store, idx, num_frames):
    cols, offsets = store.gather(torch.as_tensor(idx))
    return frame.batch(cols, offsets, num_frames=num_frames)


@pytest.mark.parametrize("kind", list(SENSORS))
def test_fast_path_equals_general(kind):
    rng = np.random.default_rng(sum(map(ord, kind)))
    sensor = SENSORS[kind]
    store = random_store(rng, sensor, kind.startswith("2d"))
    for kw in FAST:
        frame = ToFrame(sensor, **kw)
        for num_frames in (None, 1, 5, 60):
            for batch in (1, 7, 16):
                idx = torch.from_numpy(rng.choice(len(store), batch, replace=True))
                got = frame.batch_from_store(store, idx, num_frames=num_frames)
                assert got is not None, kw
                ref = reference(frame, store, idx, num_frames)
                assert got.shape == ref.shape, (kw, num_frames)
                assert torch.equal(got, ref), (kw, num_frames)
    # an all-empty batch
    idx = torch.tensor([0, 5, 10])
    for kw in FAST:
        frame = ToFrame(sensor, **kw)
        assert torch.equal(frame.batch_from_store(store, idx, num_frames=4), reference(frame, store, idx, 4))


def test_other_modes_fall_back():
    store = random_store(np.random.default_rng(0), (50, 1, 1), False)
    for kw in SLOW:
        assert ToFrame((50, 1, 1), **kw).batch_from_store(store, torch.arange(4), num_frames=3) is None
    host = EventStore(store.events, store.offsets_host, store.targets.numpy(), store.sensor_size)
    assert ToFrame((50, 1, 1), time_window=10).batch_from_store(host, torch.arange(4)) is None


def test_fast_path_after_downsample():
    rng = np.random.default_rng(3)
    sensor = (64, 32, 2)
    down = Downsample(time_factor=0.5, spatial_factor=0.25)
    raw = random_store(rng, sensor, True)
    out_sensor = down.output_sensor_size(sensor)
    samples = [(raw.sample(i), 0) for i in range(len(raw))]
    store = EventStore.from_samples(samples, out_sensor, transform=down, progress=False).to("cpu", resident=True)
    frame = ToFrame(out_sensor, time_window=25, start_time=0, include_incomplete=True)
    idx = torch.arange(len(store)).flip(0)
    assert torch.equal(frame.batch_from_store(store, idx, num_frames=50), reference(frame, store, idx, 50))


def test_dataset_uses_fast_path_and_matches():
    rng = np.random.default_rng(5)
    store = random_store(rng, (50, 1, 1), False)
    frame = ToFrame((50, 1, 1), time_window=100, start_time=0, include_incomplete=True)
    ds = EventSpikeDataset(store, frame, 20, (50,))
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(store), generator=torch.Generator().manual_seed(0))
    for i, (x, y) in enumerate(ds.batches(8, shuffle=True, generator=gen)):
        idx = order[8 * i:8 * i + 8]
        assert torch.equal(x, reference(frame, store, idx, 20).reshape(20, len(idx), 50))
        assert torch.equal(y, store.targets[idx])


def _no_sync(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("host sync in the fast path")
    for name in ("item", "tolist", "__int__", "__bool__", "__float__", "nonzero", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, boom)


@pytest.mark.parametrize("kw", [dict(time_window=4000, start_time=0, include_incomplete=True), dict(n_time_bins=25)])
@pytest.mark.parametrize("sensor", [(700, 1, 1), (13, 9, 2)])
def test_fast_path_has_no_sync_and_few_ops(monkeypatch, kw, sensor):
    rng = np.random.default_rng(7)
    store = random_store(rng, sensor, sensor[1] > 1, samples=64)
    frame = ToFrame(sensor, **kw)
    idx = rng.permutation(64)[:32]  # host indices (numpy), as `SpikeDataset.batches` hands them over
    store.first_last_t()  # built once per store, not per batch
    with pytest.MonkeyPatch.context() as m:
        _no_sync(m)
        frame.batch_from_store(store, idx, num_frames=25)
    batches = 5
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(batches):
            frame.batch_from_store(store, idx, num_frames=25)
    ops = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in ops if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    views = {"aten::select", "aten::slice", "aten::view", "aten::expand", "aten::lift_fresh", "aten::alias", "aten::unbind"}
    compute = sorted(e.name for e in top if e.name not in views)
    extra = 2 * (sensor[1] > 1) + 2 * (sensor[2] > 1)  # a gather and an add for y, for p
    assert len(top) / batches <= 29 + extra, sorted(e.name for e in top)
    assert len(compute) / batches <= 18 + extra, compute  # the general path: ~130 per batch
    assert compute.count("aten::index_add_") == batches
    for sync in ("aten::item", "aten::_local_scalar_dense", "aten::nonzero"):
        assert sync not in {e.name for e in ops}
