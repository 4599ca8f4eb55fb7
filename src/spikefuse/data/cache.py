"""Disk cache of packed event stores, keyed by everything that shaped their contents.

An entry is a folder `<root>/cache/<name>-<split>-<key>/` holding the store's files and,
written last, `manifest.json` with every file's size and sha256. An entry is built in a
temporary sibling folder and moved into place with one os.replace, so a reader sees
either nothing or a whole entry; one that fails its manifest (missing, truncated,
corrupted, or not a JSON object) or whose contents fail packing's checks when read
(an older release's entry, a hand-made one) is deleted and rebuilt, never read as data.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .events import check_flag, check_path
from .store import FILES, EventStore

FORMAT_VERSION = 1


def cache_key(name: str, split: str, params: dict) -> str:
    """A short hash of (data set, split, transform parameters, format version)."""
    blob = json.dumps({"name": name, "split": split, "params": params, "format": FORMAT_VERSION},
                      sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def check_root(root):
    """The cache root, a path, or a ValueError naming it (a number raised os.fspath's TypeError)."""
    return check_path("root", root, "the data cache")


def entry_path(root, name: str, split: str, params: dict) -> Path:
    check_root(root)
    for arg, value in (("name", name), ("split", split)):  # "../x" put an entry outside the cache
        if not isinstance(value, str) or not value or any(c in value for c in "/\\") or value.startswith("."):
            raise ValueError(f"{arg}: expected a non-empty name without path separators or a leading '.', "
                             f"got {value!r}")
    return Path(root).expanduser() / "cache" / f"{name}-{split}-{cache_key(name, split, params)}"


def is_valid(entry: Path) -> bool:
    """True only if the manifest exists and every file has its recorded size and checksum."""
    try:
        manifest = json.loads((entry / "manifest.json").read_text())
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:  # valid JSON, not ours
            return False
        for fname in FILES:
            info = manifest["files"][fname]
            path = entry / fname
            # size first: a truncated file is caught without reading it
            if path.stat().st_size != info["size"] or _sha256(path) != info["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_entry(entry: Path, store: EventStore, params: dict) -> None:
    """Save `store` as `entry` atomically: temp folder, manifest last, then one rename."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        store.save(tmp)
        files = {f: {"size": (tmp / f).stat().st_size, "sha256": _sha256(tmp / f)} for f in FILES}
        manifest = {"format": FORMAT_VERSION, "params": params, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, default=repr))
        if entry.exists():
            shutil.rmtree(entry)  # an invalid entry; a valid one is never rebuilt
        os.replace(tmp, entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_valid(entry):  # lost a race to another builder? then its entry is fine
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_store(root, name: str, split: str, params: dict, build: Callable[[], EventStore],
                 *, device="cpu", resident: bool = False) -> EventStore:
    """Load the entry for (name, split, params), building it with `build()` if absent or bad.

    The store is memory-mapped from disk; resident=True copies it onto `device`.
    """
    resident = check_flag("resident", resident)  # bool() took "no" as True
    entry = entry_path(root, name, split, params)
    store = None
    if is_valid(entry):
        try:
            store = EventStore.load(entry, device=device)
        except (ValueError, KeyError, TypeError):  # the files are as written, but unsound: rebuild
            pass
    if store is None:
        write_entry(entry, build(), params)
        store = EventStore.load(entry, device=device)
    return store.to(device, resident=True) if resident else store
