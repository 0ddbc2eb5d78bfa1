"""accum_train.fit's ``trim_padding``: which steps of each example are padding, what the option asks of the model,
and the check that cutting the padding changes nothing the update computes.

A batch's examples are put in order of length and each micro-batch is cut after its longest sequence (arrays by
index, array_feed.py; streams in their pipeline, stream_feed.py): the update is still the whole batch's, as it
sums over the batch whatever the grouping, provided that the padding cut away changes neither the loss nor its
gradient, which masked recurrent layers and a masked loss guarantee and an unmasked convolution or mean over
time do not.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from ..errors import UserError
from .arguments import WHERE


def sequence_lengths(arrays):
    """(each example's length, which arrays are cut on axis 1) for trim_padding: the length is one past
    the example's last step where any input is nonzero (padding is zeros after the sequence, what
    Embedding(mask_zero=True) and Masking() take as such); every x, y or sample weight array whose axis 1 has
    that size is cut."""
    leaves = tf.nest.flatten(arrays[0])
    steps = _time_steps([a.shape for a in leaves], [a.dtype.kind in "SU" for a in leaves], "x has no array")
    inputs = [a for a in leaves if a.ndim >= 2]
    lengths = np.zeros(len(inputs[0]), np.int64)
    for a in inputs:
        used = (a != 0).reshape(len(a), steps, -1).any(axis=2)
        lengths = np.maximum(lengths, np.where(used.any(axis=1), steps - np.argmax(used[:, ::-1], axis=1), 0))
    timed = tf.nest.map_structure(lambda a: a.ndim >= 2 and a.shape[1] == steps, arrays)
    return lengths, timed


def _time_steps(shapes, strings, missing: str):
    """The one length of axis 1 of x's inputs with two axes or more (``shapes``: every input's; ``strings``: which
    hold text), arrays' and streams' alike; refused in one line where there is none, several, or text."""
    inputs = [i for i, shape in enumerate(shapes) if len(shape) >= 2]
    if not inputs:
        raise UserError(
            f"{WHERE}: trim_padding cuts sequences along axis 1, and {missing} with one (shapes {shapes}): leave "
            f"trim_padding out"
        )
    steps = {shapes[i][1] for i in inputs}
    if len(steps) > 1:  # a stream's unknown length (None) last
        raise UserError(
            f"{WHERE}: trim_padding needs every input of x to have the same length on axis 1, and they have "
            f"{sorted(steps, key=lambda d: (d is None, d or 0))}: pad them to one length, or leave trim_padding out"
        )
    if any(strings[i] for i in inputs):
        raise UserError(f"{WHERE}: trim_padding reads padding as zeros, and x holds strings: leave trim_padding out")
    return steps.pop()


def trim_multiple(trim_padding, model, strategy) -> int:
    """trim_padding as the multiple each micro-batch's length is rounded up to (0: off), checked."""
    if trim_padding is None or trim_padding is False:
        return 0
    multiple = 16 if trim_padding is True else trim_padding
    if isinstance(multiple, bool) or not isinstance(multiple, (int, np.integer)) or multiple < 1:
        raise UserError(
            f"{WHERE}: trim_padding={trim_padding!r} must be True, False or a positive int (the multiple each "
            f"micro-batch's length is rounded up to)"
        )
    if strategy.num_replicas_in_sync > 1:
        raise UserError(
            f"{WHERE}: trim_padding runs on one replica, and the strategy has {strategy.num_replicas_in_sync}: "
            f"leave trim_padding out"
        )
    for tensor in model.inputs or []:
        if len(tensor.shape) >= 2 and tensor.shape[1] is not None:
            raise UserError(
                f"{WHERE}: trim_padding gives micro-batches of several lengths, and model {model.name!r} takes "
                f"inputs of shape {tuple(tensor.shape)}: build it on keras.Input(shape=(None, ...)), or leave "
                f"trim_padding out"
            )
    return int(multiple)


def check_trim(objective, groups, feed, cut, strategy) -> None:
    """Refuse trim_padding where cutting the padding changes the update: compare the normalisers, loss sums and
    gradients of the first batch's shortest micro-batch, whole and cut right after its longest sequence (no
    padding left there, the strictest cut), in inference mode (dropout would draw differently for two shapes)."""
    model = objective.model
    variables = model.trainable_variables
    rows, lengths = by_length(tf.nest.map_structure(tf.convert_to_tensor, feed.first_batch()))
    start, end = [b for b in cut.bounds(int(tf.shape(tf.nest.flatten(rows)[0])[0])) if b[1] > b[0]][-1]
    whole = tf.nest.map_structure(lambda t: t[start:end], rows)  # the shortest micro-batch of the first batch
    trimmed = cut_after(whole, feed.timed, lengths[start:end], 1)  # right after its longest: the most it can lose

    def steps(data):
        return next(t.shape[1] for t, timed in zip(tf.nest.flatten(data), tf.nest.flatten(feed.timed)) if timed)

    length, time_steps = steps(trimmed), steps(whole)
    if length == time_steps:
        return  # nothing cut here: nothing to compare

    def measure(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            parts, _ = objective.evaluate(x, y, sample_weight, training=False, groups=groups)
            total = tf.add_n([parts.sums[g] for g in groups])
        grads = tape.gradient(total, model.trainable_variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        return parts.sums, parts.counts, grads

    with strategy.scope():  # traced for the feed's elements, as the probe that found ``groups`` was
        measured = tf.function(measure).get_concrete_function(feed.element_spec)
        (sums, counts, grads), (cut_sums, cut_counts, cut_grads) = measured(whole), measured(trimmed)
    named = [("the number of values the loss averages", counts[g], cut_counts[g]) for g in counts]
    named += [("the loss summed", sums[g], cut_sums[g]) for g in groups]
    named += [(f"the gradient of {v.path}", g, c) for v, g, c in zip(variables, grads, cut_grads)]
    for what, whole_value, cut_value in named:
        if _differ(whole_value, cut_value):
            raise UserError(
                f"{WHERE}: trim_padding changes {what} of model {model.name!r} (a micro-batch cut from "
                f"{time_steps} to {length} steps): padding must change nothing, so mask it "
                f"(Embedding(mask_zero=True), Masking) and keep layers that mix time steps masked, or leave "
                f"trim_padding out"
            )


def _differ(whole, cut) -> bool:
    """Whether two values of one micro-batch differ by more than the rounding of a sum taken over other lengths."""
    whole, cut = np.asarray(whole, np.float64), np.asarray(cut, np.float64)
    return bool(np.max(np.abs(whole - cut), initial=0.0) > 1e-4 * max(np.max(np.abs(whole), initial=0.0), 1e-6))


def stream_timed(spec):
    """For batches read from a stream (their ``spec``): which leaves are cut on axis 1, the inputs of x with two
    axes or more and every leaf whose axis 1 is theirs (of unknown size where theirs is: padded_batch)."""
    leaves = tf.nest.flatten(spec[0] if isinstance(spec, tuple) else spec)
    shapes = [tuple(s.shape) if s.shape.rank is not None else () for s in leaves]
    steps = _time_steps(shapes, [s.dtype == tf.string for s in leaves], "x's batches have no input")
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


def cut_after(data, timed, lengths, multiple):
    """``data`` with its ``timed`` leaves cut after the longest of ``lengths``, rounded up to ``multiple`` (at least
    one multiple: an empty micro-batch, or one of empty sequences, keeps a time axis a model can run)."""
    steps = tf.shape(next(t for t, cut in zip(tf.nest.flatten(data), tf.nest.flatten(timed)) if cut), tf.int64)[1]
    longest = tf.reduce_max(tf.concat([tf.ones([1], tf.int64), tf.cast(lengths, tf.int64)], 0))
    end = tf.minimum((longest + multiple - 1) // multiple * multiple, steps)
    return tf.nest.map_structure(lambda t, cut: t[:, :end] if cut else t, data, timed)
