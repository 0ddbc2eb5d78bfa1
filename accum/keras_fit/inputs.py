"""What accum_train.fit takes as data, as model.fit takes it, turned into the micro-batches of each replica: the
feed for each kind of source (``make_feed``: array_feed.py's for arrays, stream_feed.py's for the others), and
the validation data, given or split off.

Arrays (numpy, or anything numpy reads; dicts and lists of them for several
inputs or outputs), a ``tf.data.Dataset`` (of batches, or of single examples
with ``batch_size``), a ``keras.utils.PyDataset``, or a Python generator (any
iterator) of batches. Every source becomes a
``tf.data`` pipeline whose elements are the micro-batches of this process's
replicas, in the order the update pulls them: for each update, for each of its
``k`` micro-steps, one element per local replica. Each replica takes a
contiguous share of the batch and cuts it into ``k`` contiguous micro-batches
(accum.batching.Cut), the cut the run's feed makes: a short batch of arrays
is pulled in fewer micro-steps where a share holds fewer examples than k, and
a stream's batch, whose size is known only once read, in k, some maybe empty;
a stream is cut chunk first, as the CLI's. An
element is (data, where), as the run's feed gives them (``prepare`` unpacks
the data inside the micro-step).

Arrays are stored once and never copied per epoch (array_feed.py): each element gathers its
own examples from them (the run's ``feed.by_plan``; the epoch's order is a
pure function of the seed and the pass, so a resumed fit sees the same
batches). A dataset is streamed (stream_feed.py): it is read batch by
batch as the updates pull it, never into memory. When a stream's length is
not known, the loop learns it from the rounds of empty micro-batches that
follow every source's end: an update that pulls one holds no example, changes
nothing, and tells the loop the data ended. The padding is endless, which also
tells tf.distribute that every pull has an element: under several workers it
then adds no collective to each pull to agree on that.
"""

from __future__ import annotations

import collections.abc

import keras
import numpy as np
import tensorflow as tf

from .. import keras_private
from ..defaults import ARRAY_BATCH_SIZE
from ..errors import Refused, UserError
from .arguments import WHERE
from .array_feed import ArrayFeed
from .stream_feed import DatasetFeed, GeneratorFeed


def is_dataset(x) -> bool:
    return isinstance(x, tf.data.Dataset)


def make_feed(
    x, y, sample_weight, class_weight, *, batch_size, shuffle, seed, steps_per_epoch, name="x", trim=0, schedule=()
):
    """The feed for ``x`` (and ``y``, ``sample_weight``) as model.fit takes them; bad input in one line.
    ``trim``: cut each micro-batch's padding (trim_padding); ``schedule``: batch_schedule's (arrays only)."""
    if schedule and streamed_source(x):
        raise Refused(
            "schedule-stream",
            f"{WHERE}: batch_schedule cuts arrays into batches, and {name} is a {type(x).__name__} that gives its "
            f"own: pass arrays, or call accum_train.fit once per batch size with initial_epoch",
        )
    if schedule and (steps_per_epoch is not None or shuffle == "batch"):
        what = f"steps_per_epoch={steps_per_epoch}" if steps_per_epoch is not None else "shuffle='batch'"
        raise Refused(
            "schedule-fixed-steps",
            f"{WHERE}: batch_schedule makes each epoch one pass over the arrays at the batch in force, which "
            f"{what} would change: leave {what.split('=')[0]} out",
        )
    own = (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size))  # what a source of batches has
    if isinstance(x, keras.utils.PyDataset):
        _leave_out(own, f"{name} is a PyDataset, which gives its own batches")
        batches, adapter = keras_private.py_dataset_batches(x, shuffle=bool(shuffle))
        return DatasetFeed(
            batches,
            batch_size=None,
            class_weight=class_weight,
            steps_per_epoch=steps_per_epoch,
            py_adapter=adapter,
            trim=trim,
        )
    if is_dataset(x):
        _leave_out(own[:2], f"{name} is a tf.data.Dataset", " (put it in its elements)")
        first = tf.nest.flatten(x.element_spec)
        if batch_size is not None and any(s.shape.rank and s.shape[0] is None for s in first):
            raise UserError(
                f"{WHERE}: {name} is a dataset of batches (its elements have a leading axis of unknown size) and "
                f"batch_size={batch_size} is given: leave batch_size out to train on its batches, or pass "
                f"dataset.unbatch()"
            )
        return DatasetFeed(
            x, batch_size=batch_size, class_weight=class_weight, steps_per_epoch=steps_per_epoch, trim=trim
        )
    if isinstance(x, collections.abc.Iterator):  # a generator, or any iterator of batches
        _leave_out(own, f"{name} is a generator, which gives its own batches")
        return GeneratorFeed(x, class_weight=class_weight, steps_per_epoch=steps_per_epoch, name=name, trim=trim)
    if x is None:
        raise UserError(f"{WHERE}: x is missing: pass arrays, a tf.data.Dataset or a keras.utils.PyDataset")
    if batch_size is None:
        batch_size = ARRAY_BATCH_SIZE
    return ArrayFeed(
        x,
        y,
        sample_weight,
        class_weight,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        steps_per_epoch=steps_per_epoch,
        trim=trim,
        schedule=schedule,
        names=tuple(part if name == "x" else f"{name}'s {part}" for part in ("x", "y", "sample_weight")),
    )


def _leave_out(given, source: str, why: str = "") -> None:
    """Refuse the first of ``given`` ((name, value) of model.fit's arguments) that is not None for ``source``."""
    for what, value in given:
        if value is not None:
            raise UserError(f"{WHERE}: {source}: leave {what} out{why}")


def split_validation(x, y, sample_weight, validation_data, validation_split):
    """model.fit's validation_split: the last fraction of the arrays (before any shuffling)."""
    if not validation_split:
        return (x, y, sample_weight), validation_data
    if validation_data is not None:
        raise UserError(f"{WHERE}: give validation_data or validation_split, not both")
    fraction = isinstance(validation_split, (float, int, np.floating, np.integer)) and not isinstance(
        validation_split, bool
    )
    if streamed_source(x) or not fraction or not 0 < validation_split < 1:
        raise UserError(
            f"{WHERE}: validation_split={validation_split!r} needs arrays and a fraction in (0, 1): "
            f"pass validation_data for a dataset"
        )
    at = int(len(tf.nest.flatten(x)[0]) * (1.0 - validation_split))

    def rows(s, pick):
        return None if s is None else tf.nest.map_structure(lambda a: np.asarray(a)[pick], s)

    return tuple(tuple(rows(s, pick) for s in (x, y, sample_weight)) for pick in (slice(None, at), slice(at, None)))


def streamed_source(x) -> bool:
    """A dataset, a PyDataset or a generator: batches read as they come, not arrays held."""
    return is_dataset(x) or isinstance(x, (keras.utils.PyDataset, collections.abc.Iterator))


def validation_feed(validation_data, batch_size, trim=0):
    """model.fit's validation data as a feed, cut as ``trim`` says (trim_padding)."""
    if isinstance(validation_data, collections.abc.Iterator):
        raise Refused(
            "generator-validation",
            f"{WHERE}: validation_data is a generator, which the validation of every epoch would read again: "
            f"pass arrays, a tf.data.Dataset or a keras.utils.PyDataset",
        )
    if is_dataset(validation_data) or isinstance(validation_data, keras.utils.PyDataset):
        x, y, weights, batch_size = validation_data, None, None, None  # it gives its own batches
    else:
        x, y, weights = validation_arrays(validation_data)
    settings = dict(batch_size=batch_size, shuffle=False, seed=0, steps_per_epoch=None, name="validation_data")
    return make_feed(x, y, weights, None, trim=trim, **settings)


def validation_arrays(validation_data) -> tuple:
    """(x, y, sample_weight or None) of model.fit's validation_data tuple, checked."""
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        raise UserError(
            f"{WHERE}: validation_data must be (x_val, y_val), (x_val, y_val, sample_weight_val) or a dataset"
        )
    x, y, *weights = validation_data
    return x, y, weights[0] if weights else None


def check_examples_are_batched(model, feed, batch_size) -> None:
    """A dataset without batch_size must give batches: its inputs one axis longer than an example's."""
    if batch_size is not None or not is_dataset(getattr(feed, "batches", None)) or not model.inputs:
        return
    spec = feed.element_spec
    x = spec[0] if isinstance(spec, tuple) else spec
    given, wanted = tf.nest.flatten(x)[0], model.inputs[0]
    if given.shape.rank is not None and given.shape.rank == len(wanted.shape) - 1:
        raise UserError(
            f"{WHERE}: x gives single examples (its inputs have shape {tuple(given.shape)}, the model takes "
            f"{tuple(wanted.shape)}): pass batch_size, or batch the dataset"
        )
