"""model.fit's values as accum_train.fit's pipeline carries them: a structure of arrays as numpy (floats as
float32, as model.fit casts them to floatx; lists as tuples, as tf.data carries them), and class weights as the
sample weights model.fit derives from them (``class_weights_of``, in NumPy: for arrays on every backend, the
TensorFlow feed's ArrayFeed and the JAX door; a stream's batches get the same rule in tf.data's graph,
stream_feed.class_weights_tensor)."""

from __future__ import annotations

import collections.abc
import sys

import keras
import numpy as np

from ...errors import UserError

WHERE = "accum_train.fit"  # these sources are accum_train.fit's arguments (the CLI's splits come from datasets/)


def kind(source) -> str | None:
    """What ``source`` is, the one place either door asks (sources.feed_for): a keras.utils.PyDataset, a
    tf.data.Dataset, a generator (any iterator of batches), a datasets/ split (its elements ``convert``ed in the
    update) read front to back (a stream) or by index, arrays (anything else numpy reads), or None."""
    if isinstance(source, keras.utils.PyDataset):
        return "pydataset"
    tensorflow = sys.modules.get("tensorflow")  # a tf.data.Dataset exists only where TensorFlow has been imported
    if tensorflow is not None and isinstance(source, tensorflow.data.Dataset):
        return "dataset"
    if isinstance(source, collections.abc.Iterator):
        return "generator"
    if hasattr(source, "convert") and hasattr(source, "batches"):  # a split's two calls (a PIL image has a convert)
        return "stream" if getattr(source, "streamed", False) else "split"
    return None if source is None else "arrays"


STREAMED = ("pydataset", "dataset", "generator", "stream")  # read batch by batch as they come, never held


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

    return _tuples(keras.tree.map_structure(convert, structure))


def _tuples(structure):
    if isinstance(structure, (list, tuple)):
        return tuple(_tuples(s) for s in structure)
    if isinstance(structure, dict):
        return {k: _tuples(v) for k, v in structure.items()}
    return structure


def class_weights_of(y, class_weight: dict) -> np.ndarray:
    """float32 weights as model.fit derives them: one-hot targets by their argmax, [N, 1] squeezed, rounded to
    integers; classes not named weigh 1."""
    labels = np.asarray(y)
    if labels.ndim > 1:
        labels = np.argmax(labels, axis=-1) if labels.shape[-1] != 1 else np.squeeze(labels, axis=-1)
    labels = np.round(labels.astype(np.float32)).astype(np.int64)
    size = max(int(c) for c in class_weight) + 1
    table = np.ones(size, np.float32)
    for c, w in class_weight.items():
        table[int(c)] = w
    inside = (labels >= 0) & (labels < size)
    return np.where(inside, table[np.clip(labels, 0, size - 1)], np.float32(1.0))
