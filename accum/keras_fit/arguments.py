"""accum_train.fit's arguments, checked before anything trains, each refusal one line naming the argument and
what is allowed; and what they resolve to: the strategy, the data order's seed, the memory limit, an uncompiled
model's loss and optimizer (the config's defaults, accum/defaults.py's ``CLI``)."""

from __future__ import annotations

import os
from numbers import Integral

import keras
import numpy as np

from ..backends import active
from ..config import config_from_dict
from ..config.wording import parse_size
from ..defaults import ARRAY_BATCH_SIZE, CHECKPOINT_KEEP, CHECKPOINT_SECONDS, FIT_SUBDIVISIONS
from ..errors import Refused, UserError
from ..keras_private import storage
from ..models.keras_file import ends_in_softmax
from ..models.precision import float8_scales
from ..trainer.store.rundir import CheckpointPolicy
from ..trainer.trainer import MicroBatches, TrainSpec, Wording

WHERE = "accum_train.fit"


def check_model(model) -> None:
    if not isinstance(model, keras.Model):
        raise UserError(f"{WHERE}: model is a {type(model).__name__}, not a keras.Model: pass a Keras 3 model")
    for method in ("train_step", "compute_loss"):
        if getattr(type(model), method) is not getattr(keras.Model, method):
            raise Refused(
                "own-train-step",
                f"{WHERE}: model {model.name!r} overrides {method}, which accum_train.fit does not call (it "
                f"differentiates the compiled loss itself, micro-batch by micro-batch): compile the loss with "
                f"compile(loss=...), or train with model.fit",
            )
    overwritten = float8_scales(model)
    if overwritten:
        raise Refused(
            "float8-training",
            f"{WHERE}: model {model.name!r} trains in float8 (quantize('float8')), whose scale variables (as "
            f"{overwritten[0]!r}) take each step's new value in place of a gradient, which micro-batches cannot "
            f"add up: train it before quantizing, or with model.fit",
        )
    steps = getattr(model, "steps_per_execution", 1)
    if steps != 1:
        raise Refused(
            "steps-per-execution",
            f"{WHERE}: model {model.name!r} is compiled with steps_per_execution={steps}: accum_train.fit runs "
            f"one update per graph call (its micro-steps inside it); compile with steps_per_execution=1",
        )
    steps = getattr(getattr(model, "optimizer", None), "gradient_accumulation_steps", None)
    if steps:
        raise Refused(
            "gradient-accumulation-steps",
            f"{WHERE}: the model's optimizer has gradient_accumulation_steps={steps}: accum_train.fit "
            f"accumulates exactly itself; compile without it",
        )


def strategy_of(model, strategy):
    """The strategy to train under: the one given (the model must have been created in its scope), else the
    model's own (model.fit's rule)."""
    if strategy is None:
        return model.distribute_strategy
    if not isinstance(strategy, active().STRATEGY):
        raise UserError(f"{WHERE}: strategy is a {type(strategy).__name__}, not a tf.distribute.Strategy")
    inside = [strategy.extended.variable_created_in_scope(storage(v)) for v in model.variables]
    if model.variables and not all(inside):
        raise UserError(
            f"{WHERE}: model {model.name!r} was not created under strategy.scope(): create (and compile) it "
            f"inside `with strategy.scope():`, as model.fit needs"
        )
    return strategy


def _integer(value) -> bool:
    """An integer as a count or an index: Python's or NumPy's, not a bool (True is no batch size)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _at_least_one(name: str, value, allowed: str = "") -> None:
    """``value`` None or an integer >= 1; the refusal ends with what else is ``allowed``."""
    if value is not None and (not _integer(value) or value < 1):
        raise UserError(f"{WHERE}: {name}={value!r} must be an integer >= 1{allowed}")


def check_numbers(batch_size, subdivisions, micro_batch_size, epochs, initial_epoch, steps_per_epoch, bad) -> None:
    for name, value in (
        ("batch_size", batch_size),
        ("subdivisions", subdivisions),
        ("steps_per_epoch", steps_per_epoch),
        ("max_bad_steps", bad),
    ):
        _at_least_one(name, value)
    if micro_batch_size != "auto":
        _at_least_one("micro_batch_size", micro_batch_size, " or 'auto' (the largest that fits)")
    if subdivisions is not None and micro_batch_size is not None:
        raise UserError(
            f"{WHERE}: give subdivisions or micro_batch_size, not both "
            f"(subdivisions={subdivisions}, micro_batch_size={micro_batch_size})"
        )
    for name, value in (("epochs", epochs), ("initial_epoch", initial_epoch)):
        if not _integer(value) or value < 0:
            raise UserError(f"{WHERE}: {name}={value!r} must be an integer >= 0")


def check_keywords(
    seed, shuffle, callbacks, validation_freq, validation_steps, validation_batch_size, output_dir
) -> None:
    """model.fit's other keywords, where a wrong one would fail later in another's words (Keras' seed check, a
    division by zero in the epoch loop, a callback list that is an int) or pass silently (validation_steps=0
    validates nothing and logs a loss of 0)."""
    if shuffle not in (True, False, "batch"):
        raise UserError(f"{WHERE}: shuffle={shuffle!r} must be True, False or 'batch'")
    if seed is not None and (not _integer(seed) or not 0 <= seed < 2**32):
        raise UserError(f"{WHERE}: seed={seed!r} must be None or an integer from 0 to 2**32 - 1")
    if callbacks is not None:
        if not isinstance(callbacks, (list, tuple)):
            raise UserError(
                f"{WHERE}: callbacks is a {type(callbacks).__name__}: pass a list of keras.callbacks.Callback"
            )
        for i, callback in enumerate(callbacks):
            if not isinstance(callback, keras.callbacks.Callback):
                raise UserError(
                    f"{WHERE}: callbacks[{i}] is a {type(callback).__name__}, not a keras.callbacks.Callback"
                )
    epochs = validation_freq if isinstance(validation_freq, (list, tuple)) else [validation_freq]
    if not epochs or any(not _integer(e) or e < 1 for e in epochs):
        raise UserError(
            f"{WHERE}: validation_freq={validation_freq!r} must be an integer >= 1 (validate every that many epochs) "
            f"or a list of the 1-based epochs to validate after"
        )
    for name, value, default in (
        ("validation_steps", validation_steps, "all of the validation data"),
        ("validation_batch_size", validation_batch_size, "batch_size"),
    ):
        _at_least_one(name, value, f" (None: {default})")
    # "" would be the working directory, silently
    if output_dir is not None and (not isinstance(output_dir, (str, os.PathLike)) or os.fspath(output_dir) == ""):
        raise UserError(
            f"{WHERE}: output_dir={output_dir!r} must be the path of a directory, a str or a pathlib.Path (None: "
            f"no run directory)"
        )


def memory_limit_of(memory_limit):
    """(bytes, as given) of ``memory_limit``, or None; what the CLI's memory_limit key takes."""
    if memory_limit is None:
        return None
    try:
        return parse_size(memory_limit, "memory_limit"), str(memory_limit)
    except UserError as err:
        raise UserError(f"{WHERE}: {err}") from None


def compile_if_needed(model, strategy, optimizer, learning_rate, labelled=()) -> None:
    """An uncompiled model gets the keywords of earlier releases: sparse categorical cross-entropy (on logits,
    or on the probabilities of a softmax output layer), accuracy, and the optimizer named as a config's
    optimizer.name (adam, sgd, momentum, rmsprop, lars, lamb) at ``learning_rate``, or an optimizer object.
    ``labelled``: (name, targets) held in memory (checks.held_targets), which that loss must be able to take."""
    if model.compiled:
        if optimizer is not None or learning_rate is not None:
            raise UserError(
                f"{WHERE}: model {model.name!r} is compiled: it trains with its own optimizer; leave optimizer "
                f"and learning_rate out (or compile it with the optimizer you want)"
            )
        return
    for name, targets in labelled:  # regression targets would be cast to class 0 and train to nothing, silently
        try:
            values = np.asarray(targets)
        except (ValueError, TypeError):  # ragged, or a structure: the loss's own check
            continue
        fractions = values[np.mod(values, 1) != 0] if values.dtype.kind == "f" else ()
        if len(fractions):
            raise UserError(
                f"{WHERE}: {name} holds values that are not class labels ({fractions[0]:g}), "
                f"and model {model.name!r} is not compiled, so it would train with sparse categorical cross-entropy, "
                f"which takes class labels: compile it with your loss first, e.g. model.compile(optimizer='adam', "
                f"loss='mse')"
            )
    if optimizer is None or isinstance(optimizer, str):
        from ..trainer.optim import new_optimizer

        # the config's optimizer section, its defaults (the name, the rate) where a keyword is left out
        given = {"name": optimizer, "learning_rate": learning_rate}
        section = {key: value for key, value in given.items() if value is not None}
        cfg = config_from_dict({"optimizer": section}, WHERE).optimizer
        with strategy.scope():
            optimizer = new_optimizer(cfg.name, cfg.learning_rate)
    elif not isinstance(optimizer, keras.optimizers.Optimizer):
        raise UserError(
            f"{WHERE}: optimizer is a {type(optimizer).__name__}: pass a name or a keras.optimizers.Optimizer"
        )
    elif learning_rate is not None:
        raise UserError(f"{WHERE}: optimizer is an object with its own learning rate: leave learning_rate out")
    softmax = ends_in_softmax(model)
    with strategy.scope():
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax),
            metrics=["accuracy"],
        )


def schedule_of(batch_schedule, batch_size, epochs, subdivisions, micro_batch_size) -> tuple:
    """(schedule, rule): ``batch_schedule`` checked by the rules of the CLI's key of that name (config/rules.py:
    one policy, in its words), as ((0-based epoch, batch size), ...) from epoch 0, and its rule (config.BatchRule)
    or None. fit's entries are keyed by epoch (each epoch one pass over the arrays); before a first entry after
    epoch 1 the batch is ``batch_size`` (model.fit's 32 for arrays when None). ((), None) for None."""
    if batch_schedule is None:
        return (), None
    # numpy's integers as Python's (model.fit takes both; the config's checks know YAML's types)
    batch_schedule, batch_size, epochs, subdivisions, micro_batch_size = keras.tree.map_structure(
        lambda value: int(value) if isinstance(value, np.integer) else value,
        (batch_schedule, batch_size, epochs, subdivisions, micro_batch_size),
    )
    raw = {"epochs": epochs, "batch_schedule": batch_schedule}
    entries = batch_schedule if isinstance(batch_schedule, (list, tuple)) else ()
    if any(isinstance(entry, dict) and "step" in entry for entry in entries):
        raise UserError(
            f"{WHERE}: batch_schedule keyed by step is the CLI's: key fit's entries by epoch, such as "
            f'[{{"epoch": 1, "batch_size": 32}}, {{"epoch": 4, "batch_size": 128}}]'
        )
    starts_at_one = bool(entries) and isinstance(entries[0], dict) and entries[0].get("epoch") == 1
    if batch_size is not None or not starts_at_one:  # else the first entry's
        raw["batch_size"] = ARRAY_BATCH_SIZE if batch_size is None else batch_size
    if micro_batch_size == "auto":
        raw["subdivisions"] = "auto"
    elif micro_batch_size is not None:
        raw["micro_batch_size"] = micro_batch_size
    else:
        raw["subdivisions"] = FIT_SUBDIVISIONS if subdivisions is None else subdivisions
    cfg = config_from_dict(raw, WHERE)
    changes = tuple((change.epoch - 1, change.batch_size) for change in cfg.batch_changes)
    return ((0, cfg.batch_size), *changes), cfg.batch_rule


# What a call of fit tells its user to change, in fit's own arguments.
FIT_WORDS = Wording(
    auto='micro_batch_size="auto"',
    more="pass a smaller micro_batch_size, or micro_batch_size='auto'",
    bad_fix="lower the optimizer's learning rate or compile it with an optimizer that clips (clipnorm)",
)
# Every epoch's end and every CHECKPOINT_SECONDS of training (defaults.py).
FIT_CHECKPOINTS = CheckpointPolicy(keep=CHECKPOINT_KEEP, every_seconds=CHECKPOINT_SECONDS)


def train_spec(subdivisions, micro_batch_size, memory_limit, max_bad_steps) -> TrainSpec:
    """What the trainer takes of fit's checked arguments (``memory_limit`` as ``memory_limit_of`` gives it)."""
    auto = micro_batch_size == "auto"
    return TrainSpec(
        micro=MicroBatches(count=subdivisions, size=None if auto else micro_batch_size, auto=auto),
        words=FIT_WORDS,
        memory_limit=memory_limit,
        max_bad_steps=max_bad_steps,
        checkpoints=FIT_CHECKPOINTS,
    )


def check_class_weight(class_weight, sample_weight=None) -> None:
    """model.fit's class_weight: a dict of class index to weight (what it is checked against: ``check_labels``),
    and not beside sample_weight (model.fit refuses the pair)."""
    if class_weight is None:
        return
    if sample_weight is not None:
        raise Refused(
            "class-and-sample-weight",
            f"{WHERE}: class_weight and sample_weight together, which model.fit refuses: pass sample_weight alone, "
            f"each example's weight times its class's",
        )
    if not isinstance(class_weight, dict):
        raise UserError(
            f"{WHERE}: class_weight is a {type(class_weight).__name__}: pass a dict of class index to weight, such "
            f"as {{0: 1.0, 1: 5.0}}"
        )
    for key, weight in class_weight.items():
        # model.fit takes int(key): 1.0 is class 1
        whole = isinstance(key, Integral) or (isinstance(key, float) and key.is_integer())
        if isinstance(key, bool) or not whole or key < 0:
            raise UserError(f"{WHERE}: class_weight has the key {key!r}: its keys are class indices, integers >= 0")
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.number)):
            raise UserError(f"{WHERE}: class_weight[{key}] is {weight!r}: a weight is a number")
