"""Event data sets read through Tonic (SHD, SSC, N-MNIST, DVS-Gesture).

Tonic downloads and parses the files; we only pack what it returns into an `EventStore`
(cached on disk) and frame it on the device. Without network and without the files,
`open_split` raises `DatasetUnavailable` saying where it looked and what to put there.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..errors import require
from .cache import check_root
from .events import as_columns
from .store import EventStore

PRE = "sorted_columns"  # the per-sample preprocessing `pack` applies (part of the cache keys)


class DatasetUnavailable(RuntimeError):
    """The files of a Tonic data set are neither on disk nor downloadable."""


@dataclass(frozen=True)
class TonicSet:
    tonic_class: str  # class name in tonic.datasets
    sensor_size: tuple[int, int, int]
    num_classes: int
    input_shape: tuple[int, ...]
    time_steps: int  # default number of frames
    framing: str  # "window": fixed-length windows over the first second; "bins": n_time_bins per sample
    description: str


TONIC_SETS = {
    "shd": TonicSet("SHD", (700, 1, 1), 20, (700,), 100, "window",
                    "Spiking Heidelberg Digits (Tonic download): 700 channels, 20 classes"),
    "ssc": TonicSet("SSC", (700, 1, 1), 35, (700,), 100, "window",
                    "Spiking Speech Commands (Tonic download): 700 channels, 35 classes"),
    "nmnist": TonicSet("NMNIST", (34, 34, 2), 10, (2, 34, 34), 30, "bins",
                       "N-MNIST (Tonic download): 34x34 DVS, 2 polarities, 10 classes"),
    "dvsgesture": TonicSet("DVSGesture", (128, 128, 2), 11, (2, 128, 128), 20, "bins",
                           "DVS128 Gesture (Tonic download): 128x128 DVS, 2 polarities, 11 classes"),
}


def _split_kwargs(tonic_class: str, split: str) -> dict:
    return {"split": split} if tonic_class == "SSC" else {"train": split == "train"}


def _source(cls, split: str) -> tuple[str, str]:
    """(url, archive file name) Tonic would fetch, read from the class's own attributes."""
    if hasattr(cls, f"{split}_zip"):  # SHD / SSC
        fname = getattr(cls, f"{split}_zip")
        return cls.base_url + fname, fname
    return getattr(cls, f"{split}_url", "?"), getattr(cls, f"{split}_filename", "?")


def open_split(name: str, split: str, root: str):
    """The Tonic data set object for one split (downloading if Tonic can)."""
    # checked before Tonic is imported or asked to download: an unknown name raised KeyError,
    # a NaN split went to the download, a non-path root raised os.fspath's TypeError
    if name not in TONIC_SETS:
        raise ValueError(f"name: unknown Tonic data set {name!r}; expected one of {list(TONIC_SETS)}")
    spec = TONIC_SETS[name]
    splits = ("train", "valid", "test") if spec.tonic_class == "SSC" else ("train", "test")
    if split not in splits:
        raise ValueError(f"split: expected one of {list(splits)} for {name}, got {split!r}")
    check_root(root)
    datasets = require("tonic.datasets", f"the {name} data set")
    cls = getattr(datasets, spec.tonic_class)
    root = os.path.expanduser(root)
    try:
        return cls(save_to=root, **_split_kwargs(spec.tonic_class, split))
    except Exception as e:  # whatever the download or parse failed with, say what to do about it
        url, fname = _source(cls, split)
        where = os.path.join(root, cls.__name__)
        raise DatasetUnavailable(
            f"{name} ({split} split) is not available: {type(e).__name__}: {e}\n"
            f"  looked in: {where}\n"
            f"  to place it by hand: download {url}\n"
            f"  and save it as {os.path.join(where, fname)}; Tonic checks its md5 and unpacks it on the next load"
        ) from e


def sorted_columns(events):
    """Events -> columns sorted by time (stable): time framing needs rising t within a sample."""
    cols = as_columns(events)
    t = cols["t"]
    if len(t) > 1 and bool((t[1:] < t[:-1]).any()):
        order = torch.argsort(t, stable=True)
        cols = {k: v[order] for k, v in cols.items()}
    return cols


def pack(src, sensor_size, desc: str, progress: bool = True) -> EventStore:
    """Pack a Tonic-style data set (len(src), src[i] -> (events, target)) into an EventStore,
    each sample's events sorted by time; a tqdm bar shows progress. Named Tonic sets and the
    data set objects given to `load` both take this path."""
    return EventStore.from_samples((src[i] for i in range(len(src))), sensor_size, total=len(src),
                                   transform=sorted_columns, desc=desc, progress=progress)
