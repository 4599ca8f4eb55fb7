"""Metrics as JSON lines: one object per epoch, appended and flushed as it happens."""
from __future__ import annotations

import json
import os
from pathlib import Path

FILENAME = "metrics.jsonl"


def append(path: str | os.PathLike, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def rewrite(path: str | os.PathLike, records: list[dict]) -> None:
    """Replace the file with `records` (on resume: drop lines past the checkpoint)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(path: str | os.PathLike) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
