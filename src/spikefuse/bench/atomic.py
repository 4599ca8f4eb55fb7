"""Result files written whole or not at all."""
from __future__ import annotations

import os
import tempfile


def atomic_write(path: str, content: str | bytes) -> None:
    """Write text or bytes to a temporary file in the same folder, then rename: never a
    half-written file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files: results others may read
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
