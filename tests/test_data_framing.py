"""GPU framing (run here on CPU tensors) against tonic's ToFrame and Downsample: equal counts."""
import numpy as np
import pytest
import tonic.transforms as tt
import torch

from spikefuse.data import Downsample, ToFrame
from spikefuse.data.events import pack

SENSORS = {"1d": (50, 1, 1), "1d-2pol": (50, 1, 2), "2d": (13, 9, 2), "2d-1pol": (13, 9, 1)}


def stream(rng, n, sensor, two_d, tmax, t0=0):
    """Random events typed like tonic's: t int64 µs, x,y int16, p bool (2 polarities) or int8 1."""
    w, h, p = sensor
    fields = [("x", np.int16)] + ([("y", np.int16)] if two_d else []) + [("t", np.int64), ("p", bool if p > 1 else np.int8)]
    ev = np.zeros(n, dtype=fields)
    ev["x"] = rng.integers(0, w, n)
    if two_d:
        ev["y"] = rng.integers(0, h, n)
    # a coarse time grid puts many events exactly on window edges
    ev["t"] = np.sort(t0 + rng.integers(0, tmax // 10 + 1, n) * 10)
    ev["p"] = rng.integers(0, 2, n) if p > 1 else 1
    return ev


def modes(rng):
    yield dict(time_window=100)
    yield dict(time_window=100, include_incomplete=True)
    yield dict(time_window=float(rng.uniform(20, 300)), overlap=float(rng.uniform(0, 15)), include_incomplete=True)
    yield dict(time_window=120, overlap=40)
    yield dict(time_window=100, start_time=0, include_incomplete=True)
    yield dict(event_count=int(rng.integers(1, 30)))
    yield dict(event_count=10, overlap=4, include_incomplete=True)
    yield dict(n_time_bins=int(rng.integers(1, 12)))
    yield dict(n_time_bins=7, overlap=float(rng.uniform(0, 0.9)))
    yield dict(n_event_bins=int(rng.integers(1, 12)), overlap=float(rng.uniform(0, 0.9)))


def tonic_frames(sensor, kw, ev):
    return tt.ToFrame(sensor_size=sensor, **kw)(ev.copy())


@pytest.mark.parametrize("kind", list(SENSORS))
def test_single_sample_equals_tonic(kind):
    rng = np.random.default_rng(hash(kind) % 2**32)
    sensor = SENSORS[kind]
    two_d = kind.startswith("2d")
    for _ in range(25):
        ev = stream(rng, int(rng.integers(1, 300)), sensor, two_d, tmax=int(rng.integers(10, 3000)),
                    t0=int(rng.integers(0, 10**4)))
        for kw in modes(rng):
            ref = tonic_frames(sensor, kw, ev)
            got = ToFrame(sensor, **kw)(ev).numpy()
            assert got.shape == ref.shape, kw
            np.testing.assert_array_equal(got, ref, err_msg=str(kw))


def test_events_on_bin_edges():
    ev = np.array([(0, 1, 1), (1000, 2, 1), (2000, 3, 1), (2999, 4, 1), (3000, 5, 1)],
                  dtype=[("t", np.int64), ("x", np.int16), ("p", np.int8)])
    for kw in (dict(time_window=1000), dict(time_window=1000, include_incomplete=True),
               dict(n_time_bins=3), dict(time_window=1000, overlap=500)):
        np.testing.assert_array_equal(ToFrame((10, 1, 1), **kw)(ev).numpy(), tonic_frames((10, 1, 1), kw, ev))


@pytest.mark.parametrize("two_d", [False, True])
def test_batch_is_padded_stack_of_samples(two_d):
    """A batch (including empty samples) equals each sample framed alone, padded with zero frames."""
    rng = np.random.default_rng(3)
    sensor = (13, 9, 2) if two_d else (50, 1, 1)
    samples = [stream(rng, n, sensor, two_d, tmax=int(rng.integers(10, 4000)), t0=int(rng.integers(0, 10**6)))
               for n in (0, 5, 200, 1, 0, 77)]
    cols, offsets = pack(samples)
    for kw in modes(rng):
        batch = ToFrame(sensor, **kw).batch(cols, offsets)
        assert batch.dtype == torch.float32
        for i, ev in enumerate(samples):
            ref = tonic_frames(sensor, kw, ev)
            got = batch[:, i]
            steps = ref.shape[0]
            # tonic returns empty samples in another layout ((P, W, H)); its values are zeros
            np.testing.assert_array_equal(got[:steps].numpy().ravel(), ref.ravel(), err_msg=str(kw))
            assert not got[steps:].any()


def test_empty_sample_frame_count():
    ev = np.zeros(0, dtype=[("t", np.int64), ("x", np.int16), ("p", np.int8)])
    assert ToFrame((5, 1, 1), time_window=10)(ev).shape == (1, 1, 5)
    assert ToFrame((5, 1, 1), event_count=10)(ev).shape == (1, 1, 5)
    assert ToFrame((5, 1, 1), n_time_bins=4)(ev).shape == (4, 1, 5)
    assert ToFrame((5, 1, 1), n_event_bins=3)(ev).shape == (3, 1, 5)
    for kw in (dict(time_window=10), dict(n_time_bins=4), dict(n_event_bins=3)):
        assert ToFrame((5, 1, 1), **kw)(ev).shape[0] == tonic_frames((5, 1, 1), kw, ev).shape[0]


def test_num_frames_pads_and_cuts():
    rng = np.random.default_rng(4)
    samples = [stream(rng, 100, (50, 1, 1), False, tmax=5000) for _ in range(3)]
    cols, offsets = pack(samples)
    frame = ToFrame((50, 1, 1), time_window=100, include_incomplete=True)
    full = frame.batch(cols, offsets)
    assert torch.equal(frame.batch(cols, offsets, num_frames=7), full[:7])
    padded = frame.batch(cols, offsets, num_frames=len(full) + 5)
    assert torch.equal(padded[:len(full)], full) and not padded[len(full):].any()


def test_columns_of_tensors_accepted():
    rng = np.random.default_rng(5)
    ev = stream(rng, 100, (13, 9, 2), True, tmax=1000)
    cols = {k: torch.from_numpy(ev[k].copy()) for k in ev.dtype.names}
    kw = dict(time_window=50)
    np.testing.assert_array_equal(ToFrame((13, 9, 2), **kw)(cols).numpy(), tonic_frames((13, 9, 2), kw, ev))


@pytest.mark.parametrize("factor", [100 / 700, 0.25, 0.5, 1, (0.3, 0.7)])
@pytest.mark.parametrize("time_factor", [1, 1e-3, 0.37])
def test_downsample_equals_tonic(factor, time_factor):
    rng = np.random.default_rng(6)
    ev = stream(rng, 2000, (700, 700, 2), True, tmax=10**7)
    ref = tt.Downsample(time_factor=time_factor, spatial_factor=factor)(ev)
    got = Downsample(time_factor=time_factor, spatial_factor=factor)(ev)
    for k in "txy":
        assert got[k].numpy().dtype == ref[k].dtype
        np.testing.assert_array_equal(got[k].numpy(), ref[k])


def test_downsample_target_size_then_frame_equals_tonic():
    """The SHD recipe: 700 -> 100 channels, then 4 ms frames."""
    rng = np.random.default_rng(7)
    ev = stream(rng, 3000, (700, 1, 1), False, tmax=10**6)
    ref = tt.Compose([tt.Downsample(spatial_factor=100 / 700),
                      tt.ToFrame(sensor_size=(100, 1, 1), time_window=4000, include_incomplete=True)])(ev.copy())
    down = Downsample(spatial_factor=100 / 700)
    assert down.output_sensor_size((700, 1, 1)) == (100, 1, 1)
    got = ToFrame((100, 1, 1), time_window=4000, include_incomplete=True)(down(ev))
    np.testing.assert_array_equal(got.numpy(), ref)
    np.testing.assert_array_equal(
        Downsample(sensor_size=(700, 1, 1), target_size=(100, 1))(ev)["x"].numpy(),
        tt.Downsample(sensor_size=(700, 1, 1), target_size=(100, 1))(ev)["x"])
