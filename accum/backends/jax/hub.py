"""A KerasHub task on the JAX door (backend.py): raw examples batched, then the task's preprocessor mapped over each
whole batch, as ``Task.fit`` feeds them, each preprocessed batch handed to the accumulator as NumPy structures.

A task's preprocessor decides per batch what the loss sees: the padding and packing of the token ids, and the targets
and weights it makes (a causal LM's next tokens, weighted by its padding mask). So the micro-batch cut comes after
it: the update is the whole preprocessed batch's. KerasHub's preprocessors run on tf.data (and tensorflow-text) on
every Keras backend, so TensorFlow is loaded here, and only here, when a task preprocesses (backend.py's plain
arrays still train where TensorFlow is not installed). ``Task.fit`` hands Keras a dataset, which Keras never
shuffles: neither does this, whatever ``shuffle`` says. The preprocessing runs again each epoch, as each of
``Task.fit``'s epochs iterates the dataset afresh (a preprocessor that draws, as a masked LM's, draws anew).
"""

from __future__ import annotations

import collections.abc

import keras
import numpy as np

from ...defaults import ARRAY_BATCH_SIZE
from ...errors import UserError
from .objective import refused


def preprocesses(model) -> bool:
    """Whether ``model`` preprocesses its raw inputs in ``fit`` (a KerasHub task with a preprocessor)."""
    return getattr(model, "preprocessor", None) is not None and callable(getattr(model, "preprocess_samples", None))


def task_batches(model, given: dict, where: str):
    """A function of the epoch giving ``model``'s preprocessed batches, each ``(x, y, sample_weight)`` of NumPy
    structures, from accum_train.fit's ``given`` x, y, sample_weight and batch_size as ``Task.fit`` batches them."""
    import tensorflow as tf  # KerasHub's preprocessing: tf.data, on every backend

    x, y, sample_weight, batch_size = (given[name] for name in ("x", "y", "sample_weight", "batch_size"))
    name = model.name
    if given["class_weight"] is not None:
        raise refused(f"class_weight for model {name!r}, which preprocesses its inputs in fit,", where)
    if isinstance(x, tf.data.Dataset):  # batches of raw examples, targets in their elements, as Task.fit takes them
        for what, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size)):
            if value is not None:
                raise UserError(
                    f"{where}: x is a tf.data.Dataset of raw batches for model {name!r}'s preprocessor: leave {what} "
                    f"out (batch the dataset, and put targets and weights in its elements)"
                )
        raw = x
    elif x is None or isinstance(x, (collections.abc.Iterator, keras.utils.PyDataset)):
        what = "missing" if x is None else f"a {type(x).__name__}"
        raise UserError(
            f"{where}: x is {what}, and model {name!r} preprocesses its inputs in fit: pass arrays or lists of raw "
            f"examples, or a tf.data.Dataset of raw batches"
        )
    else:
        # a Python list of examples (strings) is one array of examples, not a structure of inputs
        arrays = [np.asarray(a) if isinstance(a, list) else a for a in (x, y, sample_weight)]
        try:
            examples = tf.data.Dataset.from_tensor_slices(keras.utils.pack_x_y_sample_weight(*arrays))
        except (ValueError, TypeError) as err:
            raise UserError(
                f"{where}: x cannot be cut into examples for model {name!r}'s preprocessor: "
                f"{str(err).splitlines()[0]} (pass a list or array with one entry per example)"
            ) from None
        raw = examples.batch(int(batch_size or ARRAY_BATCH_SIZE))  # Task.fit's batches: in order, the last ragged
    batches = raw.map(model.preprocess_samples, num_parallel_calls=tf.data.AUTOTUNE)  # in order (deterministic)

    def epoch_batches(epoch: int):
        for element in batches.as_numpy_iterator():
            batch = keras.utils.unpack_x_y_sample_weight(element)
            if batch[1] is None:  # a classifier's preprocessor without labels: nothing for the loss to compare
                raise UserError(f"{where}: model {name!r}'s preprocessor gives no targets for x: pass y")
            yield batch

    return epoch_batches
