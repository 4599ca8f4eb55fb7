"""Several batches made in one pass (`SpikeDataset.batches(group=...)`, `ToFrame.batches`,
`ToFrame.batches_from_store`): the very batches of one-at-a-time framing, each contiguous."""
import numpy as np
import pytest
import torch

import spikefuse.data.dataset as dataset_mod
from spikefuse.data import EventStore, ToFrame
from spikefuse.data.dataset import MAX_GROUP, DenseSpikeDataset, EventSpikeDataset
from test_data_fastpath import random_store

SENSOR = (13, 9, 2)
SAMPLES = 37  # 4 full batches of 8 and a partial one
FAST = dict(time_window=100, start_time=0, include_incomplete=True)
SLOW = dict(event_count=10)


def one_at_a_time(ds, frame_one, batch_size, shuffle, drop_last, seed):
    """The batches as framing each on its own gives them, in the order `batches` draws."""
    n = len(ds)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    stop = n - n % batch_size if drop_last else n
    return [(frame_one(order[i:i + batch_size]), ds.targets[order[i:i + batch_size]])
            for i in range(0, stop, batch_size)]


def event_set(mode, resident=True):
    store = random_store(np.random.default_rng(11), SENSOR, True, samples=SAMPLES)
    if not resident:
        store = EventStore(store.events, store.offsets_host, store.targets.numpy(), store.sensor_size)
    frame = ToFrame(SENSOR, **mode)
    ds = EventSpikeDataset(store, frame, 12, (2, 9, 13))

    def frame_one(idx):
        cols, offsets = store.gather(idx)
        return frame.batch(cols, offsets, num_frames=12).reshape(12, len(idx), 2, 9, 13)
    return ds, frame_one


def dense_set(dtype):
    g = torch.Generator().manual_seed(3)
    data = (torch.rand(6, SAMPLES, 5, generator=g) < 0.3).to(dtype)
    ds = DenseSpikeDataset(data, torch.arange(SAMPLES) % 4)
    return ds, lambda idx: data.index_select(1, idx).to(torch.float32)


SETS = {
    "events-fast": lambda: event_set(FAST),
    "events-general": lambda: event_set(SLOW),
    "events-host-store": lambda: event_set(FAST, resident=False),
    "dense-uint8": lambda: dense_set(torch.uint8),
    "dense-float32": lambda: dense_set(torch.float32),
}


@pytest.mark.parametrize("kind", list(SETS))
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_grouped_batches_equal_one_at_a_time(kind, shuffle, drop_last):
    ds, frame_one = SETS[kind]()
    expected = one_at_a_time(ds, frame_one, 8, shuffle, drop_last, seed=5)
    for group in (1, 3, 100, None):
        gen = torch.Generator().manual_seed(5)
        got = list(ds.batches(8, shuffle=shuffle, generator=gen, drop_last=drop_last, group=group))
        assert len(got) == len(expected), group
        for (x, y), (ex, ey) in zip(got, expected):
            assert x.dtype == torch.float32 and x.is_contiguous(), group
            assert torch.equal(x, ex) and torch.equal(y, ey), (group, x.shape, ex.shape)


def test_frame_batches_split_as_one_at_a_time():
    store = random_store(np.random.default_rng(2), SENSOR, True, samples=SAMPLES)
    idx = torch.from_numpy(np.random.default_rng(4).permutation(SAMPLES)[:23])
    for mode in (FAST, dict(n_time_bins=5)):
        frame = ToFrame(SENSOR, **mode)
        cols, offsets = store.gather(idx)
        for batch_size in (1, 5, 23, 40):
            fast = frame.batches_from_store(store, idx, batch_size, num_frames=9)
            general = frame.batches(cols, offsets, batch_size, num_frames=9)
            heads = range(0, len(idx), batch_size)
            assert len(fast) == len(general) == len(heads)
            for head, a, b in zip(heads, fast, general):
                part = idx[head:head + batch_size]
                ref = frame.batch(*store.gather(part), num_frames=9)
                assert a.is_contiguous() and b.is_contiguous()
                assert torch.equal(a, ref) and torch.equal(b, ref)


def test_group_frames_once(monkeypatch):
    ds, _ = event_set(FAST)
    calls = []
    real = ds.frame.batches_from_store
    monkeypatch.setattr(ds.frame.__class__, "batches_from_store",
                        lambda self, *a, **k: calls.append(a[2]) or real(*a, **k))
    batches = list(ds.batches(8, shuffle=True, generator=torch.Generator().manual_seed(0), group=3))
    # the first batch alone (nothing overlaps its framing), then 3 batches, then the partial last
    assert len(batches) == 5 and calls == [8, 8, 8]


@pytest.mark.parametrize("group", [0, -2, 1.5, True, "4"])
def test_bad_group(group):
    ds, _ = dense_set(torch.uint8)
    with pytest.raises(ValueError, match="group"):
        next(ds.batches(8, shuffle=False, group=group))


def test_default_group_follows_the_byte_budget(monkeypatch):
    ds, _ = event_set(FAST)
    assert 1 <= ds.default_group(8) <= MAX_GROUP
    monkeypatch.setattr(dataset_mod, "GROUP_BYTES", 3 * ds.batch_bytes(8))
    assert ds.default_group(8) == 3
    monkeypatch.setattr(dataset_mod, "GROUP_BYTES", 1)
    assert ds.default_group(8) == 1  # a batch bigger than the budget is still made
    dense, _ = dense_set(torch.uint8)
    assert dense.batch_bytes(8) == 6 * 8 * 5 * (3 * 4 + 1)  # three groups of float32 frames, uint8 gathered


@pytest.mark.parametrize("n,batch,group", [(8156, 128, 64), (8156, 128, 14), (100, 128, 4), (25, 8, 2), (24, 8, 1)])
def test_groups_are_one_batch_then_fewest_passes(n, batch, group):
    from spikefuse.data.dataset import _group_edges
    edges = _group_edges(n, batch, group)
    assert edges[0] == 0 and edges[-1] == n and edges[1] == min(batch, n)
    sizes = [-(-(hi - lo) // batch) for lo, hi in zip(edges[1:], edges[2:])]
    rest = -(-(n - edges[1]) // batch)
    assert all(1 <= s <= group for s in sizes) and len(sizes) == -(-rest // group)  # fewest passes
    assert all(lo % batch == 0 for lo in edges[:-1])  # groups hold whole batches


@pytest.mark.parametrize("ahead", [True, False], ids=["on a GPU: made ahead", "on the CPU: made when needed"])
def test_the_next_group_is_made_once_the_first_batch_of_this_one_was_taken(ahead):
    """Made ahead, the second group's making waits until the consumer asks for the first group's
    second batch (it has run its first step): the first step follows the first group's making alone."""
    from spikefuse.data.dataset import _batches_of_groups
    log = []

    def launch(start):
        log.append(f"make {start}")
        return [f"y{start}.{i}" for i in range(2)], [f"x{start}.{i}" for i in range(2)]
    for x, y in _batches_of_groups(launch, lambda made: made, [0, 1, 2], ahead):
        log.append(f"step {x}")
    if ahead:
        assert log == ["make 0", "step x0.0", "make 1", "step x0.1", "step x1.0", "make 2", "step x1.1",
                       "step x2.0", "step x2.1"]
    else:
        assert log == ["make 0", "step x0.0", "step x0.1", "make 1", "step x1.0", "step x1.1", "make 2",
                       "step x2.0", "step x2.1"]

