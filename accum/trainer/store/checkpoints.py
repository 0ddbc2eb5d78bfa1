"""Checkpoints that a crash, a full disk or a bad sector damaged: found by reading every tensor back, passed
over for the newest intact one, and (by the run that writes the directory) moved aside, never deleted."""

from __future__ import annotations

import os
from pathlib import Path

from ...backends import active
from ...errors import RunDirError
from ...files import atomic_write
from ...text import first_line

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


def checkpoint_problem(prefix: str) -> str | None:
    """Why the checkpoint at ``prefix`` (…/ckpt-N) cannot be restored, or None if it is intact.

    Reads every tensor of it: TensorFlow's bundle format keeps a CRC32C of each
    tensor and of the index's blocks, so a truncated, altered or missing file
    fails here, without touching any variable of the run."""
    import tensorflow as tf

    if not Path(prefix + ".index").is_file():
        return "its .index file is missing"
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as err:  # TF's reader raises OpError, IndexError, ValueError...: all mean unreadable
        return first_line(err)
    return None


def newest_intact_checkpoint(directory: Path, flag: str = "") -> tuple:
    """(prefix, damaged): the newest checkpoint in ``directory`` that reads back whole, and the (number,
    problem) of each newer one. Reads only; no intact checkpoint: a RunDirError."""
    directory = Path(directory)
    damaged = []
    for number in checkpoint_numbers(directory):
        prefix = str(directory / f"ckpt-{number}")
        problem = checkpoint_problem(prefix)
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


class Checkpoints:
    """A run directory's checkpoints/ for both doors: the one tf.train.CheckpointManager, keeping the newest
    ``keep``. It holds the door's ``tracked`` (its model's variables, optimizer, ...), and what every run keeps:
    the update count (``step``), the accumulator's counters (``engine``, by the names of the backend's
    ``engine_state``) and the noise scale's averages (``noise``). ``optional``, with the averages: what an older
    release's checkpoints lack, restored where present, else left as it starts. ``resume_hint`` ends the line a
    failed save raises: how to continue."""

    def __init__(self, tracked: dict, directory: Path, keep: int, resume_hint: str, engine, noise, optional=None):
        import tensorflow as tf

        self.engine, self.noise = engine, noise
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.tracked = {**tracked, "step": self.step, **active().engine_state(engine)}
        self.optional = {**(optional or {}), **noise.variables()}
        self.directory, self.keep, self.resume_hint = Path(directory), keep, resume_hint
        self.manager = self._manager()

    def _manager(self):
        import tensorflow as tf

        checkpoint = tf.train.Checkpoint(**self.tracked, **self.optional)
        return tf.train.CheckpointManager(checkpoint, str(self.directory), max_to_keep=self.keep)

    def restore(self, prefix: str) -> None:
        """Restore every tracked object from the checkpoint at ``prefix``, and the optional ones it holds."""
        import tensorflow as tf

        saved = {name for name, _ in tf.train.list_variables(prefix)}
        held = {key: v for key, v in self.optional.items() if f"{key}/.ATTRIBUTES/VARIABLE_VALUE" in saved}
        tf.train.Checkpoint(**self.tracked, **held).restore(prefix).assert_existing_objects_matched()

    def restore_newest(self, run_dir: Path, say, repair: bool, flag: str, found=None) -> int:
        """Restore the newest intact checkpoint of ``run_dir`` (``latest_intact``: the damaged ones newer than it
        named, and with ``repair`` moved aside, after which TensorFlow's manager reads the list again); the
        update it was saved at."""
        intact, damaged = latest_intact(run_dir, say, repair, flag, found)
        if repair and damaged:
            self.manager = self._manager()  # TensorFlow's manager reads the checkpoint list only once
        self.restore(intact)
        self.engine.restored()
        self.noise.forget()
        return int(self.step.numpy())

    def save(self, step: int) -> None:
        """Save the state as of ``step`` updates. TensorFlow writes the files first and the 'checkpoint' list last,
        so a failed or killed save leaves the previous checkpoint as the latest; a failure is one line."""
        import tensorflow as tf

        self.step.assign(step)
        self.noise.store()
        try:
            self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as err:
            message = getattr(err, "message", None) or getattr(err, "strerror", None) or str(err)
            raise RunDirError(
                f"cannot write checkpoint {step} in {self.manager.directory} "
                f"({message.splitlines()[0]}): free space or fix permissions, then {self.resume_hint} (the last "
                f"complete checkpoint, {Path(self.manager.latest_checkpoint or 'none').name}, is intact)"
            ) from None
