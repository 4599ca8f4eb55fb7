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
