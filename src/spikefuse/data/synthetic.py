"""An event data set with SHD's shapes, for benchmarks and tests without the download.

700 channels, 20 classes, 8156 train / 2264 test samples of 0.8-1.2 s with microsecond
timestamps, events (t int64, x int16, p int8 = 1) like tonic's SHD. Each class has its
own "formants": a few smooth channel-vs-time tracks that its samples scatter events
around, with per-sample tempo, channel shift and background noise, so it is learnable
but not trivial. Sample i depends only on (seed, split, i): any sample can be made alone.
"""
from __future__ import annotations

import numpy as np

from .events import event_dtype

SENSOR_SIZE = (700, 1, 1)
NUM_CLASSES = 20
SPLIT_SIZES = {"train": 8156, "test": 2264}
FORMANTS = 3
# the targets are drawn at construction (a generator per run of classes): 2**70 samples never
# finished; past MAX_EVENTS a sample's events overflowed numpy's Poisson draw at indexing
MAX_SAMPLES, MAX_EVENTS = 10**8, 10**9


def split_size(split: str, sizes: dict, samples, seed) -> int:
    """The sample count of a generated set's split, its arguments checked (shared by the
    synthetic image and event sets)."""
    if split not in sizes:
        raise ValueError(f"split: expected one of {list(sizes)}, got {split!r}")
    n = sizes[split] if samples is None else samples
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"samples: expected a positive int (at most 10**8) or None, got {samples!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed: expected an int, got {seed!r}")
    return n


def check_mean_events(mean_events) -> int:
    """A generated sample's mean event count, a positive int up to MAX_EVENTS (shared by the
    synthetic event sets)."""
    if not isinstance(mean_events, int) or isinstance(mean_events, bool) or not 1 <= mean_events <= MAX_EVENTS:
        raise ValueError(f"mean_events: expected a positive int (at most 10**9), got {mean_events!r}")
    return mean_events


def balanced_targets(key: tuple, num_classes: int, n: int) -> np.ndarray:
    """n labels in which each run of num_classes samples holds every class once, in an order
    drawn for that run from (key, 1, run)."""
    runs = [np.random.default_rng([*key, 1, r]).permutation(num_classes) for r in range(-(-n // num_classes))]
    return np.concatenate(runs)[:n]


class SyntheticSHD:
    """Indexable like a Tonic data set: `ds[i] -> (events, target)`."""

    sensor_size = SENSOR_SIZE
    dtype = event_dtype(has_y=False)
    version = 1  # part of the cache key: bump it when the events change

    def __init__(self, split: str = "train", *, samples: int | None = None, seed: int = 0,
                 mean_events: int = 3000, noise: float = 0.1):
        # checked here as the other synthetic sets check theirs: a NaN noise or mean_events used to fail
        # only at indexing, inside numpy; int() truncated samples=2.5; a negative seed failed in numpy
        n = split_size(split, SPLIT_SIZES, samples, seed)
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise <= 1:
            raise ValueError(f"noise: expected a share of background events in [0, 1], got {noise!r}")
        self.split, self.seed, self.mean_events, self.noise = split, seed, check_mean_events(mean_events), noise
        key = seed % 2**64  # numpy seeds are >= 0
        # class templates come from the seed alone, so train and test share them
        rng = np.random.default_rng([key, 7001])
        shape = (NUM_CLASSES, FORMANTS)
        self.templates = {
            "start": rng.uniform(60, 640, shape),  # channel at the start of the track
            "end": rng.uniform(60, 640, shape),  # ... and at its end
            "wobble": rng.uniform(0, 60, shape),  # amplitude of a slow sinusoidal bend
            "freq": rng.uniform(0.5, 2.0, shape),
            "onset": rng.uniform(0.0, 0.4, shape),  # fraction of the sample the track is silent before
            "weight": rng.dirichlet(np.ones(FORMANTS), NUM_CLASSES),
        }
        split_id = list(SPLIT_SIZES).index(split)
        self.targets = np.random.default_rng([key, 7002, split_id]).permutation(np.arange(n) % NUM_CLASSES)
        self._split_id = split_id

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} samples")
        cls = int(self.targets[i])
        rng = np.random.default_rng([self.seed % 2**64, 7003, self._split_id, i])
        tp = {k: v[cls] for k, v in self.templates.items()}
        duration = rng.uniform(0.8, 1.2)  # seconds
        n = rng.poisson(self.mean_events * duration)
        # which formant each event belongs to; the last choice is background noise
        probs = np.append(tp["weight"] * (1 - self.noise), self.noise)
        which = rng.choice(FORMANTS + 1, size=n, p=probs)
        signal = which < FORMANTS
        k = np.minimum(which, FORMANTS - 1)
        u = tp["onset"][k] + rng.random(n) * (1 - tp["onset"][k])  # position in the utterance, 0..1
        shift = rng.normal(0, 10)  # a "speaker" moves all formants together
        centre = tp["start"][k] + (tp["end"][k] - tp["start"][k]) * u \
            + tp["wobble"][k] * np.sin(2 * np.pi * tp["freq"][k] * u) + shift
        channel = np.where(signal, centre + rng.normal(0, 6, n), rng.uniform(0, 700, n))
        u = np.where(signal, u, rng.random(n))
        events = np.empty(n, dtype=self.dtype)
        t = (u * duration * 1e6).astype(np.int64)
        order = np.argsort(t, kind="stable")
        events["t"] = t[order]
        events["x"] = np.clip(channel, 0, 699).astype(np.int16)[order]
        events["p"] = 1
        return events, cls
