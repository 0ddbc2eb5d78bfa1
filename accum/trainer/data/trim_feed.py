"""``trim_padding``'s cut in the feed's tf.data pipeline (its policy, on any backend: lengths.py). A batch's examples
are put in order of length and each micro-batch is cut after its longest sequence (arrays held in memory by index,
``Held``: fit's arrays and the CLI's npz; fit's streams in their pipeline, stream_feed.py): the update is still the
whole batch's, as it sums over the batch whatever the grouping, provided that the padding cut away changes neither
the loss nor its gradient (the backend's ``check_trim``)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .lengths import _time_steps, sequence_lengths, uncut_steps


def stream_timed(spec, where: str):
    """For batches read from a stream (their ``spec``): which leaves are cut on axis 1, the inputs of x with two
    axes or more and every leaf whose axis 1 is theirs (of unknown size where theirs is: padded_batch)."""
    leaves = tf.nest.flatten(spec[0] if isinstance(spec, tuple) else spec)
    shapes = [tuple(s.shape) if s.shape.rank is not None else () for s in leaves]
    steps = _time_steps(shapes, [s.dtype == tf.string for s in leaves], "x's batches have no input", where)
    return tf.nest.map_structure(lambda s: (s.shape.rank or 0) >= 2 and s.shape[1] == steps, spec)


def lengths_of(element):
    """Each example's length in a batch (tensors), as ``sequence_lengths`` reads arrays: one past its last step
    where any input of x is nonzero."""
    parts = element if isinstance(element, tuple) else (element,)
    lengths = None
    for t in tf.nest.flatten(parts[0]):
        if t.shape.rank < 2:
            continue
        used = tf.not_equal(t, tf.zeros([], t.dtype))
        if t.shape.rank > 2:
            used = tf.reduce_any(used, axis=list(range(2, t.shape.rank)))
        steps = tf.shape(used, out_type=tf.int64)[1]
        last = steps - tf.argmax(tf.cast(tf.reverse(used, [1]), tf.int32), axis=1, output_type=tf.int64)
        found = tf.where(tf.reduce_any(used, axis=1), last, tf.zeros_like(last))
        lengths = found if lengths is None else tf.maximum(lengths, found)
    return lengths


def by_length(element):
    """A batch's rows longest first (ties in their order), and their lengths."""
    lengths = lengths_of(element)
    order = tf.argsort(-lengths, stable=True)
    return tf.nest.map_structure(lambda t: tf.gather(t, order), element), tf.gather(lengths, order)


def any_length(spec, timed):
    """``spec`` with the time axis of every ``timed`` leaf of unknown length (what a cut gives)."""
    return tf.nest.map_structure(
        lambda s, cut: tf.TensorSpec([s.shape[0], None, *s.shape[2:]], s.dtype) if cut else s, spec, timed
    )


def cut_after(data, timed, lengths, multiple):
    """``data`` with its ``timed`` leaves cut after the longest of ``lengths``, rounded up to ``multiple`` (at least
    one multiple: an empty micro-batch, or one of empty sequences, keeps a time axis a model can run)."""
    steps = tf.shape(next(t for t, cut in zip(tf.nest.flatten(data), tf.nest.flatten(timed)) if cut), tf.int64)[1]
    longest = tf.reduce_max(tf.concat([tf.ones([1], tf.int64), tf.cast(lengths, tf.int64)], 0))
    end = tf.minimum((longest + multiple - 1) // multiple * multiple, steps)
    return tf.nest.map_structure(lambda t, cut: t[:, :end] if cut else t, data, timed)


class Held:
    """trim_padding for examples held in memory and read by index (fit's arrays, the CLI's npz): each example's
    length found once, a batch's examples ordered longest first (``by_length``) and each gathered micro-batch
    cut after its longest (``cut``)."""

    def __init__(self, arrays, multiple: int, where: str):
        self.multiple = multiple
        self.lengths, self.timed = sequence_lengths(arrays, where)
        self._lengths = tf.constant(self.lengths)
        self.steps = uncut_steps(arrays, self.timed)

    def by_length(self, batch: np.ndarray) -> np.ndarray:
        """A batch's indices, longest first (ties in their order): each micro-batch then holds sequences of like
        length, and the update is the same, as it sums over the whole batch."""
        return batch[np.argsort(-self.lengths[batch], kind="stable")]

    def cut(self, rows, indices):
        """``rows`` gathered at ``indices`` (a tensor), cut after their longest sequence, rounded up to the
        multiple (gathered, then cut: a cut of the stored arrays would copy every example's kept steps)."""
        return cut_after(rows, self.timed, tf.gather(self._lengths, indices), self.multiple)


class TrimmedSplit:
    """A split held in memory (datasets/base.py's TaskSplit: the CLI's npz) read with ``data.trim_padding``: what
    ``gather`` gives cut after each micro-batch's longest sequence, and ``by_length`` for each batch's order; the
    rest is the split's."""

    def __init__(self, split, multiple: int, where: str):
        self.split = split
        self.trim = Held(tuple(p for p in (split.x, split.y, split.weights) if p is not None), multiple, where)
        self.timed, self.by_length = self.trim.timed, self.trim.by_length
        stored = split.tensors()
        self.spec = any_length(  # of what ``gather`` gives
            tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), stored), self.timed
        )

    def signature(self):
        """(x spec, y spec) of a batch as the update takes it: the split's, of any length where it is cut."""
        signature = self.split.signature()
        # (x, y) or (x, (y, weights)): leaves in the order of the stored (x, y[, weights]) that ``timed`` is of
        flat = tf.nest.flatten(signature)
        return tf.nest.pack_sequence_as(signature, any_length(flat, tf.nest.flatten(self.timed)))

    def __len__(self) -> int:
        return len(self.split)

    def __getattr__(self, name):
        return getattr(self.split, name)

    def gather(self, indices):
        return self.trim.cut(self.split.gather(indices), indices)
