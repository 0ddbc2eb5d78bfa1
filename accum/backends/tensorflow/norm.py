"""Normalisation layers whose moving statistics the engine moves once per update.

TensorLayer 2.2.5's BatchNorm does not work inside tf.function on current
TensorFlow (it rebinds its moving-statistics attributes to the result of an
assign and pollutes them during the static build; ../shared/NOTES.md).
``AccumBatchNorm`` replaces its forward: statistics are updated in place,
never during the build pass, and moving_var starts at ones as in Keras.
A Keras model's BatchNormalization layers (a keras_file's, or the model handed
to accum_train.fit) get the same behaviour from ``pooled``: each layer keeps
its class, config and weights, and its ``call`` is replaced on the instance by
the pooling one, through a ``PooledBatchNorm`` adapter. Both normalise with
the statistics of the micro-batch they see and, deferred, pool them
(``PendingStats``) for the accumulator to fold in once per update. TL's
GroupNorm needs a static batch size, so ``GroupNorm`` is our own.
"""

from __future__ import annotations

import contextlib
import functools

import keras
import tensorflow as tf
import tensorlayer as tl
from tensorlayer.layers import BatchNorm

from ... import keras_private
from ...errors import Refused
from ...models.containers import leaves
from .gradient_cache import REPLICA_LOCAL


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
        local = dict(trainable=False, **REPLICA_LOCAL)
        self.count = tf.Variable(0.0, name=f"{name}_pending_count", **local)
        self.sum = tf.Variable(tf.zeros(shape), name=f"{name}_pending_sum", **local)
        self.sq = tf.Variable(tf.zeros(shape), name=f"{name}_pending_sq", **local)
        # The engine's loop-carried accumulation (micro-steps in parallel) collects each micro-batch's
        # sums as tensors instead of adding them to the variables: see ``collect``.
        self._collected = None

    def add(self, count, mean, var, shift):
        """Pool a (micro-)batch of ``count`` values per channel with these moments."""
        delta = mean - shift
        # multiply_no_nan: an empty micro-batch (count 0, NaN moments) adds nothing
        sums = [count, tf.math.multiply_no_nan(delta, count), tf.math.multiply_no_nan(var + tf.square(delta), count)]
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
        return [variable.read_value() for variable in self.variables()]

    def clear(self):
        for variable in self.variables():
            variable.assign(tf.zeros(variable.shape))  # not zeros_like: no read (a collective, across replicas)


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
    engine (``fold``). The deferred moving statistics
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
        training = bool(self.is_train)
        # the raw op: tf.nn.fused_batch_norm raises epsilon to at least 1.001e-5
        y, mean, var, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=x,
            scale=self.gamma,
            offset=self.beta,
            mean=empty if training else self.moving_mean,
            variance=empty if training else self.moving_var,
            epsilon=self.epsilon,
            is_training=training,
        )
        if training:
            count = tf.cast(tf.size(x) // channels, tf.float32)
            var = var * tf.maximum(count - 1.0, 0.0) / tf.maximum(count, 1.0)  # the op's variance is Bessel's
            if self._nodes_fixed:
                if self.deferred:
                    self.pending.add(count, mean, var, self.moving_mean)
                else:
                    move_statistics(self.moving_mean, self.moving_var, self.decay, mean, var)
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


class PooledBatchNorm(DeferredStatistics):
    """The norm-layer API (``deferred``, ``pending``, ``fold``, ``discard``) for one keras BatchNormalization
    layer, whose ``call`` ``pooled`` replaces (Keras' momentum: ``moving = moving * momentum + batch * (1 -
    momentum)``, the batch variance biased as Keras' own)."""

    def __init__(self, layer: keras.layers.BatchNormalization):
        self.layer = layer
        self.name = layer.name
        self.deferred = False
        # Plain tf.Variables, which Keras does not track: not weights (not saved, not trained).
        self.pending = PendingStats(layer.name, tuple(layer.moving_mean.shape))

    def __getattr__(self, name):  # what pooled_call reads of the layer it stands for
        return getattr(self.layer, name)

    def fold(self, values):
        """Fold pooled statistics (this layer's PendingStats values, summed over replicas) into the moving ones."""
        fold_statistics(self.layer.moving_mean, self.layer.moving_variance, self.layer.momentum, values)


def batch_norm_layers(model: keras.Model, where: str) -> list:
    """The model's BatchNormalization layers (nested models included); renorm refused in one line that starts
    with ``where`` (the model's file, or accum_train.fit's model)."""
    found = []
    for layer in leaves(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            if layer.renorm:
                raise Refused(
                    "batchnorm-renorm",
                    f"{where} has BatchNormalization {layer.name!r} with renorm=True, whose corrections cannot be "
                    f"pooled over micro-batches: use renorm=False",
                )
            if keras_private.takes_mask(layer):
                raise Refused("batchnorm-masked", f"{where}: {_masked(layer)}")
            found.append(layer)
    return found


def _masked(layer) -> str:
    """Why BatchNormalization ``layer``, given a mask, is refused, and what to do."""
    return (
        f"BatchNormalization {layer.name!r} is given a mask (Embedding(mask_zero=True) or Masking before it), which "
        f"accum-train's pooled statistics do not take: move it before the masking layer, use LayerNormalization, or "
        f"train with model.fit"
    )


def pool(model: keras.Model, where: str = "the model", adapters=None) -> list:
    """The model's BatchNormalization layers made to pool their statistics (their ``call`` replaced on the
    instance) until ``unpool``; their ``PooledBatchNorm`` adapters, created in the strategy scope in force (the
    pending sums replica-local), or ``adapters``, made by an earlier call."""
    if adapters is None:
        adapters = [PooledBatchNorm(layer) for layer in batch_norm_layers(model, where)]
    for adapter in adapters:
        layer = adapter.layer
        keras_call = type(layer).call.__get__(layer)
        # an instance attribute: Keras' Operation.__call__ looks ``self.call`` up at each call
        object.__setattr__(layer, "call", functools.partial(pooled_call, adapter, keras_call))
    return adapters


def unpool(adapters) -> None:
    """Every layer of ``adapters`` Keras' own again."""
    for adapter in adapters:
        if "call" in vars(adapter.layer):
            object.__delattr__(adapter.layer, "call")


@contextlib.contextmanager
def pooled(model: keras.Model, strategy=None, adapters=None, where: str = "the model"):
    """Within: ``pool``'s adapters (made in ``strategy``'s scope); on the way out every layer is Keras' own."""
    with (strategy or tf.distribute.get_strategy()).scope():
        adapters = pool(model, where, adapters=adapters)
    try:
        yield adapters
    finally:
        unpool(adapters)


def pooled_call(layer, keras_call, inputs, training=None, mask=None):
    """A keras BatchNormalization layer's call through its adapter ``layer`` (``layer.pending``,
    ``layer.deferred``); ``keras_call`` is Keras' own, for inference, a frozen layer and the symbolic build.

    Keras' own arithmetic (float32 moments, ops.batch_normalization), so that a whole batch here gives what
    keras.layers.BatchNormalization gives."""
    if not (training and layer.trainable):
        return keras_call(inputs, training=training, mask=mask)
    if mask is not None:  # its statistics would count the masked steps, which pooling has no weights for
        raise Refused("batchnorm-masked", _masked(layer.layer))  # a model whose graph did not show it
    x = keras.ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
    axes = keras_private.reduction_axes(layer)
    mean, var = keras.ops.moments(x, axes=axes)
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
    # An empty micro-batch (a short batch cut into more micro-batches than it has examples) has NaN moments;
    # it normalises nothing, but NaN * 0 would reach the gradients. Elsewhere where() changes no bit.
    mean, var = tf.where(count > 0, mean, 0.0), tf.where(count > 0, var, 1.0)
    if layer.deferred:
        layer.pending.add(count, mean, var, tf.convert_to_tensor(layer.moving_mean))
    else:
        move_statistics(layer.moving_mean, layer.moving_variance, layer.momentum, mean, var)
    outputs = keras.ops.batch_normalization(
        x,
        mean,
        var,
        axis=layer.axis,
        offset=layer.beta if layer.center else None,
        scale=layer.gamma if layer.scale else None,
        epsilon=layer.epsilon,
    )
    return keras.ops.cast(outputs, layer.compute_dtype)
