"""Keras' JAX backend as the trainer calls it: the first step of issue 76, accum/backends/__init__.py's
``Backend`` answered for the plain case only.

``accumulator_for`` gives the accumulator (engine.py) for a compiled Keras model and its loss (objective.py: the
reductions, masks, sample weights and outputs Keras' compiled loss takes), and ``fit`` is accum_train.fit's door for
it: arrays (``class_weight`` made per-example weights, as Keras' data adapters make them), or a tf.data.Dataset of
batches (a KerasHub task's raw examples, batched and preprocessed by fit's door as ``Task.fit`` preprocesses them),
``subdivisions`` or ``micro_batch_size`` micro-batches per update, each update the whole batch's. What the
TensorFlow backend answers beyond that (the run directory's checkpoints, strategies, evaluation, the commands) is not
here yet: asking for any of it raises one line that says so, rather than training something else.
"""

from __future__ import annotations

import math

import jax
import keras
import numpy as np

from ... import keras_private
from ...defaults import ARRAY_BATCH_SIZE, FIT
from ...errors import Refused, UserError, too_many_bad_updates
from ...trainer.data.batching import pieces
from ...trainer.data.class_weights import class_weights_of
from ...trainer.data.order import epoch_order
from ...trainer.noise import Estimate
from .devices import DataParallelAccumulator, mesh
from .engine import Accumulator
from .objective import LATER, KerasObjective, refused

NAME = "jax"
OUT_OF_MEMORY = jax.errors.JaxRuntimeError  # XLA's RESOURCE_EXHAUSTED comes as this; no retry on it yet
OP_ERROR = jax.errors.JaxRuntimeError
BAD_INPUT = (TypeError, ValueError)
WHERE = "accum_train.fit"
# accum_train.fit's arguments this door takes; any other given unlike its default is refused in one line
TAKEN = (
    "x",
    "y",
    "batch_size",
    "epochs",
    "verbose",
    "shuffle",
    "sample_weight",
    "class_weight",
    "subdivisions",
    "micro_batch_size",
    "seed",
    "max_bad_steps",
    "precision",  # fit's door sets the layers' policies around the call (models/precision.py)
)


def __getattr__(name: str):
    """The rest of ``Backend``'s names: not here yet, in one line (a module attribute that is absent otherwise)."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise UserError(f"accum-train's {name!r} {LATER}")


def accumulator_for(model, objective, optimizer, *, subdivisions: int, **options) -> Accumulator:
    """The Accumulator training ``model`` (a compiled Keras model) on ``objective`` (objective.py's), over the
    devices of the Keras distribution in force (devices.py), else on one."""
    if options:
        raise refused(f"the accumulator's {', '.join(sorted(options))}", WHERE)
    if (devices := mesh(WHERE)) is not None:
        return DataParallelAccumulator(model, objective, optimizer, subdivisions=subdivisions, mesh=devices)
    return Accumulator(model, objective, optimizer, subdivisions=subdivisions)


def built_in(spec, *_):
    """The CLI's built-in nets are TensorLayer's, which only TensorFlow runs: not a later step, never here."""
    tensorflow = "train it with KERAS_BACKEND=tensorflow"
    raise UserError(f"model.name={spec.name} is a TensorLayer net, which only TensorFlow runs: {tensorflow}")


def fit(model, given: dict, spec) -> keras.callbacks.History:
    """accum_train.fit's plain case on JAX; ``given``: its arguments by name (fit.py's), ``spec`` what the trainer
    takes of them (trainer.TrainSpec: the micro-batches' rule, max_bad_steps, the words of its lines)."""
    for name, value in given.items():
        if name not in TAKEN and not _default(value, FIT[name]):
            raise refused(f"{name}={value!r}", WHERE)
    shuffle = given["shuffle"]  # checked by fit's door (arguments.check_keywords)
    if (seed := given["seed"]) is not None:  # Keras' random state; the order's seed below: arguments.order_seed's
        keras.utils.set_random_seed(int(seed))
    seed = int(np.random.SeedSequence().generate_state(1)[0] if seed is None and shuffle else seed or 0)
    if callable(getattr(given["x"], "as_numpy_iterator", None)):  # a tf.data.Dataset of batches (TensorFlow is here)
        epoch_batches = _dataset_batches(model, given)
        first = next(epoch_batches(0))
        batch_size = len(keras.tree.flatten(first[0])[0])  # a dataset's batches are its own
    else:
        epoch_batches, first, batch_size = _array_batches(given, shuffle, seed)
    if spec.micro.auto:  # the probe and the out-of-memory retry are the Trainer's
        raise refused(f"micro_batch_size={given['micro_batch_size']!r}", WHERE)
    k = spec.micro.k_for(batch_size, getattr(mesh(WHERE), "size", 1))  # per device's share, as per replica
    if k > batch_size:
        raise UserError(
            f"{WHERE}: subdivisions={k} must be <= batch_size={batch_size} (a micro-batch holds at least one example)"
        )
    if keras_private.compile_loss(model) is not None:  # its loss, metrics and optimizer built, as model.fit builds
        keras_private.symbolic_build(model, first)
    engine = accumulator_for(model, KerasObjective(model, WHERE), model.optimizer, subdivisions=k)
    history = keras.callbacks.History()
    history.set_model(model)
    history.on_train_begin()
    compiled, noise, bad, done_updates = keras_private.compile_metrics(model), Estimate(), 0, 0
    per_output = keras_private.output_loss_trackers(model)  # <output>_loss where several outputs have a loss
    measures = k * engine.replicas >= 2  # the noise scale needs two micro-batches an update (trainer/noise.py)
    for epoch in range(int(given["epochs"])):
        model.reset_metrics()  # as model.fit: each epoch's metrics its own
        for tracker in per_output:
            tracker.reset_state()
        summed, examples = 0.0, 0
        for batch in epoch_batches(epoch):
            n = len(keras.tree.flatten(batch[0])[0])
            cut = (_rows(batch, slice(s, e)) for s, e in pieces(n, k, engine.replicas, engine.replica_ids))
            done = engine.update_from(cut, n, k)
            # Keras' loss tracker: the batch losses weighted by their examples
            summed, examples = summed + float(done["loss"]) * n, examples + n
            estimate, done_updates = noise.add(done), done_updates + 1
            for tracker, value in zip(per_output, np.asarray(done["output_losses"]).tolist()):
                tracker.update_state(value, sample_weight=n)  # as Keras' compiled loss: each batch by its examples
            bad = 0 if bool(done["applied"]) else bad + 1  # a skipped update changed nothing
            if spec.max_bad_steps is not None and bad >= spec.max_bad_steps:
                raise too_many_bad_updates(bad, spec.max_bad_steps, done_updates, spec.words.bad_fix, "")
        logs = {"loss": summed / max(examples, 1), **{t.name: float(t.result()) for t in per_output}}
        if compiled is not None:  # model.fit's logs: the loss, then each compiled metric's result
            logs.update(keras_private.pythonify_logs(compiled.result()))
        if measures:  # as TensorFlow's door logs it: the estimate after the epoch's last update, NaN before one
            logs["noise_scale"] = math.nan if estimate is None else estimate
        if given["verbose"]:
            print(f"{WHERE}: epoch {epoch + 1}/{given['epochs']}: loss {logs['loss']:.6g}")
        history.on_epoch_end(epoch, logs)
    return history


def _dataset_batches(model, given: dict):
    """A function of the epoch giving a dataset's batches, each ``(x, y, sample_weight)`` of NumPy structures, read
    afresh each epoch as model.fit reads it (a KerasHub task's: fit's door preprocessed its raw examples into it).
    Keras never shuffles a dataset: neither does this, whatever ``shuffle`` says."""
    dataset, name, task = given["x"], model.name, keras_private.preprocesses(model)
    if given["class_weight"] is not None and task:
        raise refused(f"class_weight for model {name!r}, which preprocesses its inputs in fit,", WHERE)
    for what in ("y", "sample_weight", "class_weight"):  # model.fit's rule: a dataset's elements hold them
        if given[what] is not None:
            raise refused(f"{what} beside a tf.data.Dataset (model {name!r})", WHERE)

    def epoch_batches(epoch: int):
        for element in dataset.as_numpy_iterator():
            batch = keras.utils.unpack_x_y_sample_weight(element)
            if batch[1] is None and task:  # a classifier's preprocessor given no labels
                raise UserError(f"{WHERE}: model {name!r}'s preprocessor gives no targets for x: pass y")
            if batch[1] is None:
                raise UserError(f"{WHERE}: the tf.data.Dataset's elements hold no targets: make them (x, y)")
            yield batch

    return epoch_batches


def _array_batches(given: dict, shuffle, seed: int):
    """(a function of the epoch giving its batches of NumPy arrays, the first batch, batch_size) for arrays x, y
    (sample_weight, class_weight made per-example weights, as Keras' data adapters make them)."""
    arrays = (given["x"], given["y"], given["sample_weight"])
    if given["class_weight"] is not None:  # checked by fit's door (arguments.check_class_weight); as train.py
        if keras.tree.is_nested(given["y"]):
            raise Refused(
                "class-weight-outputs",
                f"{WHERE}: class_weight is only supported for a model with one output (this one has "
                f"{len(keras.tree.flatten(given['y']))}): pass sample_weight per output instead",
            )
        arrays = (given["x"], given["y"], class_weights_of(given["y"], given["class_weight"]))
    if given["y"] is None or not all(isinstance(a, np.ndarray) for a in keras.tree.flatten(arrays) if a is not None):
        raise refused("data other than numpy arrays x, y (and sample_weight)", WHERE)
    examples = len(keras.tree.flatten(given["x"])[0])
    batch_size = int(given["batch_size"] or ARRAY_BATCH_SIZE)

    def epoch_batches(epoch: int):
        order = epoch_order(seed, epoch, examples, shuffle, batch_size)  # as TensorFlow's ArrayFeed
        for start in range(0, examples, batch_size):
            yield _rows(arrays, order[start : start + batch_size])

    return epoch_batches, _rows(arrays, slice(0, batch_size)), batch_size


def _default(value, default) -> bool:
    """Whether an argument was left at its default (or given equal to it; an array never is)."""
    return value is default or (type(value) in (bool, int, float, str) and value == default)


def _rows(arrays, rows):
    """Rows ``rows`` (a slice, or indices) of each array (None, no sample weights, stays None)."""
    return keras.tree.map_structure(lambda a: None if a is None else a[rows], arrays)
