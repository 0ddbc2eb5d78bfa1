"""Run directories and the files in them.

Every file accum-train writes goes through ``atomic_write`` (write, fsync,
rename): a reader, or a run resumed after kill -9, sees the old file or the
new one, never half of one. metrics.jsonl is the one file appended to, and a
resumed run drops what follows its checkpoint (``MetricsLog.truncate_after``).

TensorFlow is imported only where a function needs it, so that paths and
configs can be checked (and the ``--workers`` supervisor can run) without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import math
import os
from pathlib import Path

from .config import Config, as_config, load_config
from .errors import RunDirError
from .files import _UMASK, atomic_write
from .text import first_line


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file() and (Path(path) / "checkpoints").is_dir()


def require_run_dir(path: Path, flag: str = "") -> Path:
    """``path``, if it is a directory written by 'accum-train run' (``flag``, e.g. '--resume', names it)."""
    path = Path(path)
    if (path / "fit.json").is_file():
        raise RunDirError(
            f"{flag + ' ' if flag else ''}{path} was written by accum_train.fit: continue it by calling "
            f"accum_train.fit(model, ..., output_dir={str(path)!r}) again; its trained model is {path / 'model.keras'}"
        )
    if not path.is_dir() or not is_run_dir(path):
        raise RunDirError(
            f"{flag + ' ' if flag else ''}{path} is not a run directory (no config.yaml and "
            f"checkpoints/): pass a directory written by 'accum-train run'"
        )
    return path


def check_output_dir(path: Path) -> None:
    """Refuse a directory we would damage or cannot use, before anything is written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--output-dir {path} is a file: name a directory")
    ours = os.environ.get(LOCK_HELD) == str(path.resolve())  # a --workers supervisor's chief: it holds the lock
    holder = None if ours else lock_holder(path)
    if holder is not None:
        raise in_use_error(path, holder, "--output-dir ")
    if path.is_dir() and any(p.name != LOCK for p in path.iterdir()):  # a lock alone: a run that wrote nothing
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


def default_output_dir(config_path, prefix: str = "") -> Path:
    """runs/[PREFIX]NAME-DATE-TIME, NAME the config file's stem (``run`` for a config that is no file)."""
    import datetime

    stem = Path(config_path).stem if config_path else "run"
    return Path("runs") / f"{prefix}{stem}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def write_json(path: Path, data) -> None:
    """An indented JSON file, written atomically (summary.json, compare.json, bench.json)."""
    atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())


def write_result(out_dir: Path, name: str, result: dict, plot) -> None:
    """NAME.json and NAME.png (drawn by ``plot(result, path)``), both written atomically."""
    write_json(Path(out_dir) / f"{name}.json", result)
    plot(result, Path(out_dir) / f"{name}.png")


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Save a PNG atomically and free the figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    pyplot().close(fig)
    atomic_write(path, buffer.getvalue())


def save_weights(named_weights: dict, path: Path) -> None:
    """weights.npz: name -> array, from a model's explicitly named variables."""
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **{name: v.numpy() for name, v in named_weights.items()})
    atomic_write(path, buffer.getvalue())


# A keras_file run keeps a copy of the file it started from: resume, export,
# evaluate and predict rebuild the model from it (the checkpoint holds the
# weights), so the run does not depend on model.path staying where it was.
MODEL_COPY = "initial_model.keras"


def keep_model_file(run_dir: Path, model_cfg) -> None:
    if model_cfg.name == "keras_file" and not (Path(run_dir) / MODEL_COPY).is_file():
        atomic_write(Path(run_dir) / MODEL_COPY, Path(model_cfg.path).read_bytes())


def kept_model(run_dir: Path, model_cfg):
    """``model_cfg``, reading a keras_file run's model from its copy in ``run_dir`` when there is one."""
    import dataclasses

    copy = Path(run_dir) / MODEL_COPY
    if model_cfg.name == "keras_file" and copy.is_file():
        return dataclasses.replace(model_cfg, path=str(copy))
    return model_cfg


# ----------------------------------------------------------------------------
# Resuming

# Keys a resumed run may change: they do not alter what was computed so far. A change of strategy
# keeps the global batch and the data order; the resume adapts subdivisions to its replicas (train.py).
RESUMABLE_CHANGES = ("epochs", "log_every", "checkpoint.every_steps", "checkpoint.keep", "data.dir", "strategy")


def _flatten(d: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in d.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def resume_config(run_dir: Path, config_path=None, overrides=()) -> Config:
    """The config to continue ``run_dir`` with: its own, changed only in keys that allow it.

    Values resolved when the run started (a schedule's decay_steps) stay as
    resolved, even where the given config leaves them to be computed."""
    run_dir = require_run_dir(run_dir, "--resume")
    saved = load_config(run_dir / "config.yaml")
    if config_path is None and not overrides:
        return saved
    wanted = as_config(config_path if config_path is not None else run_dir / "config.yaml", overrides)
    wanted = wanted.with_decay_steps(wanted.optimizer.schedule.decay_steps or saved.optimizer.schedule.decay_steps)
    old, new = _flatten(saved.to_dict()), _flatten(wanted.to_dict())
    changed = [k for k in new if old.get(k) != new[k]]
    bad = [k for k in changed if not any(k == a or k.startswith(a + ".") for a in RESUMABLE_CHANGES)]
    if bad:
        key = bad[0]
        raise RunDirError(
            f"--resume {run_dir}: the config changes {key} ({old.get(key)!r} -> {new[key]!r}), "
            f"which the run cannot continue with; only {', '.join(RESUMABLE_CHANGES)} may change"
        )
    return wanted


# ----------------------------------------------------------------------------
# metrics.jsonl and TensorBoard


# An epoch's record as TensorBoard scalars (epoch/KEY): these, and every test_ and validation_ score (a Keras
# loss's run has its metrics there).
EPOCH_SCALARS = ("train_loss", "examples_per_s", "noise_scale")


def epoch_scalars(record: dict) -> list[str]:
    return [*EPOCH_SCALARS, *(key for key in record if key.startswith(("test_", "validation_")))]


# Keys metrics.jsonl had before 0.1.0 settled on one name per thing (summary.json's): read as today's.
RENAMED_KEYS = {"val_loss": "validation_loss", "val_accuracy": "validation_accuracy"}


def is_epoch_record(record: dict) -> bool:
    """An epoch's line of metrics.jsonl (an update's has a "loss")."""
    return "elapsed_s" in record


def read_metrics(path: Path) -> list:
    """The records of a metrics.jsonl, older key names read as today's."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [{RENAMED_KEYS.get(key, key): value for key, value in record.items()} for record in records]


class MetricsLog:
    """metrics.jsonl (one JSON object per line) plus the same scalars for TensorBoard."""

    def __init__(self, run_dir: Path):
        import tensorflow as tf

        self.path = Path(run_dir) / "metrics.jsonl"
        self.writer = tf.summary.create_file_writer(str(Path(run_dir) / "tensorboard"))

    def truncate_after(self, step: int, epochs_done: int) -> None:
        """Drop records a resumed run will write again (those after its checkpoint)."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if is_epoch_record(record):
                if record["epoch"] <= epochs_done:
                    keep.append(line)
            elif record.get("step", 0) <= step:
                keep.append(line)
        atomic_write(self.path, "".join(line + "\n" for line in keep).encode())

    def write(self, records) -> None:
        import tensorflow as tf

        with open(self.path, "a") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())  # before the checkpoint that counts these updates as done
        with self.writer.as_default():
            for record in records:
                if is_epoch_record(record):
                    for key in epoch_scalars(record):
                        if isinstance(record.get(key), (int, float)):
                            tf.summary.scalar(f"epoch/{key}", record[key], step=record["step"])
                    continue
                # a skipped update has no loss, and no rate was applied
                for key, tag in (
                    ("loss", "train/loss"),
                    ("learning_rate", "train/learning_rate"),
                    ("noise_scale", "train/noise_scale"),
                ):
                    if record.get(key) is not None:
                        tf.summary.scalar(tag, record[key], step=record["step"])
        self.writer.flush()

    def write_updates(self, pending, timeline) -> tuple:
        """Records of buffered updates, (step, examples, engine output, batch size in force, k) each; (loss sum,
        examples) of the applied ones. ``timeline`` (accum.timeline.Timeline) places each update in its epoch."""
        records = []
        loss_sum, examples = 0.0, 0
        for step, n, out, batch_size, k in pending:
            loss, rate, applied = float(out["loss"]), float(out["learning_rate"]), bool(out["applied"])
            if applied:
                loss_sum += loss * n
                examples += n
            record = {
                "epoch": timeline.epoch_of(step - 1) + 1,
                "step": step,
                "examples_seen": timeline.examples_seen(step),
                "batch_size": batch_size,
                "subdivisions": k,
                "loss": loss if math.isfinite(loss) else None,
                "learning_rate": rate if applied else None,  # the rate applied; none if skipped
                # the global norm of the update's gradient, before clipping
                "grad_norm": float(out["grad_norm"]) if applied else None,
                "skipped": not applied,
            }
            if "noise_scale" in out:  # the gradient noise scale's running estimate after it (noise.py); or null
                record["noise_scale"] = out["noise_scale"]
            if "loss_scale" in out:  # mixed_float16: the scale this update used; an overflow skip
                record.update(loss_scale=float(out["loss_scale"]), overflow=bool(out["overflow"]))
            records.append(record)
        self.write(records)
        return loss_sum, examples

    def read(self):
        return read_metrics(self.path) if self.path.exists() else []

    def epoch_losses(self, epoch: int) -> tuple:
        """(loss sum, examples) of the applied updates logged so far in ``epoch``."""
        loss_sum, examples, seen = 0.0, 0, 0
        for record in self.read():
            if "loss" not in record:
                continue
            n, seen = record["examples_seen"] - seen, record["examples_seen"]  # records start at step 1
            if record["epoch"] == epoch and not record["skipped"]:
                loss_sum += record["loss"] * n
                examples += n
        return loss_sum, examples


# ----------------------------------------------------------------------------
# Checkpoints that a crash, a full disk or a bad sector damaged

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


# ----------------------------------------------------------------------------
# One writer per run directory

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
    run_dir.mkdir(parents=True, exist_ok=True)
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
