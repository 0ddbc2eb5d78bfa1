"""trim_padding's graphs (the cut itself: accum/trainer/data/feed.py; the policy: lengths.py): the check that
cutting the padding changes nothing the update computes, and a cut micro-batch padded back for the compiled metrics."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from ... import keras_private
from ...trainer.data.feed import by_length, cut_after
from ...trainer.data.lengths import differ, judge_trim
from .graphs import graph


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
    divisor = any(differ(counts[g], cut_counts[g]) for g in counts)
    judge_trim(named, divisor and objective.steps is None, model.name, time_steps, length, where)


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
