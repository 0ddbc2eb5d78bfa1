"""accum-train from Python: ``run`` does what ``accum-train run`` does, ``fit``
trains a Keras 3 model object you hold, both with the same engine and loop.

Bad input raises ``UserError`` with the one line the CLI prints (the CLI is a
thin layer over ``run``); nothing here calls ``sys.exit``. TensorFlow is
imported only once the input has been checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .config import as_config, config_from_dict, with_overrides
from .errors import UserError
from .progress import Progress
from .rundir import (
    MODEL_COPY,
    atomic_write,
    check_output_dir,
    default_output_dir,
    is_epoch_record,
    read_metrics,
    resume_config,
)


def run(
    config: str | Path | dict | None = None,
    *,
    output_dir: str | Path | None = None,
    overrides=None,
    progress=None,
    resume: str | Path | None = None,
    workers: int | None = None,
    max_restarts: int | None = None,
) -> dict:
    """Train as ``accum-train run`` does; summary.json's content.

    ``config``: a YAML path or a dict in the YAML's shape. ``overrides``: what
    ``--set`` takes, a list of "KEY=VALUE" strings or a dict {"optimizer.learning_rate": 0.01}.
    ``output_dir``: the run directory (default runs/NAME-DATE-TIME). ``progress``:
    an ``accum_train.Progress`` (callbacks; default silent). ``resume``: a run
    directory to continue (``config`` and ``overrides`` may then change what a
    resume may change); ``workers``: N >= 2 local worker processes
    (MultiWorkerMirroredStrategy on 127.0.0.1), as ``--workers``; ``max_restarts``: how many times
    the supervisor starts all of them again from the last checkpoint when one fails, as ``--max-restarts``."""
    progress = progress or Progress()
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 2):
        raise UserError(f"workers={workers!r} must be an integer >= 2 (one device: leave it out)")
    if max_restarts is not None:
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise UserError(f"--max-restarts {max_restarts!r} must be an integer >= 0")
        if not workers:
            raise UserError(
                "--max-restarts needs --workers N: the supervisor of N workers restarts them; "
                "a single process goes on with 'accum-train run --resume RUN_DIR'"
            )
    overrides = overrides or ()
    if resume is not None:
        if output_dir is not None and Path(output_dir) != Path(resume):
            raise UserError(
                "--output-dir and --resume name different directories: "
                "a resumed run stays in its own directory; drop --output-dir"
            )
        cfg, run_dir = resume_config(resume, config, overrides), Path(resume)
        if workers and not _names_strategy(config, overrides) and cfg.strategy.name != "multi_worker":
            # the run goes on over workers, whatever the strategy it ran under before
            cfg = with_overrides(cfg, {"strategy.name": "multi_worker", "strategy.cpu_devices": None}, "--workers")
    else:
        if config is None:
            raise UserError(
                "missing CONFIG: pass a YAML file, e.g. 'accum-train run configs/fmnist.yaml', or --resume RUN_DIR"
            )
        cfg = as_config(config, overrides)
        run_dir = (
            Path(output_dir) if output_dir else default_output_dir(config if not isinstance(config, dict) else None)
        )
    if workers:
        from .launcher import launch_workers

        return launch_workers(cfg, run_dir, resume is not None, workers, progress.message, max_restarts or 0)
    from .train import train

    return train(cfg, run_dir, progress=progress, resume=resume is not None)


def _names_strategy(config, overrides) -> bool:
    """Whether this call itself names a strategy (then --workers must agree with it)."""
    keys = overrides.keys() if isinstance(overrides, dict) else [o.split("=", 1)[0].strip() for o in overrides]
    named = any(key == "strategy" or key.startswith("strategy.") for key in keys)
    if isinstance(config, dict):
        return named or "strategy" in config
    return named


# -- fit


def fit(
    model,
    x,
    y=None,
    *,
    batch_size: int,
    subdivisions: int | None = None,
    micro_batch_size: int | None = None,
    epochs: int = 1,
    optimizer: str = "adam",
    learning_rate: float = 0.001,
    validation_data=None,
    shuffle: bool = True,
    seed: int = 0,
    precision: str = "float32",
    strategy=None,
    output_dir: str | Path | None = None,
) -> dict:
    """Train ``model`` (a built Functional or Sequential Keras 3 model) with exact gradient accumulation.

    Each update takes ``batch_size`` examples, cut into ``subdivisions`` micro-batches (or as many as
    ``micro_batch_size`` needs; neither: one pass), and applies the gradient of their mean loss once.
    The loss is sparse categorical cross-entropy on integer labels (logits, or the probabilities of a
    softmax output layer, as Keras computes it). ``x``, ``y``: numpy arrays, or ``x`` an unbatched
    ``tf.data.Dataset`` of (x, y) (read once into memory). ``validation_data``: (x_val, y_val),
    evaluated after every epoch. ``shuffle=False`` keeps the given order, as ``model.fit(shuffle=False)``.
    ``strategy``: a ``tf.distribute.Strategy`` (None: one device). ``output_dir``: also write a run
    directory there (evaluate, export, predict and ``--resume`` take it); None writes nothing.

    The model object ends with the trained weights (and BatchNormalization moving statistics).
    Returns the per-epoch history: ``loss``, and ``val_loss``, ``val_accuracy`` with validation_data."""
    from .models.in_memory import Adopted, check_model, from_logits

    check_model(model)
    x_train, y_train = _arrays(x, y, "x")
    x_val = y_val = None
    if validation_data is not None:
        if not (isinstance(validation_data, (tuple, list)) and len(validation_data) == 2):
            raise UserError(f"{WHERE}: validation_data must be a pair (x_val, y_val) of arrays")
        x_val, y_val = _arrays(*validation_data, "validation_data")
    cut = _cut(subdivisions, micro_batch_size)
    run_dir = None if output_dir is None else Path(output_dir)
    strategy_name = _strategy_name(strategy)
    raw: dict[str, Any] = {
        "model": {"name": "keras_file", "path": str((run_dir or Path(".")) / MODEL_COPY)},
        "batch_size": batch_size,
        **cut,
        "epochs": epochs,
        "seed": seed,
        "optimizer": {"name": optimizer, "learning_rate": learning_rate},
        "data": {"name": "npz", "path": str((run_dir or Path(".")) / "data.npz"), "shuffle": shuffle},
        "precision": precision,
        "strategy": {"name": strategy_name},
    }
    if not from_logits(model):
        raw["model"]["from_logits"] = False
    cfg = config_from_dict(raw, WHERE)
    if run_dir is not None:
        _check_run_dir_input(run_dir, x_train, x_val)

    import keras

    from .datasets.base import ArraySplit, Dataset
    from .models.precision import set_precision
    from .train import train

    names = tuple(str(i) for i in range(int(model.outputs[0].shape[-1])))
    _check_labels(y_train, "y", len(names))
    if y_val is not None:
        _check_labels(y_val, "validation_data's y", len(names))
    data = Dataset(
        train=ArraySplit(x_train, y_train, as_given=True),
        # validation_data is the split every epoch is scored on: the run's "test" split (a run directory's
        # data.npz holds it as x_test, so evaluate and resume see the same)
        test=None if x_val is None else ArraySplit(x_val, y_val, as_given=True),
        input_shape=tuple(x_train.shape[1:]),
        class_names=names,
        source=f"{WHERE} arrays",
    )
    keras.utils.set_random_seed(seed)
    import tensorflow as tf

    with (strategy or tf.distribute.get_strategy()).scope():
        adopted = Adopted(model)
    set_precision(adopted.model, precision)
    if run_dir is not None:
        _begin_run_dir(run_dir, model, x_train, y_train, x_val, y_val, names)
    try:
        summary = train(cfg, run_dir, data=data, strategy=strategy, model=adopted.model, checked=True)
    finally:
        adopted.copy_back()  # also after an interrupt: the model holds the last update's weights
    records = summary["history"] if run_dir is None else read_metrics(run_dir / "metrics.jsonl")
    epochs_done = [r for r in records if is_epoch_record(r)]
    history = {"loss": [r["train_loss"] for r in epochs_done]}
    if x_val is not None:
        history["val_loss"] = [r["test_loss"] for r in epochs_done]
        history["val_accuracy"] = [r["test_accuracy"] for r in epochs_done]
    return history


WHERE = "accum_train.fit"


def _strategy_name(strategy) -> str:
    if strategy is None:
        return "default"
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    if isinstance(strategy, tf.distribute.Strategy):
        if strategy.num_replicas_in_sync == 1:
            return "default"
        raise UserError(
            f"{WHERE}: strategy is a {type(strategy).__name__}: accum-train runs on MirroredStrategy, "
            f"MultiWorkerMirroredStrategy or one device"
        )
    raise UserError(f"{WHERE}: strategy is a {type(strategy).__name__}, not a tf.distribute.Strategy")


def _cut(subdivisions, micro_batch_size) -> dict:
    """The config keys that cut each batch: micro_batch_size (k per batch and replica), else subdivisions
    (neither: one pass). The config check words what is wrong with either."""
    if subdivisions is not None and micro_batch_size is not None:
        raise UserError(
            f"{WHERE}: give subdivisions or micro_batch_size, not both "
            f"(subdivisions={subdivisions}, micro_batch_size={micro_batch_size})"
        )
    if micro_batch_size is not None:
        return {"micro_batch_size": micro_batch_size}
    return {"subdivisions": 1 if subdivisions is None else subdivisions}


def _arrays(x, y, name: str):
    """(x, y) as numpy arrays of equal length, from arrays or an unbatched tf.data.Dataset of (x, y)."""
    if type(x).__module__.startswith("tensorflow") and hasattr(x, "element_spec"):
        if y is not None:
            raise UserError(f"{WHERE}: {name} is a tf.data.Dataset of (x, y) pairs: leave y out")
        spec = x.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise UserError(f"{WHERE}: {name} is a tf.data.Dataset whose elements are not (x, y) pairs")
        if spec[1].shape.rank != 0:  # one integer label per example
            raise UserError(
                f"{WHERE}: {name} gives labels of shape {spec[1].shape} per element: it looks batched; "
                f"pass dataset.unbatch()"
            )
        pairs = list(x.as_numpy_iterator())
        if not pairs:
            raise UserError(f"{WHERE}: {name} is an empty tf.data.Dataset")
        x, y = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
    if y is None:
        raise UserError(f"{WHERE}: y is missing: pass integer class labels, or a tf.data.Dataset of (x, y) as x")
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim < 2 or len(x) == 0:
        raise UserError(f"{WHERE}: {name} has shape {x.shape}: it needs [N, ...] with at least one example")
    if len(x) != len(y):
        raise UserError(f"{WHERE}: {name} holds {len(x)} examples but its labels {len(y)}")
    if x.dtype.kind not in "fiu":
        raise UserError(f"{WHERE}: {name} has dtype {x.dtype}: pass numbers (float32, or uint8 images)")
    return x, y


def _check_labels(y: np.ndarray, name: str, classes: int) -> None:
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise UserError(
            f"{WHERE}: {name} has shape {y.shape} and dtype {y.dtype}: labels must be [N] integer class "
            f"indices (one-hot labels: y.argmax(axis=1))"
        )
    if y.min() < 0 or y.max() >= classes:
        raise UserError(
            f"{WHERE}: {name} holds labels from {int(y.min())} to {int(y.max())} but the model outputs "
            f"{classes} classes: labels must be 0..{classes - 1}"
        )


def _check_run_dir_input(run_dir: Path, x_train, x_val) -> None:
    """What a run directory needs beyond the arrays: images to store as data.npz and an empty place."""
    if x_val is None:
        raise UserError(
            f"{WHERE}: output_dir needs validation_data: a run directory is scored on it "
            f"(evaluate, predict and --resume read it as its test split)"
        )
    if x_train.ndim != 4:
        raise UserError(
            f"{WHERE}: output_dir stores images [N, H, W, C], but x has shape {x_train.shape}: "
            f"leave output_dir out, or give channels-last images"
        )
    check_output_dir(run_dir)


def _begin_run_dir(run_dir: Path, model, x_train, y_train, x_val, y_val, names) -> None:
    """The model and the arrays, as a keras_file run over an .npz would have them: what resume reads."""
    import io
    import tempfile

    run_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=run_dir, prefix=".model-") as scratch:
        model.save(Path(scratch) / MODEL_COPY)  # the weights it starts from; the checkpoints hold the rest
        atomic_write(run_dir / MODEL_COPY, (Path(scratch) / MODEL_COPY).read_bytes())
    buffer = io.BytesIO()
    # float32 as given: the .npz loader scales only uint8, and fit feeds its arrays unscaled
    np.savez(
        buffer,
        x_train=x_train.astype(np.float32),
        y_train=y_train,
        x_test=x_val.astype(np.float32),
        y_test=y_val,
        class_names=np.array(names),
    )
    atomic_write(run_dir / "data.npz", buffer.getvalue())
