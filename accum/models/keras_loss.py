"""A keras_file model that trains with a Keras loss (``keras_loss_model``): loaded and checked against the data
(keras_file.py), compiled with the YAML's ``loss`` and ``metrics`` or its file's compile() (per output with the
file's ``loss_weights``), and that loss taken apart as accum_train.fit takes it (keras_objective.py): every
normaliser a compiled loss divides by (the examples, the valid entries under a mask, the sample weights, or none for
``reduction="sum"``), per output, is summed over the whole batch and divided once, and the weight regularizers
count once per update."""

from __future__ import annotations

import difflib
import inspect

import keras

from .. import keras_private
from ..backends import active
from ..errors import ConfigError
from ..imports import import_function
from ..text import first_line, shape_text, traced_error_line
from .keras_file import accumulating_clone, check_data, load_keras_file, logits_by_output
from .precision import set_precision

SPARSE_LOSSES = ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy")


def keras_loss_model(path: str, element, seed: int, loss, metrics, compiled: dict, precision: str = "float32"):
    """(model, objective): the model in ``path`` checked against the data's ``element`` (the specs of a batch's
    (x, y, sample weights or None)), compiled with the YAML's ``loss`` and ``metrics`` (None: the file's, from its
    ``compiled`` compile_config), and its loss taken apart for that data (``keras_objective``)."""
    keras.utils.set_random_seed(seed)
    loaded = load_keras_file(path)
    check_data(loaded, path, *element[:2])
    model = accumulating_clone(loaded, path)
    try:
        model.network.compile(**compile_arguments(logits_by_output(model.network), loss, metrics, compiled))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"loss and metrics do not fit model.path={path}: {first_line(err)}") from None
    model = set_precision(model, precision)
    return model, keras_objective(model.network, element, path)


def compile_arguments(logits: dict, loss, metrics, compiled: dict) -> dict:
    """compile()'s loss, loss_weights, metrics and weighted_metrics for a network whose outputs give ``logits``
    (keras_file.logits_by_output): the YAML's ``loss`` (each output's taken on its logits where it gives them) and
    ``metrics``, else (None) the file's ``compiled``."""
    if loss is not None:
        loss, loss_weights = _on_logits(loss, logits), None
    else:
        loss, loss_weights = _from_file(compiled["loss"], keras.losses.get), compiled.get("loss_weights")
    if metrics is not None:
        metrics, weighted = _named(metrics, "metrics", _metric), None
    else:
        metrics = _from_file(compiled.get("metrics"), _file_metric)
        weighted = _from_file(compiled.get("weighted_metrics"), _file_metric)
    return dict(loss=loss, loss_weights=loss_weights, metrics=metrics, weighted_metrics=weighted)


def keras_objective(network, element, path: str):
    """The compiled loss of ``network`` taken apart for data of ``element`` (x, y, sample weights or None) of a
    batch: its normalisers found by tracing one micro-step. Targets the loss cannot take fail here, in one line."""
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
        known = sorted(keras_private.LOSSES)  # keras.losses.get's names, aliases too
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "e.g. mse, huber, binary_crossentropy"
        raise ConfigError(f"{key}={name!r} is not a Keras loss: {hint}") from None


def _on_logits(spec, logits: dict):
    """The YAML's loss as Keras objects; a Keras cross-entropy named for an output that ends in no activation
    takes that output's logits: Keras' own default (from_logits=False) would take them for probabilities and
    train on nonsense without a word (``logits``: per output name, in order, whether it ends in none). Your
    functions (``module:function``) are taken as they are."""

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
    names = list(logits)
    if len(names) > 1 and len(set(logits.values())) > 1:  # outputs of both kinds: one loss each
        return [one(spec, "loss", [output]) for output in names]
    return one(spec, "loss", names)


def _metric(name: str, key: str = "metrics"):
    if ":" in name:
        return import_function(name, key, ConfigError)
    if name in ("accuracy", "acc", "crossentropy", "ce"):  # Keras picks the kind for the targets at compile
        return name
    known = sorted(keras_private.METRICS)
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
