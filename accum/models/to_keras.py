"""A built model as plain Keras layers, the file ``accum-train export`` writes for a run of 'accum-train run'.

``to_keras(model, input_shape)`` computes what ``model.forward(x, training=False)`` computes with nothing of
accum-train in it: only built-in Keras layers and plain weights, so ``keras.models.load_model`` opens the file
anywhere. The TensorLayer built-ins are rebuilt layer by layer as the equivalent Keras layers (BatchNorm as
BatchNormalization with the trained moving statistics, GroupNorm as GroupNormalization, TF's leaky ReLU as
LeakyReLU(0.2)); a keras_file model gets fresh BatchNormalization layers (the trained ones pool their statistics
over micro-batches) and, with model.from_logits=false, its softmax back. The model outputs what the run's model
outputs: logits, or the file's softmax probabilities.
"""

from __future__ import annotations

import keras

from ..backends import active
from .containers import KerasModel
from .keras_file import clone_swapping


def to_keras(model, input_shape):
    """The plain Keras model computing what ``model.forward(x, training=False)`` computes."""
    if isinstance(model, KerasModel):
        return _keras_file_model(model)
    return _tensorlayer_model(model.network, input_shape)


def _keras_file_model(model):
    """The trained network as a model of its own: fresh BatchNormalization layers (the trained ones pool their
    statistics, the backend's norm.py) and the peeled softmax back."""
    originals = {id(trained): original for trained, original in model.peeled}

    def swap(layer):
        if id(layer) in originals:
            return type(originals[id(layer)]).from_config(originals[id(layer)].get_config())
        if isinstance(layer, keras.layers.BatchNormalization):
            return keras.layers.BatchNormalization.from_config(layer.get_config())
        return None

    return clone_swapping(model.network, swap)[0]


# ----------------------------------------------------------------------------
# TensorLayer built-ins, layer by layer


def _activation(fn, name):
    """The Keras layer of a TL layer's fused activation (none: [])."""
    if fn is None:
        return []
    # by name: the built-ins' leaky_relu (builtin.py's, slope 0.2, as TF's own leaky_relu) and TF's relu
    if getattr(fn, "__name__", None) == "leaky_relu":
        return [keras.layers.LeakyReLU(negative_slope=0.2, name=f"{name}_leaky_relu")]
    if getattr(fn, "__name__", None) == "relu":
        return [keras.layers.ReLU(name=f"{name}_relu")]
    raise NotImplementedError(f"no Keras layer for activation {getattr(fn, '__name__', fn)} of {name}")


def _converters():
    """TL layer class -> (Keras layer, the TL variables in that layer's get_weights() order)."""
    from tensorlayer.layers import Conv2d, Dense, Flatten, GlobalMeanPool2d

    def present(*variables):
        return [v for v in variables if v is not None]

    return {
        Conv2d: lambda t: (
            keras.layers.Conv2D(
                t.n_filter,
                t.filter_size,
                t.strides,
                padding=t.padding.lower(),
                dilation_rate=t.dilation_rate,
                use_bias=t.b_init is not None,
                name=t.name,
            ),
            present(t.W, getattr(t, "b", None) if t.b_init is not None else None),
        ),
        Dense: lambda t: (
            keras.layers.Dense(t.n_units, use_bias=t.b_init is not None, name=t.name),
            present(t.W, getattr(t, "b", None) if t.b_init is not None else None),
        ),
        active().AccumBatchNorm: lambda t: (
            keras.layers.BatchNormalization(
                momentum=t.decay, epsilon=t.epsilon, scale=t.gamma is not None, center=t.beta is not None, name=t.name
            ),
            present(t.gamma, t.beta, t.moving_mean, t.moving_var),
        ),
        active().GroupNorm: lambda t: (
            keras.layers.GroupNormalization(t.groups, epsilon=t.epsilon, name=t.name),
            [t.gamma, t.beta],
        ),
        Flatten: lambda t: (keras.layers.Flatten(name=t.name), []),
        GlobalMeanPool2d: lambda t: (keras.layers.GlobalAveragePooling2D(name=t.name), []),
    }


def _tensorlayer_model(network, input_shape):
    """A Keras Functional model equal to a TL chain (the built-ins are chains), weights copied."""
    # tl.layers.Input is a function; the layer it makes is this (TL exports it under this name)
    from tensorlayer.layers.inputs import _InputLayer

    converters = _converters()
    x = inputs = keras.Input(shape=tuple(input_shape), name="images")
    for layer in network.all_layers:
        if isinstance(layer, _InputLayer):
            continue
        if type(layer) not in converters:
            raise NotImplementedError(f"no Keras equivalent for TensorLayer {type(layer).__name__} {layer.name}")
        keras_layer, variables = converters[type(layer)](layer)
        x = keras_layer(x)
        keras_layer.set_weights([v.numpy() for v in variables])  # built by the call above
        for act in _activation(layer.act, layer.name):
            x = act(x)
    return keras.Model(inputs, x, name="accum_train_export")
