"""What a config trains on, built from it: the data (``load_data``) and the model with its objective
(``build_with_loss``): a built-in net with the built-in cross-entropy, or a keras_file with a Keras loss, the
YAML's ``loss`` and ``metrics`` or its file's compile().

A keras_file model trains with the built-in loss (sparse cross-entropy on class
labels) unless the YAML names a ``loss`` or the file was saved compiled with
one; then it trains with that loss, per output with the file's
``loss_weights``, and is scored with the YAML's (or the file's) metrics.

The loss is taken apart as accum_train.fit takes it (keras_objective.py), and
the accumulator is the same: every normaliser a compiled loss divides by (the
examples, the valid entries under a mask, the sample weights, or none for
``reduction="sum"``), per output, is summed over the whole batch and divided
once, and the weight regularizers count once per update.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect

import keras

from .. import keras_private
from ..backends import active
from ..errors import ConfigError
from ..imports import import_function
from ..models.containers import KerasModel
from ..models.keras_file import accumulating_clone, load_keras_file, outputs_logits
from ..models.precision import set_precision
from ..text import first_line, shape_text, traced_error_line
from ..trainer.data.batching import as_data
from ..trainer.data.trim import TrimmedSplit, check_trimmable
from ..trainer.store.rundir import CheckpointPolicy
from ..trainer.trainer import MicroBatches, TrainSpec, Wording
from .source import compile_config, model_source
from .startup import parallel_micro_steps

SPARSE_LOSSES = ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy")


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
    The model is the one the data was loaded for (``data.for_model``; data made without one: ``cfg``'s)."""
    source = data.for_model or model_source(cfg)
    cfg = dataclasses.replace(cfg, model=source.config)
    if source.keras_loss:
        keras.utils.set_random_seed(cfg.seed)
        model = build_keras_loss_model(cfg, data, precision)
        return model, keras_objective(model.network, data.signature(), cfg.model.path)
    from ..models import build_model

    model = build_model(cfg.model, cfg.seed, data.input_shape, data.num_classes, precision)
    return model, active().classifier(model.forward)


def build_run(cfg, data, strategy=None):
    """The trainer of a run of ``cfg`` on ``data`` (run_parts.Run), set up from what the config resolves to: the
    config checked against the training set, the model and its objective built under ``strategy`` (``None``: the
    one in scope), and the training split cut by data.trim_padding."""
    from .run_parts import Run

    cfg = cfg.for_data(len(data.train))
    spec = train_spec(cfg)
    parallel = parallel_micro_steps(cfg)
    in_scope = active().strategy_in_scope(strategy)
    with in_scope.scope():
        # the model the data was loaded for: a keras_file with the YAML's loss or its file's compile() trains on
        # that loss
        model, objective = build_with_loss(cfg, data, cfg.precision)
        if cfg.data.trim_padding is not None and len(data.train):  # none to cut in a run rebuilt without them
            data = dataclasses.replace(data, train=_trimmed(cfg, data, model, objective, in_scope))
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


def _trimmed(cfg, data, model, objective, strategy) -> TrimmedSplit:
    """The training split read with data.trim_padding (trim.TrimmedSplit), the loss probed again for sequences of
    any length; refused in one line for a model it cannot cut."""
    multiple = cfg.data.trim_padding
    where = f"data.trim_padding={multiple}"
    if data.classification:
        raise ConfigError(
            f"{where}: it cuts the sequences a Keras loss trains on, and model.path={cfg.model.path} trains "
            f"with the built-in cross-entropy on class labels: give loss: in the YAML, or remove data.trim_padding"
        )
    check_trimmable(model.network, strategy.num_replicas_in_sync, where)
    split = TrimmedSplit(data.train, multiple, where)
    objective.steps = split.trim.steps  # a mean over every position still counts them uncut
    objective.probe(as_data(split.signature()), strategy)
    return split


def build_keras_loss_model(cfg, data, precision: str = "float32") -> KerasModel:
    """The keras_file model, checked against the data's inputs, compiled with the run's loss and metrics."""
    path = cfg.model.path
    loaded = load_keras_file(path)
    _check_inputs(loaded, path, data)
    model = accumulating_clone(loaded, path)
    compiled = compile_config(path)
    if cfg.loss is not None:
        loss, loss_weights = _on_logits(cfg.loss, model.network), None
    else:
        loss, loss_weights = _from_file(compiled["loss"], keras.losses.get), compiled.get("loss_weights")
    if cfg.metrics is not None:
        metrics, weighted = _named(cfg.metrics, "metrics", _metric), None
    else:
        metrics = _from_file(compiled.get("metrics"), _file_metric)
        weighted = _from_file(compiled.get("weighted_metrics"), _file_metric)
    try:
        model.network.compile(loss=loss, loss_weights=loss_weights, metrics=metrics, weighted_metrics=weighted)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"loss and metrics do not fit model.path={path}: {first_line(err)}") from None
    return set_precision(model, precision)


def keras_objective(network, signature, path: str):
    """The compiled loss of ``network`` taken apart for data of ``signature`` ((x, y) or (x, (y, weights)) of a
    batch): its normalisers found by tracing one micro-step. Targets the loss cannot take fail here, in one line."""
    element = as_data(signature)  # (x, y, sample weights or None)
    targets = element[1]
    _check_class_targets(network.loss, targets)
    try:
        keras_private.symbolic_build(network, element)  # the compiled loss's entries exist after it
        objective = active().KerasObjective(network, where=f"the loss of model.path={path}")
        objective.probe(element, active().strategy_in_scope())
    except ConfigError:
        raise
    except Exception as err:  # Keras' own word on targets its loss cannot take
        targets = keras.tree.map_structure(lambda s: shape_text(tuple(s.shape[1:])), targets)
        if isinstance(targets, dict):  # 'price 1, kind 4' for several outputs by name
            targets = ", ".join(f"{name} {text}" for name, text in targets.items())
        outputs = [shape_text(tuple(t.shape[1:])) for t in network.outputs]
        raise ConfigError(
            f"the loss of model.path={path} cannot take the data's targets (y_train holds examples of "
            f"{targets}, the model outputs {', '.join(outputs)} per example): {traced_error_line(err)}"
        ) from None
    return objective


def describe_loss(objective) -> dict:
    """The loss per output (name, loss, weight) and the metrics' names, as plan shows them."""
    losses = [
        {"output": entry.name, "loss": _loss_name(entry.loss), "weight": entry.loss_weights}
        for entry in objective.entries
    ]
    metrics = keras_private.compile_metrics(objective.model)
    return {"loss": losses, "metrics": [] if metrics is None or not metrics.built else list(metrics.result().keys())}


def _loss_name(loss) -> str:
    """A loss's name, and "(on logits)" where it takes logits (as the built-in loss is shown)."""
    try:
        on_logits = bool(loss.get_config().get("from_logits"))
    except (AttributeError, NotImplementedError, TypeError):
        on_logits = False
    return f"{loss.name} (on logits)" if on_logits else loss.name


def _check_class_targets(losses, y_spec) -> None:
    """A sparse cross-entropy takes class indices: float targets (a regression's) would be cast to them."""
    specs = keras.tree.flatten(y_spec)
    # one loss per output (a dict or list, in the targets' order), or one loss for every output
    several = isinstance(losses, (dict, list, tuple))
    pairs = zip(keras.tree.flatten(losses), specs) if several else [(losses, s) for s in specs]
    for loss, spec in pairs:
        function = getattr(loss, "fn", loss)
        name = getattr(function, "__name__", type(loss).__name__)
        if (name in SPARSE_LOSSES or type(loss).__name__ in SPARSE_LOSSES) and spec.dtype.is_floating:
            raise ConfigError(
                f"the loss sparse_categorical_crossentropy takes integer class indices, but the targets (y_train) "
                f"are {spec.dtype.name}: save them as integers (y_train.astype('int64')), or choose a loss for "
                f"values, e.g. loss: mse"
            )


def _check_inputs(model: keras.Model, path: str, data) -> None:
    """The data's inputs are the model's (by name when several) with the model's shapes per example, and its
    targets one per output (by name when several)."""
    x_spec, y_spec, _ = as_data(data.signature())
    inputs = {tensor.name: tensor for tensor in model.inputs}
    _check_names(path, "inputs", "x_train", list(inputs), x_spec)
    _check_names(path, "outputs", "y_train", output_names(model), y_spec)
    for name, spec in x_spec.items() if isinstance(x_spec, dict) else [(None, x_spec)]:
        given = tuple((inputs[name] if name else model.inputs[0]).shape[1:])
        shape = tuple(spec.shape[1:])
        if len(given) != len(shape) or any(g is not None and g != d for g, d in zip(given, shape)):
            key = f"x_train_{name}" if name else "x_train"
            raise ConfigError(
                f"model.path={path} takes inputs of shape {shape_text(given)} per example but {key} holds "
                f"{shape_text(shape)}: build the model on keras.Input(shape={shape}) or reshape {key}"
            )


def output_names(model: keras.Model) -> list:
    """The names a model's outputs go by: a functional model's ``output_names``; a Sequential model (which has
    none, and one output) its last layer's name, as the same model made functional would call it."""
    names = getattr(model, "output_names", None)
    return list(names) if names else [model.layers[-1].name]


def _check_names(path: str, what: str, key: str, names: list, spec) -> None:
    """One array ``key`` for a model with one of ``what``, else one ``key_<name>`` per name."""
    if not isinstance(spec, dict):
        if len(names) != 1:
            raise ConfigError(
                f"model.path={path} has {len(names)} {what} ({', '.join(names)}) but the data gives one {key}: "
                f"save one array per name, {', '.join(f'{key}_{name}' for name in names)}"
            )
        return
    if sorted(spec) != sorted(names):
        given = ", ".join(f"{key}_{name}" for name in sorted(spec))
        raise ConfigError(
            f"model.path={path} has {what} {', '.join(names)} but the data gives {given}: name the arrays "
            f"{', '.join(f'{key}_{name}' for name in names)}"
        )


def _named(spec, key: str, get):
    """A loss or metrics spec from the YAML (a name, a list, a mapping per output) as Keras objects."""
    if isinstance(spec, dict):
        return {name: _named(item, f"{key}.{name}", get) for name, item in spec.items()}
    if isinstance(spec, (list, tuple)):
        return [get(name, key) for name in spec]
    return get(spec, key)


def _loss(name: str, key: str = "loss"):
    if ":" in name:
        return import_function(name, key, ConfigError)
    try:
        return keras.losses.get(name)
    except (ValueError, TypeError):
        known = keras_private.loss_names()
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "e.g. mse, huber, binary_crossentropy"
        raise ConfigError(f"{key}={name!r} is not a Keras loss: {hint}") from None


def _on_logits(spec, network):
    """The YAML's loss as Keras objects; a Keras cross-entropy named for an output that ends in no activation
    takes that output's logits: Keras' own default (from_logits=False) would take them for probabilities and
    train on nonsense without a word. Your functions (``module:function``) are taken as they are."""
    names = output_names(network)
    logits = dict(zip(names, outputs_logits(network)))

    def one(name, key, outputs):
        loss = _loss(name, key)
        if ":" in name or not all(logits.get(output) for output in outputs):
            return loss
        if isinstance(loss, keras.losses.Loss):  # named by its class (SparseCategoricalCrossentropy)
            config = loss.get_config()
            return type(loss).from_config({**config, "from_logits": True}) if "from_logits" in config else loss
        if "from_logits" not in inspect.signature(loss).parameters:
            return loss
        # its class (sparse_categorical_crossentropy: SparseCategoricalCrossentropy), as compile() would build it
        named = getattr(keras.losses, "".join(part.capitalize() for part in loss.__name__.split("_")), None)
        return named(from_logits=True) if named else keras.losses.LossFunctionWrapper(loss, from_logits=True)

    if isinstance(spec, dict):  # one name per output (config/values.py: a name, or a mapping of them)
        return {output: one(name, f"loss.{output}", [output]) for output, name in spec.items()}
    if len(names) > 1 and len({logits[output] for output in names}) > 1:  # outputs of both kinds: one loss each
        return [one(spec, "loss", [output]) for output in names]
    return one(spec, "loss", names)


def _metric(name: str, key: str = "metrics"):
    if ":" in name:
        return import_function(name, key, ConfigError)
    if name in ("accuracy", "acc", "crossentropy", "ce"):  # Keras picks the kind for the targets at compile
        return name
    known = keras_private.metric_names()
    if name in known:
        return name  # compile() resolves it, and names the metric as model.fit does ("mae", not its function's)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else "e.g. mae, accuracy, auc"
    raise ConfigError(f"{key} has {name!r}, which is not a Keras metric: {hint}")


def _file_metric(entry):
    return entry if isinstance(entry, str) else keras.metrics.get(entry)


def _from_file(spec, get):
    """A loss or metrics spec as compile() saved it (names and serialized objects, nested per output)."""
    if spec is None:
        return None
    if isinstance(spec, dict) and "class_name" not in spec:
        return {name: _from_file(item, get) for name, item in spec.items()}
    if isinstance(spec, list):
        return [_from_file(item, get) for item in spec]
    return get(spec)
