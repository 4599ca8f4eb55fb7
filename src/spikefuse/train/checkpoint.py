"""Checkpoints that are never half-written: write a temp file in the same directory,
fsync it, then os.replace it over the old one (atomic on POSIX), then fsync the directory.

RNG states are stored as tensors and plain tuples so `torch.load(weights_only=True)` can
read them back without unpickling arbitrary objects.
"""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..errors import one_line

FILENAME = "checkpoint.pt"
VERSION = 1  # the layout Trainer.state_dict writes; resume refuses any other (rundir.check_resume)
TMP_GLOB = f".{FILENAME}.*.tmp"  # save()'s temp files: a killed write leaves one (rundir.py removes it)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: empty, truncated, foreign or corrupt."""


def save(obj, path: str | os.PathLike) -> None:
    """torch.save `obj` to `path` atomically: readers see the old file or the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # make the rename itself durable


def load(path: str | os.PathLike, map_location="cpu") -> dict:
    """The saved dict; CheckpointError (one line, naming the file) if it cannot be read."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:  # torch.load's error says nothing useful here
            raise CheckpointError(f"checkpoint {path} is empty (0 bytes): it was not written by a finished save")
        state = torch.load(path, map_location=map_location, weights_only=True)
    except CheckpointError:
        raise
    except Exception as e:  # a foreign or damaged file: whatever the unpickler trips on
        raise CheckpointError(f"cannot read checkpoint {path}: {_unreadable(path, e)}") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, expected a dict")
    return state


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _unreadable(path: Path, e: Exception) -> str:
    """Why torch.load could not read `path`, in one line. A NIR graph (HDF5) is named as one;
    torch's weights-only refusal is cut to its cause: its first line advises loading with
    weights_only=False, which runs whatever code the file holds."""
    try:
        with open(path, "rb") as f:
            if f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                return "it is an HDF5 file (a NIR graph, as spikefuse export writes?), not a checkpoint"
    except OSError:
        pass
    text = str(e)
    if "Weights only load failed" in text:
        lines = [line.strip() for line in text.split("WeightsUnpickler error:", 1)[-1].splitlines()]
        cause = next((line for line in lines if line and not line.startswith("Check the documentation")), "")
        return ("not a checkpoint written by spikefuse (it holds objects other than tensors and plain values, or "
                f"is no PyTorch file{': ' + cause if cause else ''})")
    return one_line(e)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rng_state(generator: torch.Generator | None = None) -> dict:
    """Every random number source a training step may touch."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        # only where this process has used CUDA: reading it would initialize CUDA, which a CPU
        # run (a forked data-parallel rank, say) must not do; unused, it holds nothing to restore
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "python": random.getstate(),
        "data": generator.get_state() if generator is not None else None,
    }


def set_rng_state(state: dict, generator: torch.Generator | None = None) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if generator is not None and state["data"] is not None:
        generator.set_state(state["data"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too
