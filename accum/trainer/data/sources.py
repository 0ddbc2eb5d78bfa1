"""One dispatch from a data source to the feed that serves it, both doors': ``feed_for`` asks ``kind`` (conversion.py)
what a source is. A datasets/ split (the CLI's: Fashion-MNIST, npz, a task's arrays, image folders; a factory's
stream) is fed an epoch at a time by ``Feed``; accum_train.fit's arrays (numpy or anything numpy reads, held tensors;
dicts and lists of them for several inputs or outputs) by ``ArrayFeed`` (array_feed.py), a ``tf.data.Dataset`` (of
batches, or of single examples with ``batch_size``; KerasHub's preprocessed batches too) or a
``keras.utils.PyDataset`` by ``DatasetFeed``, a Python generator (any iterator) of batches by ``GeneratorFeed``
(stream_feed.py); what a source gives itself (y, batch_size) is refused here, once. This dispatch imports no
TensorFlow: the feeds it picks do.

Every source becomes a ``tf.data`` pipeline (the data layer Keras reads on every backend) of this process's
micro-batches in pull order, (data, where), cut as batching.Cut cuts a batch (a stream's, known once read, chunk
first), and with ``trim_padding`` each micro-batch's time axis cut after its longest sequence (feed.py). Arrays
(arrays.Arrays) are stored once in host memory and never copied per epoch: each element gathers its own examples
(``feed.by_plan``) in an order that is a pure function of the seed and the pass, so a resumed fit sees the same
batches. A stream is read batch by batch as the updates pull it, never into memory; where its length is not known,
the loop learns it from the endless empty micro-batches after every source's end (an update that pulls one changes
nothing; under several workers tf.distribute then needs no collective per pull to agree that one is left).
"""

from __future__ import annotations

import keras

from ... import keras_private
from ...defaults import ARRAY_BATCH_SIZE
from ...errors import UserError
from .array_feed import ArrayFeed
from .arrays import check_schedule
from .conversion import WHERE, kind
from .feed import Feed
from .stream_feed import DatasetFeed, GeneratorFeed


def feed_for(source, *args, **settings):
    """The feed that serves ``source``, chosen by its ``kind`` (asked here once): a datasets/ split's (the CLI's,
    ``args``: Feed's order, epoch, segments, k_for, strategy, replica_ids), else the feed of model.fit's arguments."""
    what = kind(source)
    if what in ("split", "stream"):
        return Feed(source, *args, **settings)
    return fed(what, source, *args, **settings)


def fed(
    what, x, y, weights, class_weight, *, batch_size, shuffle, seed, steps_per_epoch, name="x", trim=0, schedule=()
):
    """The feed for ``x`` of kind ``what`` (with ``y`` and sample ``weights`` as model.fit takes them); bad input in
    one line. ``trim``: cut each micro-batch's padding (trim_padding); ``schedule``: batch_schedule's (arrays only)."""
    check_schedule(schedule, what, x, name, steps_per_epoch, shuffle)
    common = dict(class_weight=class_weight, steps_per_epoch=steps_per_epoch, trim=trim)
    own = (("y", y), ("sample_weight", weights), ("batch_size", batch_size))  # what a source of batches has
    if what == "pydataset":
        _leave_out(own, f"{name} is a PyDataset, which gives its own batches")
        adapter = keras_private.py_dataset_adapter(x, shuffle=bool(shuffle))  # model.fit's reader of a PyDataset
        return DatasetFeed(adapter.get_tf_dataset(), batch_size=None, py_adapter=adapter, **common)
    if what == "dataset":
        _leave_out(own[:2], f"{name} is a tf.data.Dataset", " (put it in its elements)")
        first = keras.tree.flatten(x.element_spec)
        if batch_size is not None and any(s.shape.rank and s.shape[0] is None for s in first):
            raise UserError(
                f"{WHERE}: {name} is a dataset of batches (its elements have a leading axis of unknown size) and "
                f"batch_size={batch_size} is given: leave batch_size out to train on its batches, or pass "
                f"dataset.unbatch()"
            )
        return DatasetFeed(x, batch_size=batch_size, **common)
    if what == "generator":
        _leave_out(own, f"{name} is a generator, which gives its own batches")
        return GeneratorFeed(x, name=name, **common)
    if what is None:
        raise UserError(f"{WHERE}: x is missing: pass arrays, a tf.data.Dataset or a keras.utils.PyDataset")
    names = tuple(part if name == "x" else f"{name}'s {part}" for part in ("x", "y", "sample_weight"))
    size = ARRAY_BATCH_SIZE if batch_size is None else batch_size
    return ArrayFeed(
        x, y, weights, batch_size=size, shuffle=shuffle, seed=seed, schedule=schedule, names=names, **common
    )


def _leave_out(given, source: str, why: str = "") -> None:
    """Refuse the first of ``given`` ((name, value) of model.fit's arguments) that is not None for ``source``."""
    for what, value in given:
        if value is not None:
            raise UserError(f"{WHERE}: {source}: leave {what} out{why}")
