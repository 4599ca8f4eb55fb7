"""One run at a time per run directory: an OS lock (flock) on DIR/.lock while a run uses it.

The kernel drops the lock when its process ends, however it ends (SIGKILL too), so a killed
run never leaves a stale lock; the file stays behind and means nothing by itself. Whoever
takes the lock also removes the temp files a killed checkpoint or metrics write left (no one
else can be writing them then). Re-entrant within a process (the command and the Trainer
both take it); under torchrun only rank 0 takes it.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import RunError
from . import checkpoint, metrics

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock (documented in docs/reliability.md)
    fcntl = None

LOCK_NAME = ".lock"

_held: dict[Path, list] = {}  # resolved directory -> [fd, depth]


class RunDirInUse(RunError):
    """Another process holds the run directory's lock."""


def holds_run(directory) -> bool:
    """Whether `directory` already holds a run's files (a checkpoint, or the metrics of a run
    that stopped before its first checkpoint): a new run there is refused, only resumed."""
    directory = Path(directory)
    return (directory / checkpoint.FILENAME).exists() or (directory / metrics.FILENAME).exists()


@contextlib.contextmanager
def lock(directory):
    """Hold `directory`'s lock (creating the directory) for the `with` block; RunDirInUse at
    once if another process holds it. A directory this call created and the run left empty
    is removed again."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"run directory {directory} is a file, expected a directory")
    if fcntl is None or os.environ.get("RANK", "0") != "0":
        yield
        return
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    key = directory.resolve()
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    fd = _acquire(directory / LOCK_NAME)
    _held[key] = [fd, 1]
    try:
        remove_stale_tmp(directory)
        yield
    finally:
        del _held[key]
        try:
            if created and os.listdir(directory) == [LOCK_NAME]:  # nothing written: leave no trace
                os.unlink(directory / LOCK_NAME)
                directory.rmdir()
        except OSError:
            pass
        os.close(fd)  # releases the lock


def _acquire(path: Path) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            who = f"process {holder}" if holder.isdigit() else "another process"
            raise RunDirInUse(f"run directory {path.parent} is in use by another run ({who} holds "
                              f"{path}); wait for it to finish or choose another --out") from None
        except BaseException:
            os.close(fd)
            raise
        # the holder we raced with may have removed the file: then our lock is on a stale inode
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def remove_stale_tmp(directory: Path) -> list[Path]:
    """Delete the temp files of checkpoint and metrics writes that never finished."""
    stale = [*directory.glob(checkpoint.TMP_GLOB), *directory.glob(metrics.TMP_NAME)]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale
