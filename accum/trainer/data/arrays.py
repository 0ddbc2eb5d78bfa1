"""Arrays in memory as accum_train.fit's feed, on any backend: x, y and sample weights checked and held as numpy
(class weights made sample weights), and each epoch laid out as updates in an order that is a pure function of the
seed and the pass (order.py), so a resumed fit sees the same batches. Each backend's feed reads its elements from
this plan (TensorFlow's sources.ArrayFeed through tf.data, JAX's jax/feed.py in numpy)."""

from __future__ import annotations

import math

import keras
import numpy as np

from ...errors import Refused, UserError
from .conversion import STREAMED, WHERE, _leaves_as_arrays, class_weights_of
from .order import epoch_order
from .timeline import Segment


class Arrays:
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
        schedule=(),
        names=("x", "y", "sample_weight"),
    ):
        given = [(part_name, part) for part_name, part in zip(names, (x, y, sample_weight)) if part is not None]
        arrays = tuple(_leaves_as_arrays(part, part_name) for part_name, part in given)
        counts = {len(leaf) for leaf in keras.tree.flatten(arrays)}
        if len(counts) > 1:
            raise UserError(f"{WHERE}: {_rows_differ(given, arrays)}: every array needs one row per example")
        self.examples = counts.pop()
        if self.examples == 0:
            raise UserError(f"{WHERE}: x holds no example")
        if class_weight is not None:
            weights = class_weights_of(keras.tree.flatten(arrays[1])[0], class_weight)
            if sample_weight is not None:
                weights = weights * np.asarray(arrays[2], np.float32).reshape(self.examples, -1)[:, 0]
            arrays = (*arrays[:2], weights)
        self.arrays = arrays
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        # batch_schedule: ((0-based epoch, batch size), ...); each epoch is then one pass at the batch in force
        self.schedule = tuple(schedule)
        self.batches_per_pass = math.ceil(self.examples / batch_size)
        self.steps_per_epoch = steps_per_epoch or self.batches_per_pass
        self.continues = False  # each epoch's elements follow from the epoch's index
        self.once = False  # read again each epoch
        self.sizes = True  # each update's examples are known before it runs (batch_length)

    def first_batch(self):
        """The first batch's arrays (what the model, its loss and its metrics are built from)."""
        return keras.tree.map_structure(lambda t: t[: min(self.batch_size, self.examples)], self.arrays)

    def _pass_order(self, p: int) -> np.ndarray:
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

    def segments(self, epoch: int, first: int) -> tuple:
        """(the order of examples, the timeline.Segment list) of updates ``first``.. of ``epoch`` (0-based)."""
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
        return order, segments


def check_schedule(schedule, what, x, name, steps_per_epoch, shuffle) -> None:
    """A batch_schedule (of either backend's feed) refused in one line where the source of kind ``what`` (``x``,
    named ``name``) gives its own batches, or fit's other arguments would change an epoch's one pass."""
    if schedule and what in STREAMED:
        raise Refused(
            "schedule-stream",
            f"{WHERE}: batch_schedule cuts arrays into batches, and {name} is a {type(x).__name__} that gives "
            f"its own: pass arrays, or call accum_train.fit once per batch size with initial_epoch",
        )
    if schedule and (steps_per_epoch is not None or shuffle == "batch"):
        given = f"steps_per_epoch={steps_per_epoch}" if steps_per_epoch is not None else "shuffle='batch'"
        raise Refused(
            "schedule-fixed-steps",
            f"{WHERE}: batch_schedule makes each epoch one pass over the arrays at the batch in force, which "
            f"{given} would change: leave {given.split('=')[0]} out",
        )


def check_cut(feed, subdivisions, auto: bool) -> None:
    """Either backend's feed checked against how its batches are cut: ``subdivisions`` (as given, or None) over the
    feed's batch size, or automatic micro-batches (``auto``), whose retry reads a batch again, on a source read
    once (a generator), refused in one line."""
    if subdivisions is not None and feed.batch_size is not None and subdivisions > feed.batch_size:
        raise UserError(
            f"{WHERE}: subdivisions={subdivisions} must be <= batch_size={feed.batch_size} "
            f"(a micro-batch holds at least one example)"
        )
    if auto and feed.once:
        raise Refused(
            "auto-generator",
            f"{WHERE}: micro_batch_size='auto' retries an update that runs out of memory from the same batch, which "
            f"a generator cannot give again: pass subdivisions or a micro_batch_size in examples",
        )


def _rows_differ(given: list, arrays: tuple) -> str:
    """Which arrays disagree on the examples, by the names of ``given`` ((name, part) of x, y, sample_weight):
    x's count against the first part that has another (x's own arrays, where they differ among themselves)."""
    rows = [[len(leaf) for leaf in keras.tree.flatten(part)] for part in arrays]

    def count(n):
        return n[0] if len(set(n)) == 1 else n

    x_rows = rows[0]
    if len(set(x_rows)) > 1:
        return f"{given[0][0]} holds {x_rows} examples"
    other = next(i for i in range(1, len(rows)) if set(rows[i]) != {x_rows[0]})
    return f"{given[0][0]} holds {x_rows[0]} examples but {given[other][0]} {count(rows[other])}"
