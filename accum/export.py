"""A trained run as a standard Keras 3 model file.

``export_run(run_dir)`` loads the run's latest checkpoint (accum/reload.py)
and writes RUN_DIR/model.keras, which ``keras.models.load_model`` opens with
nothing of accum-train installed: only built-in Keras layers and plain
weights. The TensorLayer built-ins are rebuilt layer by layer as the
equivalent Keras layers (BatchNorm as BatchNormalization with the trained
moving statistics, GroupNorm as GroupNormalization, TF's leaky ReLU as
LeakyReLU(0.2)); a keras_file model gets fresh BatchNormalization layers
(the trained ones pool their statistics over micro-batches) and, with
model.from_logits=false, its softmax back. The model outputs what the run's
model outputs: logits, or the file's softmax probabilities.

A run directory of accum_train.fit holds a Keras model already (the file fit
saved as the run began): it is written as it is, with the checkpoint's
weights, uncompiled as every export is (the optimizer's state stays in the
checkpoint), to RUN_DIR/export.keras by default: model.keras there is fit's.
"""

from __future__ import annotations

from pathlib import Path

from .files import atomic_write, check_output_file, keras_bytes

# The default export of a fit output_dir: fit writes model.keras itself each time a call returns, so that name would
# be taken on every finished directory and replaced by the next call on an unfinished one.
FIT_EXPORT = "export.keras"


def export_run(run_dir: Path, output: Path | None = None, overwrite: bool = False) -> Path:
    """Write the run's trained model to ``output`` (default RUN_DIR/model.keras; for a fit output_dir,
    RUN_DIR/export.keras); the path written.

    An existing file is replaced only with ``overwrite`` (atomically: a reader
    sees the old file or the new one)."""
    from .reload import describe_run, load_fit_run, load_run
    from .trainer.rundir import is_fit_run_dir

    run_dir = Path(run_dir)
    fit = is_fit_run_dir(run_dir)
    if not fit:
        describe_run(run_dir)  # a directory that is not a run fails here, before anything is built
    output = Path(output) if output is not None else run_dir / (FIT_EXPORT if fit else "model.keras")
    check_output_file(output, overwrite, ".keras", "Keras 3's model file format")
    if fit:
        model = load_fit_run(run_dir, compile=False)
    else:
        run = load_run(run_dir, float32=True)  # a plain Keras file, float32 as the weights are
        model = to_keras(run.model, run.data.input_shape)
    atomic_write(output, keras_bytes(model))
    return output


def to_keras(model, input_shape):
    """The plain Keras model computing what ``model.forward(x, training=False)`` computes."""
    from .models.containers import KerasModel

    if isinstance(model, KerasModel):
        return _keras_file_model(model)
    return _tensorlayer_model(model.network, input_shape)


def _keras_file_model(model):
    """The trained network as a model of its own: fresh BatchNormalization layers (the trained ones pool their
    statistics, models/norm.py) and the peeled softmax back."""
    import keras

    originals = {id(trained): original for trained, original in model.peeled}
    replaced = []

    def swap(layer):
        if id(layer) in originals:
            new = type(originals[id(layer)]).from_config(originals[id(layer)].get_config())
        elif isinstance(layer, keras.layers.BatchNormalization):
            new = keras.layers.BatchNormalization.from_config(layer.get_config())
        else:
            return layer
        replaced.append((layer, new))
        return new

    exported = keras.models.clone_model(model.network, clone_function=swap, recursive=True)
    for trained, new in replaced:
        new.set_weights(trained.get_weights())
    return exported


# ----------------------------------------------------------------------------
# TensorLayer built-ins, layer by layer


def _activation(fn, name):
    """The Keras layer of a TL layer's fused activation (none: [])."""
    import keras
    import tensorflow as tf

    if fn is None:
        return []
    from .models.builtin import leaky_relu

    leaky = lambda: keras.layers.LeakyReLU(negative_slope=0.2, name=f"{name}_leaky_relu")  # noqa: E731
    layers = {
        leaky_relu: leaky,
        tf.nn.leaky_relu: leaky,  # TF's leaky_relu slope is 0.2, as the built-ins'
        tf.nn.relu: lambda: keras.layers.ReLU(name=f"{name}_relu"),
    }
    if fn not in layers:
        raise NotImplementedError(f"no Keras layer for activation {getattr(fn, '__name__', fn)} of {name}")
    return [layers[fn]()]


def _converters():
    """TL layer class -> (Keras layer, the TL variables in that layer's get_weights() order)."""
    import keras
    from tensorlayer.layers import Conv2d, Dense, Flatten, GlobalMeanPool2d

    from .models.norm import AccumBatchNorm, GroupNorm

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
        AccumBatchNorm: lambda t: (
            keras.layers.BatchNormalization(
                momentum=t.decay, epsilon=t.epsilon, scale=t.gamma is not None, center=t.beta is not None, name=t.name
            ),
            present(t.gamma, t.beta, t.moving_mean, t.moving_var),
        ),
        GroupNorm: lambda t: (
            keras.layers.GroupNormalization(t.groups, epsilon=t.epsilon, name=t.name),
            [t.gamma, t.beta],
        ),
        Flatten: lambda t: (keras.layers.Flatten(name=t.name), []),
        GlobalMeanPool2d: lambda t: (keras.layers.GlobalAveragePooling2D(name=t.name), []),
    }


def _tensorlayer_model(network, input_shape):
    """A Keras Functional model equal to a TL chain (the built-ins are chains), weights copied."""
    import keras

    # tl.layers.Input is a function; the layer it makes is this (TL exports it under this name)
    from tensorlayer.layers.inputs import _InputLayer

    converters = _converters()
    x = inputs = keras.Input(shape=tuple(input_shape), name="images")
    weights = []
    for layer in network.all_layers:
        if isinstance(layer, _InputLayer):
            continue
        if type(layer) not in converters:
            raise NotImplementedError(f"no Keras equivalent for TensorLayer {type(layer).__name__} {layer.name}")
        keras_layer, variables = converters[type(layer)](layer)
        x = keras_layer(x)
        weights.append((keras_layer, variables))
        for act in _activation(layer.act, layer.name):
            x = act(x)
    model = keras.Model(inputs, x, name="accum_train_export")
    for keras_layer, variables in weights:
        keras_layer.set_weights([v.numpy() for v in variables])
    return model
