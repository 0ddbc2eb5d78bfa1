"""Arrays in memory as accum_train.fit's feed: stored once and never copied per epoch, each element gathering its
own examples from them (the run's ``feed.by_plan``) in an order that is a pure function of the seed and the pass,
so a resumed fit sees the same batches; cut into this process's micro-batches as batching.Cut says, and with
``trim_padding`` each micro-batch's time axis cut after its longest sequence (accum/trainer/data/trim.py)."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from ...datasets.base import stored
from ...errors import UserError
from .batching import Cut
from .class_weights import class_weights_of
from .conversion import WHERE, _leaves_as_arrays
from .feed import by_plan, endless
from .order import epoch_order
from .timeline import Segment
from .trim import Held, any_length


class ArrayFeed:
    """Arrays in memory: x, y and sample weights as structures of [N, ...] arrays; ``names``: theirs in messages
    (validation_data's x, ...)."""

    def __init__(
        self,
        x,
        y,
        sample_weight,
        class_weight,
        *,
        batch_size,
        shuffle,
        seed,
        steps_per_epoch,
        trim=0,
        schedule=(),
        names=("x", "y", "sample_weight"),
    ):
        given = [(part_name, part) for part_name, part in zip(names, (x, y, sample_weight)) if part is not None]
        arrays = tuple(_leaves_as_arrays(part, part_name) for part_name, part in given)
        counts = {len(leaf) for leaf in tf.nest.flatten(arrays)}
        if len(counts) > 1:
            raise UserError(f"{WHERE}: {_rows_differ(given, arrays)}: every array needs one row per example")
        self.examples = counts.pop()
        if self.examples == 0:
            raise UserError(f"{WHERE}: x holds no example")
        if class_weight is not None:
            weights = class_weights_of(tf.nest.flatten(arrays[1])[0], class_weight)
            if sample_weight is not None:
                weights = weights * np.asarray(arrays[2], np.float32).reshape(self.examples, -1)[:, 0]
            arrays = (*arrays[:2], weights)
        self.arrays = arrays
        # once, in host memory: what every epoch gathers from; a copy, as the caller's arrays may change while
        # fit trains (a callback's in-place edit), and what it trains on must not
        self.stored = tf.nest.map_structure(lambda a: stored(a, copy=True), arrays)
        self.parallel_gather = tf.data.AUTOTUNE
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        # batch_schedule: ((0-based epoch, batch size), ...); each epoch is then one pass at the batch in force
        self.schedule = tuple(schedule)
        self.batches_per_pass = math.ceil(self.examples / batch_size)
        self.steps_per_epoch = steps_per_epoch or self.batches_per_pass
        self.continues = False  # each epoch's elements follow from the epoch's index
        self.once = False  # read again each epoch
        self.sizes = True  # each update's examples are known before it runs (batch_length)
        self.trim = int(trim)  # 0, or cut each micro-batch's time axis to a multiple of it (trim_padding)
        self.held = Held(arrays, self.trim, WHERE) if self.trim else None
        self.timed = self.held.timed if self.trim else None
        self.steps = self.held.steps if self.trim else None
        if self.trim:  # each batch's examples longest first (feed.by_plan asks for it)
            self.by_length = self.held.by_length

    @property
    def element_spec(self):
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), self.stored)
        return any_length(spec, self.timed) if self.trim else spec

    def first_batch(self):
        """The first batch's arrays (what the model, its loss and its metrics are built from)."""
        return tf.nest.map_structure(lambda t: t[: min(self.batch_size, self.examples)], self.arrays)

    def gather(self, indices):
        """Examples ``indices`` (a tensor) of every array (feed.gathered's reader); with ``trim``, the time axis
        cut after the longest of them, rounded up to a multiple of ``trim``."""
        rows = tf.nest.map_structure(lambda t: tf.gather(t, indices), self.stored)
        return self.held.cut(rows, indices) if self.trim else rows

    def _pass_order(self, p: int) -> np.ndarray:  # the JAX backend's door draws its order the same way
        return epoch_order(self.seed, p, self.examples, self.shuffle, self.batch_size)

    def batch_size_of(self, epoch: int) -> int:
        """The batch size in force in ``epoch`` (0-based): batch_schedule's, else ``batch_size``."""
        return next((size for start, size in reversed(self.schedule) if start <= epoch), self.batch_size)

    def updates(self, epoch: int) -> int:
        if self.schedule:
            return math.ceil(self.examples / self.batch_size_of(epoch))
        return self.steps_per_epoch

    def batch_length(self, epoch: int, step: int) -> int:
        """The examples of update ``step`` of ``epoch`` (0-based): the batch size, less at the end of a pass."""
        if self.schedule:
            size = self.batch_size_of(epoch)
            return min(size, self.examples - step * size)
        b = (epoch * self.steps_per_epoch + step) % self.batches_per_pass
        return min(self.batch_size, self.examples - b * self.batch_size)

    def dataset(self, epoch: int, first: int, cut: Cut, pad: bool = True, again: bool = False) -> tf.data.Dataset:
        """This process's elements for updates ``first``.. of ``epoch`` (0-based) (``pad``: then endless
        empty ones)."""
        if self.schedule:  # the epoch is one pass, cut at the batch in force
            size = self.batch_size_of(epoch)
            order, segments = self._pass_order(epoch), [Segment(epoch, first, first * size, self.examples, size)]
        else:  # steps_per_epoch may end an epoch inside a pass, or run over into the next: a segment per pass
            size, per_pass = self.batch_size, self.batches_per_pass
            start, end = epoch * self.steps_per_epoch + first, (epoch + 1) * self.steps_per_epoch
            passes = range(start // per_pass, (end - 1) // per_pass + 1)
            order = np.concatenate([np.zeros(0, np.int64)] + [self._pass_order(p) for p in passes])
            segments = []
            for i, p in enumerate(passes):  # its updates [u0, u1), at the pass's place in ``order``
                u0, u1 = max(start, p * per_pass) - p * per_pass, min(end, (p + 1) * per_pass) - p * per_pass
                at, step = i * self.examples, p * per_pass + u0 - epoch * self.steps_per_epoch
                segments.append(Segment(epoch, step, at + u0 * size, at + min(u1 * size, self.examples), size))
        elements = by_plan(self, order, epoch, segments, lambda _: cut.k, cut.replicas, cut.local)[0]
        return endless(elements) if pad else elements


def _rows_differ(given: list, arrays: tuple) -> str:
    """Which arrays disagree on the examples, by the names of ``given`` ((name, part) of x, y, sample_weight):
    x's count against the first part that has another (x's own arrays, where they differ among themselves)."""
    rows = [[len(leaf) for leaf in tf.nest.flatten(part)] for part in arrays]

    def count(n):
        return n[0] if len(set(n)) == 1 else n

    x_rows = rows[0]
    if len(set(x_rows)) > 1:
        return f"{given[0][0]} holds {x_rows} examples"
    other = next(i for i in range(1, len(rows)) if set(rows[i]) != {x_rows[0]})
    return f"{given[0][0]} holds {x_rows[0]} examples but {given[other][0]} {count(rows[other])}"
