"""What a training process and the processes around it share: the environment variables a ``--workers``
supervisor sets, the signals that stop a run, the command that starts one of the core's own training processes,
and how the tool runs a child of its own (compare's two runs, bench's workers, the data check of ``--workers``,
the workers themselves) and finds the one line that says why one failed.

A leaf: it imports nothing of the package, so the training process (train, stopping) and the supervisor
(launcher) read the same names without importing each other.

A child of ours ends a failure with one line on stderr (``error: ...``, or
``stopped by ...`` after a signal); anything else that fails leaves a
traceback, whose last line is the exception. ``last_error`` finds that line
among TensorFlow's own log lines, for every caller alike.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# The supervisor names a file per worker in this variable; the worker creates it once training begins,
# which for the chief means that every worker has joined.
STARTED_FILE = "ACCUM_TRAIN_STARTED_FILE"
# How many times the supervisor has restarted the workers (summary.json's restarts); unset: none.
RESTARTS = "ACCUM_TRAIN_RESTARTS"
# The signals that stop a run after the update in hand (rundir.StopFlag; the supervisor hands them to the
# chief), and the exit codes of a run they stopped (Interrupted: 128 + the signal's number).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPTED_CODES = tuple(128 + sig for sig in STOP_SIGNALS)


def announce_started() -> None:
    """Tell a ``--workers`` supervisor that this process is training; nothing for a run of its own."""
    path = os.environ.get(STARTED_FILE)
    if path:
        Path(path).touch()


def restarts() -> int:
    """How many times a ``--workers`` supervisor has started this run's workers again (0: never, or none)."""
    return int(os.environ.get(RESTARTS, "0"))


def training_process(*args: str) -> list[str]:
    """The argument list that starts one of the core's training processes (``python -m accum_train.worker``)
    with ``args`` (CONFIG, --output-dir DIR or --resume DIR, --set ...)."""
    return [sys.executable, "-m", "accum_train.worker", *args]


# What a child's stderr holds besides its own last words: TensorFlow's and absl's start-up and log
# lines, and the indented lines of a traceback.
_NOISE = (" ", "I0000", "W0000", "WARNING", "To enable")
# A warning Python prints while it imports a module it has to compile first (a site-packages without its .pyc
# files: TensorLayer's "is" with a literal), "path:line: SomeWarning: text": noise too, not why the child failed.
_PYTHON_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")


def last_error(lines: Iterable[str], default: str = "no message") -> str:
    """The line that says why a child failed: its last ``error: ...`` or ``stopped by ...`` line, else its
    last line that is not TensorFlow's noise (a traceback's exception), else ``default``."""
    ours, other = None, None
    for line in lines:
        if line.startswith(("error: ", "stopped by ")):
            ours = line.strip()
        elif line.strip() and not line.startswith(_NOISE) and not _PYTHON_WARNING.match(line):
            other = line.strip()
    return ours or other or default


def error_message(line: str) -> str:
    """An ``error: ...`` line without its prefix (a message to raise again); any other line as it is."""
    return line[len("error: ") :] if line.startswith("error: ") else line


@dataclass(frozen=True)
class Child:
    code: int
    stdout: str
    error: str  # last_error of its stderr


def run_child(command: Sequence[str], *, env: dict | None = None, say: Callable[[str], None] | None = None):
    """Run a command to its end; its exit code, stdout and ``last_error``. Each stdout line is handed to
    ``say`` as it comes; stderr is read beside it, so that neither pipe can fill up and block the child."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    errors: list = []
    reader = threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True)
    reader.start()
    out = []
    for line in process.stdout:
        out.append(line)
        if say is not None:
            say(line.rstrip("\n"))
    code = process.wait()
    reader.join()
    return Child(code=code, stdout="".join(out), error=last_error(errors))
