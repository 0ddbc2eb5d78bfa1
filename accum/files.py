"""Writing a file so that a reader, or a run resumed after kill -9, sees the old file or the new one, never half
of one. A leaf: it imports nothing of the package, so the dataset loaders and the run directory both use it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def user_cache() -> Path:
    """The tool's folder in the user's cache ($XDG_CACHE_HOME, else ~/.cache): downloads, image checks."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accum-train"


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: Path, data: bytes) -> None:
    """Write then rename: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a run's files are ordinary files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
