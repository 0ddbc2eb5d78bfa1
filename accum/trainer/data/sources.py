"""One dispatch from a data source to the feed that serves it, both doors': ``feed_for`` asks ``kind`` (conversion.py)
what a source is. A datasets/ split (the CLI's: Fashion-MNIST, npz, a task's arrays, image folders; a factory's
stream) is fed an epoch at a time by ``Feed`` (feed.py); accum_train.fit's arrays (numpy or anything numpy reads, held
tensors; dicts and lists of them for several inputs or outputs) by ``ArrayFeed``, a ``tf.data.Dataset`` (of batches,
or of single examples with ``batch_size``; KerasHub's preprocessed batches too, ``preprocessed``) or a
``keras.utils.PyDataset`` by ``DatasetFeed``, a Python generator (any iterator) of batches by ``GeneratorFeed``; what a
source gives itself (y, batch_size) is refused here, once.

Every source becomes a ``tf.data`` pipeline (the data layer Keras reads on every backend) of this process's
micro-batches in pull order, (data, where), cut as batching.Cut cuts a batch (a stream's, known once read, chunk
first), and with ``trim_padding`` each micro-batch's time axis cut after its longest sequence (feed.py). Arrays
(arrays.Arrays) are stored once in host memory and never copied per epoch: each element gathers its own examples
(``feed.by_plan``) in an order that is a pure function of the seed and the pass, so a resumed fit sees the same
batches. A stream is read batch by batch as the updates pull it, never into memory, cut by the run's one stream cutter
(feed.cut_stream), class weights made sample weights on the way; where its length is not known, the loop learns it
from the endless empty micro-batches after every source's end (an update that pulls one changes nothing; under
several workers tf.distribute then needs no collective per pull to agree that one is left).
"""

from __future__ import annotations

import itertools

import keras
import numpy as np
import tensorflow as tf

from ... import keras_private
from ...datasets.base import stored
from ...defaults import ARRAY_BATCH_SIZE
from ...errors import Refused, UserError
from .arrays import Arrays, check_schedule
from .batching import Cut
from .conversion import WHERE, _leaves_as_arrays, kind
from .feed import Feed, Held, any_length, by_plan, cut_stream, endless, stream_timed
from .lengths import uncut_steps


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
        batches, adapter = keras_private.py_dataset_batches(x, shuffle=bool(shuffle))
        return DatasetFeed(batches, batch_size=None, py_adapter=adapter, **common)
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


class ArrayFeed(Arrays):
    """Arrays in memory (arrays.Arrays), read through tf.data; ``trim``: cut each micro-batch's time axis to a multiple
    of it (trim_padding)."""

    def __init__(self, x, y, sample_weight, class_weight, *, trim=0, **settings):
        super().__init__(x, y, sample_weight, class_weight, **settings)
        arrays = self.arrays
        # once, in host memory: what every epoch gathers from; a copy, as the caller's arrays may change while
        # fit trains (a callback's in-place edit), and what it trains on must not
        self.stored = tf.nest.map_structure(lambda a: stored(a, copy=True), arrays)
        self.parallel_gather = tf.data.AUTOTUNE
        self.trim = int(trim)  # 0, or cut each micro-batch's time axis to a multiple of it (trim_padding)
        self.held = self.timed = self.steps = None
        if self.trim:  # each batch's examples longest first (feed.by_plan asks for by_length)
            self.held = Held(arrays, self.trim, WHERE)
            self.timed, self.steps, self.by_length = self.held.timed, self.held.steps, self.held.by_length

    @property
    def element_spec(self):
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), self.stored)
        return any_length(spec, self.timed) if self.trim else spec

    def gather(self, indices):
        """Examples ``indices`` (a tensor) of every array (feed.gathered's ``gather``); with ``trim``, the time axis
        cut after the longest of them, rounded up to a multiple of ``trim``."""
        rows = tf.nest.map_structure(lambda t: tf.gather(t, indices), self.stored)
        return self.held.cut(rows, indices) if self.trim else rows

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False) -> tf.data.Dataset:
        """This process's elements for updates ``first``.. of ``epoch`` (0-based) (``pad``: then endless
        empty ones)."""
        order, segments = self.segments(epoch, first)
        elements = by_plan(self, order, epoch, segments, lambda _: cut.k, cut.replicas, cut.local)[0]
        return endless(elements) if pad else elements


class DatasetFeed:
    """A tf.data.Dataset (its elements batches, or single examples cut into batches of ``batch_size``), or a
    PyDataset (through Keras' own adapter). Streamed: read as the updates pull it."""

    def __init__(self, dataset, *, batch_size, class_weight, steps_per_epoch, py_adapter=None, trim=0):
        if batch_size is not None:
            dataset = dataset.batch(batch_size)
        if class_weight is not None:
            dataset = dataset.map(lambda *e: _with_class_weights(e, class_weight))
        self.batches = dataset
        self.py_adapter = py_adapter
        cardinality = int(dataset.cardinality())
        if cardinality == tf.data.INFINITE_CARDINALITY and steps_per_epoch is None:
            raise UserError(
                f"{WHERE}: x is an infinite dataset (it repeats): pass steps_per_epoch, the updates of one epoch"
            )
        self.cardinality = None if cardinality < 0 else cardinality
        if self.cardinality is None and py_adapter is not None:
            self.cardinality = py_adapter.num_batches  # a PyDataset's len(), which its generator's pipeline hides
        self.steps_per_epoch = steps_per_epoch
        self.continues = steps_per_epoch is not None  # one stream from epoch to epoch, as model.fit reads it
        self.once = False  # read again each epoch (or, with steps_per_epoch, one stream that can start over)
        self.sizes = False  # a batch's examples are known once it is read
        self.batch_size = batch_size
        self.class_weight = class_weight
        self.trim = int(trim)  # 0, or cut each micro-batch's time axis to a multiple of it (trim_padding)
        self.timed = stream_timed(self.batches.element_spec, WHERE) if self.trim else None
        self.steps = uncut_steps(self.batches.element_spec, self.timed) if self.trim else None

    @property
    def element_spec(self):
        spec = self.batches.element_spec
        return any_length(spec, self.timed) if self.trim else spec

    def first_batch(self):
        first = next(iter(self.batches.take(1)))
        if self.py_adapter is not None:  # its workers' queue begins again at batch 0 for the epoch's own reading
            keras_private.restart_py_dataset_workers(self.py_adapter)
        return first

    def updates(self, epoch: int) -> int | None:
        return self.cardinality if self.steps_per_epoch is None else self.steps_per_epoch

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False) -> tf.data.Dataset:
        """This process's elements from update ``first`` of ``epoch`` on (``pad``: then endless empty ones;
        ``again``: the stream ran out before this epoch and starts over, as model.fit's does)."""
        elements = cut_stream(self._batches(epoch, first, again), cut, trim=self.trim, timed=self.timed)
        return endless(elements) if pad else elements

    def _batches(self, epoch: int, first: int, again: bool) -> tf.data.Dataset:
        if self.continues and not again:  # one stream from epoch to epoch: the epochs before read from it too
            first += epoch * self.steps_per_epoch
        return self.batches.skip(first) if first else self.batches

    def end_of_epoch(self) -> None:
        if self.py_adapter is not None:
            self.py_adapter.on_epoch_end()


class GeneratorFeed(DatasetFeed):
    """A Python generator or iterator of batches, (x,), (x, y) or (x, y, sample_weight), as model.fit reads
    one: a single stream, read once, each epoch going on where the last stopped (``steps_per_epoch`` batches,
    else to its end). Its element types and shapes come from its first two batches (model.fit's rule: an axis
    they disagree on may vary). A call that resumes a run directory skips the batches the run had read, so a
    generator that yields the same batches again resumes exactly."""

    def __init__(self, iterator, *, class_weight, steps_per_epoch, name, trim=0):
        peeked = [_batch_as_arrays(batch, name) for batch in itertools.islice(iterator, 2)]
        if not peeked:
            raise UserError(f"{WHERE}: {name} is a generator that yields no batch: it must yield at least one")
        shape_of = lambda batch: tf.nest.map_structure(lambda a: None, batch)  # noqa: E731
        if len(peeked) > 1 and shape_of(peeked[0]) != shape_of(peeked[1]):
            raise UserError(f"{WHERE}: {name}'s first two batches differ in structure: every batch must be alike")

        def spec(*arrays):
            dims = [d if all(a.shape[1:][i] == d for a in arrays) else None for i, d in enumerate(arrays[0].shape[1:])]
            return tf.TensorSpec([None, *dims], arrays[0].dtype)

        self.first = peeked[0]
        # one live stream: every tf.data iterator over it goes on where the last one stopped
        stream = itertools.chain(peeked, (_batch_as_arrays(batch, name) for batch in iterator))
        batches = tf.data.Dataset.from_generator(lambda: stream, output_signature=tf.nest.map_structure(spec, *peeked))
        super().__init__(
            batches, batch_size=None, class_weight=class_weight, steps_per_epoch=steps_per_epoch, trim=trim
        )
        self.continues = False  # each epoch opens the stream again: it goes on by itself
        self.once = True  # an epoch after its end has nothing to read
        self.opened = False

    def first_batch(self):
        first = tf.nest.map_structure(tf.constant, self.first)
        return first if self.class_weight is None else _with_class_weights(first, self.class_weight)

    def _batches(self, epoch: int, first: int, again: bool) -> tf.data.Dataset:
        """The stream from where it stands: ``steps_per_epoch - first`` batches, or to its end. Opened first at
        update ``first`` of ``epoch`` (a resume), it passes over the batches before."""
        batches = self.batches
        if not self.opened:
            self.opened = True
            read = first + (epoch * self.steps_per_epoch if self.steps_per_epoch else 0)
            batches = batches.skip(read) if read else batches
        return batches if self.steps_per_epoch is None else batches.take(self.steps_per_epoch - first)


def _batch_as_arrays(batch, name: str):
    """One batch a generator yielded, checked, as arrays (floats as float32, as model.fit casts them)."""
    if not isinstance(batch, tuple) or not 1 <= len(batch) <= 3:
        raise UserError(
            f"{WHERE}: {name} yielded a {type(batch).__name__}: a generator of batches yields tuples (x,), "
            f"(x, y) or (x, y, sample_weight)"
        )
    parts = list(batch)
    while parts and parts[-1] is None:  # (x, None) and (x, y, None) are (x,) and (x, y), as in model.fit
        parts.pop()
    if any(part is None for part in parts):
        raise Refused(
            "weights-without-targets",
            f"{WHERE}: {name} yielded (x, None, sample_weight): sample weights without targets are not "
            f"supported; yield (x, y, sample_weight)",
        )
    return _leaves_as_arrays(tuple(parts), f"a batch of {name}")


def _with_class_weights(element, class_weight):
    if len(element) < 2:
        raise UserError(f"{WHERE}: class_weight needs targets: the dataset's elements are not (x, y) pairs")
    x, y = element[0], element[1]
    weights = class_weights_tensor(y, class_weight)
    if len(element) > 2:
        weights = weights * tf.cast(tf.reshape(element[2], [tf.shape(weights)[0], -1])[:, 0], tf.float32)
    return x, y, weights


def class_weights_tensor(y, class_weight: dict):
    """Sample weights from class weights, in tf.data's graph for a stream's batches: conversion.class_weights_of's rule
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


def preprocessed(model, x, y, sample_weight, batch_size, name="x") -> tf.data.Dataset:
    """A KerasHub task's raw examples as the feed's batches (keras_fit/pipeline.py says why): ``x`` (with ``y`` and
    ``sample_weight``) batched by ``batch_size`` as ``task.fit`` batches them, and ``model.preprocess_samples`` mapped
    over each whole batch on tf.data, which KerasHub's preprocessors need on every backend; a ``tf.data.Dataset`` of
    raw batches is taken as it is, as task.fit takes it."""
    if kind(x) == "dataset":
        given = (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size))
        source = f"{name} is a tf.data.Dataset of raw batches for model {model.name!r}'s preprocessor"
        _leave_out(given, source, " (batch the dataset, and put targets and weights in its elements)")
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
