"""Writing a file so that a reader, or a run resumed after kill -9, sees the old file or the new one, never half
of one; and the strict JSON every JSON file of the tool is written in (``strict_json``). A leaf: it imports
nothing of the package, so the dataset loaders and the run directory both use it."""

from __future__ import annotations

import json
import math
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


def keras_bytes(model, name: str = "model.keras", folder=None) -> bytes:
    """The bytes of ``model`` as a .keras file: Keras writes one only to a path, here a private folder (in
    ``folder``, default the system's temporary one), whose bytes then go through ``atomic_write``."""
    with tempfile.TemporaryDirectory(dir=folder, prefix=".model-") as scratch:
        model.save(Path(scratch) / name)
        return (Path(scratch) / name).read_bytes()


def strict_json(data, indent: int | None = None) -> str:
    """``data`` as strict JSON (RFC 8259), for every file and ``--json`` output the tool writes for others to read:
    a non-finite float (NaN, Infinity) becomes null. Python's json writes them as the bare words NaN and Infinity,
    which strict readers refuse (JavaScript's JSON.parse, jq before 1.7, Go's encoding/json). ``allow_nan=False``:
    a non-finite number in a type the conversion does not reach raises here instead of writing such a file."""
    return json.dumps(_finite_or_null(data), indent=indent, allow_nan=False)


def _finite_or_null(value):
    if isinstance(value, float):  # numpy's float64 too (a subclass)
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(item) for item in value]
    return value


def check_output_file(output: Path, overwrite: bool, suffix: str, why: str = "") -> None:
    """``--output FILE`` before anything is computed: named ``*suffix`` (``why``: what that format is), not a
    directory, in a writable folder, and an existing file replaced only with ``--overwrite``."""
    from .errors import RunDirError, UserError

    if output.suffix != suffix:
        raise UserError(f"--output {output} must end in {suffix}" + (f" ({why})" if why else ""))
    if output.is_dir():
        raise UserError(f"--output {output} is a directory: name a {suffix} file")
    if output.exists() and not overwrite:
        raise UserError(f"{output} exists: pass --overwrite to replace it, or --output another {suffix} file")
    parent = output.parent
    if not parent.is_dir():
        raise UserError(f"--output {output}: the folder {parent} does not exist: create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"--output {output}: {parent} is not writable: choose another folder")
