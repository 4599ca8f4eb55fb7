"""One run at a time per run directory: an OS lock (flock) on DIR/.lock while a run uses it.

The kernel drops the lock when its process ends, however it ends (SIGKILL too), so a killed
run never leaves a stale lock; the file stays behind and means nothing by itself. Whoever
takes the lock also removes the temp files a killed checkpoint or metrics write left (no one
else can be writing them then). Re-entrant within a process (the command and the Trainer
both take it); under torchrun only rank 0 takes it.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

from ..errors import RunError, one_line
from . import checkpoint, metrics
from .checkpoint import CheckpointError

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


# what a run writes into its directory: the files --overwrite (Trainer(overwrite=True)) removes
# before a new run starts there; anything else in the directory (an exported model.nir, notes)
# is left as it is
RUN_FILES = (checkpoint.FILENAME, metrics.FILENAME, "curves.png", "firing_rates.png", "raster.png")


def clear_run(directory) -> list[Path]:
    """Remove the run files (RUN_FILES) of the run `directory` holds, for a new run that was
    told to overwrite it; call it holding the directory's lock. Returns what was removed."""
    directory = Path(directory)
    removed = []
    for name in RUN_FILES:
        path = directory / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed


def check_resume(directory, state: dict, epochs: int | None = None) -> None:
    """Refuse (CheckpointError, one line) a checkpoint that cannot be resumed as it is: a format
    version this release does not know, an epoch out of range (past `epochs`, where known), a
    history that is not epochs 1 to its epoch, or a metrics.jsonl that is not this run's.

    metrics.jsonl may run ahead of the checkpoint (a diverged epoch's line, or a checkpoint cut
    back by hand: resume drops those lines) or lag it by one line (killed between writing the
    checkpoint and appending the epoch's line: resume writes it from the history)."""
    directory = Path(directory)
    path = directory / checkpoint.FILENAME
    version = state.get("version")
    if version is None:
        raise CheckpointError(f"checkpoint {path} has no format version: not a spikefuse training checkpoint")
    if version != checkpoint.VERSION or isinstance(version, bool):
        raise CheckpointError(f"checkpoint {path} has format version {version!r}; this release reads version "
                              f"{checkpoint.VERSION} only (was it written by another release of spikefuse?)")
    epoch, history = state.get("epoch"), state.get("history")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise CheckpointError(f"checkpoint {path} is at epoch {epoch!r}; expected a whole number >= 0")
    if epochs is not None and epoch > epochs:
        raise CheckpointError(f"checkpoint {path} is at epoch {epoch}, past the {epochs} epochs of the run "
                              "resuming it")
    saved = [r.get("epoch") if isinstance(r, dict) else r for r in history] if isinstance(history, list) else None
    if saved != list(range(1, epoch + 1)):
        held = "no list" if saved is None else _epochs_text(saved)
        raise CheckpointError(f"checkpoint {path} is at epoch {epoch} but its history holds {held}; "
                              f"expected epochs 1 to {epoch}")
    _check_metrics(directory / metrics.FILENAME, path, epoch, history)


def _check_metrics(file: Path, path: Path, epoch: int, history: list) -> None:
    try:
        lines = metrics.read(file)
    except FileNotFoundError:
        lines = []
    except (OSError, ValueError) as e:  # unreadable, or not JSON lines
        raise CheckpointError(f"cannot read {file}: {one_line(e)}") from e
    found = [r.get("epoch") if isinstance(r, dict) else r for r in lines]
    if found != list(range(1, len(lines) + 1)):  # duplicated, missing or unordered epochs
        raise CheckpointError(f"{file} holds {_epochs_text(found)}, not epochs 1, 2, 3, ... in order: "
                              f"it is not the metrics of one run (its checkpoint is at epoch {epoch})")
    if len(lines) < epoch - 1:
        raise CheckpointError(f"{file} holds {_epochs_text(found)}, but {path} is at epoch {epoch}: "
                              "they are not of one run")
    for record, line in zip(history, lines):  # as append wrote it: non-finite as null, through JSON
        if json.loads(json.dumps(metrics.finite(record)[0])) != line:
            raise CheckpointError(f"{file} differs from the history in {path} at epoch {line['epoch']}: "
                                  "they are not of one run")


def _epochs_text(epochs: list) -> str:
    if not epochs:
        return "no epochs"
    shown = epochs if len(epochs) <= 8 else [*epochs[:3], "...", *epochs[-3:]]
    return "epochs " + ", ".join(map(str, shown))


def unusable(directory) -> str | None:
    """Why `directory` can be neither used nor created as a run directory (completing "DIR ..."),
    or None: asked before anything is created or locked."""
    try:  # one stat: isdir then exists raced another rank's mkdir between them ("is a file")
        if not stat.S_ISDIR(os.stat(directory).st_mode):
            return "is a file"
    except FileNotFoundError:
        # a dangling link, here or above, makes mkdir fail with "File exists"
        path = Path(directory)
        for part in (path, *path.parents):
            if os.path.islink(part) and not os.path.exists(part):
                return f"leads through the symbolic link {part} to a missing {os.readlink(part)}"
            if os.path.exists(part):  # the rest is missing: mkdir makes it
                return None
    except OSError as e:  # a symbolic link loop, a name too long, no permission
        return f"cannot be used: {e.strerror or e}"
    return None


@contextlib.contextmanager
def lock(directory):
    """Hold `directory`'s lock (creating the directory) for the `with` block; RunDirInUse at
    once if another process holds it. A directory this call created and the run left empty
    is removed again. A path that cannot be a directory is a ValueError (rundir.unusable)."""
    directory = Path(directory)
    reason = unusable(directory)
    if reason is not None:
        raise ValueError(f"run_dir: {directory} {reason}; expected a run directory")
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
