"""A KerasHub task's raw examples as the feed's batches (keras_fit/inputs.task_batches says why): batched as
``task.fit`` batches them and preprocessed per whole batch on tf.data, which KerasHub's preprocessors need on every
backend."""

from __future__ import annotations

import keras
import tensorflow as tf

from ...defaults import ARRAY_BATCH_SIZE
from ...errors import Refused, UserError
from .conversion import WHERE, kind


def preprocessed(model, x, y, sample_weight, batch_size, name="x") -> tf.data.Dataset:
    """``x`` (with ``y`` and ``sample_weight``) as batches of ``batch_size`` with ``model.preprocess_samples``
    mapped over each; a ``tf.data.Dataset`` of raw batches is taken as it is, as task.fit takes it."""
    if kind(x) == "dataset":
        for what, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size)):
            if value is not None:
                raise UserError(
                    f"{WHERE}: {name} is a tf.data.Dataset of raw batches for model {model.name!r}'s preprocessor: "
                    f"leave {what} out (batch the dataset, and put targets and weights in its elements)"
                )
        batches = x
    elif kind(x) in ("pydataset", "generator"):
        raise Refused(
            "raw-generator",
            f"{WHERE}: {name} is a {type(x).__name__}, and model {model.name!r} preprocesses its inputs in fit: pass "
            f"arrays or lists of raw examples, or a tf.data.Dataset of raw batches",
        )
    elif x is None:
        raise UserError(f"{WHERE}: {name} is missing: pass raw examples (a list or array) or a tf.data.Dataset")
    else:
        examples = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        try:
            batches = tf.data.Dataset.from_tensor_slices(examples).batch(batch_size or ARRAY_BATCH_SIZE)
        except (ValueError, TypeError) as err:
            raise UserError(
                f"{WHERE}: {name} cannot be cut into examples for model {model.name!r}'s preprocessor: "
                f"{str(err).splitlines()[0]} (pass a list or array with one entry per example)"
            ) from None
    return batches.map(model.preprocess_samples, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
