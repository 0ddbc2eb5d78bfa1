"""What accum_train.fit takes as data, as model.fit takes it: a KerasHub task's raw examples, the validation data
(given or split off), the seed of the data order, and the feed of each (accum/trainer/data/sources.py's ``feed_for``,
both doors' one dispatch by kind of source).
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np

from ..backends import active
from ..errors import Refused, UserError
from ..trainer.data.conversion import STREAMED, kind
from ..trainer.store.rundir import read_record
from .arguments import WHERE


def split_validation(x, y, sample_weight, validation_data, validation_split, what):
    """model.fit's validation_split: the last fraction of the arrays (before any shuffling); ``what``: x's kind."""
    if not validation_split:
        return (x, y, sample_weight), validation_data
    if validation_data is not None:
        raise UserError(f"{WHERE}: give validation_data or validation_split, not both")
    fraction = isinstance(validation_split, (float, int, np.floating, np.integer)) and not isinstance(
        validation_split, bool
    )
    if what in STREAMED or not fraction or not 0 < validation_split < 1:
        raise UserError(
            f"{WHERE}: validation_split={validation_split!r} needs arrays and a fraction in (0, 1): "
            f"pass validation_data for a dataset"
        )
    at = int(len(keras.tree.flatten(x)[0]) * (1.0 - validation_split))

    def rows(s, pick):
        return None if s is None else keras.tree.map_structure(lambda a: np.asarray(a)[pick], s)

    return tuple(tuple(rows(s, pick) for s in (x, y, sample_weight)) for pick in (slice(None, at), slice(at, None)))


def order_seed(seed, output_dir, strategy, shuffled: bool) -> int:
    """The seed of the data order: ``seed`` if given; else the one a run directory being resumed recorded; else
    a fresh one from the operating system's entropy (NumPy's global state untouched), where arrays are
    ``shuffled`` (0 where nothing is drawn). Several workers must shuffle alike, so there a seed is needed."""
    if seed is not None:
        return seed
    if output_dir is not None:  # first: a resume that changed shuffle is then refused for that, not for the seed
        recorded = ((read_record(Path(output_dir)) or {}).get("fit") or {}).get("seed")
        if recorded is not None:
            return recorded
    if not shuffled:
        return 0
    if active().several_processes(strategy):
        raise Refused(
            "seed-none-workers",
            f"{WHERE}: seed=None on several workers, which would each shuffle the data their own way: pass "
            f"seed=<int>, the same on every worker",
        )
    return int(np.random.SeedSequence().generate_state(1)[0])


def validation_feed(validation_data, batch_size, trim=0):
    """model.fit's validation data as a feed on tf.data, cut as ``trim`` says (trim_padding)."""
    from ..trainer.data.sources import feed_for  # tf.data's: this module's other calls serve JAX's door too

    what = check_validation_source(validation_data)
    if what in ("dataset", "pydataset"):
        x, y, weights, batch_size = validation_data, None, None, None  # it gives its own batches
    else:
        x, y, weights = validation_arrays(validation_data)
    settings = dict(batch_size=batch_size, shuffle=False, seed=0, steps_per_epoch=None, name="validation_data")
    return feed_for(x, y, weights, None, trim=trim, **settings)


def check_validation_source(validation_data) -> str | None:
    """What kind of source ``validation_data`` is (conversion.kind), a generator refused in one line."""
    what = kind(validation_data)
    if what == "generator":
        raise Refused(
            "generator-validation",
            f"{WHERE}: validation_data is a generator, which the validation of every epoch would read again: "
            f"pass arrays, a tf.data.Dataset or a keras.utils.PyDataset",
        )
    return what


def validation_arrays(validation_data) -> tuple:
    """(x, y, sample_weight or None) of model.fit's validation_data tuple, checked."""
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        raise UserError(
            f"{WHERE}: validation_data must be (x_val, y_val), (x_val, y_val, sample_weight_val) or a dataset"
        )
    x, y, *weights = validation_data
    return x, y, weights[0] if weights else None


def check_examples_are_batched(model, feed, batch_size, what) -> None:
    """A stream (x's kind: ``what``) without batch_size must give batches: inputs one axis longer than an example's."""
    if batch_size is not None or what not in STREAMED or not model.inputs:
        return
    given, wanted = keras.tree.flatten(feed.element_spec)[0], model.inputs[0]  # x leads the element: its first input
    if given.shape.rank is not None and given.shape.rank == len(wanted.shape) - 1:
        raise UserError(
            f"{WHERE}: x gives single examples (its inputs have shape {tuple(given.shape)}, the model takes "
            f"{tuple(wanted.shape)}): pass batch_size, or batch the dataset"
        )


def task_batches(model, what, x, y, sample_weight, batch_size, validation_data, validation_split, batch_schedule):
    """(x, validation_data) for a model that ``preprocesses`` (a KerasHub task; ``x`` of kind ``what``), fed as its own
    ``fit`` feeds it. KerasHub's ``PipelineModel.fit`` batches raw inputs (strings, images) by ``batch_size`` and maps
    the preprocessor over each whole batch, so padding, packing and the targets it makes (a causal LM's next tokens
    and their weights) are decided per batch. The micro-batch cut must come after that, or a micro-batch would be
    padded to its own length and the update would differ: so raw data become a tf.data of preprocessed batches
    (task_feed.py), which the feed cuts as any dataset's, the same batches in the same order as ``task.fit`` (which
    never shuffles the batches it builds). ``validation_split`` is taken from the raw arrays first (model.fit's last
    fraction); ``validation_data``, a dataset of raw batches or (x, y[, sample_weight]) batched by ``batch_size``, is
    preprocessed the same way."""
    if batch_schedule is not None:
        raise Refused(
            "schedule-preprocessor",
            f"{WHERE}: batch_schedule re-cuts arrays into batches each epoch, and model {model.name!r} preprocesses "
            f"whole batches of raw examples: leave batch_schedule out, or preprocess the data yourself and pass "
            f"the model with preprocessor=None",
        )
    from ..trainer.data.task_feed import preprocessed  # tf.data's, which KerasHub's preprocessors need on JAX too

    # a Python list of examples (strings) is one array to split and slice, not a structure of inputs
    arrays = (np.asarray(a) if isinstance(a, list) else a for a in (x, y, sample_weight))
    (x, y, sample_weight), validation_data = split_validation(*arrays, validation_data, validation_split, what)
    x = preprocessed(model, x, y, sample_weight, batch_size)
    if validation_data is None:
        return x, None
    if kind(validation_data) == "dataset":
        return x, preprocessed(model, validation_data, None, None, None, "validation_data")
    return x, preprocessed(model, *validation_arrays(validation_data), batch_size, "validation_data")
