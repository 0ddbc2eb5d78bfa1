"""What the commands ask of TensorFlow outside an update: a trained run's checkpoint read back (its weights, a
variable, the weights' shapes), its model's outputs in batches, compare's whole-batch gradient, and the spec of a
batch of any size that fit's checks read. A checkpoint is tf.train.Checkpoint's: a JAX backend answers these from
the files its own saving writes."""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from .graphs import graph


def restore_weights(prefix: str, weights: list) -> None:
    """The checkpoint ``prefix``'s "weights" (the run's and fit's alike hold the model's variables under it) into
    ``weights``, nothing else; a file that does not match raises (AssertionError, ValueError or an op's error)."""
    tf.train.Checkpoint(weights=weights).restore(prefix).expect_partial().assert_existing_objects_matched()


def saved_value(prefix: str, name: str):
    """The value the checkpoint ``prefix`` holds for its variable ``name`` (a top-level one), None if none."""
    reader, key = tf.train.load_checkpoint(prefix), f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
    return reader.get_tensor(key) if reader.has_tensor(key) else None


def saved_weight_shapes(prefix: str) -> list:
    """The shapes of the checkpoint ``prefix``'s "weights", in their order (model.variables')."""
    found = {}
    for name, shape in tf.train.list_variables(prefix):
        match = re.fullmatch(r"weights/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE", name)
        if match:
            found[int(match.group(1))] = tuple(shape)
    return [found[i] for i in sorted(found)]


def outputs_in_batches(forward, x, batch_size: int):
    """``forward(inputs, False)`` over ``x`` (arrays), ``batch_size`` examples at a time, as float32 numpy: one
    graph, traced as training traces the model."""
    spec = tf.nest.map_structure(lambda a: tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype)), x)
    batch_outputs = graph(
        lambda inputs: tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), forward(inputs, False)),
        input_signature=[spec],
    )
    n = len(tf.nest.flatten(x)[0])
    batches = [
        batch_outputs(tf.nest.map_structure(lambda a, s=start: a[s : s + batch_size], x))
        for start in range(0, n, batch_size)
    ]
    return tf.nest.map_structure(lambda *parts: np.concatenate([p.numpy() for p in parts]), *batches)


def gradients(loss, variables) -> list:
    """The gradient of ``loss()`` with respect to ``variables`` (None for one it does not reach)."""
    with tf.GradientTape() as tape:
        value = loss()
    return tape.gradient(value, variables)


def batch_spec(arrays):
    """The spec of a batch of any size of ``arrays`` (a structure), as fit's checks and Keras' build read one."""
    return tf.nest.map_structure(lambda a: tf.TensorSpec((None, *a.shape[1:]), a.dtype), arrays)
