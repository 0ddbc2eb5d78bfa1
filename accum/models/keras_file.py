"""Your own Keras 3 model from a .keras file (``model.name: keras_file``).

The file is loaded with ``safe_mode=True`` (no Python code from the file runs)
and checked against the dataset's input shape and class count. Its
``BatchNormalization`` layers pool their statistics over the micro-batches of
an update (the backend's ``pooled``: each keeps its class, config and
weights). Built inside a tf.distribute strategy's scope (as train.Run builds
every model), the loaded and cloned weights are mirrored variables and the
layers' pending statistics replica-local ones, so the model trains on every
strategy as the built-ins do.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import keras

from ..backends import active
from ..config import ModelConfig
from ..errors import ConfigError
from ..text import shape_text
from .containers import KerasModel
from .precision import float8_scales


def _file_error(path: str, problem: str) -> ConfigError:
    return ConfigError(f"model.path={path} {problem}")


def _custom_code(node) -> list:
    """What a .keras config.json names from outside Keras: custom classes and Python functions."""
    found = []
    if isinstance(node, dict):
        module = node.get("module")
        if "class_name" in node and isinstance(module, str) and module.split(".")[0] != "keras":
            found.append(
                f"the Python function {node.get('config')!r}"
                if node["class_name"] == "function"
                else f"the custom class {node.get('registered_name') or node['class_name']!r}"
            )
        for value in node.values():
            found += _custom_code(value)
    elif isinstance(node, list):
        for value in node:
            found += _custom_code(value)
    return found


def load_keras_file(path: str) -> keras.Model:
    """keras.models.load_model(path, safe_mode=True, compile=False); every failure as one line."""
    save_hint = "save your model with model.save('my_model.keras') and give that file"
    file = Path(path)
    if not file.exists():
        raise _file_error(path, f"does not exist: {save_hint}")
    if file.is_dir():
        raise _file_error(path, f"is a directory: {save_hint}")
    try:
        with zipfile.ZipFile(file) as archive:
            config = json.loads(archive.read("config.json"))
    except zipfile.BadZipFile:
        raise _file_error(
            path, f"is not a .keras archive (truncated, corrupt or another format): {save_hint}"
        ) from None
    except KeyError:
        raise _file_error(path, f"is a zip archive without config.json, not a Keras model: {save_hint}") from None
    except (OSError, ValueError) as err:  # unreadable, a damaged member, JSON that does not parse
        raise _file_error(path, f"cannot be read ({str(err).splitlines()[0]}): {save_hint}") from None
    custom = _custom_code(config)
    if custom:  # refused before Keras sees it: loading would need that code
        raise _file_error(
            path,
            f"uses {custom[0]}, which is not part of Keras: accum-train loads only built-in "
            f"Keras layers and functions (no custom code); rebuild the model from them",
        )
    try:
        model = keras.models.load_model(file, safe_mode=True, compile=False)
    except Exception as err:
        text = str(err)
        if "arbitrary code execution" in text or "safe_mode" in text:
            raise _file_error(
                path,
                "holds Python code (a Lambda layer or a lambda), which loading with "
                "safe_mode=True refuses: rebuild the model from built-in Keras layers",
            ) from None
        raise _file_error(
            path,
            f"could not be loaded by keras.models.load_model ({type(err).__name__}: "
            f"{text.splitlines()[0][:160] if text else 'no message'}): {save_hint}",
        ) from None
    if not isinstance(model, keras.Model):
        raise _file_error(path, f"holds a {type(model).__name__}, not a model: {save_hint}")
    if float8_scales(model):
        raise _file_error(
            path,
            "holds a model quantized for float8 training (quantize('float8')), whose scale variables take each "
            "step's new value in place of a gradient, which micro-batches cannot add up: save it before quantizing",
        )
    return model


def _check_interface(model: keras.Model, path: str, input_shape, num_classes: int) -> None:
    """One image input of the dataset's shape, one output of num_classes values per example."""
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise _file_error(
            path,
            f"has {len(model.inputs)} inputs and {len(model.outputs)} outputs: accum-train "
            f"feeds one image tensor and reads one output of class scores",
        )
    given = tuple(model.inputs[0].shape[1:])
    if len(given) != len(input_shape) or any(g is not None and g != d for g, d in zip(given, input_shape)):
        raise _file_error(
            path,
            f"takes inputs of {shape_text(given)} but the dataset's images are {shape_text(input_shape)} "
            f"(height x width x channels): build the model on keras.Input(shape={tuple(input_shape)})",
        )
    out = tuple(model.outputs[0].shape[1:])
    if out != (num_classes,):
        raise _file_error(
            path,
            f"outputs {shape_text(out)} values per example but the dataset has {num_classes} "
            f"classes: end the model in a Dense({num_classes}) layer",
        )


def check_data(model: keras.Model, path: str, x_spec, y_spec) -> None:
    """The data's inputs (``x_spec``) are the model's (by name when several) with the model's shapes per example,
    and its targets (``y_spec``) one per output (by name when several)."""
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


def _output_layer(model: keras.Model, index: int = 0):
    """The innermost layer that computes the model's output (its ``index``-th)."""
    layer = model.outputs[index]._keras_history.operation
    return _output_layer(layer) if isinstance(layer, keras.Model) else layer


def ends_in_softmax(model: keras.Model) -> bool:
    """Whether the model's (one) output is a softmax's: probabilities, not logits (False for a model whose
    output layer cannot be told: a subclassed one)."""
    try:
        return len(model.outputs or []) == 1 and _is_softmax(_output_layer(model))
    except (ValueError, AttributeError, IndexError):
        return False


def logits_by_output(model: keras.Model) -> dict:
    """Per output name (``output_names``): whether its layer ends in no activation, so that it gives logits (a
    softmax, a sigmoid or a layer with no activation to read gives False)."""

    def linear(layer) -> bool:
        while isinstance(getattr(layer, "layer", None), keras.layers.Layer):  # TimeDistributed, Bidirectional
            layer = layer.layer
        return getattr(layer, "activation", None) is keras.activations.linear

    return {name: linear(_output_layer(model, index)) for index, name in enumerate(output_names(model))}


def _is_softmax(layer) -> bool:
    return isinstance(layer, keras.layers.Softmax) or getattr(layer, "activation", None) is keras.activations.softmax


def _without_softmax(layer):
    """The same layer computing the logits under its softmax (weights copied after the clone)."""
    if isinstance(layer, (keras.layers.Softmax, keras.layers.Activation)):
        return keras.layers.Identity(name=layer.name)
    return type(layer).from_config({**layer.get_config(), "activation": "linear"})


def keras_file(cfg: ModelConfig, input_shape, num_classes: int) -> KerasModel:
    """The model in model.path, checked, its BatchNormalization layers made accumulating."""
    loaded = checked_file(cfg, input_shape, num_classes)
    return accumulating_clone(loaded, cfg.path, None if cfg.from_logits else _output_layer(loaded))


def checked_file(cfg: ModelConfig, input_shape, num_classes: int) -> keras.Model:
    """The model in model.path, loaded and checked against the images and classes it trains on, and against
    model.from_logits."""
    loaded = load_keras_file(cfg.path)
    _check_interface(loaded, cfg.path, input_shape, num_classes)
    last = _output_layer(loaded)
    if not cfg.from_logits and not _is_softmax(last):
        raise _file_error(
            cfg.path,
            f"ends in {type(last).__name__} {last.name!r}, not a softmax, but "
            f"model.from_logits=false says it outputs probabilities: remove "
            f"model.from_logits if it outputs logits, or end it in activation='softmax'",
        )
    if cfg.from_logits and _is_softmax(last):  # the loss would take probabilities for logits: a silent wrong run
        raise _file_error(
            cfg.path,
            f"ends in a softmax ({type(last).__name__} {last.name!r}), but model.from_logits=true (the default) "
            f"takes its outputs as logits: set model.from_logits=false (it then trains on the logits under it)",
        )
    return loaded


def accumulating_clone(loaded: keras.Model, path: str, softmax=None) -> KerasModel:
    """A clone of ``loaded`` (read from ``path``) with the file's weights, its BatchNormalization layers pooling
    their statistics for as long as the model lives, and ``softmax`` (the output layer, when given) computing
    the logits under it."""
    # every other layer is reused as it is: its weights stay the file's
    network, peeled = clone_swapping(loaded, lambda layer: _without_softmax(layer) if layer is softmax else None)
    norm_layers = active().pool(network, f"model.path={path}")

    def forward(x, training: bool):
        return network(x, training=training)

    return KerasModel(network=network, forward=forward, norm_layers=norm_layers, peeled=peeled)


def clone_swapping(network: keras.Model, swap):
    """(a clone of ``network`` in which each layer that ``swap(layer)`` gives a new one for (None: none) is
    replaced by it, with the replaced layer's weights; the [(new, replaced)] pairs)."""
    replaced = []

    def clone_function(layer):
        new = swap(layer)
        if new is None:
            return layer
        replaced.append((new, layer))
        return new

    clone = keras.models.clone_model(network, clone_function=clone_function, recursive=True)
    for new, old in replaced:  # clone_model builds the new layer; the weights are the replaced one's
        new.set_weights(old.get_weights())
    return clone, replaced
