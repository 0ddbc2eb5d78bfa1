"""A model that carries its preprocessor (a KerasHub task: ``preprocess_samples``), fed as its own ``fit`` feeds it.

KerasHub's ``PipelineModel.fit`` batches raw inputs (strings, images) by
``batch_size`` and maps the preprocessor over each whole batch, so padding,
packing and the targets it makes (a causal LM's next tokens and their weights)
are decided per batch. The micro-batch cut must come after that, or a
micro-batch would be padded to its own length and the update would differ. So
raw data become a ``tf.data`` of preprocessed batches (task_feed.py's ``preprocessed``), before the feed
sees them, and the feed cuts each batch as it cuts any dataset's: the same
batches in the same order as ``task.fit`` (which never shuffles the batches it
builds). ``validation_split`` is taken from the raw arrays first, and
``validation_data`` is preprocessed the same way.
"""

from __future__ import annotations

import numpy as np

from ..errors import Refused
from ..trainer.data.conversion import kind
from ..trainer.data.task_feed import preprocessed
from .arguments import WHERE
from .inputs import split_validation, validation_arrays


def task_batches(model, what, x, y, sample_weight, batch_size, validation_data, validation_split, batch_schedule):
    """(x, validation_data) for a model that ``preprocesses`` (``x`` of kind ``what``): datasets of preprocessed
    batches, the validation data split off the raw arrays first (model.fit's last fraction)."""
    if batch_schedule is not None:
        raise Refused(
            "schedule-preprocessor",
            f"{WHERE}: batch_schedule re-cuts arrays into batches each epoch, and model {model.name!r} preprocesses "
            f"whole batches of raw examples: leave batch_schedule out, or preprocess the data yourself and pass "
            f"the model with preprocessor=None",
        )
    # a Python list of examples (strings) is one array to split and slice, not a structure of inputs
    arrays = (np.asarray(a) if isinstance(a, list) else a for a in (x, y, sample_weight))
    (x, y, sample_weight), validation_data = split_validation(*arrays, validation_data, validation_split, what)
    return preprocessed(model, x, y, sample_weight, batch_size), preprocessed_validation(
        model, validation_data, batch_size
    )


def preprocessed_validation(model, validation_data, batch_size):
    """``validation_data`` preprocessed as the training data are: a dataset of raw batches, or
    (x, y[, sample_weight]) batched by ``batch_size``."""
    if validation_data is None:
        return None
    if kind(validation_data) == "dataset":
        return preprocessed(model, validation_data, None, None, None, "validation_data")
    return preprocessed(model, *validation_arrays(validation_data), batch_size, "validation_data")
