"""model.fit's values as accum_train.fit's pipeline carries them: a structure of arrays as numpy (floats as
float32, as model.fit casts them to floatx; lists as tuples, as tf.data carries them), and class weights as the
sample weights model.fit derives from them; for arrays in memory (array_feed.py) and streams (stream_feed.py)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...errors import UserError

WHERE = "accum_train.fit"  # these sources are accum_train.fit's arguments (the CLI's splits come from datasets/)


def _leaves_as_arrays(structure, name: str):
    """A structure of arrays as numpy, floats as float32 (model.fit casts floats to floatx); lists as tuples
    (what tf.data carries)."""

    def convert(value):
        array = np.asarray(value)
        if array.dtype.kind == "f" and array.dtype != np.float32:
            array = array.astype(np.float32)
        if array.dtype.kind not in "fiub" and array.dtype.kind not in "SU":
            raise UserError(f"{WHERE}: {name} holds values of dtype {array.dtype}: pass numbers or strings")
        if array.ndim == 0 and isinstance(structure, (list, tuple)):  # Keras reads a list as separate inputs
            raise UserError(
                f"{WHERE}: {name} is a Python list of numbers, which Keras takes as that many separate inputs, not "
                f"as rows: pass np.asarray({name}), an array [N, ...] with one row per example"
            )
        if array.ndim == 0:
            raise UserError(f"{WHERE}: {name} is a scalar: pass an array [N, ...] with one row per example")
        return array

    return _tuples(tf.nest.map_structure(convert, structure))


def _tuples(structure):
    if isinstance(structure, (list, tuple)):
        return tuple(_tuples(s) for s in structure)
    if isinstance(structure, dict):
        return {k: _tuples(v) for k, v in structure.items()}
    return structure


def class_weights_tensor(y, class_weight: dict):
    """Sample weights from class weights, in tf.data's graph for a stream's batches: class_weights.py's rule
    (arrays take it in NumPy)."""
    labels = tf.convert_to_tensor(y)
    if labels.shape.rank > 1:
        labels = tf.argmax(labels, axis=-1) if labels.shape[-1] != 1 else tf.squeeze(labels, axis=-1)
    labels = tf.cast(tf.round(tf.cast(labels, tf.float32)), tf.int64)
    size = max(int(c) for c in class_weight) + 1
    table = np.ones(size, np.float32)
    for c, w in class_weight.items():
        table[int(c)] = w
    inside = tf.logical_and(labels >= 0, labels < size)
    return tf.where(inside, tf.gather(tf.constant(table), tf.clip_by_value(labels, 0, size - 1)), 1.0)
