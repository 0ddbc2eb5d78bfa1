"""What a config trains on, built from it: the data (``load_data``), the model with its objective
(``build_with_loss``: a built-in net with the built-in cross-entropy, or a keras_file with a Keras loss, the YAML's
``loss`` and ``metrics`` or its file's compile(), models/keras_loss.py) and the run (``build_run``).

A keras_file model trains with the built-in loss (sparse cross-entropy on class labels) unless the YAML names a
``loss`` or the file was saved compiled with one; then it trains with that loss, per output with the file's
``loss_weights``, and is scored with the YAML's (or the file's) metrics.

The run's runtime is set up before the process's first op (``configure``): the micro-steps in flight its keys ask
for and the thread pools that go with them (trainer/runtime.py has how many and why), which the backend sets. The
pools are fixed once the runtime starts: ``configure`` runs before any other op, the backend's ``make_strategy``
after it (lifecycle.train). A process that has already started it (a test, a notebook) keeps its threads; the run
still works, only slower. TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS, if set, are left to rule."""

from __future__ import annotations

import dataclasses
import os

from ..backends import active
from ..defaults import AUTO_PARALLEL
from ..errors import ConfigError
from ..trainer.data.batching import as_data
from ..trainer.runtime import ENV, auto_parallel, thread_pools
from ..trainer.store.rundir import CheckpointPolicy
from ..trainer.trainer import MicroBatches, TrainSpec, Wording
from .source import model_source


def load_data(cfg, run_dir=None, source=None):
    """The data of a run of ``cfg`` for the model it builds (``source``, a rundir.ModelSource, default
    ``run_dir``'s, kept as the data's ``for_model``): an .npz's targets taken as the loss takes them when the model
    has a Keras loss, else as class labels. ``run_dir``: a run directory whose image checks an image folder
    reads."""
    from ..datasets import load

    source = source or model_source(cfg, run_dir)
    task = source.keras_loss
    if cfg.data.name == "python" and not task:
        raise ConfigError(
            "data.name=python feeds a model that brings its own loss: model.name=keras_file with loss: in the "
            "YAML or a file saved after compile(loss=...) (the built-in nets need images with class labels)"
        )
    return dataclasses.replace(load(cfg.data, run_dir, task=task, seed=cfg.seed), for_model=source)


def build_with_loss(cfg, data, precision: str = "float32"):
    """(model, objective): the model a run of ``cfg`` trains and what it trains on (objective.py), the built-in
    cross-entropy (``objective.classifier``) or its Keras loss, taken apart for the data (a KerasObjective).
    The model is the one the data was loaded for (``data.for_model``, source.ModelSource)."""
    source = data.for_model
    if not source.keras_loss:
        from ..models import build_model

        model = build_model(source.config, cfg.seed, data.input_shape, data.num_classes, precision)
        return model, active().classifier(model.forward)
    from ..models.keras_loss import keras_loss_model

    element = as_data(data.signature())  # (x, y, sample weights or None)
    return keras_loss_model(source.config.path, element, cfg.seed, cfg.loss, cfg.metrics, source.compiled, precision)


def build_run(cfg, data, strategy=None):
    """The trainer of a run of ``cfg`` on ``data`` (run_parts.Run), set up from what the config resolves to: the
    config checked against the training set, the model and its objective built under ``strategy`` (``None``: the
    one in scope); the Run cuts the training split by data.trim_padding."""
    from .run_parts import Run

    cfg = cfg.for_data(len(data.train))
    spec = train_spec(cfg)
    parallel = parallel_micro_steps(cfg)
    in_scope = active().strategy_in_scope(strategy)
    with in_scope.scope():
        # the model the data was loaded for: a keras_file with the YAML's loss or its file's compile() trains on
        # that loss
        model, objective = build_with_loss(cfg, data, cfg.precision)
    return Run(cfg, data, model, objective, strategy, parallel, spec=spec)


# What a run of the CLI's tells its user to change, in the config's own keys.
CLI_WORDS = Wording(
    auto="subdivisions=auto",
    more="use more subdivisions or subdivisions: auto",
    bad_fix="lower optimizer.learning_rate or set optimizer.clip_norm",
)


def train_spec(cfg) -> TrainSpec:
    """What the trainer takes of ``cfg``: its micro-batches, limits and checkpoints, in no config's terms."""
    count = cfg.subdivisions if isinstance(cfg.subdivisions, int) else None
    return TrainSpec(
        micro=MicroBatches(count=count, size=cfg.micro_batch_size, auto=cfg.auto_subdivisions),
        words=CLI_WORDS,
        memory_limit=None if cfg.memory_limit is None else (cfg.memory_limit_bytes, cfg.memory_limit),
        max_bad_steps=cfg.max_bad_steps,
        baseline=cfg.baseline,
        checkpoints=CheckpointPolicy(keep=cfg.checkpoint.keep, every_steps=cfg.checkpoint.every_steps, at_start=True),
    )


def parallel_micro_steps(cfg) -> int:
    """The configured number, or auto's choice (``auto_parallel``); never more than the micro-batches of an
    update."""
    if cfg.baseline:
        return 1
    if cfg.whole_set:  # the training set's size is not known yet: as if it were large
        limit = cfg.subdivisions if isinstance(cfg.subdivisions, int) else AUTO_PARALLEL
    elif cfg.auto_subdivisions:
        limit = max(cfg.batch_sizes)
    else:
        limit = max(cfg.subdivisions_for(b) for b in cfg.batch_sizes)
    if cfg.parallel_micro_steps != "auto":
        return min(cfg.parallel_micro_steps, limit)
    return auto_parallel(limit, cfg.memory_limit is not None, 2 if cfg.strategy.name == "mirrored" else 1)


def configure(cfg) -> dict:
    """Set this process's thread pools for the run's micro-steps (before any op); what is in effect: the threads set
    in this process, else TF_NUM_*'s (which the runtime reads when nothing is set), else 0 (as many as cores)."""
    parallel = parallel_micro_steps(cfg)
    pools = None if active().has_gpu() else thread_pools(parallel)
    given = {pool: os.environ.get(name, "") for pool, name in ENV.items()}
    threads = active().set_thread_pools({pool: n for pool, n in (pools or {}).items() if not given[pool]})
    env = {pool: int(value) if value.isdigit() else 0 for pool, value in given.items()}
    return {"parallel_micro_steps": parallel, **{f"{pool}_op_threads": threads[pool] or env[pool] for pool in ENV}}
