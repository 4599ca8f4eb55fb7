"""Bad events, parameters and names raise a ValueError/TypeError that names the argument."""
import numpy as np
import pytest
import torch

import spikefuse.data as data
from spikefuse.data import Downsample, ToFrame
from spikefuse.data.events import pack

DT = [("t", np.int64), ("x", np.int16), ("p", np.int8)]


def events(t, x, p=None):
    ev = np.zeros(len(t), dtype=DT)
    ev["t"], ev["x"], ev["p"] = t, x, 1 if p is None else p
    return ev


def test_missing_field():
    ev = np.zeros(3, dtype=[("t", np.int64), ("x", np.int16)])
    with pytest.raises(ValueError, match=r"events: missing field\(s\) \['p'\]"):
        ToFrame((4, 1, 1), time_window=10)(ev)
    with pytest.raises(ValueError, match="missing field"):
        ToFrame((4, 1, 1), time_window=10)({"t": torch.arange(3), "p": torch.ones(3)})


def test_not_structured_or_float_time():
    with pytest.raises(TypeError, match="events: expected a structured numpy array"):
        ToFrame((4, 1, 1), time_window=10)(np.zeros((3, 3)))
    with pytest.raises(TypeError, match="events"):
        ToFrame((4, 1, 1), time_window=10)([1, 2, 3])
    with pytest.raises(TypeError, match="'t' must be integer"):
        ToFrame((4, 1, 1), time_window=10)({"t": torch.rand(3), "x": torch.zeros(3), "p": torch.ones(3)})


def test_negative_and_unsorted_timestamps():
    with pytest.raises(ValueError, match="negative timestamps"):
        ToFrame((4, 1, 1), time_window=10)(events([-5, 0, 3], [0, 1, 2]))
    with pytest.raises(ValueError, match="sorted within each sample"):
        ToFrame((4, 1, 1), time_window=10)(events([5, 0, 3], [0, 1, 2]))
    with pytest.raises(ValueError, match="sorted"):
        ToFrame((4, 1, 1), n_time_bins=2)(events([5, 0, 3], [0, 1, 2]))
    # slicing by event count does not look at time order, so unsorted is fine there (as in tonic)
    assert ToFrame((4, 1, 1), event_count=2)(events([5, 0, 3], [0, 1, 2])).sum() == 2
    # a drop in time across a sample boundary is no disorder
    cols, offsets = pack([events([10, 15], [0, 1]), events([0, 5], [2, 3])])
    assert ToFrame((4, 1, 1), time_window=10).batch(cols, offsets).sum() == 4


def test_sensor_too_small():
    with pytest.raises(ValueError, match=r"sensor_size: events have x in \[0, 9\]"):
        ToFrame((4, 1, 1), time_window=10)(events([0, 1], [0, 9]))
    ev = np.zeros(2, dtype=[("t", np.int64), ("x", np.int16), ("y", np.int16), ("p", np.int8)])
    ev["y"] = [0, 7]
    with pytest.raises(ValueError, match="sensor_size: events have y"):
        ToFrame((4, 4, 2), time_window=10)(ev)
    with pytest.raises(ValueError, match="sensor_size: events have p"):
        ToFrame((4, 1, 2), time_window=10)(events([0, 1], [0, 1], p=[0, 3]))
    with pytest.raises(ValueError, match="single polarity"):
        ToFrame((4, 1, 1), time_window=10)(events([0, 1], [0, 1], p=[0, 1]))


def test_bad_parameters():
    with pytest.raises(ValueError, match="exactly one of"):
        ToFrame((4, 1, 1))
    with pytest.raises(ValueError, match="exactly one of"):
        ToFrame((4, 1, 1), time_window=10, n_time_bins=3)
    with pytest.raises(ValueError, match="time_window: must be > 0"):
        ToFrame((4, 1, 1), time_window=0)
    with pytest.raises(ValueError, match="overlap"):
        ToFrame((4, 1, 1), time_window=10, overlap=10)
    with pytest.raises(ValueError, match="overlap"):
        ToFrame((4, 1, 1), n_time_bins=3, overlap=1.0)
    with pytest.raises(ValueError, match="sensor_size"):
        ToFrame((4, 1), time_window=10)
    with pytest.raises(ValueError, match="num_frames"):
        ToFrame((4, 1, 1), time_window=10).batch(events([0], [0]), [0, 1], num_frames=0)
    with pytest.raises(ValueError, match="offsets"):
        ToFrame((4, 1, 1), time_window=10).batch(events([0, 1], [0, 1]), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="spatial_factor"):
        Downsample(spatial_factor=0)
    with pytest.raises(ValueError, match="sensor_size"):
        Downsample(target_size=(10, 10))


def test_load_errors():
    with pytest.raises(ValueError, match="valid names: digits, digits-latency, randman, shd-synthetic, shd"):
        data.load("mnist")
    with pytest.raises(ValueError, match="time_steps"):
        data.load("digits", time_steps=0)
    splits = data.load("digits", time_steps=2)
    with pytest.raises(ValueError, match="batch_size"):
        next(splits.train.batches(0, shuffle=False))


# ---- issue 14: the event store refuses what it would store wrongly; sizes checked before allocating ----

def xy_events(x, y=None, p=None, t=None):
    n = len(x)
    cols = {"t": np.arange(n) if t is None else np.asarray(t), "x": np.asarray(x, dtype=np.int64),
            "p": np.ones(n, dtype=np.int64) if p is None else np.asarray(p, dtype=np.int64)}
    if y is not None:
        cols["y"] = np.asarray(y, dtype=np.int64)
    return cols


@pytest.mark.parametrize("sensor, samples, match", [
    # x = 65541 used to be stored as 5 in an int16 column: inside the sensor, silently wrong
    ((700, 1, 1), [xy_events([1, 2]), xy_events([3, 65541, 4])], r"sample 1 has x = 65541 \(event 1\), outside 0..699"),
    ((34, 34, 2), [xy_events([1], y=[40], p=[0])], r"sample 0 has y = 40 \(event 0\), outside 0..33"),
    ((34, 34, 2), [xy_events([1, 1], y=[0, 0], p=[0, 2])], r"sample 0 has p = 2 .* 2 polarities"),
    ((700, 1, 1), [xy_events([1, 1], p=[300, 300])], r"sample 0 has p = 300 .* outside -128..127"),  # int8 wrap
    ((700, 1, 1), [xy_events([1], t=[-4])], r"sample 0 has t = -4"),
    ((700, 1, 1), [{"t": np.arange(2), "x": np.array([1.0, 2.5]), "p": np.ones(2)}], r"x = 2.5 .* whole number"),
    ((700, 1, 1), [{"t": np.array([2**64 - 1], np.uint64), "x": np.zeros(1), "p": np.ones(1)}], "more than an int64"),
])
def test_packing_refuses_events_outside_the_sensor_or_dtype(sensor, samples, match):
    from spikefuse.data import EventStore

    with pytest.raises(ValueError, match=match):
        EventStore.from_samples([(s, 0) for s in samples], sensor, progress=False)


@pytest.mark.parametrize("first_has_y", [True, False])
def test_packing_refuses_samples_with_different_fields(first_has_y):
    from spikefuse.data import EventStore

    with_y, without = xy_events([1], y=[2]), xy_events([1])
    samples = [(with_y, 0), (without, 1)] if first_has_y else [(without, 0), (with_y, 1)]
    with pytest.raises(ValueError, match="sample 1 has fields t, x, (y, )?p but sample 0 has"):
        EventStore.from_samples(samples, (4, 4, 1), progress=False)  # used to drop y silently (or KeyError)
    with pytest.raises(ValueError, match="sample 1 has fields"):
        pack([s for s, _ in samples])


def test_framing_refuses_absurd_frame_counts_before_allocating():
    ev = events([0, 5, 2**62], [0, 1, 2])  # a recording 2**62 µs long
    # one-second windows from t = 0 (SHD's framing): 4.6e12 frames of a 36 TB table
    with pytest.raises(ValueError, match=r"time_window=1000000, start_time=0\): 4611686018427 windows .* "
                                         r"needs about .* memory, .* available; use a larger time_window"):
        ToFrame((4, 1, 1), time_window=10**6, start_time=0)(ev)
    with pytest.raises(ValueError, match="windows .* use fewer n_time_bins"):
        ToFrame((4, 1, 1), n_time_bins=10**13)(ev)
    with pytest.raises(ValueError, match="windows"):  # a window so small its count overflows int64
        ToFrame((4, 1, 1), time_window=1e-9)(ev)
    # a 2**62 µs window is one frame; with num_frames only the frames kept are ever built
    assert ToFrame((4, 1, 1), time_window=2**62)(ev).shape == (1, 1, 4)
    frames = ToFrame((4, 1, 1), time_window=1, start_time=0).batch(ev, torch.tensor([0, 3]), num_frames=7)
    assert frames.shape == (7, 1, 1, 4) and frames[0, 0, 0, 0] == frames[5, 0, 0, 1] == frames.sum() - 1 == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_load_on_cuda_without_cuda():
    with pytest.raises(ValueError, match="device: 'cuda' requested but this PyTorch build has no CUDA support"):
        data.load("digits", device="cuda")  # used to be torch's AssertionError
    with pytest.raises(ValueError, match="device"):
        data.load("digits", device="tpu")


def test_load_refuses_more_memory_than_there_is(monkeypatch):
    from spikefuse.data import memory

    with pytest.raises(ValueError, match=r"encoding digits at 1000000000 time steps needs about 1.15 PB of host memory"):
        data.load("digits", time_steps=10**9)  # more than any machine: refused without the patch below
    monkeypatch.setattr(memory, "available_bytes", lambda device, **_: 8 * 10**9)
    with pytest.raises(ValueError, match="needs about 115 GB of host memory, 8 GB is available; lower time_steps"):
        data.load("digits", time_steps=100_000)
    with pytest.raises(ValueError, match="seed"):
        data.load("digits", seed=2**70)
