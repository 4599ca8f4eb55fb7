"""Metrics as JSON lines: one object per epoch, appended and flushed as it happens.

Every line is standard JSON: a NaN or infinite value (training diverged) is written as
null, with a DivergedWarning naming the keys, never as the non-standard `NaN`/`Infinity`.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

FILENAME = "metrics.jsonl"
TMP_NAME = f".{FILENAME}.tmp"  # rewrite()'s temp file: a killed rewrite leaves it (rundir.py removes it)


class DivergedWarning(RuntimeWarning):
    """A metric was NaN or infinite: training diverged."""


def predicted(output):
    """The class each sample is predicted as, for the accuracy metrics: a model's [B, C] output
    (logits, rates) or a time-major [T, B, C] one (potentials or spikes per step, as
    spikefuse.loss takes) read through its mean over time."""
    return (output.mean(0) if output.dim() == 3 else output).argmax(-1)


def finite(record: dict) -> tuple[dict, list[str]]:
    """(`record` with every non-finite float replaced by None, the keys that were)."""
    bad: list[str] = []

    def clean(value, key):
        if isinstance(value, float) and not math.isfinite(value):
            bad.append(key)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{key}.{k}") for k, v in value.items()}
        return value
    return {k: clean(v, k) for k, v in record.items()}, bad


def _line(record: dict) -> str:
    clean, bad = finite(record)
    if bad:
        epoch = f" at epoch {record['epoch']}" if "epoch" in record else ""
        warnings.warn(f"training diverged{epoch}: {', '.join(bad)} not finite, written as null",
                      DivergedWarning, stacklevel=3)
    return json.dumps(clean, allow_nan=False) + "\n"


def append(path: str | os.PathLike, record: dict) -> None:
    data = _line(record).encode()
    # unbuffered, so a failed write leaves nothing behind in a buffer to be flushed at close
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:  # a full disk or Ctrl-C: no half line for the next append to follow
            os.ftruncate(fd, start)
            raise
        # outside the try: a Ctrl-C while the whole line is being synced keeps it (it once dropped
        # the line of an epoch whose checkpoint was already written)
        os.fsync(fd)
    finally:
        os.close(fd)


def rewrite(path: str | os.PathLike, records: list[dict]) -> None:
    """Replace the file with `records` (on resume: drop lines past the checkpoint)."""
    path = Path(path)
    tmp = path.with_name(TMP_NAME if path.name == FILENAME else f".{path.name}.tmp")
    lines = [_line(r) for r in records]
    try:
        with open(tmp, "w") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read(path: str | os.PathLike) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
