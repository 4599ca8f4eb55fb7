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
    with pytest.raises(ValueError, match="time_window: must be a finite number > 0"):
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


# ---- issue 36: every number checked where it enters (the constructor), by name ----

NOT_NUMBERS = [float("inf"), float("-inf"), float("nan"), True, "10", [10]]
COUNTS = ["event_count", "n_time_bins", "n_event_bins"]


@pytest.mark.parametrize("mode", ["time_window", *COUNTS])
@pytest.mark.parametrize("value", [*NOT_NUMBERS, 0, -3, 2**70, 1e300])
def test_framing_modes_refuse_bad_numbers_at_construction(mode, value):
    # inf, NaN and 2**70 used to pass the constructor and fail inside the first call
    kind = "a finite number" if mode == "time_window" else "an integer"
    with pytest.raises(ValueError, match=rf"^{mode}: must be {kind} > 0 and at most 2\*\*62, got "):
        ToFrame((4, 1, 1), **{mode: value})


@pytest.mark.parametrize("mode", COUNTS)
def test_counts_refuse_fractions_and_take_whole_floats(mode):
    with pytest.raises(ValueError, match=rf"^{mode}: must be an integer > 0"):
        ToFrame((4, 1, 1), **{mode: 2.5})
    frame = ToFrame((4, 1, 1), **{mode: np.float64(2.0)})
    assert getattr(frame, mode) == 2 and type(getattr(frame, mode)) is int
    assert frame(events([0, 1, 2, 3], [0, 1, 2, 3])).shape[1:] == (1, 4)


@pytest.mark.parametrize("field", ["start_time", "end_time"])
@pytest.mark.parametrize("value", [*NOT_NUMBERS, 2**70, -(2**70)])
def test_start_and_end_time_refuse_bad_numbers_at_construction(field, value):
    with pytest.raises(ValueError, match=rf"^{field}: must be a finite number >= -2\*\*62 and at most 2\*\*62"):
        ToFrame((4, 1, 1), time_window=10, **{field: value})


@pytest.mark.parametrize("value", [*NOT_NUMBERS, -1])
def test_overlap_refuses_bad_numbers(value):
    with pytest.raises(ValueError, match="^overlap: must be a finite number >= 0"):
        ToFrame((4, 1, 1), time_window=10, overlap=value)


@pytest.mark.parametrize("sensor", [(float("inf"), 1, 1), (float("nan"), 1, 1), (4.5, 1, 1), (0, 1, 1), (True, 1, 1),
                                    (2**31, 1, 1), (4, 1), "abc", None])
def test_sensor_size_refuses_bad_values(sensor):
    with pytest.raises(ValueError, match=r"^sensor_size: expected 3 positive ints \(W, H, P\)"):
        ToFrame(sensor, time_window=10)


@pytest.mark.parametrize("field", ["time_factor", "spatial_factor"])
@pytest.mark.parametrize("value", [*NOT_NUMBERS, 0, -0.5, 1e300])
def test_downsample_refuses_bad_factors_at_construction(field, value):
    # time_factor=inf used to give INT64_MIN timestamps
    with pytest.raises(ValueError, match=rf"^{field}: must be a finite number > 0"):
        Downsample(**{field: value})
    if field == "spatial_factor":
        with pytest.raises(ValueError, match=rf"^{field}: must be a finite number > 0"):
            Downsample(spatial_factor=(0.5, value))


def test_downsample_refuses_bad_sizes_and_results_that_overflow():
    with pytest.raises(ValueError, match=r"spatial_factor: expected one factor or \(fx, fy\)"):
        Downsample(spatial_factor=(0.5, 0.5, 0.5))
    for size in [(0, 4), (2.5, 4), (float("inf"), 4)]:
        with pytest.raises(ValueError, match="^target_size: must be an integer > 0"):
            Downsample(sensor_size=(8, 8, 2), target_size=size)
    with pytest.raises(ValueError, match=r"^target_size: expected \(W', H'\)"):
        Downsample(sensor_size=(8, 8, 2), target_size=(4,))
    with pytest.raises(ValueError, match="^sensor_size: expected 3 positive ints"):
        Downsample(sensor_size=(8, float("nan"), 2), target_size=(4, 4))
    # finite factors whose result leaves the column's dtype: refused on the CPU, not wrapped
    with pytest.raises(ValueError, match=r"^time_factor: 1099511627776 scales t to 1\.2\d+e\+24, beyond its torch.int64"):
        Downsample(time_factor=2**40)(events([2**40], [1]))
    with pytest.raises(ValueError, match=r"^spatial_factor: 10000\.0 scales x to 100000, beyond its torch.int16"):
        Downsample(spatial_factor=1e4)(events([0, 1], [10, 3]))
    assert Downsample(time_factor=2**20)(events([2**40], [1]))["t"].item() == 2**60


@pytest.mark.parametrize("target", [2.5, -1, float("nan"), float("inf"), -0.5, 2**70, "a"])
def test_targets_that_are_not_class_indices_are_refused_naming_the_sample(target):
    from spikefuse.data import DenseSpikeDataset, EventStore, StaticImageDataset

    message = r"^targets: (sample 1 has target|expected integer class indices >= 0)"
    with pytest.raises(ValueError, match=message):
        EventStore.from_samples([(events([0], [1]), 0), (events([0], [2]), target)], (4, 1, 1), progress=False)
    if isinstance(target, float):  # what a tensor of targets can hold
        with pytest.raises(ValueError, match=message):
            DenseSpikeDataset(torch.zeros(2, 3, 4), torch.tensor([0.0, target, 1.0]))
        with pytest.raises(ValueError, match=message):
            StaticImageDataset(torch.zeros(3, 4), torch.tensor([0.0, target, 1.0]), time_steps=2)
        with pytest.raises(ValueError, match=message):
            EventStore(events([0, 1, 2], [1, 2, 3]), np.array([0, 1, 2, 3]), np.array([0.0, target, 1.0]), (4, 1, 1))


def test_whole_number_targets_of_any_numeric_type_are_accepted():
    from spikefuse.data import DenseSpikeDataset, EventStore

    store = EventStore.from_samples([(events([0], [1]), np.int16(2)), (events([0], [2]), torch.tensor(1)),
                                     (events([0], [3]), 3.0)], (4, 1, 1), progress=False)
    assert store.targets.tolist() == [2, 1, 3] and store.targets.dtype == torch.int64
    assert DenseSpikeDataset(torch.zeros(2, 2, 4), torch.tensor([1.0, 0.0])).targets.dtype == torch.int64
    with pytest.raises(ValueError, match=r"targets: expected one class index per sample \(1-D\)"):
        DenseSpikeDataset(torch.zeros(2, 2, 4), torch.zeros(2, 3))  # one-hot


def test_load_of_objects_refuses_negative_and_fractional_targets():
    class Set(torch.utils.data.Dataset):
        sensor_size = (4, 1, 1)

        def __init__(self, bad):
            self.bad = bad

        def __len__(self):
            return 3

        def __getitem__(self, i):
            return events([0, 1], [0, 1]), self.bad if i == 2 else i

    with pytest.raises(ValueError, match=r"targets: sample 2 has target -1; expected a class index"):
        data.load(Set(-1), test=Set(0), time_steps=2)
    with pytest.raises(TypeError, match=r"item 2 has target 1.5"):
        data.load(Set(1.5), test=Set(0), time_steps=2)


@pytest.mark.parametrize("steps", [float("nan"), 2.5, "3", True, 0, -1, 2**70])
def test_datasets_refuse_time_steps_that_are_not_a_count(steps):
    """int() truncated 2.5 to 2 steps and read "3" and True as steps; NaN raised int()'s error;
    0 and -1 made a static set that its model could not use, or failed at the first batch."""
    from spikefuse.data import EventSpikeDataset, EventStore, StaticImageDataset

    with pytest.raises(ValueError, match=r"^time_steps must be an int"):
        StaticImageDataset(torch.zeros(2, 4), torch.tensor([0, 1]), steps)
    store = EventStore(events([0, 1, 0], [0, 1, 2]), np.array([0, 2, 3]), np.array([0, 1]), (4, 1, 1))
    with pytest.raises(ValueError, match=r"^time_steps must be an int"):
        EventSpikeDataset(store, ToFrame((4, 1, 1), time_window=1), steps, (4,))


@pytest.mark.parametrize("shape, words", [((5,), r"input_shape: \(5,\) holds 5 values per step, but frame's "
                                                   r"sensor_size \(4, 1, 1\) gives 4"),
                                          ((0,), "input_shape must be an int"), ((4.0,), "input_shape must be an int"),
                                          (4, "input_shape must be a tuple of ints")])
def test_an_event_set_refuses_an_input_shape_its_frames_do_not_fill(shape, words):
    """The batches' view raised torch's "shape '[2, 2, 5]' is invalid for input of size 16"."""
    from spikefuse.data import EventSpikeDataset, EventStore

    store = EventStore(events([0, 1, 0], [0, 1, 2]), np.array([0, 2, 3]), np.array([0, 1]), (4, 1, 1))
    with pytest.raises(ValueError, match=rf"^{words}"):
        EventSpikeDataset(store, ToFrame((4, 1, 1), time_window=1), 2, shape)
    x, _ = next(EventSpikeDataset(store, ToFrame((4, 1, 1), time_window=1), 2, (1, 4)).batches(2, shuffle=False))
    assert x.shape == (2, 2, 1, 4)
