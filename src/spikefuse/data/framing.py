"""Events -> dense frames with torch ops only, a whole batch in one pass, on any device.

`ToFrame` and `Downsample` take the same parameters as their Tonic namesakes and give the
same numbers. Every slicing mode reduces to one idea: each frame of a sample is a range
[start, end) of that sample's event indices (time modes find the range by binary search of
t, count modes compute it). Ranges may overlap, so the ranges of the whole batch are
expanded to (frame, event) pairs and counted with a single `index_add_`.
Window arithmetic is done in float64 in the same order as Tonic so bin edges round alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import memory
from .events import (LIMIT, Columns, as_columns, check_events, check_number, check_offsets, check_sensor_size,
                     segment_ids)

MAX_WINDOWS = 2**62  # window counts are clamped here before becoming int64 (memory checks refuse far less)
TABLE_BYTES = 48  # per (sample, window): the float64/int64 window tables `_windows` builds


@dataclass(frozen=True)
class ToFrame:
    """Accumulate events into frames [T, P, (H,) W] (single sample) or [T, B, P, (H,) W].

    Exactly one of time_window (µs), event_count, n_time_bins, n_event_bins. `overlap` is in
    µs / events / fraction of a bin, as in Tonic; include_incomplete keeps the last partial
    window of the time_window and event_count modes; start_time / end_time (time_window
    only) fix the time span instead of taking it from the first and last event.
    Samples of a batch are padded with empty frames to the longest one.
    """

    sensor_size: tuple[int, int, int]
    time_window: float | None = None
    event_count: int | None = None
    n_time_bins: int | None = None
    n_event_bins: int | None = None
    overlap: float = 0
    include_incomplete: bool = False
    start_time: float | None = None
    end_time: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "sensor_size", check_sensor_size(self.sensor_size))
        modes = {k: getattr(self, k) for k in ("time_window", "event_count", "n_time_bins", "n_event_bins")}
        chosen = [k for k, v in modes.items() if v is not None]
        if len(chosen) != 1:
            raise ValueError(f"ToFrame: set exactly one of {list(modes)}, got {chosen or 'none'}")
        mode = chosen[0]
        # every number checked here, once: past this point no inf, NaN or int64 overflow can arise
        value = check_number(mode, modes[mode], integer=mode != "time_window")
        if mode != "time_window":
            object.__setattr__(self, mode, value)  # a count as a Python int (3.0 and np.int64(3) -> 3)
        overlap = check_number("overlap", self.overlap, low=0, low_open=False)
        if mode in ("n_time_bins", "n_event_bins"):
            if not overlap < 1:
                raise ValueError(f"overlap: for {mode} a fraction in [0, 1), got {self.overlap}")
        elif not overlap < value:
            raise ValueError(f"overlap: must be in [0, {mode}), got {self.overlap}")
        for name in ("start_time", "end_time"):
            if getattr(self, name) is not None:
                if mode != "time_window":
                    raise ValueError("start_time/end_time: only used with time_window")
                check_number(name, getattr(self, name), low=-LIMIT, low_open=False)

    @property
    def mode(self) -> str:
        return next(k for k in ("time_window", "event_count", "n_time_bins", "n_event_bins") if getattr(self, k) is not None)

    def __call__(self, events, *, dtype=torch.float32) -> torch.Tensor:
        """One sample (structured array or columns) -> [T, P, (H,) W], like tonic's ToFrame."""
        cols = as_columns(events)
        offsets = torch.tensor([0, len(cols["t"])], dtype=torch.int64, device=cols["t"].device)
        return self.batch(cols, offsets, dtype=dtype)[:, 0]

    def batch(self, events, offsets, *, num_frames: int | None = None, dtype=torch.float32,
              validate: bool = True) -> torch.Tensor:
        """CSR-packed samples -> frames [T, B, P, (H,) W] on the events' device.

        num_frames: pad with empty frames or cut to exactly this many (a fixed T for training).
        validate=False skips the input checks (each costs a device sync): for stores checked once.
        """
        samples = len(offsets) - 1
        return self.batches(events, offsets, max(samples, 1), num_frames=num_frames, dtype=dtype,
                            validate=validate)[0]

    def batches(self, events, offsets, batch_size: int, *, num_frames: int | None = None,
                dtype=torch.float32, validate: bool = True) -> list[torch.Tensor]:
        """Like `batch`, but every run of `batch_size` consecutive samples (the last may be
        shorter) comes out as its own contiguous [T, b, P, (H,) W] tensor: several batches
        framed in one pass, as views of one buffer. Without num_frames, T is the longest
        sample of all of them."""
        check_batch_size(batch_size)
        cols = as_columns(events)
        t = cols["t"]
        offsets = torch.as_tensor(offsets, dtype=torch.int64, device=t.device)
        if validate:
            check_offsets(offsets, len(t))
            check_events(cols, offsets, self.sensor_size, need_sorted=self.mode in ("time_window", "n_time_bins"))
        num_frames = _check_num_frames(num_frames)
        samples = len(offsets) - 1
        start, end, n = self._windows(t, offsets, limit=num_frames)
        frames_needed = int(n.max()) if num_frames is None else num_frames
        self._check_frames(frames_needed, samples, math.prod(self._cell_shape("y" in cols)), dtype, t.device)
        flat = _accumulate(cols, offsets, start, end, n, frames_needed, self.sensor_size, dtype, batch_size)
        return _split_blocks(flat, frames_needed, samples, batch_size, self._cell_shape("y" in cols))

    def _describe(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)}" for k in ("start_time", "end_time") if getattr(self, k) is not None)
        extra = (f", overlap={self.overlap}" if self.overlap else "") + extra
        return f"ToFrame({self.mode}={getattr(self, self.mode)}{extra})"

    def _hint(self) -> str:
        fewer = f"fewer {self.mode}" if self.mode.startswith("n_") else f"a larger {self.mode}"
        return f"use {fewer}, or pass num_frames to keep only the first frames"

    def _check_frames(self, frames: int, samples: int, cell: int, dtype, device) -> None:
        """Refuse (ValueError) an output of `frames` frames per sample that memory cannot hold."""
        nbytes = frames * max(samples, 1) * cell * dtype.itemsize
        # free=False: framing runs per batch group, where a driver call per check is not wanted
        memory.require(nbytes, device, f"{self._describe()}: {frames} frames x {samples} sample(s)", self._hint(),
                       free=False)

    def _table_width(self, n_max: int, limit: int | None, samples: int, device) -> int:
        """Windows per sample to materialise in `_windows`: all, or the first `limit` (num_frames:
        later ones are cut anyway), after checking their tables fit in memory."""
        width = n_max if limit is None else min(n_max, limit)
        memory.require(TABLE_BYTES * width * max(samples, 1), device,
                       f"{self._describe()}: {width} windows x {samples} sample(s)", self._hint(), free=False)
        return width

    def _cell_shape(self, two_d: bool) -> tuple[int, ...]:
        """Shape of one frame of one sample: (P, H, W), or (P, W) for events without y."""
        width, height, polarities = self.sensor_size
        return (polarities, height, width) if two_d else (polarities, width)

    def fast_plan_ok(self) -> bool:
        """Whether `batch_from_store` covers this framing: non-overlapping time windows whose
        edges are exact integers (integral time_window, integral or no start_time), or
        non-overlapping n_time_bins. Other modes go through `batch`."""
        if self.overlap != 0:
            return False
        if self.mode == "n_time_bins":
            return True
        if self.mode == "time_window":
            st = self.start_time
            return float(self.time_window).is_integer() and (st is None or float(st).is_integer())
        return False

    def batch_from_store(self, store, idx, *, num_frames: int | None = None,
                         dtype=torch.float32) -> torch.Tensor | None:
        """Frames [T, B, P, (H,) W] of samples `idx` (host indices) of a resident `store`, or
        None where the fast path does not apply (then use `store.gather` + `batch`).

        Same numbers as `batch`. Everything per sample (event counts, window counts, first
        time, where its frames go) is computed on the host from the store's host CSR copy and
        sent in one transfer; per event: one repeat_interleave, one gather of the sample
        table, one gather per column, integer bin arithmetic, and ONE index_add_ where events
        outside [0, T) go to a dump cell that is sliced off. No host sync, ~25 ops.
        """
        blocks = self.batches_from_store(store, idx, max(len(idx), 1), num_frames=num_frames, dtype=dtype)
        return None if blocks is None else blocks[0]

    def batches_from_store(self, store, idx, batch_size: int, *, num_frames: int | None = None,
                           dtype=torch.float32) -> list[torch.Tensor] | None:
        """`batch_from_store` for several batches at once, split as `batches` splits: one
        pass (the same ops as a single batch) over every run of `batch_size` samples of idx."""
        check_batch_size(batch_size)
        if not (store.resident and self.fast_plan_ok()):
            return None
        num_frames = _check_num_frames(num_frames)
        if isinstance(idx, torch.Tensor):
            if idx.device.type != "cpu":
                return None  # the caller would pay a sync to bring it over: let it decide
            idx = idx.numpy()
        ids = np.asarray(idx, dtype=np.int64)
        starts, counts = store.offsets_host[ids], store.lengths_host[ids]
        first, last = (a[ids] for a in store.first_last_t())
        empty = counts == 0
        batch = len(ids)
        f64 = np.float64
        if self.mode == "time_window":
            tw = self.time_window
            stride = tw - self.overlap
            t0 = first.astype(f64) if self.start_time is None else np.zeros(batch, f64) + self.start_time
            t1 = last.astype(f64) if self.end_time is None else np.zeros(batch, f64) + self.end_time
            ratio = (t1 - t0 - tw) / stride  # in float64, the same order as `_windows`
            n = (np.ceil(ratio) if self.include_incomplete else np.floor(ratio)) + 1
            n = np.clip(n, 1, MAX_WINDOWS).astype(np.int64)
            n[empty] = 1
            origin = first if self.start_time is None else np.full(batch, int(self.start_time), np.int64)
            width = np.full(batch, int(tw), np.int64)
        else:
            bins = self.n_time_bins
            span = (last - first) // bins  # integer edges: first + w * span, exact in float64 too
            n = np.full(batch, bins, np.int64)
            origin = first
            width = np.where(span > 0, span, 1)
            n = np.where(span > 0, n, 0)  # zero-width bins hold no event (windows [t, t))
        if num_frames is not None:
            frames = num_frames
        elif self.mode == "n_time_bins":
            frames = self.n_time_bins
        else:
            frames = int(n.max()) if batch else 1
        limit = np.minimum(n, frames)

        width_s, height, polarities = self.sensor_size
        cols = store.columns
        two_d = "y" in cols
        cell_shape = self._cell_shape(two_d)
        size = frames * batch * math.prod(cell_shape)
        dev = store.device
        self._check_frames(frames, batch, math.prod(cell_shape), dtype, dev)
        total = int(counts.sum())
        if total == 0:
            flat = torch.zeros(size, dtype=dtype, device=dev)
            return _split_blocks(flat, frames, batch, batch_size, cell_shape)
        boff = np.cumsum(counts) - counts
        base, frame_stride = _block_layout(batch, batch_size, frames, math.prod(cell_shape))
        table = np.stack([counts, starts - boff, origin, width, limit, base, frame_stride])
        tab = torch.from_numpy(table)
        if dev.type == "cuda":
            tab = tab.pin_memory().to(dev, non_blocking=True)
        elif dev != tab.device:
            tab = tab.to(dev)
        owner = torch.repeat_interleave(tab[0], output_size=total)
        # the sample table gathered per event: each is [total]
        delta, origin_e, width_e, limit_e, base_e, stride_e = tab[1:].index_select(1, owner)
        ev = torch.arange(total, device=dev).add_(delta)
        t = cols["t"][ev]
        w = (t - origin_e).div_(width_e, rounding_mode="floor")
        valid = (w >= 0).logical_and_(w < limit_e)
        # a single-polarity sensor puts every event in channel 0, whatever its p (as Tonic)
        pos = w.mul_(stride_e).add_(base_e).add_(cols["x"][ev])
        if two_d:
            pos.add_(cols["y"][ev], alpha=width_s)  # computed in int64, pos's dtype
        if polarities > 1:
            pos.add_(cols["p"][ev], alpha=(height if two_d else 1) * width_s)
        pos = torch.where(valid, pos, size)  # out-of-range events land in the dump cell
        out = torch.zeros(size + 1, dtype=dtype, device=dev)
        out.index_add_(0, pos, torch.ones((), dtype=dtype, device=dev).expand(total))
        return _split_blocks(out, frames, batch, batch_size, cell_shape)  # the blocks leave out the dump cell

    def _windows(self, t: torch.Tensor, offsets: torch.Tensor, limit: int | None = None):
        """Per sample b and window w < min(n.max(), limit) the local event range [start, end),
        and each sample's window count n[b]."""
        lengths = offsets.diff()
        samples = len(lengths)
        empty = lengths == 0
        dev, f64 = t.device, torch.float64
        ov = self.overlap
        if self.mode in ("time_window", "n_time_bins"):
            last_i = (offsets[1:] - 1).clamp(min=0)
            first_i = offsets[:-1].clamp(max=max(len(t) - 1, 0))
            if len(t) == 0:
                first = last = torch.zeros_like(lengths)
            else:
                first, last = t[first_i].to(torch.int64), t[last_i].to(torch.int64)
            if self.mode == "time_window":
                tw = self.time_window
                stride = tw - ov
                t0 = first.to(f64) if self.start_time is None else torch.full_like(first, 0, dtype=f64) + self.start_time
                t1 = last.to(f64) if self.end_time is None else torch.full_like(first, 0, dtype=f64) + self.end_time
                ratio = (t1 - t0 - tw) / stride
                n = (ratio.ceil() if self.include_incomplete else ratio.floor()) + 1
                n = n.clamp(min=1, max=MAX_WINDOWS).to(torch.int64)
                w = torch.arange(self._table_width(int(n.max()), limit, samples, dev), device=dev, dtype=f64)
                lo = w * stride + t0[:, None]
                hi = lo + tw
            else:
                bins = self.n_time_bins
                span = ((last - first) // bins).to(f64) * (1 + ov)
                stride = span * (1 - ov)
                width = self._table_width(bins, limit, samples, dev)
                lo = torch.arange(width, device=dev, dtype=f64) * stride[:, None] + first.to(f64)[:, None]
                hi = lo + span[:, None]
                n = torch.full_like(lengths, bins)
            start = _count_below(t, offsets, first, last, lo)
            end = _count_below(t, offsets, first, last, hi)
        elif self.mode == "event_count":
            count = self.event_count
            eff = lengths.clamp(max=count)
            stride = count - ov
            ratio = (lengths - eff).to(f64) / stride
            n = (ratio.ceil() if self.include_incomplete else ratio.floor()) + 1
            n = n.clamp(max=MAX_WINDOWS).to(torch.int64)
            w = torch.arange(self._table_width(int(n.max()), limit, samples, dev), device=dev, dtype=f64)
            start = (w * stride).to(torch.int64).expand(len(lengths), -1)
            end = start + eff[:, None]
        else:
            bins = self.n_event_bins
            size = ((lengths // bins).to(f64) * (1 + ov)).to(torch.int64)
            stride = (size.to(f64) * (1 - ov)).to(torch.int64)
            start = torch.arange(self._table_width(bins, limit, samples, dev), device=dev)[None, :] * stride[:, None]
            end = start + size[:, None]
            n = torch.full_like(lengths, bins)
        # Tonic answers an empty sample before slicing: one frame, or n bins, all zero
        n = torch.where(empty, 1 if self.mode in ("time_window", "event_count") else n, n)
        # python slicing semantics: events[start:end] clipped to the sample
        start = torch.minimum(start, lengths[:, None])
        end = torch.maximum(torch.minimum(end, lengths[:, None]), start)
        return start, end, n


def _count_below(t, offsets, first, last, q):
    """For each sample b and query q[b, w]: how many of the sample's events have t < q.

    t is an integer, so t < q  <=>  t < ceil(q). Clamping the query into
    [first, last + 1] keeps the count and lets every sample live in its own disjoint
    stretch of one int64 key line, so one global searchsorted serves the whole batch.
    """
    if len(t) == 0:
        return torch.zeros(q.shape, dtype=torch.int64, device=q.device)
    q = q.ceil().clamp(min=-(2.0**62), max=2.0**62).to(torch.int64)
    q = torch.minimum(torch.maximum(q, first[:, None]), last[:, None] + 1)
    span = (last - first + 2).clamp(min=0)
    span = torch.where(offsets.diff() > 0, span, torch.zeros_like(span))
    base = torch.cumsum(span, 0) - span
    sid = segment_ids(offsets.diff(), len(t))
    keys = t.to(torch.int64) - first[sid] + base[sid]
    found = torch.searchsorted(keys, q - first[:, None] + base[:, None])
    return (found - offsets[:-1, None]).clamp(min=0)


def _accumulate(cols: Columns, offsets, start, end, n, frames, sensor_size, dtype, batch_size):
    """Count every (frame, event) pair into zeroed frames laid out by `_block_layout` (flat)."""
    width, height, polarities = sensor_size
    samples = len(offsets) - 1
    two_d = "y" in cols
    cell = polarities * (height if two_d else 1) * width
    dev = cols["t"].device
    out = torch.zeros(frames * samples * cell, dtype=dtype, device=dev)
    windows = start.shape[1]
    keep = min(windows, frames)  # windows past `frames` are cut, never counted
    w_idx = torch.arange(keep, device=dev)
    valid = w_idx[None, :] < n[:, None]
    counts = torch.where(valid, end[:, :keep] - start[:, :keep], 0).reshape(-1)
    total = int(counts.sum())
    if total:
        pair = segment_ids(counts, total)
        within = torch.arange(total, device=dev) - (torch.cumsum(counts, 0) - counts)[pair]
        b, w = pair // keep, pair % keep
        ev = offsets[b] + start[:, :keep].reshape(-1)[pair] + within
        base, frame_stride = torch.from_numpy(np.stack(_block_layout(samples, batch_size, frames, cell))).to(dev)
        idx = w * frame_stride[b] + base[b] + cols["x"][ev].to(torch.int64)
        if two_d:
            idx += cols["y"][ev].to(torch.int64) * width
        # a single-polarity sensor puts every event in channel 0, whatever its p (as Tonic)
        if polarities > 1:
            idx += cols["p"][ev].to(torch.int64) * (cell // polarities)
        # atomic adds of 1.0 in any order give exact counts (below 2**24 per cell in float32)
        out.index_add_(0, idx, torch.ones((), dtype=dtype, device=dev).expand(total))
    return out


def check_batch_size(batch_size) -> None:
    # at most 2**62: 2**70 overflowed numpy's int64 block layout (OverflowError)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or not 1 <= batch_size <= LIMIT:
        raise ValueError(f"batch_size: expected a positive int (at most 2**62), got {batch_size!r}")


def _check_num_frames(num_frames) -> int | None:
    """None, or an int >= 1 (a float or a bool reached torch.zeros as a size; a string a comparison)."""
    return None if num_frames is None else check_number("num_frames", num_frames, integer=True)


def _block_layout(samples: int, batch_size: int, frames: int, cell: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sample, where its frame 0 lies in the flat output and how far apart its frames are,
    when every run of `batch_size` samples gets its own contiguous [frames, b, cell] block
    (batch_size >= samples: the plain [frames, samples, cell] layout)."""
    b = np.arange(samples, dtype=np.int64)
    head = b - b % batch_size  # the first sample of b's block
    size = np.minimum(batch_size, samples - head)
    return head * frames * cell + (b - head) * cell, size * cell


def _split_blocks(flat: torch.Tensor, frames: int, samples: int, batch_size: int,
                  cell_shape: tuple[int, ...]) -> list[torch.Tensor]:
    """The blocks of `_block_layout` as [frames, b, *cell_shape] views of `flat` (one empty
    block for zero samples)."""
    step = frames * math.prod(cell_shape)
    return [flat[head * step:(head + size) * step].view(frames, size, *cell_shape)
            for head in range(0, max(samples, 1), batch_size) for size in [min(batch_size, samples - head)]]


@dataclass(frozen=True)
class Downsample:
    """Scale timestamps and coordinates, truncating to the field's integer type, as tonic's Downsample.

    spatial_factor: one factor or (fx, fy); or give sensor_size (W, H, P) and target_size (W', H').
    """

    time_factor: float = 1
    spatial_factor: float | tuple[float, float] = 1
    sensor_size: tuple[int, int, int] | None = None
    target_size: tuple[int, int] | None = None

    def __post_init__(self):
        if self.target_size is not None and self.sensor_size is None:
            raise ValueError("sensor_size: required when target_size is given")
        # an infinite factor used to scale timestamps to INT64_MIN: refused here, by name
        check_number("time_factor", self.time_factor)
        f = self.spatial_factor
        if isinstance(f, tuple) and len(f) != 2:
            raise ValueError(f"spatial_factor: expected one factor or (fx, fy), got {f!r}")
        for v in f if isinstance(f, tuple) else (f,):
            check_number("spatial_factor", v)
        if self.sensor_size is not None:
            object.__setattr__(self, "sensor_size", check_sensor_size(self.sensor_size))
        if self.target_size is not None:
            size = self.target_size
            if not (isinstance(size, (tuple, list)) and len(size) == 2):
                raise ValueError(f"target_size: expected (W', H'), got {size!r}")
            object.__setattr__(self, "target_size", tuple(check_number("target_size", v, integer=True) for v in size))

    def factors(self) -> tuple[float, float]:
        if self.target_size is not None:
            return tuple(self.target_size[i] / self.sensor_size[i] for i in range(2))
        f = self.spatial_factor
        return tuple(f) if isinstance(f, tuple) else (f, f)

    def output_sensor_size(self, sensor_size) -> tuple[int, int, int]:
        """The smallest sensor that holds the scaled coordinates of `sensor_size`."""
        fx, fy = self.factors()
        w, h, p = sensor_size
        return (_scale(torch.tensor([w - 1]), fx).item() + 1, _scale(torch.tensor([h - 1]), fy).item() + 1, p)

    def __call__(self, events) -> Columns:
        cols = dict(as_columns(events))
        fx, fy = self.factors()
        cols["t"] = _scale(cols["t"], self.time_factor, "time_factor", "t")
        cols["x"] = _scale(cols["x"], fx, "spatial_factor", "x")
        if "y" in cols:
            cols["y"] = _scale(cols["y"], fy, "spatial_factor", "y")
        return cols


def _scale(v: torch.Tensor, factor, name: str = "factor", field: str = "value") -> torch.Tensor:
    """v * factor cast back to v's dtype: integer factors stay exact, float ones go through
    float64 and truncate toward zero, as numpy does when assigning into an int field. On the
    CPU (no sync) a result beyond v's dtype is refused: it would wrap (Tonic wraps silently)."""
    scaled = v.to(torch.float64) * float(factor)
    if v.device.type == "cpu" and len(v) and not v.is_floating_point():
        info = torch.iinfo(v.dtype)
        lo, hi = float(scaled.min()), float(scaled.max())
        if lo < info.min or hi >= info.max + 1:
            raise ValueError(f"{name}: {factor} scales {field} to {hi if hi >= info.max + 1 else lo:.6g}, "
                             f"beyond its {v.dtype} column")
    if isinstance(factor, int) and not isinstance(factor, bool):
        return v * factor
    return scaled.trunc().to(v.dtype)
