"""Checkpoints that a crash, a full disk or a bad sector damaged: found by reading every tensor back (the backend's
``checkpoint_problem``), passed over for the newest intact one, and (by the run that writes the directory) moved aside,
never deleted."""

from __future__ import annotations

import os
from pathlib import Path

from ...backends import active
from ...errors import RunDirError
from ...files import atomic_write

# Where a resume moves a damaged checkpoint's files (kept, never deleted), inside checkpoints/.
DAMAGED = "damaged"


def checkpoint_numbers(directory: Path) -> list:
    """The numbers of the checkpoints ``directory`` holds any file of (ckpt-N.index or ckpt-N.data-*), newest
    first: a checkpoint whose index or data file is gone still shows, so that it is reported, not skipped."""
    numbers = set()
    for path in Path(directory).glob("ckpt-*.*"):
        number = path.name[len("ckpt-") :].split(".", 1)[0]
        if number.isdigit():
            numbers.add(int(number))
    return sorted(numbers, reverse=True)


def newest_intact_checkpoint(directory: Path, flag: str = "") -> tuple:
    """(prefix, damaged): the newest checkpoint in ``directory`` that reads back whole, and the (number,
    problem) of each newer one. Reads only; no intact checkpoint: a RunDirError."""
    directory = Path(directory)
    damaged = []
    for number in checkpoint_numbers(directory):
        prefix = str(directory / f"ckpt-{number}")
        problem = active().checkpoint_problem(prefix)
        if problem is None:
            return prefix, damaged
        damaged.append((number, problem))
    found = ", ".join(f"ckpt-{n}: {why}" for n, why in damaged) or "none"
    raise RunDirError(
        f"{flag}{directory.parent}: no intact checkpoint in {directory} ({found}); nothing was changed: start a new run"
    )


def latest_intact(run_dir: Path, say, repair: bool = False, flag: str = "--resume ", found=None) -> tuple:
    """(prefix, damaged) of the newest intact checkpoint of ``run_dir``; ``say`` names each newer, damaged one,
    and with ``repair`` (a resume's chief) they are moved aside. ``found``: what ``newest_intact_checkpoint``
    gave, if the caller looked already. No checkpoint at all: a RunDirError naming ``flag``."""
    directory = Path(run_dir) / "checkpoints"
    if not checkpoint_numbers(directory):
        raise RunDirError(f"{flag}{run_dir}: no checkpoint in {directory}; start a new run instead")
    intact, damaged = found or newest_intact_checkpoint(directory, flag)
    pass_over_damaged(intact, damaged, say, repair)
    return intact, damaged


def pass_over_damaged(prefix: str, damaged: list, say, repair: bool) -> None:
    """Name each damaged checkpoint newer than ``prefix`` in one line (``say``). With ``repair`` (the run that
    will write here: a resume's chief, holding the writer lock) move its files to checkpoints/damaged/ and
    rewrite the checkpoint list to end at ``prefix``, so that TensorFlow's manager neither restores nor
    prunes by them; readers (evaluate, export, predict) change nothing."""
    directory, intact = Path(prefix).parent, Path(prefix).name
    for bad, problem in damaged:
        where = f"moved to {directory / DAMAGED}" if repair else "left in place"
        say(f"checkpoint ckpt-{bad} is damaged ({problem}): using {intact} instead; its files are {where}")
        if repair:
            _move_aside(directory, bad)
    if repair and damaged:
        _rewrite_checkpoint_list(directory, int(intact[len("ckpt-") :]))


def _move_aside(directory: Path, number: int) -> None:
    target = directory / DAMAGED
    target.mkdir(exist_ok=True)
    for path in directory.glob(f"ckpt-{number}.*"):
        destination, copy = target / path.name, 1
        while destination.exists():  # the same number damaged again in a later resume: keep both
            destination, copy = target / f"{path.name}.{copy}", copy + 1
        os.replace(path, destination)


def _rewrite_checkpoint_list(directory: Path, latest: int) -> None:
    """The 'checkpoint' file TensorFlow's manager reads: the intact checkpoints, ``latest`` last. Written as the
    CheckpointState text TensorFlow writes (paths relative to the folder), atomically; TensorFlow's own writer
    for it (tf.compat.v1.train.update_checkpoint_state) prints a deprecation warning into the run's output."""
    kept = sorted(n for n in checkpoint_numbers(directory) if n <= latest)
    lines = [f'model_checkpoint_path: "ckpt-{latest}"', *(f'all_model_checkpoint_paths: "ckpt-{n}"' for n in kept)]
    atomic_write(Path(directory) / "checkpoint", ("\n".join(lines) + "\n").encode())
