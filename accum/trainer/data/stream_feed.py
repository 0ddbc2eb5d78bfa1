"""Streamed sources as accum_train.fit's feed: a tf.data.Dataset, a keras.utils.PyDataset or a Python generator,
read batch by batch as the updates pull them, never into memory; each batch cut into this process's elements in
pull order by the run's one stream cutter (feed.cut_stream), class weights made sample weights on the way, and with
``trim_padding`` each element's time axis cut after its longest sequence (feed.py)."""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

from ... import keras_private
from ...errors import Refused, UserError
from .batching import Cut
from .conversion import WHERE, _leaves_as_arrays
from .feed import any_length, cut_stream, endless
from .lengths import _time_steps, uncut_steps


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


def stream_timed(spec, where: str):
    """For batches read from a stream (their ``spec``): which leaves are cut on axis 1, the inputs of x with two
    axes or more and every leaf whose axis 1 is theirs (of unknown size where theirs is: padded_batch)."""
    leaves = tf.nest.flatten(spec[0] if isinstance(spec, tuple) else spec)
    shapes = [tuple(s.shape) if s.shape.rank is not None else () for s in leaves]
    steps = _time_steps(shapes, [s.dtype == tf.string for s in leaves], "x's batches have no input", where)
    return tf.nest.map_structure(lambda s: (s.shape.rank or 0) >= 2 and s.shape[1] == steps, spec)


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
