"""Event containers: structured numpy arrays in, column tensors out, checked once.

An event stream is a set of equally long columns t (microseconds, integer), x, [y], p.
Tonic hands out numpy structured arrays; on the device we keep a dict of 1-D tensors
(torch has no structured dtype). Several samples are packed CSR-style: one set of
columns plus int64 `offsets` of length B+1, sample i being events[offsets[i]:offsets[i+1]].
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch

Columns = dict[str, torch.Tensor]

REQUIRED = ("t", "x", "p")
LIMIT = 2**62  # times, counts and factors past this overflow the int64 arithmetic of framing


def check_number(name: str, value, *, integer: bool = False, low: float = 0, low_open: bool = True):
    """`value` as a Python int (integer=True) or float, or a ValueError naming `name`: a bool,
    a non-number, NaN/inf, a fraction where an integer is wanted, a value <= low (< low if not
    low_open) or beyond 2**62 in magnitude. Used where a parameter enters (a transform's or
    framing's constructor), so that nothing past it meets an inf or an int64 overflow."""
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    ok = real and math.isfinite(value) and (not integer or float(value).is_integer())
    ok = ok and (value > low if low_open else value >= low) and abs(value) <= LIMIT
    if not ok:
        kind = "an integer" if integer else "a finite number"
        bound = "-2**62" if low == -LIMIT else low
        raise ValueError(f"{name}: must be {kind} {'>' if low_open else '>='} {bound} and at most 2**62, "
                         f"got {value!r}")
    return int(value) if integer else float(value)


def check_sensor_size(sensor_size) -> tuple[int, int, int]:
    """sensor_size as (W, H, P) positive ints below 2**31 (x and y are stored as int16 or int32,
    event_dtype), or a ValueError naming it: int() raised on NaN and truncated 2.5 before."""
    ok = isinstance(sensor_size, (Sequence, np.ndarray)) and not isinstance(sensor_size, str) \
        and len(sensor_size) == 3
    try:
        ok = ok and all(check_number("sensor_size", s, integer=True) < 2**31 for s in sensor_size)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"sensor_size: expected 3 positive ints (W, H, P), got {sensor_size!r}")
    return tuple(int(s) for s in sensor_size)


def check_path(name: str, value, what: str):
    """A path (str or os.PathLike), or a ValueError naming `name` (a number raised os.fspath's TypeError)."""
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name}: expected a directory path ({what}), got {value!r}")
    return value


def check_flag(name: str, value) -> bool:
    """True or False, or a ValueError naming `name` (bool() took "no" or NaN as True)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return value


def class_indices(targets, name: str = "targets") -> torch.Tensor:
    """`targets` as an int64 tensor of class indices, or a ValueError naming the first bad one:
    a fraction, a negative value, NaN/inf or a non-number (casting would turn 2.5 into class 2 and
    keep -1: silently wrong labels). Checked where targets enter (a data set or store is built
    or loaded); on a GPU tensor the check is one sync, at load time."""
    try:
        t = torch.as_tensor(targets)
    except (TypeError, ValueError, OverflowError, RuntimeError) as e:  # strings, objects, ints past int64
        preview = ", ".join(repr(v) for v in list(np.asarray(targets, dtype=object).reshape(-1)[:4]))
        raise ValueError(f"{name}: expected integer class indices >= 0 (within int64), got {preview}, ...") from e
    if t.dim() != 1:
        raise ValueError(f"{name}: expected one class index per sample (1-D), got shape {tuple(t.shape)}")
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name}: expected integer class indices >= 0, got dtype {t.dtype}")
    bad = t < 0
    if t.is_floating_point():
        bad |= ~torch.isfinite(t) | (t != t.trunc()) | (t.abs() > LIMIT)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name}: sample {i} has target {t[i].item()!r}; expected a class index, an integer >= 0")
    return t.to(torch.int64, copy=True)  # never an alias of the caller's array


def event_dtype(has_y: bool, sensor_size: Sequence[int] | None = None) -> np.dtype:
    """The packed on-disk dtype: t int64 µs, x/y int16 (int32 if the sensor is wider), p int8."""
    wide = sensor_size is not None and max(sensor_size[:2]) > np.iinfo(np.int16).max
    xy = np.int32 if wide else np.int16
    fields = [("t", np.int64), ("x", xy)] + ([("y", xy)] if has_y else []) + [("p", np.int8)]
    return np.dtype(fields)


def _to_tensor(a, name: str) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a
    a = np.asarray(a)
    if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"events: field {name!r} holds {a.max()}, more than an int64 can hold")
    if a.dtype in (np.uint16, np.uint32, np.uint64):
        a = a.astype(np.int64)  # torch's unsigned types support few ops
    if a.ndim == 1 and a.strides[0] != a.itemsize:
        a = a.copy()  # a field of a structured array is strided (even when one element long)
    return torch.from_numpy(np.ascontiguousarray(a))


def as_columns(events, device=None) -> Columns:
    """Structured array or mapping of arrays/tensors -> dict of 1-D tensors on `device`."""
    if isinstance(events, np.ndarray):
        if events.dtype.names is None:
            raise TypeError(
                f"events: expected a structured numpy array with fields t, x, [y], p, "
                f"got a plain array of dtype {events.dtype}"
            )
        names = events.dtype.names
        cols = {k: _to_tensor(events[k], k) for k in names if k in ("t", "x", "y", "p")}
    elif isinstance(events, Mapping):
        cols = {k: _to_tensor(v, k) for k, v in events.items() if k in ("t", "x", "y", "p")}
    else:
        raise TypeError(
            f"events: expected a structured numpy array or a mapping of columns, "
            f"got {type(events).__name__}"
        )
    missing = [k for k in REQUIRED if k not in cols]
    if missing:
        raise ValueError(f"events: missing field(s) {missing}; need t, x, [y], p")
    n = cols["t"].shape
    for k, v in cols.items():
        if v.dim() != 1 or v.shape != n:
            raise ValueError(f"events: field {k!r} has shape {tuple(v.shape)}, expected ({n[0]},)")
    if cols["t"].is_floating_point() or cols["t"].dtype == torch.bool:
        raise TypeError(f"events: field 't' must be integer microseconds, got {cols['t'].dtype}")
    if device is not None:
        cols = {k: v.to(device, non_blocking=True) for k, v in cols.items()}
    return cols


def pack(samples: Sequence) -> tuple[Columns, torch.Tensor]:
    """A list of per-sample event arrays -> (concatenated columns, int64 offsets [B+1])."""
    if len(samples) == 0:
        raise ValueError("samples: need at least one sample")
    per = [as_columns(s) for s in samples]
    keys = per[0].keys()
    for i, p in enumerate(per):
        check_same_fields(p, keys, i)
    lengths = torch.tensor([len(p["t"]) for p in per], dtype=torch.int64)
    offsets = torch.zeros(len(per) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return {k: torch.cat([p[k] for p in per]) for k in keys}, offsets


def check_same_fields(cols: Columns, fields, index: int) -> None:
    """Sample `index` must have exactly `fields` (those of sample 0): packing would drop or miss one."""
    if set(cols) != set(fields):
        have, want = (", ".join(k for k in "txyp" if k in f) for f in (cols, fields))
        raise ValueError(f"samples: sample {index} has fields {have} but sample 0 has {want}; "
                         "every sample must have the same fields")


def check_fits(cols: Columns, sensor_size: Sequence[int], dtype: np.dtype, index: int) -> None:
    """Raise ValueError naming sample `index`, the field and the value if an event lies outside
    the sensor or outside what the packed `dtype` holds (numpy would wrap it: x = 65541 -> 5)."""
    width, height, polarities = (int(s) for s in sensor_size)
    allowed = {"t": (0, None), "x": (0, width - 1), "y": (0, height - 1),
               "p": (0, polarities - 1) if polarities > 1 else (None, None)}  # one polarity: any p
    for k in dtype.names:
        v = cols[k]
        if len(v) == 0:
            continue
        if v.is_floating_point():
            whole = v == v.trunc()  # False for NaN and inf too
            if not bool(whole.all()):
                i = int((~whole).nonzero()[0])
                raise ValueError(f"samples: sample {index} has {k} = {v[i].item()} (event {i}); "
                                 f"{k} must be a whole number")
        info = np.iinfo(dtype[k])
        lo, hi = allowed[k]
        lo, hi = max(info.min, info.min if lo is None else lo), min(info.max, info.max if hi is None else hi)
        v = v.to(torch.int64) if v.dtype == torch.bool else v
        vmin, vmax = int(v.min()), int(v.max())
        if vmin < lo or vmax > hi:
            bad = vmin if vmin < lo else vmax
            i = int((v == bad).nonzero()[0])
            where = {"x": f"the sensor's width {width}", "y": f"the sensor's height {height}",
                     "p": f"the sensor's {polarities} polarities"}.get(k, "time in microseconds")
            raise ValueError(f"samples: sample {index} has {k} = {bad} (event {i}), outside {lo}..{hi} "
                             f"({where}, stored as {dtype[k]})")


def check_offsets(offsets: torch.Tensor, n_events: int) -> torch.Tensor:
    """Offsets must be int64, start at 0, never decrease and end at the event count."""
    if not isinstance(offsets, torch.Tensor):
        offsets = torch.as_tensor(np.asarray(offsets), dtype=torch.int64)
    if offsets.dim() != 1 or len(offsets) < 2 or offsets.dtype != torch.int64:
        raise ValueError(f"offsets: expected an int64 vector of length B+1 >= 2, got {offsets.dtype} {tuple(offsets.shape)}")
    if offsets[0] != 0 or offsets[-1] != n_events or bool((offsets.diff() < 0).any()):
        raise ValueError(f"offsets: must rise from 0 to the event count {n_events}")
    return offsets


def check_events(
    cols: Columns,
    offsets: torch.Tensor,
    sensor_size: Sequence[int],
    *,
    need_sorted: bool,
) -> None:
    """Raise ValueError naming the culprit if events do not fit `sensor_size` or time runs back.

    `need_sorted`: time slicing binary-searches t, so t must rise within each sample.
    """
    if len(sensor_size) != 3 or any(int(s) != s or s < 1 for s in sensor_size):
        raise ValueError(f"sensor_size: expected 3 positive ints (W, H, P), got {tuple(sensor_size)}")
    if len(cols["t"]) == 0:
        return
    width, height, polarities = sensor_size
    t = cols["t"]
    if bool((t < 0).any()):
        raise ValueError("events: negative timestamps in field 't'")
    for k, size in (("x", width), ("y", height)):
        if k in cols:
            v = cols[k]
            lo, hi = int(v.min()), int(v.max())
            if lo < 0 or hi >= size:
                raise ValueError(
                    f"sensor_size: events have {k} in [{lo}, {hi}] but sensor_size gives {k} < {size}"
                )
    p = cols["p"].to(torch.int64)
    if polarities > 1 and (int(p.min()) < 0 or int(p.max()) >= polarities):
        raise ValueError(
            f"sensor_size: events have p in [{int(p.min())}, {int(p.max())}] but sensor_size has {polarities} polarities"
        )
    same_sample = _same_sample_neighbours(offsets, len(t))
    if polarities == 1 and bool(((p[1:] != p[:-1]) & same_sample).any()):
        raise ValueError("events: single polarity sensor (sensor_size[2] == 1) but a sample has both polarities")
    if need_sorted and bool(((t[1:] < t[:-1]) & same_sample).any()):
        raise ValueError("events: timestamps 't' must be sorted within each sample for time slicing")


def _same_sample_neighbours(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """mask[i] is True when events i and i+1 belong to the same sample."""
    mask = torch.ones(max(n - 1, 0), dtype=torch.bool, device=offsets.device)
    inner = offsets[1:-1]
    inner = inner[(inner > 0) & (inner < n)]
    mask[inner - 1] = False
    return mask


def segment_ids(counts: torch.Tensor, total: int) -> torch.Tensor:
    """owner[i] = the segment that element i of the concatenation of len-`counts` segments is in."""
    if counts.is_cuda:  # a known total spares the device a sync
        return torch.repeat_interleave(counts, output_size=total)
    return torch.repeat_interleave(counts)  # on the CPU, output_size takes a slow path


def to_structured(cols: Columns, dtype: np.dtype | None = None) -> np.ndarray:
    """Columns -> a numpy structured array (on the host)."""
    dtype = dtype or event_dtype("y" in cols)
    out = np.empty(len(cols["t"]), dtype=dtype)
    for k in dtype.names:
        out[k] = cols[k].cpu().numpy()
    return out


def check_device(device) -> torch.device:
    """`device` as a torch.device, or ValueError if this PyTorch or this machine cannot use it."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:  # ValueError: an index of 2**70 overflowed
        raise ValueError(f"device: expected a device such as 'cpu' or 'cuda', got {device!r}") from e
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            why = "this PyTorch build has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"device: {str(device)!r} requested but {why}; use device='cpu'")
        if device.index is not None and device.index >= count:
            raise ValueError(f"device: {str(device)!r} requested but only {count} CUDA device(s) exist")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device: 'mps' requested but MPS is not available here; use device='cpu'")
    return device
