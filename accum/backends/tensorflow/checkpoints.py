"""Checkpoint I/O on TensorFlow: a run directory's tf.train.CheckpointManager and the check that a checkpoint reads
back whole (which ones to pass over, and moving them aside: accum/trainer/store/checkpoints.py)."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from ...errors import RunDirError
from ...text import first_line


def engine_state(engine) -> dict:
    """The engine's variables a checkpoint holds, by name: the bad and skipped updates, and under a dynamic loss
    scale the scale and the applied updates since it last grew (the update count and the door's own variables
    are the run directory's and the door's)."""
    state = {"bad_updates_in_a_row": engine.bad_updates_in_a_row, "skipped_updates": engine.skipped_updates}
    if engine.dynamic:
        state.update(loss_scale=engine.loss_scale, good_updates=engine.good_updates)
    return state


def checkpoint_problem(prefix: str) -> str | None:
    """Why the checkpoint at ``prefix`` (…/ckpt-N) cannot be restored, or None if it is intact.

    Reads every tensor of it: TensorFlow's bundle format keeps a CRC32C of each
    tensor and of the index's blocks, so a truncated, altered or missing file
    fails here, without touching any variable of the run."""
    if not Path(prefix + ".index").is_file():
        return "its .index file is missing"
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as err:  # TF's reader raises OpError, IndexError, ValueError...: all mean unreadable
        return first_line(err)
    return None


class Checkpoints:
    """A run directory's checkpoints/ for both doors: the one tf.train.CheckpointManager, keeping the newest
    ``keep``. It holds the door's ``tracked`` (its model's variables, optimizer, ...), and what every run keeps:
    the update count (``step``), the accumulator's counters (``engine``, by the names of the backend's
    ``engine_state``) and the noise scale's averages (``noise``). ``optional``, with the averages: what an older
    release's checkpoints lack, restored where present, else left as it starts. ``resume_hint`` ends the line a
    failed save raises: how to continue."""

    def __init__(self, tracked: dict, directory: Path, keep: int, resume_hint: str, engine, noise, optional=None):
        self.engine, self.noise = engine, noise
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.tracked = {**tracked, "step": self.step, **engine_state(engine)}
        self.optional = {**(optional or {}), **noise.variables()}
        self.directory, self.keep, self.resume_hint = Path(directory), keep, resume_hint
        self.manager = self._manager()

    def _manager(self):
        checkpoint = tf.train.Checkpoint(**self.tracked, **self.optional)
        return tf.train.CheckpointManager(checkpoint, str(self.directory), max_to_keep=self.keep)

    def restore(self, prefix: str) -> None:
        """Restore every tracked object from the checkpoint at ``prefix``, and the optional ones it holds."""
        saved = {name for name, _ in tf.train.list_variables(prefix)}
        held = {key: v for key, v in self.optional.items() if f"{key}/.ATTRIBUTES/VARIABLE_VALUE" in saved}
        tf.train.Checkpoint(**self.tracked, **held).restore(prefix).assert_existing_objects_matched()

    def restore_newest(self, intact: str, reread: bool) -> int:
        """Restore the newest intact checkpoint, ``intact`` (the store's ``latest_intact``), the manager reading
        the checkpoint list again first if ``reread`` (damaged ones moved aside: it reads the list only once); the
        update it was saved at."""
        if reread:
            self.manager = self._manager()
        self.restore(intact)
        self.engine.restored()
        self.noise.forget()
        return int(self.step.numpy())

    def save(self, step: int) -> None:
        """Save the state as of ``step`` updates. TensorFlow writes the files first and the 'checkpoint' list last,
        so a failed or killed save leaves the previous checkpoint as the latest; a failure is one line."""
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
