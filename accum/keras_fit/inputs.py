"""What accum_train.fit takes as data, as model.fit takes it, turned into the micro-batches of each replica.

Arrays (numpy, or anything numpy reads; dicts and lists of them for several
inputs or outputs), a ``tf.data.Dataset`` (of batches, or of single examples
with ``batch_size``), a ``keras.utils.PyDataset``, or a Python generator (any
iterator) of batches. Every source becomes a
``tf.data`` pipeline whose elements are the micro-batches of this process's
replicas, in the order the update pulls them: for each update, for each of its
``k`` micro-steps, one element per local replica. Each replica takes a
contiguous share of the batch and cuts it into ``k`` contiguous micro-batches
(accum.batching), the cut the run's feed makes; a short batch gives short or
even empty micro-batches, never fewer of them, so updates stay aligned. An
element is (data, where), as the run's feed gives them (``prepare`` unpacks
the data inside the micro-step).

Arrays are stored once and never copied per epoch: each element gathers its
own examples from them (the run's ``feed.gathered``; the epoch's order is a
pure function of the seed and the pass, so a resumed fit sees the same
batches). A dataset is streamed: it is read batch by
batch as the updates pull it, never into memory. When a stream's length is
not known, the loop learns it from the rounds of empty micro-batches that
follow every source's end: an update that pulls one holds no example, changes
nothing, and tells the loop the data ended. The padding is endless, which also
tells tf.distribute that every pull has an element: under several workers it
then adds no collective to each pull to agree on that.
"""

from __future__ import annotations

import collections.abc
import itertools
import math
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from .. import keras_private
from ..batching import pieces
from ..data import epoch_order
from ..datasets.base import stored
from ..errors import UserError
from ..feed import Layout, endless, gathered
from .padding import by_length, cut_after, sequence_lengths, stream_timed

WHERE = "accum_train.fit"


@dataclass(frozen=True)
class Cut:
    """How a batch becomes this process's elements: ``k`` micro-steps, ``replicas`` in all, these local ones."""

    k: int
    replicas: int
    local: tuple[int, ...]

    def bounds(self, n):
        """[start, end) of each element of a batch of ``n`` examples, in pull order (ints or tensors)."""
        return pieces(n, self.k, self.replicas, self.local)


def _leaves_as_arrays(structure, name: str):
    """A structure of arrays as numpy, floats as float32 (model.fit casts floats to floatx); lists as tuples
    (what tf.data carries)."""

    def convert(value):
        array = np.asarray(value)
        if array.dtype.kind == "f" and array.dtype != np.float32:
            array = array.astype(np.float32)
        if array.dtype.kind not in "fiub" and array.dtype.kind not in "SU":
            raise UserError(f"{WHERE}: {name} holds values of dtype {array.dtype}: pass numbers or strings")
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
    """Sample weights from class weights as model.fit derives them: one-hot targets by their argmax, [N, 1]
    squeezed, rounded to integers; classes not named weigh 1 (arrays' and a dataset's batches alike)."""
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


class ArrayFeed:
    """Arrays in memory: x, y and sample weights as structures of [N, ...] arrays."""

    def __init__(self, x, y, sample_weight, class_weight, *, batch_size, shuffle, seed, steps_per_epoch, trim=0):
        data = tuple(part for part in (x, y, sample_weight) if part is not None)
        self.structure = (x is not None, y is not None, sample_weight is not None or class_weight is not None)
        arrays = _leaves_as_arrays(data, "x")
        counts = {len(leaf) for leaf in tf.nest.flatten(arrays)}
        if len(counts) > 1:
            sizes = [len(leaf) for leaf in tf.nest.flatten(arrays[0])]
            others = [len(leaf) for part in arrays[1:] for leaf in tf.nest.flatten(part)]
            raise UserError(
                f"{WHERE}: x holds {sizes[0] if len(set(sizes)) == 1 else sizes} examples but "
                f"{'y' if y is not None else 'sample_weight'} {others[0] if len(set(others)) == 1 else others}: "
                f"every array needs one row per example"
            )
        self.examples = counts.pop()
        if self.examples == 0:
            raise UserError(f"{WHERE}: x holds no example")
        if class_weight is not None:
            weights = class_weights_tensor(tf.nest.flatten(arrays[1])[0], class_weight).numpy()
            if sample_weight is not None:
                weights = weights * np.asarray(arrays[2], np.float32).reshape(self.examples, -1)[:, 0]
            arrays = (*arrays[:2], weights)
        self.arrays = arrays
        # once, in host memory: what every epoch gathers from; a copy, as the caller's arrays may change while
        # fit trains (a callback's in-place edit), and what it trains on must not
        self.stored = tf.nest.map_structure(lambda a: stored(a, copy=True), arrays)
        self.parallel_gather = tf.data.AUTOTUNE
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.batches_per_pass = math.ceil(self.examples / batch_size)
        self.steps_per_epoch = steps_per_epoch or self.batches_per_pass
        self.continues = False  # each epoch's elements follow from the epoch's index
        self.once = False  # read again each epoch
        self.sizes = True  # each update's examples are known before it runs (batch_length)
        self.trim = int(trim)  # 0, or cut each micro-batch's time axis to a multiple of it (trim_padding)
        if self.trim:
            # each example's length (after its last nonzero step), and which arrays have the time axis
            self.lengths, self.timed = sequence_lengths(arrays)
            self._lengths = tf.constant(self.lengths)

    @property
    def element_spec(self):
        def spec(t, timed=False):
            shape = [None, None if timed else t.shape[1], *t.shape[2:]] if t.shape.rank >= 2 else [None]
            return tf.TensorSpec(shape, t.dtype)

        if not self.trim:
            return tf.nest.map_structure(spec, self.stored)
        return tf.nest.map_structure(spec, self.stored, self.timed)

    def first_batch(self):
        """The first batch's arrays (what the model, its loss and its metrics are built from)."""
        return tf.nest.map_structure(lambda t: t[: min(self.batch_size, self.examples)], self.arrays)

    def gather(self, indices):
        """Examples ``indices`` (a tensor) of every array (feed.gathered's reader); with ``trim``, the time axis
        cut after the longest of them, rounded up to a multiple of ``trim``."""
        if not self.trim:
            return tf.nest.map_structure(lambda t: tf.gather(t, indices), self.stored)
        # gathered, then cut: a cut of the stored arrays would copy every example's kept steps
        rows = tf.nest.map_structure(lambda t: tf.gather(t, indices), self.stored)
        return cut_after(rows, self.timed, tf.gather(self._lengths, indices), self.trim)

    def by_length(self, batch: np.ndarray) -> np.ndarray:
        """A batch's examples, longest first (ties in their order): with ``trim``, each micro-batch then holds
        sequences of like length, and the update is the same, as it sums over the whole batch."""
        return batch[np.argsort(-self.lengths[batch], kind="stable")] if self.trim else batch

    def _pass_order(self, p: int) -> np.ndarray:
        if self.shuffle == "batch":  # whole batches in a new order, each batch's examples as stored
            blocks = epoch_order(self.seed, p, self.batches_per_pass, True)
            return np.concatenate(
                [np.arange(b * self.batch_size, min((b + 1) * self.batch_size, self.examples)) for b in blocks]
            )
        return epoch_order(self.seed, p, self.examples, bool(self.shuffle))

    def updates(self, epoch: int) -> int:
        return self.steps_per_epoch

    def batch_length(self, epoch: int, step: int) -> int:
        """The examples of update ``step`` of ``epoch`` (0-based): the batch size, less at the end of a pass."""
        b = (epoch * self.steps_per_epoch + step) % self.batches_per_pass
        return min(self.batch_size, self.examples - b * self.batch_size)

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False) -> tf.data.Dataset:
        """This process's elements for updates ``first``.. of ``epoch`` (0-based) (``pad``: then endless
        empty ones)."""
        batches, orders = [], {}
        for u in range(epoch * self.steps_per_epoch + first, (epoch + 1) * self.steps_per_epoch):
            p, b = divmod(u, self.batches_per_pass)
            if p not in orders:
                orders[p] = self._pass_order(p)
            batches.append(self.by_length(orders[p][b * self.batch_size : (b + 1) * self.batch_size]))
        starts, ends, where, offset = [], [], [], 0
        for u, batch in enumerate(batches):  # each batch's elements, at its place in the epoch's order
            for start, end in cut.bounds(len(batch)):
                starts.append(offset + start)
                ends.append(offset + end)
                where.append((first + u, start))
            offset += len(batch)
        order = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        as_array = lambda values: np.asarray(values, np.int64).reshape(-1)  # noqa: E731
        layout = Layout([], as_array(starts), as_array(ends), np.asarray(where, np.int64).reshape(-1, 2))
        elements = gathered(self, order, layout)
        return endless(elements) if pad else elements


def _batched_split(dataset: tf.data.Dataset, cut: Cut, trim: int = 0, timed=None) -> tf.data.Dataset:
    """Each element a batch: cut into this process's elements, in pull order, each (data, where) as the run's
    feed gives them (where: unused here). ``trim``: each batch's rows ordered by length first, and each
    element's ``timed`` leaves cut after its longest sequence (trim_padding)."""
    nowhere = tf.zeros([2], tf.int64)

    def split(*batch):
        element = batch if len(batch) > 1 else batch[0]
        n = tf.shape(tf.nest.flatten(element)[0])[0]
        if trim:
            element, lengths = by_length(element)
        bounds = tf.stack([tf.stack([start, end]) for start, end in cut.bounds(n)])

        def piece(b):
            data = tf.nest.map_structure(lambda t: t[b[0] : b[1]], element)
            return (cut_after(data, timed, lengths[b[0] : b[1]], trim) if trim else data), nowhere

        return tf.data.Dataset.from_tensor_slices(bounds).map(piece)

    return dataset.flat_map(split)


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
        self.structure = None
        self.class_weight = class_weight
        self.trim = int(trim)  # 0, or cut each micro-batch's time axis to a multiple of it (trim_padding)
        self.timed = stream_timed(self.batches.element_spec) if self.trim else None

    @property
    def element_spec(self):
        spec = self.batches.element_spec
        if not self.trim:
            return spec
        return tf.nest.map_structure(
            lambda s, timed: tf.TensorSpec([s.shape[0], None, *s.shape[2:]], s.dtype) if timed else s, spec, self.timed
        )

    def first_batch(self):
        return next(iter(self.batches.take(1)))

    def updates(self, epoch: int) -> int | None:
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch
        return self.cardinality

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False) -> tf.data.Dataset:
        """This process's elements from update ``first`` of ``epoch`` on (``pad``: then endless empty ones;
        ``again``: the stream ran out before this epoch and starts over, as model.fit's does)."""
        if self.continues and not again:  # one stream from epoch to epoch: the epochs before read from it too
            first += epoch * self.steps_per_epoch
        elements = _batched_split(self.batches.skip(first) if first else self.batches, cut, self.trim, self.timed)
        return endless(elements) if pad else elements

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

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False) -> tf.data.Dataset:
        """The stream from where it stands: ``steps_per_epoch - first`` batches, or to its end. Opened first at
        update ``first`` of ``epoch`` (a resume), it passes over the batches before."""
        batches = self.batches
        if not self.opened:
            self.opened = True
            read = first + (epoch * self.steps_per_epoch if self.steps_per_epoch else 0)
            batches = batches.skip(read) if read else batches
        if self.steps_per_epoch is not None:
            batches = batches.take(self.steps_per_epoch - first)
        elements = _batched_split(batches, cut, self.trim, self.timed)
        return endless(elements) if pad else elements


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
        raise UserError(
            f"{WHERE}: {name} yielded (x, None, sample_weight): sample weights without targets are not "
            f"supported; yield (x, y, sample_weight)"
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


def is_dataset(x) -> bool:
    return isinstance(x, tf.data.Dataset)


def make_feed(x, y, sample_weight, class_weight, *, batch_size, shuffle, seed, steps_per_epoch, name="x", trim=0):
    """The feed for ``x`` (and ``y``, ``sample_weight``) as model.fit takes them; bad input in one line.
    ``trim``: cut each micro-batch's padding (trim_padding)."""
    if isinstance(x, keras.utils.PyDataset):
        for what, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size)):
            if value is not None:
                raise UserError(f"{WHERE}: {name} is a PyDataset, which gives its own batches: leave {what} out")
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
        for what, value in (("y", y), ("sample_weight", sample_weight)):
            if value is not None:
                raise UserError(f"{WHERE}: {name} is a tf.data.Dataset: leave {what} out (put it in its elements)")
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
        for what, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size)):
            if value is not None:
                raise UserError(f"{WHERE}: {name} is a generator, which gives its own batches: leave {what} out")
        return GeneratorFeed(x, class_weight=class_weight, steps_per_epoch=steps_per_epoch, name=name, trim=trim)
    if x is None:
        raise UserError(f"{WHERE}: x is missing: pass arrays, a tf.data.Dataset or a keras.utils.PyDataset")
    if batch_size is None:
        batch_size = 32  # model.fit's default for arrays
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
    )


def split_validation(x, y, sample_weight, validation_data, validation_split):
    """model.fit's validation_split: the last fraction of the arrays (before any shuffling)."""
    if not validation_split:
        return (x, y, sample_weight), validation_data
    if validation_data is not None:
        raise UserError(f"{WHERE}: give validation_data or validation_split, not both")
    if streamed_source(x) or not 0 < validation_split < 1:
        raise UserError(
            f"{WHERE}: validation_split={validation_split!r} needs arrays and a fraction in (0, 1): "
            f"pass validation_data for a dataset"
        )
    count = len(tf.nest.flatten(x)[0])
    at = int(count * (1.0 - validation_split))

    def head(s):
        return None if s is None else tf.nest.map_structure(lambda a: np.asarray(a)[:at], s)

    def tail(s):
        return None if s is None else tf.nest.map_structure(lambda a: np.asarray(a)[at:], s)

    return (head(x), head(y), head(sample_weight)), (tail(x), tail(y), tail(sample_weight))


def streamed_source(x) -> bool:
    """A dataset, a PyDataset or a generator: batches read as they come, not arrays held."""
    return is_dataset(x) or isinstance(x, (keras.utils.PyDataset, collections.abc.Iterator))


def validation_feed(validation_data, batch_size, trim=0):
    """model.fit's validation data as a feed, cut as ``trim`` says (trim_padding)."""
    if isinstance(validation_data, collections.abc.Iterator):
        raise UserError(
            f"{WHERE}: validation_data is a generator, which the validation of every epoch would read again: "
            f"pass arrays, a tf.data.Dataset or a keras.utils.PyDataset"
        )
    if is_dataset(validation_data) or isinstance(validation_data, keras.utils.PyDataset):
        return make_feed(
            validation_data,
            None,
            None,
            None,
            batch_size=None,
            shuffle=False,
            seed=0,
            steps_per_epoch=None,
            name="validation_data",
            trim=trim,
        )
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        raise UserError(
            f"{WHERE}: validation_data must be (x_val, y_val), (x_val, y_val, sample_weight_val) or a dataset"
        )
    x, y, *weights = validation_data
    return make_feed(
        x,
        y,
        weights[0] if weights else None,
        None,
        batch_size=batch_size or 32,
        shuffle=False,
        seed=0,
        steps_per_epoch=None,
        name="validation_data",
        trim=trim,
    )
