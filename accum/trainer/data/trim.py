"""``trim_padding``, through either door (accum_train.fit's argument, the CLI's ``data.trim_padding``): which steps
of each example are padding, what the option asks of the model, and the cut itself, in the data pipeline that every
backend reads (the check that the cut changes nothing the update computes: the backend's ``check_trim``).

A batch's examples are put in order of length and each micro-batch is cut after its longest sequence (arrays held
in memory by index, ``Held``: fit's arrays and the CLI's npz; fit's streams in their pipeline, stream_feed.py): the
update is still the whole batch's, as it sums over the batch whatever the grouping, provided that the padding cut
away changes neither the loss nor its gradient, which masked recurrent layers and a masked loss guarantee and an
unmasked convolution or mean over time do not. ``where`` begins every refusal: the door's name for the option.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...defaults import TRIM_MULTIPLE
from ...errors import Refused, UserError


def sequence_lengths(arrays, where: str):
    """(each example's length, which arrays are cut on axis 1) for trim_padding: the length is one past
    the example's last step where any input is nonzero (padding is zeros after the sequence, what
    Embedding(mask_zero=True) and Masking() take as such); every x, y or sample weight array whose axis 1 has
    that size is cut."""
    leaves = tf.nest.flatten(arrays[0])
    steps = _time_steps([a.shape for a in leaves], [a.dtype.kind in "SU" for a in leaves], "x has no array", where)
    inputs = [a for a in leaves if a.ndim >= 2]
    lengths = np.zeros(len(inputs[0]), np.int64)
    for a in inputs:
        used = (a != 0).reshape(len(a), steps, -1).any(axis=2)
        lengths = np.maximum(lengths, np.where(used.any(axis=1), steps - np.argmax(used[:, ::-1], axis=1), 0))
    timed = tf.nest.map_structure(lambda a: a.ndim >= 2 and a.shape[1] == steps, arrays)
    return lengths, timed


def _time_steps(shapes, strings, missing: str, where: str):
    """The one length of axis 1 of x's inputs with two axes or more (``shapes``: every input's; ``strings``: which
    hold text), arrays' and streams' alike; refused in one line where there is none, several, or text."""
    inputs = [i for i, shape in enumerate(shapes) if len(shape) >= 2]
    if not inputs:
        raise Refused(
            "trim-no-time-axis",
            f"{where}: trim_padding cuts sequences along axis 1, and {missing} with one (shapes {shapes}): leave "
            f"trim_padding out",
        )
    steps = {shapes[i][1] for i in inputs}
    if len(steps) > 1:  # a stream's unknown length (None) last
        raise Refused(
            "trim-lengths",
            f"{where}: trim_padding needs every input of x to have the same length on axis 1, and they have "
            f"{sorted(steps, key=lambda d: (d is None, d or 0))}: pad them to one length, or leave trim_padding out",
        )
    if any(strings[i] for i in inputs):
        raise Refused(
            "trim-strings", f"{where}: trim_padding reads padding as zeros, and x holds strings: leave trim_padding out"
        )
    return steps.pop()


def trim_multiple(trim_padding, where: str) -> int:
    """trim_padding as the multiple each micro-batch's length is rounded up to (0: off), checked."""
    if trim_padding is None or trim_padding is False:
        return 0
    multiple = TRIM_MULTIPLE if trim_padding is True else trim_padding
    if isinstance(multiple, bool) or not isinstance(multiple, (int, np.integer)) or multiple < 1:
        raise UserError(
            f"{where}: trim_padding={trim_padding!r} must be True, False or a positive int (the multiple each "
            f"micro-batch's length is rounded up to)"
        )
    return int(multiple)


def check_trimmable(model, replicas: int, where: str) -> None:
    """Refuse trim_padding for what it cannot cut: several replicas, a model of fixed sequence length."""
    if replicas > 1:
        raise Refused(
            "trim-replicas",
            f"{where}: trim_padding runs on one replica, and the strategy has {replicas}: leave trim_padding out",
        )
    for tensor in model.inputs or []:
        if len(tensor.shape) >= 2 and tensor.shape[1] is not None:
            raise Refused(
                "trim-fixed-length",
                f"{where}: trim_padding gives micro-batches of several lengths, and model {model.name!r} takes "
                f"inputs of shape {tuple(tensor.shape)}: build it on keras.Input(shape=(None, ...)), or leave "
                f"trim_padding out",
            )


def stream_timed(spec, where: str):
    """For batches read from a stream (their ``spec``): which leaves are cut on axis 1, the inputs of x with two
    axes or more and every leaf whose axis 1 is theirs (of unknown size where theirs is: padded_batch)."""
    leaves = tf.nest.flatten(spec[0] if isinstance(spec, tuple) else spec)
    shapes = [tuple(s.shape) if s.shape.rank is not None else () for s in leaves]
    steps = _time_steps(shapes, [s.dtype == tf.string for s in leaves], "x's batches have no input", where)
    return tf.nest.map_structure(lambda s: (s.shape.rank or 0) >= 2 and s.shape[1] == steps, spec)


def uncut_steps(data, timed):
    """The length of the time axis before the cut (the arrays' axis 1, or a stream's static one), or None where a
    stream's batches may each have their own (padded_batch): what a loss that divides by every position, padding
    included (``sum_over_batch_size``), still divides by once its micro-batches are cut (keras_objective.py)."""
    steps = {leaf.shape[1] for leaf, cut in zip(tf.nest.flatten(data), tf.nest.flatten(timed)) if cut}
    return steps.pop() if len(steps) == 1 else None


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
