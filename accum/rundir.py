"""Run directories and the files in them.

Every file accum-train writes goes through ``files.atomic_write`` (write,
fsync, rename): a reader, or a run resumed after kill -9, sees the old file or
the new one, never half of one. The rest of a run directory has rooms of its
own: metrics_log.py (metrics.jsonl and TensorBoard), checkpoints.py (damaged
checkpoints passed over), lock.py (one writer).

TensorFlow is imported only where a function needs it, so that paths and
configs can be checked (and the ``--workers`` supervisor can run) without it.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from .config import Config, as_config, load_run_config
from .errors import RunDirError
from .files import atomic_write
from .keras_archive import uses_keras_loss
from .lock import LOCK, LOCK_HELD, in_use_error, lock_holder

# What accum_train.fit's output_dir holds first (keras_fit/rundir.py): how a reader tells the two doors' run
# directories apart.
FIT_RECORD = "fit.json"


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file() and (Path(path) / "checkpoints").is_dir()


def is_fit_run_dir(path: Path) -> bool:
    return (Path(path) / FIT_RECORD).is_file()


def require_run_dir(path: Path, flag: str = "") -> Path:
    """``path``, if it is a directory written by 'accum-train run' (``flag``, e.g. '--resume', names it). One
    written by accum_train.fit is refused: only that call has the model's code and data to go on with it (the
    readers, export, evaluate and predict, tell it apart first: ``is_fit_run_dir``)."""
    path = Path(path)
    if is_fit_run_dir(path):
        raise RunDirError(
            f"{flag + ' ' if flag else ''}{path} was written by accum_train.fit: continue it by calling "
            f"accum_train.fit(model, ..., output_dir={str(path)!r}) again (the command line has neither the model's "
            f"code nor the data); accum-train export, predict and evaluate --data read it as it is"
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


# A keras_file run keeps a copy of the file it started from, and accum_train.fit
# saves its model there as a run starts: resume, export, evaluate and predict
# rebuild the model from it (the checkpoint holds the weights), so the run does
# not depend on model.path staying where it was, or on the call returning.
MODEL_COPY = "initial_model.keras"


def keep_model_file(run_dir: Path, model_cfg) -> None:
    if model_cfg.name == "keras_file" and not (Path(run_dir) / MODEL_COPY).is_file():
        atomic_write(Path(run_dir) / MODEL_COPY, Path(model_cfg.path).read_bytes())


@dataclass(frozen=True)
class ModelSource:
    """What a run builds its model from, decided once (``model_source``)."""

    config: object  # the config's ModelConfig; a keras_file's path the run directory's copy where it has one
    keras_loss: bool  # trains with a Keras loss (the YAML's loss or the file's compile()), not the built-in one


def model_source(cfg, run_dir: Path | None = None) -> ModelSource:
    """The model a run of ``cfg`` builds, read from ``run_dir``'s copy of a keras_file when there is one (a
    resume, evaluate, a worker beside the chief), and whether it trains with a Keras loss: the file is opened
    here, once, and every stage after takes this."""
    model = cfg.model
    if model.name == "keras_file" and run_dir is not None and (Path(run_dir) / MODEL_COPY).is_file():
        model = replace(model, path=str(Path(run_dir) / MODEL_COPY))
    return ModelSource(model, uses_keras_loss(model, cfg.loss))


# ----------------------------------------------------------------------------
# Resuming

# Keys a resumed run may change: they do not alter what was computed so far. A change of strategy
# keeps the global batch and the data order; the resume adapts subdivisions to its replicas (config_run.py).
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
    saved = load_run_config(run_dir)
    if config_path is None and not overrides:
        return saved
    wanted = as_config(config_path, overrides) if config_path is not None else load_run_config(run_dir, overrides)
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
