"""Run directories and atomic files, without TensorFlow.

Kept apart from the training loop so that the CLI can check paths before it
imports TensorFlow: a multi-worker strategy must be created before
TensorFlow (or TensorLayer's import) runs anything.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .errors import RunDirError

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


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file() and (Path(path) / "checkpoints").is_dir()


def check_output_dir(path: Path) -> None:
    """Refuse a directory we would damage or cannot use, before anything is written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--output-dir {path} is a file: name a directory")
    if path.is_dir() and any(path.iterdir()):
        hint = f"continue it with --resume {path}" if is_run_dir(path) else "choose an empty or new directory"
        raise RunDirError(f"--output-dir {path} is not empty: {hint}")
    parent = path if path.is_dir() else _existing_parent(path)
    if not parent.is_dir():
        raise RunDirError(f"--output-dir {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"--output-dir {path}: {parent} is not writable: choose another directory")


def _existing_parent(path: Path) -> Path:
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")




def write_json(path: Path, data) -> None:
    """An indented JSON file, written atomically (summary.json, compare.json, bench.json)."""
    atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path) -> None:
    """Save a PNG atomically and free the figure."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    pyplot().close(fig)
    tmp.replace(path)
