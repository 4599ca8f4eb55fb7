"""Data from outside spikefuse: event data set objects for `load`, DataLoaders for the Trainer.

Data set objects (a Tonic data set, or any map-style torch Dataset whose items are
`(events, target)`, events a structured numpy array with fields t, x, [y], p):

    splits = spikefuse.data.load(tonic.datasets.NMNIST(root, train=True),
                                 test=tonic.datasets.NMNIST(root, train=False), time_steps=30)
    splits = spikefuse.data.load((train_ds, test_ds), time_steps=50, sensor_size=(700, 1, 1))

are packed once into the disk-cached event store, the same path the named Tonic sets take
(`tonic_sets.pack`), and framed per batch on the device. The cache entry is keyed by the
object's class, length, sensor size and a fingerprint of a few of its samples, so a second
`load` of the same data reuses it. Random transforms on the data set are applied once, at
packing time (and change the fingerprint, so such a set is packed again on every load).

DataLoaders yielding `(x, y)` batches go to `fit`/`Trainer` as they are, or as a pair
`(train_loader, test_loader)`; see `LoaderSplits`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from .events import check_flag, check_sensor_size

FINGERPRINT_SAMPLES = 16  # samples, evenly spaced and including the first and last, hashed into the cache key


# ---- data set objects, for load() ----

def split_pair(data, test, arg: str = "name"):
    """(train, test) from load's first argument and its `test` keyword."""
    if isinstance(data, (tuple, list)):
        if len(data) != 2:
            raise ValueError(f"{arg}: expected a (train, test) pair of data sets, got a {type(data).__name__} "
                             f"of {len(data)}")
        if test is not None:
            raise ValueError(f"test: given twice, as the second item of {arg} and as test=")
        data, test = data
    if test is None:
        raise ValueError(f"test: a data set object is one split; pass the test split too: "
                         f"load(train_set, test=test_set, ...) or load((train_set, test_set), ...)")
    check_dataset(data, "train" if arg == "name" else arg)
    check_dataset(test, "test")
    return data, test


def check_dataset(ds, arg: str) -> None:
    """A map-style data set: len() and [i]; a DataLoader or an iterable-style set is refused."""
    if isinstance(ds, torch.utils.data.DataLoader):
        raise TypeError(f"{arg}: got a DataLoader; load() packs data set objects (pass loader.dataset), "
                        "while fit()/Trainer take DataLoaders as they are")
    if isinstance(ds, torch.utils.data.IterableDataset) or not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise TypeError(f"{arg}: expected a data set name (str) or a map-style data set with __len__ and "
                        f"__getitem__ (a Tonic data set, a torch Dataset), got {type(ds).__name__}")
    if len(ds) == 0:
        raise ValueError(f"{arg}: the data set is empty")


class Checked:
    """A view of data set `ds` whose items are checked to be (structured events, integer target)."""

    def __init__(self, ds, arg: str):
        self.ds, self.arg = ds, arg

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        item = self.ds[i]
        expected = ("expected items (events, target), events a structured numpy array with fields "
                    "t, x, [y], p (as Tonic gives without a transform, or with one that keeps events)")
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            what = f"a {type(item).__name__} of {len(item)}" if isinstance(item, (tuple, list)) else type(item).__name__
            raise TypeError(f"{self.arg}: item {i} is {what}; {expected}")
        events, target = item
        if not isinstance(events, np.ndarray) or events.dtype.names is None:
            got = (f"a plain array of shape {events.shape}, dtype {events.dtype} (frames? drop the ToFrame "
                   "transform: framing happens on the device)" if isinstance(events, np.ndarray)
                   else type(events).__name__)
            raise TypeError(f"{self.arg}: item {i} holds events as {got}; {expected}")
        missing = [k for k in ("t", "x", "p") if k not in events.dtype.names]
        if missing:
            raise ValueError(f"{self.arg}: item {i}'s events lack field(s) {missing} (it has "
                             f"{list(events.dtype.names)}); {expected}")
        try:
            ok = np.ndim(target) == 0 and int(target) == target
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise TypeError(f"{self.arg}: item {i} has target {target!r}; expected one integer class index "
                            "(no one-hot target_transform)")
        return events, int(target)


def sensor_of(train, test, sensor_size) -> tuple[int, int, int]:
    """The sensor size: the `sensor_size` argument, else the data sets' own attribute (Tonic's)."""
    if sensor_size is None:
        sensor_size = getattr(train, "sensor_size", None)
        if sensor_size is None:
            raise ValueError(f"sensor_size: {type(train).__name__} has no sensor_size attribute; pass "
                             "sensor_size=(W, H, P), e.g. (700, 1, 1) for 700 audio channels")
        other = getattr(test, "sensor_size", None)
        if other is not None and tuple(other) != tuple(sensor_size):
            raise ValueError(f"sensor_size: the train set's is {tuple(sensor_size)} but the test set's is "
                             f"{tuple(other)}; pass sensor_size= to choose")
    return check_sensor_size(sensor_size)


def num_classes_of(train, stores, num_classes) -> int:
    """num_classes if given, else len(train.classes) (Tonic's), else the largest target + 1."""
    top = max(int(s.targets.max()) for s in stores)
    low = min(int(s.targets.min()) for s in stores)
    if low < 0:
        raise ValueError(f"targets: class indices must be >= 0, got {low}")
    if num_classes is None:
        classes = getattr(train, "classes", None)
        num_classes = len(classes) if classes else top + 1
        if top >= num_classes:  # classes lists something else; trust the targets
            num_classes = top + 1
    elif not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes: expected a positive int or None, got {num_classes!r}")
    elif top >= num_classes:
        raise ValueError(f"num_classes: {num_classes} given but a target is {top}")
    return num_classes


def input_shape_for(sensor_size, has_y: bool) -> tuple[int, ...]:
    """Frames' per-step shape as the framing lays them out: (P, H, W), or without y (W,) / (P, W)."""
    width, height, polarities = sensor_size
    if has_y:
        return (polarities, height, width)
    return (width,) if polarities == 1 else (polarities, width)


def cache_params(ds, arg: str, sensor_size, pre: str) -> dict:
    """What keys ds's cache entry: its class, length, sensor and a hash of a few samples."""
    checked = Checked(ds, arg)
    n = len(ds)
    picks = sorted({round(k * (n - 1) / max(FINGERPRINT_SAMPLES - 1, 1)) for k in range(FINGERPRINT_SAMPLES)})
    h = hashlib.sha256()
    for i in picks:
        events, target = checked[i]
        h.update(f"{i}:{target}:{events.dtype.descr}:{len(events)}:".encode())
        h.update(np.ascontiguousarray(events).tobytes())
    cls = type(ds)
    return {"object": f"{cls.__module__}.{cls.__qualname__}", "samples": n, "sensor": list(sensor_size),
            "fingerprint": h.hexdigest()[:32], "pre": pre}


def cache_name(ds) -> str:
    """A readable folder-name prefix for ds's cache entries."""
    return "obj-" + "".join(c if c.isalnum() else "_" for c in type(ds).__name__.lower())


# ---- DataLoaders, for the Trainer ----

class LoaderSplit:
    """A DataLoader yielding (x, y) seen as a split the Trainer iterates.

    batch_first=True (the default, what Tonic's `PadTensors()` / `PadTensors(batch_first=True)`
    gives): x is [B, T, ...]; batch_first=False: x is time-major [T, B, ...], as our own splits
    yield. Batches come out time-major, float32 and contiguous; y as int64 [B]. The loader's own
    batch size, sampler and shuffling apply (the Trainer's batch_size and data-order seed do not).
    """

    shardable = False  # the Trainer's data parallel slices our own splits' batches, not a loader's

    def __init__(self, loader, arg: str = "splits", batch_first: bool = True):
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise TypeError(f"{arg}: expected a torch.utils.data.DataLoader, got {type(loader).__name__}")
        check_flag("batch_first", batch_first)  # bool() took "no" as True: the layout read wrongly
        try:
            self.size = len(loader.dataset)
        except TypeError:
            raise TypeError(f"{arg}: the DataLoader's data set has no len(); the Trainer needs a sized "
                            "(map-style) data set") from None
        self.loader, self.arg, self.batch_first = loader, arg, batch_first

    def __len__(self) -> int:
        return self.size

    def batches(self, batch_size=None, *, shuffle=None, generator=None, drop_last=False, group=None):
        """The loader's batches as (x [T, B, ...] float32, y [B] int64); the arguments are the
        Trainer's and are ignored: the loader decides batch size and order."""
        for i, batch in enumerate(self.loader):
            yield self._convert(batch, i)

    def _convert(self, batch, i: int):
        layout = ("batch-first [B, T, ...] (Tonic's PadTensors(batch_first=True), the default here)"
                  if self.batch_first else "time-major [T, B, ...] (batch_first=False)")
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"{self.arg}: batch {i} is a {type(batch).__name__}"
                            f"{f' of {len(batch)}' if isinstance(batch, (tuple, list)) else ''}; "
                            "expected (x, y) pairs of tensors")
        x, y = batch
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError(f"{self.arg}: batch {i} holds ({type(x).__name__}, {type(y).__name__}); "
                            "expected (x, y) tensors (collate events into frames, e.g. tonic's ToFrame "
                            "transform with PadTensors)")
        if x.is_sparse:
            x = x.to_dense()
        y = y.reshape(-1) if y.dim() > 1 and y.shape[-1] == 1 else y
        axis = 0 if self.batch_first else 1
        if y.dim() != 1 or x.dim() < 3 or x.shape[axis] != len(y):
            raise ValueError(f"{self.arg}: batch {i} has x of shape {list(x.shape)} and y of shape "
                             f"{list(y.shape)}; expected x {layout} with at least one feature dimension, "
                             "and y [B] class indices")
        if y.is_floating_point() or y.dtype == torch.bool:
            raise TypeError(f"{self.arg}: batch {i} has y of dtype {y.dtype}; expected integer class indices")
        if self.batch_first:
            x = x.transpose(0, 1)
        return x.to(torch.float32).contiguous(), y.to(torch.int64)


@dataclass
class LoaderSplits:
    """Splits made of DataLoaders: `.train`, `.test` (or None: no evaluation); the shapes
    the named splits carry are unknown here (None)."""

    train: LoaderSplit
    test: LoaderSplit | None
    name: str = "dataloader"
    num_classes: int | None = None
    input_shape: tuple[int, ...] | None = None
    time_steps: int | None = None


def loader_splits(train, test=None, *, batch_first: bool = True) -> LoaderSplits:
    """Splits for fit()/Trainer from DataLoaders yielding (x, y): x batch-first [B, T, ...] by
    default (Tonic's PadTensors()), or time-major [T, B, ...] with batch_first=False. Without a
    test loader the Trainer trains only (no test metrics)."""
    return LoaderSplits(LoaderSplit(train, "train", batch_first),
                        None if test is None else LoaderSplit(test, "test", batch_first))


def as_splits(splits, batch_first: bool = True):
    """What the Trainer iterates: our splits (anything with .train/.test) as they are; a
    DataLoader (trained on, no evaluation) or a (train_loader, test_loader) pair wrapped."""
    DataLoader = torch.utils.data.DataLoader
    if isinstance(splits, DataLoader):
        return LoaderSplits(LoaderSplit(splits, "splits", batch_first), None)
    if isinstance(splits, (tuple, list)):
        if len(splits) != 2 or not all(isinstance(s, DataLoader) for s in splits):
            raise TypeError(f"splits: expected a (train_loader, test_loader) pair of DataLoaders, got "
                            f"({', '.join(type(s).__name__ for s in splits)})")
        return LoaderSplits(LoaderSplit(splits[0], "splits[0] (train)", batch_first),
                            LoaderSplit(splits[1], "splits[1] (test)", batch_first))
    if hasattr(splits, "train") and hasattr(splits, "test"):
        return splits
    raise TypeError(f"splits: expected spikefuse.data.load(...)'s splits, a DataLoader or a (train_loader, "
                    f"test_loader) pair, got {type(splits).__name__}")


def as_split(data, arg: str = "data", batch_first: bool = True):
    """One split to evaluate: a DataLoader wrapped, anything else as it is."""
    if isinstance(data, torch.utils.data.DataLoader):
        return LoaderSplit(data, arg, batch_first)
    return data
