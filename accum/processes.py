"""What a training process and the processes around it share: the environment variables a ``--workers``
supervisor sets, the signals that stop a run, and the command that starts one of the core's own training
processes.

A leaf: it imports nothing of the package, so the training process (train, stopping) and the supervisor
(launcher) read the same names without importing each other.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

# The supervisor names a file per worker in this variable; the worker creates it once training begins,
# which for the chief means that every worker has joined.
STARTED_FILE = "ACCUM_TRAIN_STARTED_FILE"
# How many times the supervisor has restarted the workers (summary.json's restarts); unset: none.
RESTARTS = "ACCUM_TRAIN_RESTARTS"
# The signals that stop a run after the update in hand (stopping.StopFlag; the supervisor hands them to the
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
