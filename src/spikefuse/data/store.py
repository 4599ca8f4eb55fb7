"""A whole split packed CSR-style: one contiguous event array, int64 offsets, targets.

Sample i is events[offsets[i]:offsets[i+1]]. On disk: three .npy files read memory-mapped.
In use, either on the host (batches gathered from the memory map, then sent to `device`
to be framed there) or resident on the device as column tensors (batches gathered with
index arithmetic on the device: no host round trip, no DataLoader workers).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .events import (Columns, as_columns, check_device, check_events, check_fits, check_flag, check_number,
                     check_path, check_same_fields, check_sensor_size, class_indices, event_dtype, segment_ids)

FILES = ("events.npy", "offsets.npy", "targets.npy", "meta.json")
CHECK_CHUNK = 1 << 22  # events checked at a time when a store is loaded


class EventStore:
    """Packed events of one split. `device` is where batches come out (and get framed)."""

    def __init__(self, events: np.ndarray, offsets: np.ndarray, targets: np.ndarray,
                 sensor_size: tuple[int, int, int], device="cpu", columns: Columns | None = None):
        """events: a structured array with fields t, x, p (and y), samples one after another;
        offsets: where each sample starts, from 0 to len(events); targets: one class index per
        sample. The contents are checked here as `from_samples` and `load` check theirs (every
        event inside the sensor, time sorted within each sample): ValueError naming the field
        otherwise (an event outside the sensor was framed into another cell, or another sample)."""
        self._setup(events, offsets, targets, sensor_size, device, columns)
        self._check_contents()

    @classmethod
    def _checked(cls, events, offsets, targets, sensor_size, device="cpu", columns=None) -> EventStore:
        """A store of events already checked (packed by from_samples, or copied from a store)."""
        store = cls.__new__(cls)
        store._setup(events, offsets, targets, sensor_size, device, columns)
        return store

    def _setup(self, events, offsets, targets, sensor_size, device, columns) -> None:
        offsets = np.asarray(offsets)
        n_targets = len(np.asarray(targets))
        if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) != n_targets + 1 or \
                offsets[0] != 0 or offsets[-1] != len(events) or bool((np.diff(offsets) < 0).any()):
            raise ValueError(f"offsets: expected {n_targets + 1} integers rising from 0 to {len(events)}")
        self.events = events  # host copy, maybe a memory map
        self.sensor_size = check_sensor_size(sensor_size)  # int() raised on NaN, truncated 2.5
        self.device = check_device(device)  # NaN or 2**70 failed inside torch.device
        self._offsets_np = offsets.astype(np.int64, copy=False)
        # host copies of the CSR layout: a batch's event counts are known without a device sync
        self.offsets_host = self._offsets_np
        self.lengths_host = np.diff(self._offsets_np)
        self._first_last = None
        self.offsets = torch.from_numpy(np.array(offsets, dtype=np.int64)).to(self.device)
        self.targets = class_indices(targets).to(self.device)
        self.columns = columns  # device-resident columns, or None

    def _check_contents(self) -> None:
        """Every event inside the sensor, time sorted within each sample (check_events), read
        once in chunks of whole samples, so that a memory-mapped split is never copied whole."""
        events, offsets = self.events, self.offsets_host
        names = getattr(getattr(events, "dtype", None), "names", None)
        if names is None or any(k not in names for k in ("t", "x", "p")):
            raise ValueError(f"events: expected a structured array with fields t, x, p (and y), got "
                             f"{getattr(events, 'dtype', type(events).__name__)}")
        cuts = np.unique(np.searchsorted(offsets, np.arange(0, len(events), CHECK_CHUNK), side="right") - 1)
        for a, b in zip(cuts, [*cuts[1:], len(offsets) - 1]):
            part = offsets[a:b + 1]
            check_events(as_columns(events[part[0]:part[-1]]), torch.from_numpy(part - part[0]), self.sensor_size,
                         need_sorted=True)

    def __len__(self) -> int:
        return len(self.targets)

    @property
    def resident(self) -> bool:
        return self.columns is not None

    @property
    def nbytes(self) -> int:
        return int(self.events.nbytes) + 8 * (2 * len(self) + 1)

    def first_last_t(self) -> tuple[np.ndarray, np.ndarray]:
        """Host int64 arrays: each sample's first and last timestamp (0 for an empty sample)."""
        if self._first_last is None:
            n = len(self.events)
            lo = np.minimum(self._offsets_np[:-1], max(n - 1, 0))
            hi = np.maximum(self._offsets_np[1:] - 1, 0)
            t = self.events["t"]
            if n == 0:
                first = last = np.zeros(len(self), dtype=np.int64)
            else:
                first, last = np.asarray(t[lo], dtype=np.int64), np.asarray(t[hi], dtype=np.int64)
            empty = self.lengths_host == 0
            self._first_last = (np.where(empty, 0, first), np.where(empty, 0, last))
        return self._first_last

    def targets_tensor(self) -> torch.Tensor:
        return self.targets

    @classmethod
    def from_samples(cls, samples: Iterable, sensor_size, *, total: int | None = None, transform=None,
                     desc: str = "packing events", progress: bool = True) -> EventStore:
        """Pack (events, target) pairs, applying `transform` (events -> columns) to each; a tqdm bar shows progress.

        Every sample is checked before it is packed: the same fields as sample 0, and every
        coordinate, polarity and time inside the sensor and the packed dtype (ValueError
        naming the sample, field and value otherwise)."""
        sensor_size = check_sensor_size(sensor_size)
        progress = check_flag("progress", progress)
        if total is not None:  # tqdm's bar only, but NaN, "3" or -1 were taken
            total = check_number("total", total, integer=True, low=0, low_open=False)
        dtype, fields, parts, targets, lengths = None, None, [], [], []
        for i, (events, target) in enumerate(tqdm(samples, total=total, desc=desc, unit="sample",
                                                  disable=not progress)):
            cols = as_columns(events) if transform is None else transform(events)
            if dtype is None:
                dtype, fields = event_dtype("y" in cols, sensor_size), set(cols)
            check_same_fields(cols, fields, i)
            check_fits(cols, sensor_size, dtype, i)
            part = np.empty(len(cols["t"]), dtype=dtype)
            for k in dtype.names:
                part[k] = cols[k].numpy()
            parts.append(part)
            targets.append(target)  # checked with the others when the store is built: 2.5 is not class 2
            lengths.append(len(part))
        if not parts:
            raise ValueError("samples: no samples to pack")
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        events = np.concatenate(parts)
        cols = as_columns(events)
        check_events(cols, torch.from_numpy(offsets), sensor_size, need_sorted=True)
        return cls._checked(events, offsets, _target_array(targets), sensor_size)

    def save(self, directory: Path) -> None:
        """Write the .npy files and meta.json into `directory` (the caller makes it atomic)."""
        directory = Path(directory)
        np.save(directory / "events.npy", np.asarray(self.events))
        np.save(directory / "offsets.npy", self._offsets_np)
        np.save(directory / "targets.npy", self.targets.cpu().numpy())
        meta = {"sensor_size": list(self.sensor_size), "samples": len(self), "events": int(len(self.events))}
        (directory / "meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, directory: Path, device="cpu", mmap: bool = True) -> EventStore:
        """The store saved in `directory`, its contents checked as `from_samples` checks them
        (offsets, targets, every event inside the sensor, time sorted within each sample): a
        manifest proves the files are the ones written, not that what was written is sound
        (an older release, or a hand-made entry). ValueError naming the field otherwise."""
        # checked before any file is read: a NaN device failed after the split was loaded,
        # mmap="no" mapped, a number raised Path's TypeError
        directory = Path(check_path("directory", directory, "a saved event store"))
        device = check_device(device)
        mode = "r" if check_flag("mmap", mmap) else None
        meta = _read_meta(directory / "meta.json")
        events = np.load(directory / "events.npy", mmap_mode=mode)
        if events.dtype.names is None or any(k not in events.dtype.names for k in ("t", "x", "p")):
            raise ValueError(f"{directory}: events.npy holds {events.dtype}, not packed events")
        # the constructor reads every event once (the manifest's checksum just did too)
        return cls(events, np.load(directory / "offsets.npy"), np.load(directory / "targets.npy"),
                   tuple(meta["sensor_size"]), device=device)

    def to(self, device, resident: bool = True) -> EventStore:
        """A store whose batches come out on `device`; resident=True also copies the events there."""
        device = check_device(device)  # before the copy: NaN or 2**70 failed inside Tensor.to
        columns = None
        if check_flag("resident", resident):
            # np.array copies the memory map into RAM once, field by field, then one transfer each
            columns = {k: torch.from_numpy(np.array(self.events[k])).to(device) for k in self.events.dtype.names}
        return EventStore._checked(self.events, self._offsets_np, self.targets.cpu().numpy(), self.sensor_size,
                                   device=device, columns=columns)

    def sample(self, i: int) -> np.ndarray:
        """Sample i as a structured numpy array (a copy)."""
        # -1 gave an empty sample (offsets[-1]:offsets[0]), len() or 2.5 raised numpy's IndexError
        i = check_number("i", i, integer=True, low=0, low_open=False)
        if i >= len(self):
            raise ValueError(f"i: expected a sample index from 0 to {len(self) - 1}, got {i}")
        return np.array(self.events[self._offsets_np[i]:self._offsets_np[i + 1]])

    def gather(self, idx: torch.Tensor) -> tuple[Columns, torch.Tensor]:
        """Events of samples `idx`, packed in that order: (columns on `device`, offsets [B+1])."""
        if self.resident:
            # a host index gives the total from the host offsets: no device sync
            total = int(self.lengths_host[idx.numpy()].sum()) if idx.device.type == "cpu" else None
            idx = idx.to(self.device)
            starts = self.offsets[idx]
            lengths = self.offsets[idx + 1] - starts
            offsets = torch.zeros(len(idx) + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(lengths, 0, out=offsets[1:])
            if total is None:
                total = int(offsets[-1])
            owner = segment_ids(lengths, total)
            where = starts[owner] + torch.arange(total, device=self.device) - offsets[:-1][owner]
            return {k: v[where] for k, v in self.columns.items()}, offsets
        ids = idx.cpu().numpy()
        lo, hi = self._offsets_np[ids], self._offsets_np[ids + 1]
        part = np.concatenate([self.events[a:b] for a, b in zip(lo, hi)])
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(hi - lo, out=offsets[1:])
        return as_columns(part, device=self.device), torch.from_numpy(offsets).to(self.device)


def _target_array(targets: list) -> np.ndarray:
    """Per-sample targets (ints, numpy or 0-d tensor scalars) as one array for `class_indices`."""
    return np.array([t.item() if isinstance(t, (torch.Tensor, np.generic, np.ndarray)) and np.ndim(t) == 0 else t
                     for t in targets])


def _read_meta(path: Path) -> dict:
    """meta.json as written by save: an object with the sensor size as a list (a hand-made or
    older entry without it raised a bare KeyError; one that is not JSON, json's own error)."""
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("sensor_size"), list):
        raise ValueError(f"{path}: expected an object with a sensor_size list, as EventStore.save writes, got {meta!r}"[:300])
    return meta
