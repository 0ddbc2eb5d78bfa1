"""Model registry: the seed's conv net and a small MLP (TensorLayer), or your
own Keras 3 model from a .keras file.

``build_model(cfg, ...)`` returns a ``Model``: the network, a
``forward(x, training)`` that gives logits, the variables to train and to
checkpoint, and the norm layers whose moving statistics the engine commits
once per update (objects with ``deferred``, ``commit()`` and ``discard()``).

TensorLayer 2.2.5's BatchNorm does not work inside tf.function on current
TensorFlow (it rebinds its moving-statistics attributes to the result of an
assign and pollutes them during the static build; ../shared/NOTES.md).
``AccumBatchNorm`` replaces its forward: statistics are updated in place,
never during the build pass, and moving_var starts at ones as in Keras. TL's
GroupNorm needs a static batch size, so ``GroupNorm`` is our own.

A ``keras_file`` model is loaded with ``safe_mode=True`` (no Python code from
the file runs) and checked against the dataset's input shape and class count.
Its ``BatchNormalization`` layers are swapped for ``KerasAccumBatchNorm``, a
subclass with the same weights that pools its statistics over the
micro-batches of an update; export swaps them back (accum/export.py).
"""

from __future__ import annotations

import contextlib
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
import tensorlayer as tl
from tensorlayer.layers import BatchNorm, Conv2d, Dense, Flatten, GlobalMeanPool2d, Input

from .config import MODEL_NAMES, NORM_NAMES, SEED_CHANNELS, ModelConfig
from .errors import ConfigError

__all__ = [
    "BUILDERS",
    "SEED_CHANNELS",
    "SEED_STRIDES",
    "AccumBatchNorm",
    "GroupNorm",
    "KerasAccumBatchNorm",
    "KerasModel",
    "Model",
    "build_model",
]

SEED_STRIDES = (2, 2, 1, 1, 1)


class PendingStats:
    """The BatchNorm statistics of one update so far: count, sum and sum of squares.

    Sums of ``h - shift`` rather than of ``h``, with ``shift`` the moving mean
    (the same on every replica, and fixed during an update), so that the sum of
    squares does not cancel. Sums are additive: micro-batches add to them, and
    replicas sum them in the engine's one all-reduce. The variables are
    replica-local (``ON_READ``/``SUM``) under tf.distribute and plain on one
    device. Not weights: zero between updates, never saved or trained.
    """

    def __init__(self, name: str, shape):
        local = dict(
            trainable=False, synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM
        )
        self.count = tf.Variable(0.0, name=f"{name}_pending_count", **local)
        self.sum = tf.Variable(tf.zeros(shape), name=f"{name}_pending_sum", **local)
        self.sq = tf.Variable(tf.zeros(shape), name=f"{name}_pending_sq", **local)
        # The engine's loop-carried accumulation (micro-steps in parallel) collects each micro-batch's
        # sums as tensors instead of adding them to the variables: see ``collect``.
        self._collected = None

    def add(self, count, mean, var, shift):
        """Pool a (micro-)batch of ``count`` values per channel with these moments."""
        delta = mean - shift
        sums = [count, count * delta, count * (var + tf.square(delta))]
        if self._collected is not None:
            self._collected.append(sums)
        else:
            self.add_sums(sums)

    def add_sums(self, sums):
        """Add [count, sum, sum of squares] (one ``add``'s, or a loop's total of them) to the variables."""
        for variable, value in zip(self.variables(), sums):
            variable.assign_add(value)

    def variables(self) -> list:
        return [self.count, self.sum, self.sq]

    @contextlib.contextmanager
    def collect(self):
        """Within: ``add`` appends its sums (three tensors) to the list yielded, and leaves the variables
        alone. A layer called twice in one micro-batch appends twice."""
        self._collected = collected = []
        try:
            yield collected
        finally:
            self._collected = None

    def values(self) -> list:
        """This replica's sums, in the order ``fold`` takes them."""
        return [self.count.read_value(), self.sum.read_value(), self.sq.read_value()]

    def clear(self):
        self.count.assign(0.0)
        self.sum.assign(tf.zeros(self.sum.shape))  # not zeros_like: no read (a collective, across replicas)
        self.sq.assign(tf.zeros(self.sq.shape))


def move_statistics(moving_mean, moving_var, momentum, mean, var, seen=True):
    """moving = moving * momentum + batch * (1 - momentum); nothing moves unless ``seen``."""
    moving_mean.assign(tf.where(seen, moving_mean * momentum + mean * (1.0 - momentum), moving_mean))
    moving_var.assign(tf.where(seen, moving_var * momentum + var * (1.0 - momentum), moving_var))


def fold_statistics(moving_mean, moving_var, momentum, values):
    """Move the moving statistics once by the pooled ones, from (summed) PendingStats values.

    The shift of the sums is the moving mean, read here before anything moves.
    Nothing moves when the update saw no example (count 0)."""
    count, total, squares = values
    n = tf.maximum(count, 1.0)
    delta = total / n
    move_statistics(
        moving_mean,
        moving_var,
        momentum,
        moving_mean + delta,
        tf.maximum(squares / n - tf.square(delta), 0.0),
        count > 0,
    )


class DeferredStatistics:
    """The engine's norm-layer API on top of a layer's ``pending`` (PendingStats) and ``fold(values)``."""

    def commit(self):
        """Fold this layer's own pooled statistics in and forget them (one device)."""
        self.fold(self.pending.values())
        self.discard()

    def discard(self):
        """Forget the pooled statistics (an update that is folded, skipped or retried)."""
        self.pending.clear()


class AccumBatchNorm(DeferredStatistics, BatchNorm):
    """BatchNorm that works in graph mode and can defer its moving-average update.

    Training normalises with the statistics of the batch it sees (for the engine,
    a micro-batch, as darknet and the seed do). The moving statistics are
    updated either right away (``deferred=False``: what a plain loop wants) or,
    with ``deferred=True``, from the statistics of the whole update, pooled over
    its micro-batches (and replicas) by example count and folded in once by the
    engine (``fold``; ``commit`` on one device). The deferred moving statistics
    are then exactly those a single pass over the whole batch would produce, and
    they move once per update, not per micro-step.
    """

    def __init__(self, decay=0.9, epsilon=1e-5, act=None, name=None):
        super().__init__(decay=decay, epsilon=epsilon, act=act, name=name, moving_var_init=tl.initializers.ones())
        self.deferred = False

    def build(self, inputs_shape):
        super().build(inputs_shape)
        # Plain attributes, not TL weights: not in weights.npz or the trainable list.
        self.pending = PendingStats(self.name, self.moving_mean.shape)

    def forward(self, inputs):
        """One FusedBatchNormV3: it returns the batch statistics that the pooling needs, and it keeps
        fewer activations for the backward pass than moments + batch_normalization (measured: 0.8x the
        allocator peak of an update, and faster; README, "Where the time goes"). Under mixed precision
        it runs on the 16-bit activations, its statistics and scale in float32 (no float32 copy of the
        activations is kept, unlike a cast)."""
        shape = tf.shape(inputs)
        channels = inputs.shape[-1]
        x = inputs if len(inputs.shape) == 4 else tf.reshape(inputs, [-1, 1, 1, channels])
        empty = tf.zeros([0], tf.float32)
        if self.is_train:
            y, mean, var, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                x=x,
                scale=self.gamma,
                offset=self.beta,
                mean=empty,
                variance=empty,
                epsilon=self.epsilon,
                is_training=True,
            )
            count = tf.cast(tf.size(x) // channels, tf.float32)
            var = var * tf.maximum(count - 1.0, 0.0) / tf.maximum(count, 1.0)  # the op's variance is Bessel's
            if self._nodes_fixed:
                if self.deferred:
                    self.pending.add(count, mean, var, self.moving_mean)
                else:
                    move_statistics(self.moving_mean, self.moving_var, self.decay, mean, var)
        else:
            # the raw op: tf.nn.fused_batch_norm raises epsilon to at least 1.001e-5
            y = tf.raw_ops.FusedBatchNormV3(
                x=x,
                scale=self.gamma,
                offset=self.beta,
                mean=self.moving_mean,
                variance=self.moving_var,
                epsilon=self.epsilon,
                is_training=False,
            )[0]
        outputs = tf.reshape(y, shape)
        return self.act(outputs) if self.act else outputs

    def fold(self, values):
        """Fold pooled statistics (this layer's PendingStats values, summed over replicas) into the moving ones."""
        fold_statistics(self.moving_mean, self.moving_var, self.decay, values)


class GroupNorm(tl.layers.Layer):
    """Group normalisation (Wu & He, 2018) over the last axis, for [n, C] or [n, H, W, C].

    Each example is normalised by the mean and variance of each of ``groups``
    groups of its own channels (and positions); gamma and beta are per
    channel. Nothing depends on the other examples of the batch, so a
    subdivided update computes what a whole batch does. TL 2.2.5's GroupNorm
    bakes the batch size of the build pass into a reshape, hence this layer.
    Same arithmetic as keras.layers.GroupNormalization (export maps to it).
    """

    def __init__(self, groups, epsilon=1e-5, act=None, name=None):
        super().__init__(name, act=act)
        self.groups, self.epsilon = int(groups), float(epsilon)

    def build(self, inputs_shape):
        channels = int(inputs_shape[-1])
        if channels % self.groups:  # the config checks this; a direct caller gets the same rule
            raise ValueError(f"{self.name}: {channels} channels do not split into {self.groups} groups")
        self.gamma = self._get_weights("gamma", shape=(channels,), init=tl.initializers.ones())
        self.beta = self._get_weights("beta", shape=(channels,), init=tl.initializers.zeros())

    def forward(self, inputs):
        channels = inputs.shape[-1]
        shape = tf.shape(inputs)
        grouped = tf.reshape(inputs, tf.concat([shape[:-1], [self.groups, channels // self.groups]], 0))
        rank = len(inputs.shape) + 1
        # every axis but the batch and the group index: positions and the channels within a group
        axes = list(range(1, rank - 2)) + [rank - 1]
        mean, var = tf.nn.moments(grouped, axes, keepdims=True)
        normed = tf.reshape((grouped - mean) * tf.math.rsqrt(var + self.epsilon), shape)
        outputs = normed * self.gamma + self.beta
        return self.act(outputs) if self.act else outputs


class KerasAccumBatchNorm(DeferredStatistics, keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization with the engine's norm-layer API (as AccumBatchNorm).

    Same config, same four weights, same inference. In training it normalises
    with the statistics of the (micro-)batch it sees; ``deferred=False``
    moves the moving statistics right away as Keras does, ``deferred=True``
    pools them (PendingStats) and the engine folds them in once per update with
    Keras' momentum: ``moving = moving * momentum + batch * (1 - momentum)``,
    the batch variance biased as Keras' own.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.renorm:  # load_keras_file refuses it with a message naming the file
            raise ValueError("batch renormalisation is not supported")
        self.deferred = False

    def build(self, input_shape):
        super().build(input_shape)
        # Plain tf.Variables, which Keras does not track: not weights (not saved, not trained).
        self.pending = PendingStats(self.name, tuple(self.moving_mean.shape))

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable):  # inference, a frozen layer, or Keras' symbolic build
            return super().call(inputs, training=training, mask=mask)
        if mask is not None:
            raise NotImplementedError(f"{self.name}: masked inputs to BatchNormalization are not supported")
        # Keras' own arithmetic (float32 moments, ops.batch_normalization), so that a
        # whole batch here gives what keras.layers.BatchNormalization gives.
        x = keras.ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        mean, var = keras.ops.moments(x, axes=self._reduction_axes)
        if self.deferred:
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), self._reduction_axes)), tf.float32)
            self.pending.add(count, mean, var, tf.convert_to_tensor(self.moving_mean))
        else:
            move_statistics(self.moving_mean, self.moving_variance, self.momentum, mean, var)
        outputs = keras.ops.batch_normalization(
            x,
            mean,
            var,
            axis=self.axis,
            offset=self.beta if self.center else None,
            scale=self.gamma if self.scale else None,
            epsilon=self.epsilon,
        )
        return keras.ops.cast(outputs, self.compute_dtype)

    def fold(self, values):
        """Fold pooled statistics (this layer's PendingStats values, summed over replicas) into the moving ones."""
        fold_statistics(self.moving_mean, self.moving_variance, self.momentum, values)


@dataclass
class Model:
    """A TensorLayer network and what the engine needs to train it."""

    network: Any  # tl.models.Model here; keras.Model in KerasModel
    forward: Callable  # (images float32 [n, *input_shape], training: bool) -> logits [n, num_classes]
    norm_layers: list[Any]  # AccumBatchNorm or KerasAccumBatchNorm

    @property
    def trainable_variables(self):
        return list(self.network.trainable_weights)

    @property
    def variables(self):
        """Everything that defines the model: weights and moving statistics (what a checkpoint holds)."""
        return list(self.network.all_weights)

    def named_weights(self) -> dict:
        """Stable names (from explicit layer names) -> variables, for weights.npz."""
        return {v.name.split(":")[0]: v for v in self.variables}


@dataclass
class KerasModel(Model):
    """A keras_file network. Its variables are handed out as the tf.Variables
    under Keras' own (the same storage), so the engine, the optimizer and
    tf.train.Checkpoint see what they see for TensorLayer. ``peeled`` pairs
    the output layer trained without its softmax (from_logits=false) with the
    file's original, which export puts back."""

    peeled: list[tuple[Any, Any]] = field(default_factory=list)

    @property
    def trainable_variables(self):
        return [_storage(v) for v in self.network.trainable_variables]

    @property
    def variables(self):
        # includes the state of dropout's seed generators: a resumed run draws the same masks
        return [_storage(v) for v in self.network.variables]

    def named_weights(self) -> dict:
        """LAYER/WEIGHT names (nested models as MODEL/LAYER/WEIGHT) -> variables, for weights.npz.

        Built from the layer tree, not from Keras' variable paths, which depend
        on where a layer was first built (a clone's prefix, or none after a load)."""
        names: dict = {}

        def add(name, variable):
            unique, n = name, 0
            while unique in names:  # two weights of one name (a layer with inner layers): _1, _2, ...
                n += 1
                unique = f"{name}_{n}"
            names[unique] = _storage(variable)

        def walk(layer, prefix):
            if isinstance(layer, keras.Model):
                for inner in layer.layers:
                    walk(inner, f"{prefix}{layer.name}/")
                return
            for v in layer.variables:
                tail = v.path.rsplit(f"{layer.name}/", 1)[-1] if f"{layer.name}/" in v.path else v.name
                add(f"{prefix}{layer.name}/{tail}", v)

        for layer in self.network.layers:
            walk(layer, "")
        named = {id(v) for v in names.values()}
        for v in self.network.variables:  # any variable no layer owns
            if id(_storage(v)) not in named:
                add(v.path, v)
        return names


def _storage(variable):
    """The tf.Variable under a Keras 3 variable (outside autocast scopes, ``value`` is it)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


# ----------------------------------------------------------------------------
# The built-ins


@tf.custom_gradient
def leaky_relu(features):
    """tf.nn.leaky_relu (slope 0.2) whose gradient reads its output, not its input.

    The same values and the same gradient bits (output > 0 exactly where input > 0), but the
    backward pass keeps only the output, which the next layer keeps anyway. The built-in gradient
    keeps the input as well: one more activation tensor per layer, and with a conv bias it stops
    grappler's remapper from fusing Conv2D + BiasAdd + LeakyRelu ("remapper failed" for the
    whole graph, losing every other fusion of it too)."""
    outputs = tf.nn.leaky_relu(features, 0.2)

    def grad(upstream):
        return tf.where(outputs > 0, upstream, upstream * tf.cast(0.2, upstream.dtype))

    return outputs, grad


def _norm_layer(cfg: ModelConfig, act, index) -> tl.layers.Layer:
    """The normalisation layer model.norm names (its activation fused in), or None for none."""
    return {
        "batchnorm": lambda: AccumBatchNorm(act=act, name=f"bn{index}"),
        "groupnorm": lambda: GroupNorm(cfg.groups, act=act, name=f"gn{index}"),
        "none": lambda: None,
    }[cfg.norm]()


if set(NORM_NAMES) != {"batchnorm", "groupnorm", "none"}:  # a registry out of step with the config is a bug
    raise ImportError(f"norm layers out of step with config.NORM_NAMES {NORM_NAMES}")


def seed_convnet(cfg: ModelConfig, input_shape, num_classes: int) -> tl.models.Model:
    """The seed's network: 5 x (3x3 conv, no bias; norm; leaky ReLU), mean pool, dense."""
    use_norm = cfg.norm != "none"
    net = inputs = Input([None, *input_shape], name="images")
    for i, (width, stride) in enumerate(zip(cfg.norm_channels, SEED_STRIDES), start=1):
        net = Conv2d(
            width,
            (3, 3),
            (stride, stride),
            padding="SAME",
            b_init=None if use_norm else tl.initializers.constant(0.0),
            act=None if use_norm else leaky_relu,
            name=f"conv{i}",
        )(net)
        if use_norm:
            net = _norm_layer(cfg, leaky_relu, i)(net)
    net = GlobalMeanPool2d(name="pool")(net)
    net = Dense(num_classes, name="logits")(net)
    return tl.models.Model(inputs=inputs, outputs=net)


def mlp(cfg: ModelConfig, input_shape, num_classes: int) -> tl.models.Model:
    """Flattened input -> hidden (ReLU, optional norm) -> classes."""
    net = inputs = Input([None, *input_shape], name="images")
    net = Flatten(name="flatten")(net)
    if cfg.norm != "none":
        net = Dense(cfg.hidden, b_init=None, name="hidden")(net)
        net = _norm_layer(cfg, tf.nn.relu, "_hidden")(net)
    else:
        net = Dense(cfg.hidden, act=tf.nn.relu, name="hidden")(net)
    net = Dense(num_classes, name="logits")(net)
    return tl.models.Model(inputs=inputs, outputs=net)


def _tensorlayer(builder) -> Callable:
    def build(cfg: ModelConfig, input_shape, num_classes: int) -> Model:
        network = builder(cfg, input_shape, num_classes)
        norm_layers = [layer for layer in network.all_layers if isinstance(layer, AccumBatchNorm)]

        def forward(images, training: bool):
            # TL fixes train/eval mode at trace time: the engine traces training and
            # evaluation as separate tf.functions.
            return network(images, is_train=training)

        return Model(network=network, forward=forward, norm_layers=norm_layers)

    return build


# ----------------------------------------------------------------------------
# keras_file


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
    return model


def _shape_text(shape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


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
            f"takes inputs of shape {_shape_text(given)} but the dataset's images are "
            f"{_shape_text(input_shape)} (height, width, channels): build the model on "
            f"keras.Input(shape={_shape_text(input_shape)})",
        )
    out = tuple(model.outputs[0].shape[1:])
    if out != (num_classes,):
        raise _file_error(
            path,
            f"outputs shape {_shape_text(out)} per example but the dataset has {num_classes} "
            f"classes: end the model in a Dense({num_classes}) layer",
        )


def _output_layer(model: keras.Model):
    """The innermost layer that computes the model's output."""
    layer = model.outputs[0]._keras_history.operation
    return _output_layer(layer) if isinstance(layer, keras.Model) else layer


def _is_softmax(layer) -> bool:
    return isinstance(layer, keras.layers.Softmax) or getattr(layer, "activation", None) is keras.activations.softmax


def _without_softmax(layer):
    """The same layer computing the logits under its softmax (weights copied after the clone)."""
    if isinstance(layer, (keras.layers.Softmax, keras.layers.Activation)):
        return keras.layers.Identity(name=layer.name)
    return type(layer).from_config({**layer.get_config(), "activation": "linear"})


def keras_file(cfg: ModelConfig, input_shape, num_classes: int) -> KerasModel:
    """The model in model.path, checked, its BatchNormalization layers made accumulating."""
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
    for layer in _leaves(loaded):
        if isinstance(layer, keras.layers.BatchNormalization) and layer.renorm:
            raise _file_error(
                cfg.path,
                f"has BatchNormalization {layer.name!r} with renorm=True, whose "
                f"corrections cannot be pooled over micro-batches: use renorm=False",
            )

    replaced, peeled = [], []

    def swap(layer):
        if layer is last and not cfg.from_logits:
            new = _without_softmax(layer)
            peeled.append((new, layer))
        elif isinstance(layer, keras.layers.BatchNormalization):
            new = KerasAccumBatchNorm.from_config(layer.get_config())
        else:
            return layer  # reused as it is: its weights stay the file's
        replaced.append((layer, new))
        return new

    network = keras.models.clone_model(loaded, clone_function=swap, recursive=True)
    for old, new in replaced:  # clone_model builds the new layers; the weights are the file's
        new.set_weights(old.get_weights())
    norm_layers = [layer for layer in _leaves(network) if isinstance(layer, KerasAccumBatchNorm)]

    def forward(images, training: bool):
        return network(images, training=training)

    return KerasModel(network=network, forward=forward, norm_layers=norm_layers, peeled=peeled)


def _leaves(model: keras.Model) -> list:
    """Every layer of a model, nested Functional and Sequential models opened."""
    layers = []
    for layer in model.layers:
        layers += _leaves(layer) if isinstance(layer, keras.Model) else [layer]
    return layers


BUILDERS = {"seed_convnet": _tensorlayer(seed_convnet), "mlp": _tensorlayer(mlp), "keras_file": keras_file}
if tuple(BUILDERS) != MODEL_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"model registry {tuple(BUILDERS)} != config.MODEL_NAMES {MODEL_NAMES}")


def _compute_dtype(precision: str):
    return {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16, "mixed_float16": tf.float16}[precision]


def _cast_weights_forward(layer, dtype):
    """layer.forward in ``dtype``: its input and its float32 weights cast for the call (their gradients come
    back float32 through the cast). TL keeps the weights as attributes (self.W, self.b) apart from its
    weight lists, so swapping the attributes for the length of one call changes nothing else."""
    original = layer.forward
    names = [k for k, v in vars(layer).items() if isinstance(v, tf.Variable) and v.dtype == tf.float32]

    def forward(inputs, *args, **kwargs):
        saved = {k: layer.__dict__[k] for k in names}
        try:
            for k, v in saved.items():
                layer.__dict__[k] = tf.cast(v, dtype)
            return original(tf.cast(inputs, dtype) if inputs.dtype.is_floating else inputs, *args, **kwargs)
        finally:
            layer.__dict__.update(saved)

    return forward


def _float32_forward(layer, dtype):
    """layer.forward in float32 (GroupNorm: no fused op), its output back in ``dtype``."""
    original = layer.forward
    return lambda inputs, *args, **kwargs: tf.cast(original(tf.cast(inputs, tf.float32), *args, **kwargs), dtype)


def set_precision(model: Model, precision: str) -> Model:
    """Compute in bfloat16/float16 with float32 variables (a Keras mixed policy); logits come out float32.

    Weights, their gradients, BatchNorm statistics and everything the engine keeps stay float32."""
    if precision == "float32":
        return model
    dtype = _compute_dtype(precision)
    if isinstance(model, KerasModel):
        for layer in _leaves(model.network):
            if not isinstance(layer, keras.layers.InputLayer):
                layer.dtype_policy = keras.DTypePolicy(precision)  # a global policy does nothing to a file's layers
    else:
        for layer in model.network.all_layers:
            if not isinstance(layer, AccumBatchNorm):  # the fused op takes 16-bit activations as they come
                layer.forward = (_float32_forward if isinstance(layer, GroupNorm) else _cast_weights_forward)(
                    layer, dtype
                )
    forward = model.forward
    model.forward = lambda images, training: tf.cast(forward(images, training), tf.float32)
    return model


def build_model(cfg: ModelConfig, seed: int, input_shape, num_classes: int, precision: str = "float32") -> Model:
    """Build the named network for the dataset's input shape and class count.

    Built-in weights are drawn from ``seed``; a keras_file model starts from
    its file's weights (the seed still fixes dropout masks and the data order).
    Keras' layers draw their seed generators' seeds from Python's ``random``
    when the file is loaded, hence Keras' own seeding (it includes TensorFlow's)."""
    keras.utils.set_random_seed(seed)
    return set_precision(BUILDERS[cfg.name](cfg, tuple(input_shape), int(num_classes)), precision)
