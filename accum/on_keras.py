"""The CLI's run of a config where Keras runs on a backend other than TensorFlow (JAX): the config turned into one
call of ``accum_train.fit``, whose door trains on that backend (keras_fit/fit.py), and nothing more. It sits above
both front ends, as a command does: the config's door (from_config/api.py) hands a run to it on JAX.

What the config names is read as on TensorFlow (the model file, the data, the optimizer and its schedule); the
model is compiled with the YAML's loss and metrics (or its file's, or cross-entropy on class labels) and fit
trains it in the run directory, which is fit's (run.json, initial_model.keras, checkpoints, metrics.jsonl,
summary.json) with the CLI's config.yaml and data.json beside it: ``accum-train run --resume`` continues it, the
readers read it as they read any fit directory. What only TensorFlow runs (the built-in TensorLayer nets,
tf.distribute strategies, --workers, data.augment's draws in the micro-step, image folders streamed from disk) is
refused in one line before anything is read or written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import keras
import numpy as np

from .backends import active
from .config import Config
from .errors import ConfigError, DataError, Refused
from .files import atomic_write
from .from_config.build import load_data
from .from_config.optim import make_optimizer, run_schedule
from .from_config.source import ModelSource, compile_config, model_source
from .progress import Progress
from .trainer.data.batching import as_data, eval_batch_size
from .trainer.data.order import describe_split
from .trainer.data.timeline import Timeline
from .trainer.store.rundir import CONFIG_FILES, check_output_dir, write_json

# config.yaml, then what the run trains on (its Dataset's describe(): a resume loads the data as it was) and the
# model file it began from (a resume builds and compiles the model from it again)
_, DATA_RECORD, MODEL_FILE = CONFIG_FILES


def train(cfg: Config, run_dir: Path, progress: Progress, resume: bool) -> dict:
    """Train ``cfg`` in ``run_dir`` through accum_train.fit on the backend Keras runs on; summary.json's content,
    with the test scores. ``resume``: continue ``run_dir`` from its newest checkpoint."""
    backend = active().NAME
    refuse(cfg, backend)
    run_dir = Path(run_dir)
    source = _source(cfg, run_dir if resume else None)
    data = load_data(cfg, run_dir if resume else None, source)  # before anything is written
    cfg = cfg.for_data(len(data.train))
    model = compiled(cfg, data, source)
    if not resume:
        check_output_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / "config.yaml", cfg.to_yaml().encode())
    write_json(run_dir / DATA_RECORD, data.describe())
    if not (run_dir / MODEL_FILE).is_file():
        atomic_write(run_dir / MODEL_FILE, Path(source.config.path).read_bytes())

    from .keras_fit.fit import fit_with_summary

    k = 1 if cfg.baseline else cfg.subdivisions_for(cfg.batch_size)
    if cfg.micro_batch_size is None and not cfg.auto_subdivisions:
        progress.message(describe_split(cfg.batch_size, k))
    x, y, weights, steps = _training(data.train, cfg)
    test = _scorer(model, data.test, _eval_batch_size(cfg))
    watch = Watch(progress, cfg, k, test)
    validation = None if data.validation is None else _arrays(data.validation)

    def summary() -> dict:  # the last epoch's scores, which its end scored (or, with no epoch left to run, now)
        scores = watch.scores if watch.scores is not None else {f"test_{name}": v for name, v in test().items()}
        return {**scores, "batch_size": cfg.batch_size, "baseline": cfg.baseline, "precision": cfg.precision,
                "backend": backend}  # fmt: skip

    fit_with_summary(
        model,
        summary,
        x=x,
        y=y,
        batch_size=None if steps else cfg.batch_size,
        epochs=cfg.epochs,
        verbose=0,
        callbacks=[watch],
        validation_data=None if validation is None else validation[: 2 if validation[2] is None else 3],
        shuffle=cfg.data.shuffle,
        sample_weight=weights,
        steps_per_epoch=steps,
        subdivisions=None if cfg.micro_batch_size or cfg.auto_subdivisions else k,
        micro_batch_size="auto" if cfg.auto_subdivisions else cfg.micro_batch_size,
        trim_padding=cfg.data.trim_padding,
        seed=cfg.seed,
        precision=cfg.precision,
        output_dir=str(run_dir),
        max_bad_steps=cfg.max_bad_steps,
        batch_schedule=_schedule(cfg),
    )
    return json.loads((run_dir / "summary.json").read_text())


def refuse(cfg: Config, backend: str) -> None:
    """What this door cannot run on ``backend``, in one line naming the key, before anything is read."""
    on = f"KERAS_BACKEND={backend}"
    tensorflow = "train it with KERAS_BACKEND=tensorflow"
    if cfg.model.name != "keras_file":
        raise Refused(
            "jax-builtin-net",
            f"model.name={cfg.model.name} is a TensorLayer net, which only TensorFlow runs: {tensorflow}",
        )
    data, every = cfg.data, cfg.checkpoint.every_steps
    refused = (  # (given, what is named, why)
        (data.name == "image_folder", "data.name=image_folder", "streams image files through tf.data's decoder"),
        (cfg.strategy.name != "default", f"strategy.name={cfg.strategy.name}", "is a tf.distribute strategy"),
        (data.augment.flip or data.augment.crop, "data.augment", "draws inside TensorFlow's micro-step"),
        (cfg.memory_limit is not None, f"memory_limit={cfg.memory_limit}", "reads TensorFlow's allocator peak"),
        (cfg.parallel_micro_steps not in ("auto", 1), "parallel_micro_steps", "runs TensorFlow's micro-steps together"),
        (every != 0, f"checkpoint.every_steps={every}", "is the TensorFlow door's (JAX: each epoch and each 300 s)"),
        (
            any(change.step is not None for change in cfg.batch_changes),
            "batch_schedule by update (step:)",
            "is the TensorFlow door's (JAX: by epoch:)",
        ),
    )
    for given, named, why in refused:
        if given:
            raise Refused("jax-cli-key", f"{named} {why}, which {on} does not run: {tensorflow}, or remove it")
    scale = cfg.optimizer.scale_learning_rate
    if cfg.batch_rule is not None and scale.rule != "none":
        raise Refused(
            "jax-cli-key",
            f"optimizer.scale_learning_rate with batch_schedule's rule is the TensorFlow door's: on {on} the rule "
            f"keeps the learning rate; {tensorflow}, or remove one of them",
        )


def _source(cfg: Config, run_dir: Path | None) -> ModelSource:
    """The model a run builds and whether it trains with a Keras loss: on a resume, the run directory's copy of the
    model file and the task its data.json recorded."""
    if run_dir is None or not (run_dir / MODEL_FILE).is_file():
        return model_source(cfg)
    copy = str(run_dir / MODEL_FILE)
    recorded = json.loads((run_dir / DATA_RECORD).read_text()) if (run_dir / DATA_RECORD).is_file() else {}
    model = dataclasses.replace(cfg.model, path=copy)
    return ModelSource(model, recorded.get("task") == "keras_loss", compile_config(copy))


def compiled(cfg: Config, data, source: ModelSource):
    """The model file loaded and checked for ``data``, compiled as the config says: its optimizer (the schedule's
    rate at each update, optimizer.clip_norm as a global norm), and the YAML's loss and metrics, the file's, or
    cross-entropy on class labels with accuracy."""
    from .models.keras_file import checked_file
    from .models.keras_loss import compile_arguments

    keras.utils.set_random_seed(cfg.seed)
    path = source.config.path
    if source.keras_loss:
        from .models.keras_file import check_data, load_keras_file, logits_by_output

        model = load_keras_file(path)
        check_data(model, path, *as_data(data.signature())[:2])
        arguments = compile_arguments(logits_by_output(model), cfg.loss, cfg.metrics, source.compiled)
    else:
        model = checked_file(source.config, data.input_shape, data.num_classes)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=source.config.from_logits)
        arguments = dict(loss=loss, metrics=["accuracy"])
    changes = tuple(cfg.batch_changes)
    timeline = Timeline(len(data.train), cfg.epochs, cfg.batch_size, changes)
    schedule = run_schedule(cfg.optimizer, cfg.batch_size, bool(changes), timeline)
    optimizer = make_optimizer(cfg.optimizer, schedule, model.trainable_variables)
    if cfg.optimizer.clip_norm is not None:
        optimizer.global_clipnorm = cfg.optimizer.clip_norm
    try:
        model.compile(optimizer=optimizer, **arguments)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"loss and metrics do not fit model.path={path}: {str(err).splitlines()[0]}") from None
    return model


def _eval_batch_size(cfg: Config) -> int:
    """The batch the test split is scored in, during training and by evaluate alike."""
    k = 1 if cfg.baseline else cfg.subdivisions_for(cfg.batch_size)
    return eval_batch_size(cfg.batch_size, k if isinstance(k, int) else 1, cfg.micro_batch_size)


def _arrays(split) -> tuple:
    """A split held in memory as numpy (x, y, sample weights or None), converted as the TensorFlow door converts
    its batches (uint8 inputs scaled by 1/255, float64 as float32, class labels as int32)."""
    return _unpacked(split.take(np.arange(len(split))))


def _unpacked(batch) -> tuple:
    """A converted batch, (x, y) or (x, (y, sample weights)), as numpy (x, y, sample weights or None)."""
    x, y = keras.tree.map_structure(np.asarray, tuple(batch[:2]))
    if isinstance(y, tuple):  # (targets, sample weights)
        return x, y[0], y[1]
    return x, y, None


def _training(split, cfg: Config) -> tuple:
    """(x, y, sample weights, steps per epoch) fit trains on: arrays, or a python factory's stream read epoch by
    epoch (its own order for each epoch, as on TensorFlow), with the epoch's updates counted."""
    if not getattr(split, "streamed", False):
        return (*_arrays(split), None)
    steps = math.ceil(len(split) / cfg.batch_size)

    def batches():
        for epoch in range(cfg.epochs):
            for batch in split.epoch_batches(epoch, cfg.batch_size):
                yield tuple(part for part in _unpacked(batch) if part is not None)

    return batches(), None, None, steps


def _scorer(model, split, batch_size: int):
    """The test split's scores now (loss and metrics by name; {} without test examples), as model.evaluate gives
    them."""

    def scores() -> dict:
        if not len(split):
            return {}
        if getattr(split, "streamed", False):
            batches = (_unpacked(batch) for batch in split.epoch_batches(0, batch_size))
            return model.evaluate(batches, verbose=0, return_dict=True)
        x, y, weights = _arrays(split)
        return model.evaluate(x, y, sample_weight=weights, batch_size=batch_size, verbose=0, return_dict=True)

    return scores


def test_split(cfg: Config, run_dir: Path, model) -> tuple:
    """(its examples, its scores) of the test split ``cfg`` names, for ``model`` of the run in ``run_dir`` (the
    readers' evaluate); refused in one line where it is empty."""
    split = load_data(cfg, run_dir, _source(cfg, run_dir)).test
    if not len(split):
        raise DataError("the test split is empty: nothing to evaluate")
    return len(split), _scorer(model, split, _eval_batch_size(cfg))


def _schedule(cfg: Config):
    """batch_schedule as fit takes it: its changes by 1-based epoch, or its rule's settings."""
    rule = cfg.batch_rule
    if rule is not None:
        return {"rule": rule.rule, "max_batch_size": rule.max_batch_size, "every_epochs": rule.every_epochs}
    return [{"epoch": change.epoch, "batch_size": change.batch_size} for change in cfg.batch_changes] or None


class Watch(keras.callbacks.Callback):
    """The CLI's progress (``accum_train.Progress``) from fit's callbacks: an epoch's start, its updates every
    ``log_every``, and its end with the test scores, which go into the epoch's logs (metrics.jsonl, History)."""

    def __init__(self, progress: Progress, cfg: Config, k, test):
        super().__init__()
        self.progress, self.cfg, self.test = progress, cfg, test
        self.k = k if isinstance(k, int) else 1
        self.started = time.time()
        self.scores = None  # the last epoch's test scores, as summary.json's test_ keys

    def on_epoch_begin(self, epoch, logs=None):
        self.started, self.updates = time.time(), 0
        steps = self.params.get("steps") or 0
        self.progress.epoch_start(epoch + 1, self.cfg.epochs, steps * self.k, 0)

    def _rate(self) -> float:
        return self.updates * self.cfg.batch_size / max(time.time() - self.started, 1e-9)

    def on_train_batch_end(self, batch, logs=None):
        self.updates = batch + 1
        if self.updates % self.cfg.log_every == 0:
            self.progress.updates(self.updates * self.k, float(logs["loss"]), self._rate())

    def on_epoch_end(self, epoch, logs=None):
        self.scores = scores = {f"test_{name}": float(value) for name, value in self.test().items()}
        logs.update(scores)
        validation = {f"validation_{name[4:]}": value for name, value in logs.items() if name.startswith("val_")}
        self.progress.epoch_end(
            {
                "epoch": epoch + 1,
                "train_loss": logs.get("loss"),
                **validation,
                **scores,
                "elapsed_s": time.time() - self.started,
                "examples_per_s": self._rate(),
            }
        )
