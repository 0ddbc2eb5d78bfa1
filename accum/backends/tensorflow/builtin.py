"""The CLI's built-in networks, in TensorLayer, which only TensorFlow runs (hence here, in the TensorFlow backend):
the seed's conv net and a small MLP, built by model.name through the seam's ``built_in``.

Both adapt to the dataset's input shape and class count (the conv net through
its global pooling, the MLP by flattening) and take their normalisation layer
from ``model.norm`` (``NORM_LAYERS``).
"""

from __future__ import annotations

import tensorflow as tf
import tensorlayer as tl
from tensorlayer.layers import Conv2d, Dense, Flatten, GlobalMeanPool2d, Input

from ...models.containers import BuiltInNet, Model
from .norm import AccumBatchNorm, GroupNorm

SEED_STRIDES = (2, 2, 1, 1, 1)


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
        # LeakyReluGrad given the output as its features: one fused op (a compare and a select over the
        # activation took about six times its kernel time), the bits of upstream where features > 0, else
        # upstream * 0.2
        return tf.raw_ops.LeakyReluGrad(gradients=upstream, features=outputs, alpha=0.2)

    return outputs, grad


# model.norm -> the normalisation layer after a conv (or the MLP's hidden layer), its activation fused in
NORM_LAYERS = {
    "batchnorm": lambda net, act, index: AccumBatchNorm(decay=net.bn_momentum, act=act, name=f"bn{index}"),
    "groupnorm": lambda net, act, index: GroupNorm(net.groups, act=act, name=f"gn{index}"),
    "none": None,
}


def seed_convnet(spec: BuiltInNet, input_shape, num_classes: int) -> tl.models.Model:
    """The seed's network: 5 x (3x3 conv, no bias; norm; leaky ReLU), mean pool, dense."""
    use_norm = spec.norm != "none"
    net = inputs = Input([None, *input_shape], name="images")
    for i, (width, stride) in enumerate(zip(spec.channels, SEED_STRIDES), start=1):
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
            net = NORM_LAYERS[spec.norm](spec, leaky_relu, i)(net)
    net = GlobalMeanPool2d(name="pool")(net)
    net = Dense(num_classes, name="logits")(net)
    return tl.models.Model(inputs=inputs, outputs=net)


def mlp(spec: BuiltInNet, input_shape, num_classes: int) -> tl.models.Model:
    """Flattened input -> hidden (ReLU, optional norm) -> classes."""
    net = inputs = Input([None, *input_shape], name="images")
    net = Flatten(name="flatten")(net)
    if spec.norm != "none":
        net = Dense(spec.hidden, b_init=None, name="hidden")(net)
        net = NORM_LAYERS[spec.norm](spec, tf.nn.relu, "_hidden")(net)
    else:
        net = Dense(spec.hidden, act=tf.nn.relu, name="hidden")(net)
    net = Dense(num_classes, name="logits")(net)
    return tl.models.Model(inputs=inputs, outputs=net)


# model.name -> its TensorLayer network (the registry's other entry, keras_file, is models/keras_file.py's)
NETS = {"seed_convnet": seed_convnet, "mlp": mlp}


def built_in(spec: BuiltInNet, input_shape, num_classes: int) -> Model:
    """The built-in net ``spec.name`` as a ``Model``."""
    network = NETS[spec.name](spec, input_shape, num_classes)
    norm_layers = [layer for layer in network.all_layers if isinstance(layer, AccumBatchNorm)]

    def forward(images, training: bool):
        # TL fixes train/eval mode at trace time: the engine traces training and
        # evaluation as separate tf.functions.
        return network(images, is_train=training)

    return Model(network=network, forward=forward, norm_layers=norm_layers)
