"""Where a run's config and model come from, read without Keras or TensorFlow: the config a resume continues
with (``resume_config``), and the model a run builds (``model_source``: the YAML's, or the run directory's copy
of its keras_file, and whether it trains with a Keras loss, from the .keras file's own config.json).

The ``--workers`` supervisor, which never loads TensorFlow, decides from it whether a run's .npz holds
class labels or targets for the model's own loss (build.py)."""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import Config, as_config, load_run_config, override_key
from ..errors import RunDirError
from ..trainer.store.rundir import MODEL_COPY, require_run_dir


def default_output_dir(config_path, prefix: str = "") -> Path:
    """runs/[PREFIX]NAME-DATE-TIME, NAME the config file's stem (``run`` for a config that is no file)."""
    import datetime

    stem = Path(config_path).stem if config_path else "run"
    return Path("runs") / f"{prefix}{stem}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def compile_config(path: str) -> dict:
    """What ``compile()`` gave the model in a .keras file (its config.json's compile_config; {}: none).
    A file that cannot be read says so when it is loaded."""
    try:
        with zipfile.ZipFile(path) as archive:
            return json.loads(archive.read("config.json")).get("compile_config") or {}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return {}


@dataclass(frozen=True)
class ModelSource:
    """What a run builds its model from, decided once (``model_source``)."""

    config: object  # the config's ModelConfig; a keras_file's path the run directory's copy where it has one
    keras_loss: bool  # trains with a Keras loss (the YAML's loss or the file's compile()), not the built-in one
    compiled: dict  # a keras_file's compile_config ({}: none, or no keras_file)


def model_source(cfg, run_dir: Path | None = None) -> ModelSource:
    """The model a run of ``cfg`` builds, read from ``run_dir``'s copy of a keras_file when there is one (a
    resume, evaluate, a worker beside the chief), and whether it trains with a Keras loss (the YAML's ``loss``, or
    the file's compile()) rather than the built-in classification loss: the file is opened here, once, and every
    stage after takes this."""
    model = cfg.model
    if model.name != "keras_file":
        return ModelSource(model, False, {})
    if run_dir is not None and (Path(run_dir) / MODEL_COPY).is_file():
        model = replace(model, path=str(Path(run_dir) / MODEL_COPY))
    compiled = compile_config(model.path)
    return ModelSource(model, cfg.loss is not None or bool(compiled.get("loss")), compiled)


def with_model_source(data, cfg):
    """``data`` with the model it is for (``for_model``): its own, or ``cfg``'s for data made without one (a
    caller's own arrays, given to plan or compare's gradient check)."""
    return data if data.for_model is not None else replace(data, for_model=model_source(cfg))


# ----------------------------------------------------------------------------
# Resuming

# Keys a resumed run may change: they do not alter what was computed so far. A change of strategy
# keeps the global batch and the data order; the resume adapts subdivisions to its replicas (from_config/lifecycle.py).
# The learning rate and clipping are what a run stopped by max_bad_steps is told to change before it resumes:
# the updates after the checkpoint use them (run_parts.Run.regrow sets a constant rate the checkpoint restored).
RESUMABLE_CHANGES = (
    "epochs",
    "log_every",
    "checkpoint.every_steps",
    "checkpoint.keep",
    "data.dir",
    "strategy",
    "optimizer.learning_rate",
    "optimizer.clip_norm",
    "subdivisions",
    "micro_batch_size",
)


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


def names_strategy(config, overrides) -> bool:
    """Whether this call itself names a strategy (then --workers must agree with it)."""
    keys = overrides.keys() if isinstance(overrides, dict) else [override_key(o) for o in overrides]
    named = any(key == "strategy" or key.startswith("strategy.") for key in keys)
    return named or (isinstance(config, dict) and "strategy" in config)
