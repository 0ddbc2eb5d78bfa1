"""Model registry: the seed's conv net and a small MLP, built with TensorLayer.

``build_model(cfg)`` returns a ``Model``: the TensorLayer network, a
``forward(x, training)`` that gives logits, and the BatchNorm layers whose
moving statistics the engine commits once per update.

TensorLayer 2.2.5's BatchNorm does not work inside tf.function on current
TensorFlow (it rebinds its moving-statistics attributes to the result of an
assign and pollutes them during the static build; ../shared/NOTES.md).
``AccumBatchNorm`` replaces its forward: statistics are updated in place,
never during the build pass, and moving_var starts at ones as in Keras.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List

import tensorflow as tf
import tensorlayer as tl
from tensorlayer.layers import BatchNorm, Conv2d, Dense, Flatten, GlobalMeanPool2d, Input

from .config import MODEL_NAMES, ModelConfig

SEED_CHANNELS = (128, 256, 384, 512, 640)
SEED_STRIDES = (2, 2, 1, 1, 1)


class AccumBatchNorm(BatchNorm):
    """BatchNorm that works in graph mode and can defer its moving-average update.

    Training normalises with the statistics of the batch it sees (for the engine,
    a micro-batch, as darknet and the seed do). The moving statistics are
    updated either right away (``deferred=False``: what a plain loop wants) or,
    with ``deferred=True``, from the statistics of the whole update, pooled over
    its micro-batches by example count and committed once by ``commit()``. The
    deferred moving statistics are then exactly those a single pass over the
    whole batch would produce, and they move once per update, not per micro-step.
    """

    def __init__(self, decay=0.9, epsilon=1e-5, act=None, name=None):
        super().__init__(decay=decay, epsilon=epsilon, act=act, name=name,
                         moving_var_init=tl.initializers.ones())
        self.deferred = False

    def build(self, inputs_shape):
        super().build(inputs_shape)
        shape = self.moving_mean.shape
        # Plain attributes, not TL weights: they are scratch space, zero between
        # updates, and must not appear in weights.npz or the trainable list.
        self.pending_count = tf.Variable(0.0, trainable=False, name=f"{self.name}_pending_count")
        self.pending_sum = tf.Variable(tf.zeros(shape), trainable=False, name=f"{self.name}_pending_sum")
        self.pending_sq = tf.Variable(tf.zeros(shape), trainable=False, name=f"{self.name}_pending_sq")

    def forward(self, inputs):
        self._check_input_shape(inputs)
        self.channel_axis = len(inputs.shape) - 1
        if self.axes is None:
            self.axes = [i for i in range(len(inputs.shape)) if i != self.channel_axis]
        if self.is_train:
            mean, var = tf.nn.moments(inputs, self.axes, keepdims=False)
            # TL runs one forward pass while it builds a static model: no update then.
            if self._nodes_fixed:
                if self.deferred:
                    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), self.axes)), tf.float32)
                    self.pending_count.assign_add(count)
                    self.pending_sum.assign_add(count * mean)
                    self.pending_sq.assign_add(count * (var + tf.square(mean)))
                else:
                    self._move(mean, var)
        else:
            mean, var = self.moving_mean, self.moving_var
        outputs = tf.nn.batch_normalization(inputs, mean, var, self.beta, self.gamma, self.epsilon)
        return self.act(outputs) if self.act else outputs

    def _move(self, mean, var):
        self.moving_mean.assign_sub((self.moving_mean - mean) * (1.0 - self.decay))
        self.moving_var.assign_sub((self.moving_var - var) * (1.0 - self.decay))

    def commit(self):
        """Fold the pooled statistics of this update into the moving averages (graph-safe)."""
        count = tf.maximum(self.pending_count, 1.0)
        mean = self.pending_sum / count
        var = tf.maximum(self.pending_sq / count - tf.square(mean), 0.0)
        keep = tf.cast(self.pending_count > 0, tf.float32)
        self.moving_mean.assign_sub(keep * (self.moving_mean - mean) * (1.0 - self.decay))
        self.moving_var.assign_sub(keep * (self.moving_var - var) * (1.0 - self.decay))
        self.discard()

    def discard(self):
        """Forget the pooled statistics (an update that is skipped or retried)."""
        self.pending_count.assign(0.0)
        self.pending_sum.assign(tf.zeros_like(self.pending_sum))
        self.pending_sq.assign(tf.zeros_like(self.pending_sq))


@dataclass
class Model:
    """A network and what the engine needs to train it."""
    network: tl.models.Model
    forward: Callable  # (images float32 [n, *input_shape], training: bool) -> logits [n, num_classes]
    norm_layers: List[AccumBatchNorm]

    @property
    def trainable_variables(self):
        return list(self.network.trainable_weights)

    @property
    def variables(self):
        """Everything that defines the model: weights and moving statistics."""
        return list(self.network.all_weights)

    def named_weights(self) -> dict:
        """Stable names (from explicit layer names) -> variables, for weights.npz."""
        return {v.name.split(":")[0]: v for v in self.variables}


def seed_convnet(cfg: ModelConfig, input_shape, num_classes: int) -> tl.models.Model:
    """The seed's network: 5 x (3x3 conv, no bias; BatchNorm; leaky ReLU), mean pool, dense."""
    use_bn = cfg.norm == "batchnorm"
    net = inputs = Input([None, *input_shape], name="images")
    for i, (channels, stride) in enumerate(zip(SEED_CHANNELS, SEED_STRIDES), start=1):
        width = max(1, round(channels * cfg.width))
        net = Conv2d(width, (3, 3), (stride, stride), padding="SAME",
                     b_init=None if use_bn else tl.initializers.constant(0.0),
                     act=None if use_bn else tf.nn.leaky_relu, name=f"conv{i}")(net)
        if use_bn:
            net = AccumBatchNorm(act=tf.nn.leaky_relu, name=f"bn{i}")(net)
    net = GlobalMeanPool2d(name="pool")(net)
    net = Dense(num_classes, name="logits")(net)
    return tl.models.Model(inputs=inputs, outputs=net)


def mlp(cfg: ModelConfig, input_shape, num_classes: int) -> tl.models.Model:
    """Flattened input -> hidden (ReLU, optional BatchNorm) -> classes."""
    net = inputs = Input([None, *input_shape], name="images")
    net = Flatten(name="flatten")(net)
    if cfg.norm == "batchnorm":
        net = Dense(cfg.hidden, b_init=None, name="hidden")(net)
        net = AccumBatchNorm(act=tf.nn.relu, name="bn_hidden")(net)
    else:
        net = Dense(cfg.hidden, act=tf.nn.relu, name="hidden")(net)
    net = Dense(num_classes, name="logits")(net)
    return tl.models.Model(inputs=inputs, outputs=net)


BUILDERS = {"seed_convnet": seed_convnet, "mlp": mlp}
if tuple(BUILDERS) != MODEL_NAMES:  # a registry out of step with the config is a bug
    raise ImportError(f"model registry {tuple(BUILDERS)} != config.MODEL_NAMES {MODEL_NAMES}")


def build_model(cfg: ModelConfig, seed: int, input_shape, num_classes: int) -> Model:
    """Build the named network for the dataset's input shape and class count, weights drawn from ``seed``."""
    tf.random.set_seed(seed)
    network = BUILDERS[cfg.name](cfg, tuple(input_shape), int(num_classes))
    norm_layers = [layer for layer in network.all_layers if isinstance(layer, AccumBatchNorm)]

    def forward(images, training: bool):
        # TL fixes train/eval mode at trace time: the engine traces training and
        # evaluation as separate tf.functions.
        return network(images, is_train=training)

    return Model(network=network, forward=forward, norm_layers=norm_layers)
