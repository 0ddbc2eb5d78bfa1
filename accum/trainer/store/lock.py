"""One writer per run directory: an exclusive flock on a file in it while a process writes the directory."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ...errors import RunDirError
from ...files import _UMASK

# The lock file in a run directory: an exclusive flock on it while a process writes the directory. The kernel
# drops the lock when its holder dies, even by kill -9, so a stale file never blocks; it holds the pid to name.
LOCK = "writer.lock"
# A --workers supervisor holds the lock for its workers and names the run directory here: they skip it.
LOCK_HELD = "ACCUM_TRAIN_LOCK_HELD"


def lock_holder(run_dir: Path) -> str | None:
    """The pid of the process that writes ``run_dir`` now, or None: nothing is written, nothing taken."""
    path = Path(run_dir) / LOCK
    try:
        handle = open(path)  # noqa: SIM115 - the with below closes it; a missing file means no writer
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def in_use_error(run_dir: Path, pid: str, flag: str) -> RunDirError:
    return RunDirError(
        f"{flag}{run_dir} is in use: process {pid} is writing it (one writer per run directory); "
        f"wait for it to end or stop it, then try again"
    )


@contextlib.contextmanager
def writing(run_dir: Path, flag: str = "", for_children: bool = False):
    """Hold ``run_dir``'s lock while the block writes it (creating the directory); another writer is refused
    at once with the holder's pid (a RunDirError, nothing written). ``for_children``: the processes this one
    starts inside the block write it under this lock (a --workers supervisor). A directory it created and
    that holds nothing but the lock at the end (the block wrote nothing) is removed again."""
    run_dir = Path(run_dir)
    if os.environ.get(LOCK_HELD) == str(run_dir.resolve()):
        yield  # our supervisor holds it
        return
    created = not run_dir.exists()
    try:  # check_place saw a writable folder; some are not, whatever their mode says (/proc, a read-only mount)
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"{flag}{run_dir} cannot be made ({err.strerror}): choose another directory") from None
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o666 & ~_UMASK)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise in_use_error(run_dir, holder, flag) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        previous = os.environ.get(LOCK_HELD)
        if for_children:
            os.environ[LOCK_HELD] = str(run_dir.resolve())
        try:
            yield
        finally:
            if for_children:
                if previous is None:
                    os.environ.pop(LOCK_HELD, None)
                else:
                    os.environ[LOCK_HELD] = previous
    finally:
        if created and [p.name for p in run_dir.iterdir()] == [LOCK]:
            (run_dir / LOCK).unlink()
            run_dir.rmdir()
        os.close(fd)  # releases the lock
