"""``trim_padding``, through either door (accum_train.fit's argument, the CLI's ``data.trim_padding``): which steps
of each example are padding, what the option asks of the model, the check that cutting the padding changes nothing
the update computes, and the cut itself.

A batch's examples are put in order of length and each micro-batch is cut after its longest sequence (arrays held
in memory by index, ``Held``: fit's arrays and the CLI's npz; fit's streams in their pipeline, stream_feed.py): the
update is still the whole batch's, as it sums over the batch whatever the grouping, provided that the padding cut
away changes neither the loss nor its gradient, which masked recurrent layers and a masked loss guarantee and an
unmasked convolution or mean over time do not. ``where`` begins every refusal: the door's name for the option.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from ... import keras_private
from ...backends.tensorflow.graphs import graph
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


def check_trim(objective, groups, first_batch, timed, spec, cut, strategy, where: str, unpack=None) -> None:
    """Refuse trim_padding where cutting the padding changes the update: compare the normalisers, loss sums and
    gradients of the first batch's shortest micro-batch, whole and cut right after its longest sequence (no
    padding left there, the strictest cut), in inference mode (dropout would draw differently for two shapes).
    ``first_batch`` is as the feed stores it, ``timed`` its leaves with the time axis, ``spec`` the feed's elements',
    ``cut`` (batching.Cut) how a batch becomes micro-batches; ``unpack`` makes (x, y, sample_weight) of it (Keras'
    own by default)."""
    model = objective.model
    variables = model.trainable_variables
    unpack = unpack or keras.utils.unpack_x_y_sample_weight
    rows, lengths = by_length(tf.nest.map_structure(tf.convert_to_tensor, first_batch))
    start, end = [b for b in cut.bounds(int(tf.shape(tf.nest.flatten(rows)[0])[0])) if b[1] > b[0]][-1]
    whole = tf.nest.map_structure(lambda t: t[start:end], rows)  # the shortest micro-batch of the first batch
    trimmed = cut_after(whole, timed, lengths[start:end], 1)  # right after its longest: the most it can lose

    def steps(data):
        return next(t.shape[1] for t, cut in zip(tf.nest.flatten(data), tf.nest.flatten(timed)) if cut)

    length, time_steps = steps(trimmed), steps(whole)
    if length == time_steps:
        return  # nothing cut here: nothing to compare

    def measure(data):
        x, y, sample_weight = unpack(data)
        with tf.GradientTape() as tape:
            parts, _ = objective.evaluate(x, y, sample_weight, training=False, groups=groups)
            total = tf.add_n([parts.sums[g] for g in groups])
        grads = tape.gradient(total, model.trainable_variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        return parts.sums, parts.counts, grads

    with strategy.scope():  # traced for the feed's elements, as the probe that found ``groups`` was
        measured = graph(measure).get_concrete_function(spec)
        (sums, counts, grads), (cut_sums, cut_counts, cut_grads) = measured(whole), measured(trimmed)
    named = [("the number of values the loss averages", counts[g], cut_counts[g], 0.0) for g in counts]
    named += [("the loss summed", sums[g], cut_sums[g], 0.0) for g in groups]
    # A gradient that is zero in exact arithmetic (a key bias under a softmax, which cancels it) is rounding noise
    # of the size of the others: each gradient is held to its own size or a thousandth of the largest, if more.
    largest = max((float(np.max(np.abs(g), initial=0.0)) for g in grads), default=0.0)
    named += [(f"the gradient of {v.path}", g, c, 1e-3 * largest) for v, g, c in zip(variables, grads, cut_grads)]
    if objective.steps is None and any(_differ(counts[g], cut_counts[g]) for g in counts):
        raise Refused(
            "trim-divisor",
            f"{where}: trim_padding changes the number of values the loss of model {model.name!r} averages (a "
            f"micro-batch cut from {time_steps} to {length} steps): it divides by every position, padding included "
            f"(reduction 'sum_over_batch_size'), and the batches' length before the cut is not fixed: pad every "
            f"batch to one length, or leave trim_padding out",
        )
    for what, whole_value, cut_value, floor in named:
        if _differ(whole_value, cut_value, floor):
            raise Refused(
                "trim-changes-result",
                f"{where}: trim_padding changes {what} of model {model.name!r} (a micro-batch cut from "
                f"{time_steps} to {length} steps): padding must change nothing, so mask it "
                f"(Embedding(mask_zero=True), Masking) and keep layers that mix time steps masked, or leave "
                f"trim_padding out",
            )


def _differ(whole, cut, floor: float = 0.0) -> bool:
    """Whether two values of one micro-batch differ by more than the rounding of a sum taken over other lengths:
    1e-4 of their own size, or of ``floor`` where that is larger (and of 1e-6 at least)."""
    whole, cut = np.asarray(whole, np.float64), np.asarray(cut, np.float64)
    size = max(np.max(np.abs(whole), initial=0.0), floor, 1e-6)
    return bool(np.max(np.abs(whole - cut), initial=0.0) > 1e-4 * size)


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


def uncut(y, y_pred, sample_weight, steps: int):
    """A cut micro-batch's targets, outputs and sample weights as the compiled metrics take them: every leaf whose
    time axis was cut (of unknown length where traced) padded back to ``steps``, the steps cut away masked. Keras'
    mean metrics average each example over its time axis, and count it by its weights' mean over that axis: two
    micro-batches of different lengths would weigh their steps differently, where model.fit's uncut batch weighs
    every step alike."""

    def cut(t):
        return t is not None and t.shape.rank is not None and t.shape.rank >= 2 and t.shape[1] is None

    def pad(t):
        return tf.pad(t, [[0, 0], [0, steps - tf.shape(t)[1]]] + [[0, 0]] * (t.shape.rank - 2))

    def output(t):
        if not cut(t):
            return t
        mask = keras_private.get_keras_mask(t)
        padded = pad(t)
        keras_private.set_keras_mask(padded, pad(tf.ones(tf.shape(t)[:2], tf.bool) if mask is None else mask))
        return padded

    def other(t):
        return pad(t) if cut(t) else t

    return (
        tf.nest.map_structure(other, y),
        tf.nest.map_structure(output, y_pred),
        tf.nest.map_structure(other, sample_weight),
    )


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
        self.split, self.where = split, where
        self.trim = Held(tuple(p for p in (split.x, split.y, split.weights) if p is not None), multiple, where)
        self.timed, self.by_length = self.trim.timed, self.trim.by_length
        stored = tuple(part for part in split.tensors() if part is not None)
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
