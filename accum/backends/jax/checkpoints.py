"""Checkpoint I/O on JAX, where no TensorFlow may be installed: a run directory's checkpoints/ as numpy files, with
the TensorFlow backend's names and guarantees (which checkpoints to pass over, and moving them aside, are
accum/trainer/store/checkpoints.py's for both).

A checkpoint is two files: ``ckpt-N.data`` (an .npz of every value it holds, by name) and ``ckpt-N.index`` (JSON:
the data file's SHA-256 and each value's shape and dtype). Each is written under a name the store does not read,
then renamed into place, the index last: a save killed before its index is renamed leaves at most a data file, which
``checkpoint_problem`` names and a resume passes over, as it passes over a damaged TensorFlow checkpoint."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from ...errors import RunDirError
from ...files import atomic_write


class Counter:
    """An engine's counter (an attribute holding a JAX or Python number) as a checkpoint reads and restores it."""

    def __init__(self, engine, name: str, dtype: str | None = "int32"):
        self.engine, self.name, self.dtype = engine, name, dtype  # dtype None: a Python int (the engine's k)

    def numpy(self):
        return np.asarray(getattr(self.engine, self.name))

    def assign(self, value) -> None:
        setattr(self.engine, self.name, int(value) if self.dtype is None else jnp.asarray(value, self.dtype))


def engine_state(engine) -> dict:
    """The engine's counters a checkpoint holds, by name: the bad updates in a row and the skipped ones (a
    LossScaleOptimizer keeps its scale among its own variables, which the optimizer's checkpoint holds)."""
    return {"bad_updates_in_a_row": Counter(engine, "_bad"), "skipped_updates": Counter(engine, "_skipped")}


def _items(name: str, value) -> list:
    """(key, holder) of what ``value`` holds: a list of variables by index, an optimizer or metrics by their
    variables, anything with ``numpy`` and ``assign`` (a Keras variable, a door's state) as itself."""
    if hasattr(value, "variables") and not hasattr(value, "numpy"):  # an optimizer (whose ``assign`` is another's)
        value = value.variables
    if isinstance(value, (list, tuple)):
        return [(f"{name}/{i}", v) for i, v in enumerate(value)]
    return [(name, value)]


def _read(holder) -> np.ndarray:
    return np.asarray(holder.numpy() if hasattr(holder, "numpy") else holder)


def checkpoint_problem(prefix: str) -> str | None:
    """Why the checkpoint at ``prefix`` (…/ckpt-N) cannot be restored, or None if it is intact: its index missing
    or unreadable, its data file missing, or the data not the bytes the index's SHA-256 names."""
    index, data = Path(prefix + ".index"), Path(prefix + ".data")
    if not index.is_file():
        return "its .index file is missing"
    try:
        expected = json.loads(index.read_text())["sha256"]
    except (OSError, ValueError, KeyError) as err:
        return f"its .index file is unreadable ({err})"
    if not data.is_file():
        return "its .data file is missing"
    if hashlib.sha256(data.read_bytes()).hexdigest() != expected:
        return "its .data file is not the bytes its index names (a changed or truncated file)"
    return None


def _saved(prefix: str) -> dict:
    """Every value the checkpoint at ``prefix`` holds, by name."""
    with np.load(prefix + ".data", allow_pickle=False) as saved:
        return {name: saved[name] for name in saved.files}


def saved_weight_shapes(prefix: str) -> list:
    """The shapes of the checkpoint ``prefix``'s "weights", in their order (model.variables')."""
    values = _saved(prefix)
    found = {int(name.split("/")[1]): value.shape for name, value in values.items() if name.startswith("weights/")}
    return [tuple(found[i]) for i in sorted(found)]


def saved_value(prefix: str, name: str):
    """The value the checkpoint ``prefix`` holds for ``name`` (a top-level one), None if none."""
    return _saved(prefix).get(name)


def restore_weights(prefix: str, weights: list) -> None:
    """The checkpoint ``prefix``'s "weights" into ``weights`` (Keras variables), nothing else; a checkpoint of
    other weights raises ValueError."""
    values = _saved(prefix)
    saved = [values[f"weights/{i}"] for i in range(len(weights)) if f"weights/{i}" in values]
    if len(saved) != len(weights) or f"weights/{len(weights)}" in values:
        raise ValueError(f"the checkpoint holds other weights than these {len(weights)}")
    for variable, value in zip(weights, saved):
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{variable.path} is {tuple(variable.shape)}, {tuple(value.shape)} in the checkpoint")
        variable.assign(value)


class Checkpoints:
    """A run directory's checkpoints/ on JAX, keeping the newest ``keep``: the door's ``tracked`` (its model's
    variables, optimizer, metrics, counters), the update count (``step``), the accumulator's counters
    (``engine_state``) and the noise scale's averages. ``optional``: what an older checkpoint may lack, restored
    where present. ``resume_hint`` ends the line a failed save raises. The TensorFlow backend's Checkpoints' calls."""

    def __init__(self, tracked: dict, directory: Path, keep: int, resume_hint: str, engine, noise, optional=None):
        self.engine, self.noise, self.directory, self.keep, self.resume_hint = (
            engine,
            noise,
            Path(directory),
            keep,
            resume_hint,
        )
        self.holders = dict(
            item for name, value in {**tracked, **engine_state(engine)}.items() for item in _items(name, value)
        )
        self.optional = dict(item for name, value in (optional or {}).items() for item in _items(name, value))

    def restore(self, prefix: str) -> None:
        """Every tracked value from the checkpoint at ``prefix``, and the optional ones it holds; one that does not
        match the run's (another model, optimizer or metrics) raises ValueError."""
        with np.load(prefix + ".data", allow_pickle=False) as saved:
            values = {name: saved[name] for name in saved.files}
        missing = [name for name in self.holders if name not in values]
        extra = [name for name in values if name not in {**self.holders, **self.optional, "step": 0, "noise": 0}]
        if missing or extra:
            raise ValueError(f"the checkpoint holds {len(values)} values where this call has {len(self.holders)}")
        for name, holder in {**self.holders, **self.optional}.items():
            if name in values:
                value = values[name]
                shape = np.shape(_read(holder))
                if value.dtype.kind not in "SU" and value.shape != shape:
                    raise ValueError(f"{name} is {value.shape} in the checkpoint, {shape} here")
                holder.assign(value.item() if value.dtype.kind == "S" else value)
        if "noise" in values:
            self.noise.hold(values["noise"])
        self.step = int(values["step"])

    def restore_newest(self, intact: str, reread: bool) -> int:
        """Restore the newest intact checkpoint, ``intact`` (the store's ``latest_intact``); the update it was saved
        at. ``reread``: the TensorFlow manager's, nothing to read again here."""
        self.restore(intact)
        self.engine.restored()
        return self.step

    def save(self, step: int) -> None:
        """Save the state as of ``step`` updates: the data, then its index (a save cut short leaves the newest
        complete checkpoint the latest); older ones past ``keep`` removed; a failure is one line."""
        values = {name: _read(holder) for name, holder in {**self.holders, **self.optional}.items()}
        values.update(step=np.asarray(step, np.int64), noise=np.asarray(self.noise.held(), np.float64))
        buffer = io.BytesIO()
        np.savez(buffer, **values)
        data = buffer.getvalue()
        prefix = self.directory / f"ckpt-{step}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write(Path(f"{prefix}.data"), data)
            index = {
                "sha256": hashlib.sha256(data).hexdigest(),
                "values": {k: [list(v.shape), str(v.dtype)] for k, v in values.items()},
            }
            atomic_write(Path(f"{prefix}.index"), json.dumps(index).encode())
        except OSError as err:
            newest = next(
                (
                    p.stem
                    for p in sorted(self.directory.glob("ckpt-*.index"), key=_number, reverse=True)
                    if _number(p) != step
                ),
                "none",
            )
            raise RunDirError(
                f"cannot write checkpoint {step} in {self.directory} ({err.strerror or err}): free space or fix "
                f"permissions, then {self.resume_hint} (the last complete checkpoint, {newest}, is intact)"
            ) from None
        for old in sorted({_number(p) for p in self.directory.glob("ckpt-*.index")})[: -self.keep or None]:
            for path in self.directory.glob(f"ckpt-{old}.*"):
                os.remove(path)


def _number(path: Path) -> int:
    return int(path.name[len("ckpt-") :].split(".", 1)[0])
