"""A compiled Keras loss taken apart into sums and normalisers (objective.py), so that micro-batches add up to
their batch: what ``accum_train.fit`` and a keras_file run with a Keras loss train with.

For each output, Keras' loss over a batch is ``S / D``: ``S`` the sum of the
output's per-element values times their sample weights (and mask), ``D`` its
normaliser: the element count (``sum_over_batch_size``), the valid entries
under a mask, the sum of the sample weights (``mean_with_sample_weight``), or
1 (``sum``). ``S`` and ``D`` are both sums over the batch's examples, hence
over its micro-batches and replicas: the accumulator (engine.py) accumulates
the gradient of ``S`` and the sum of ``D`` and divides once, after the update's
all-reduce.
Averaging micro-batch losses instead (what Keras' own
``gradient_accumulation_steps`` does) weighs a micro-batch with few valid
tokens as much as one with many.

Outputs whose ``D`` is a fixed multiple of the example count share one
normaliser, ``examples``; so do the losses layers add in ``call()``, taken as
means over the batch's examples (as Keras' activity regularizers are). Each
output whose ``D`` depends on the data (a mask, a sample-weighted mean, a
shape that changes from batch to batch) has a normaliser of its own, and so
its own gradient cache and backward pass. ``sum`` losses need none (``total``).
Weight regularizers do not depend on the data: they are counted once per
update (``regularization``).
"""

from __future__ import annotations

import copy

import keras
import tensorflow as tf

from ... import keras_private
from ...errors import Refused
from .graphs import graph
from .objective import EXAMPLES, TOTAL, Parts


def _shape(tensor) -> str:
    dims = ["batch" if i == 0 else str(d) for i, d in enumerate(tensor.shape.as_list())]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _take_apart(loss, y_true, y_pred, sample_weight, steps=None):
    """(S, D, kind) of one output's loss: ``loss(y_true, y_pred, sample_weight) == S / D`` as Keras reduces it
    (Loss.__call__ and reduce_weighted_values, with the mask and the sample weights merged the same way).
    kind: "sum" (D is 1 for the whole batch), ("examples", e) (D is e per example), or "data". ``steps``: under
    trim_padding, the time axis' length before the cut: a mean over every position (padding included) divides by
    that many per example, as the uncut batch's mean does."""
    in_mask = keras_private.get_keras_mask(y_pred)
    y_pred = tf.nest.map_structure(lambda t: keras.ops.convert_to_tensor(t, dtype=loss.dtype), y_pred)
    y_true = tf.nest.map_structure(lambda t: keras.ops.convert_to_tensor(t, dtype=loss.dtype), y_true)
    values = loss.call(y_true, y_pred)
    out_mask = keras_private.get_keras_mask(values)
    if in_mask is not None and out_mask is not None:
        mask = tf.logical_and(tf.cast(in_mask, tf.bool), tf.cast(out_mask, tf.bool))
    else:
        mask = in_mask if in_mask is not None else out_mask
    values = keras.ops.convert_to_tensor(values, dtype=loss.dtype)
    weights = None if sample_weight is None else keras.ops.convert_to_tensor(sample_weight, dtype=loss.dtype)
    if mask is not None:
        float_mask = tf.cast(mask, values.dtype)
        if weights is None:
            weights = float_mask
        else:
            float_mask, weights = keras_private.squeeze_or_expand_to_same_rank(float_mask, weights)
            weights = weights * float_mask
    if values.shape.rank == 0:  # a loss function that reduces the batch itself: taken as a mean over its examples
        n = tf.cast(tf.shape(tf.nest.flatten(y_pred)[0])[0], values.dtype)
        return values * n, n, ("examples", 1)
    if weights is not None:
        values, weights = keras_private.squeeze_or_expand_to_same_rank(values, weights)
        if weights.shape.rank is not None and values.shape.rank is not None and weights.shape.rank > values.shape.rank:
            # broadcasting would pair the weights' batch axis with another (TensorFlow fails only as it runs)
            raise ValueError(
                f"sample weights of shape {_shape(weights)} do not fit the loss values of shape {_shape(values)}: "
                "give one weight per example, or one per loss value"
            )
        values = values * weights
    total = tf.reduce_sum(values)
    if loss.reduction == "sum":
        return total, None, "sum"
    if loss.reduction == "mean_with_sample_weight" and weights is not None:
        return total, tf.reduce_sum(weights), "data"
    elements = tf.cast(tf.size(values), values.dtype)
    if mask is not None:  # the valid entries (sample weights do not count), per element of the values
        valid = tf.reduce_sum(tf.cast(mask, values.dtype))
        return total, tf.math.divide_no_nan(valid * elements, tf.cast(tf.size(mask), values.dtype)), "data"
    per_example = values.shape[1:]
    if steps is not None and per_example.rank >= 1 and per_example[0] is None and per_example[1:].is_fully_defined():
        per_example = tf.TensorShape([steps, *per_example[1:]])  # axis 1 was cut: count it uncut
        e = per_example.num_elements()
        return total, tf.cast(tf.shape(values)[0], values.dtype) * e, ("examples", e)
    if per_example.is_fully_defined():
        return total, elements, ("examples", per_example.num_elements())
    return total, elements, "data"


class KerasObjective:
    """The model's compiled loss (and the losses its layers add) as normalisers and sums.

    Which normalisers a micro-batch has depends on the model and on what the data holds (sample weights,
    masks, static shapes): ``probe`` finds them for a data source by tracing, before the accumulator creates
    its caches (``groups``), and ``parts`` gives every micro-batch of that source the same ones. ``where``:
    who refuses a loss that cannot be accumulated (the error's first words)."""

    def __init__(self, model: keras.Model, where: str = "accum_train.fit", steps: int | None = None):
        self.model = model
        self.entries = keras_private.flat_losses(model)
        for entry in self.entries:
            if entry.loss.reduction in (None, "none"):
                raise Refused(
                    "loss-reduction",
                    f"{where}: loss {entry.loss.name!r} has reduction={entry.loss.reduction!r}: give it "
                    f"'sum_over_batch_size' (the mean, model.fit's default) or 'sum', whose gradients add up over "
                    f"micro-batches",
                )
        self.regularized = [v for v in model.trainable_weights if getattr(v, "regularizer", None) is not None]
        self.kinds: list = ["data"] * len(self.entries)  # per compiled loss: "sum", "examples" or "data"
        self.groups: tuple = ()  # the normalisers of the data the last ``probe`` traced
        # trim_padding: the time axis' length before the cut (lengths.uncut_steps), which a mean over every position
        # still divides by; None: nothing is cut, or the length is not known (then the cut is checked, and refused)
        self.steps = steps

    def with_steps(self, steps: int | None) -> KerasObjective:
        """The same loss for data whose time axis is ``steps`` long before the cut (fit's validation data)."""
        other = copy.copy(self)
        other.steps = steps
        return other

    def probe(self, element_spec, strategy) -> tuple:
        """The normalisers of the data whose elements ``element_spec`` describes, in a fixed order, found by
        tracing one micro-step (no data read, nothing run). A loss that cannot take the targets fails here,
        before anything trains."""
        found = []

        def step(*element):
            data = element if len(element) > 1 else element[0]
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            found.append(self.parts(x, y, self.model(x, training=True), sample_weight))
            return tf.constant(0.0)

        specs = element_spec if isinstance(element_spec, tuple) else (element_spec,)
        with strategy.scope():
            graph(step).get_concrete_function(*specs)  # traced as the micro-step is (graphs.py)
        self.groups = tuple(sorted(found[0].sums, key=lambda g: (g != EXAMPLES, g != TOTAL, g)))
        return self.groups

    def evaluate(self, x, y, sample_weight, training: bool, groups=None):
        """(Parts, predictions) of one micro-batch, every one of ``groups`` there (default: the last probed)."""
        y_pred = self.model(x, training=training)
        return self.parts(x, y, y_pred, sample_weight, self.groups if groups is None else groups), y_pred

    def parts(self, x, y, y_pred, sample_weight, groups=()) -> Parts:
        """One micro-batch's sums and normalisers (call after ``y_pred = model(x, training=...)``); every one
        of ``groups`` is there, at zero if this micro-batch has none of it."""
        n = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]  # as model.fit counts: x's first input
        parts = Parts(examples=tf.cast(n, tf.float32))
        taken = [None] * len(self.entries)

        def replace(index, entry):
            def take(y_t, y_p, sw):
                taken[index] = _take_apart(entry.loss, y_t, y_p, sw, self.steps)
                return tf.zeros(())

            return take

        if self.entries:
            with keras_private.each_output_loss(self.model, replace) as compiled:
                compiled.call(y, y_pred, sample_weight)

        def add(group, value, count=None):
            value = tf.cast(value, tf.float32)
            parts.sums[group] = parts.sums[group] + value if group in parts.sums else value
            if count is not None:  # a normaliser of its own; the examples are counted once
                parts.counts[group] = tf.cast(count, tf.float32)

        for i, (entry, (total, count, kind)) in enumerate(zip(self.entries, taken)):
            weight = 1.0 if entry.loss_weights is None else entry.loss_weights
            self.kinds[i] = kind if isinstance(kind, str) else "examples"
            if kind == "sum":
                add(TOTAL, total * weight)
                parts.outputs.append([tf.cast(total, tf.float32), tf.constant(0.0)])
            elif isinstance(kind, tuple):  # D = e per example: the shared normaliser counts examples
                add(EXAMPLES, total * (weight / kind[1]), n)  # D = n * e: the sum over e, the count once
                parts.outputs.append([tf.cast(total, tf.float32), tf.cast(count, tf.float32)])
            else:
                add(f"output_{i}", total * weight, count)
                parts.outputs.append([tf.cast(total, tf.float32), tf.cast(count, tf.float32)])
        losses = self.model.losses  # those the model's layers added in this call, then the weight regularizers
        added = [tf.cast(tf.reduce_sum(loss), tf.float32) for loss in losses[: len(losses) - len(self.regularized)]]
        if added:  # means over the batch's examples (Keras' activity regularizers divide by the batch size)
            add(EXAMPLES, tf.add_n(added) * tf.cast(n, tf.float32), n)
        if groups and not set(parts.sums) <= set(groups):
            raise RuntimeError(f"normalisers {sorted(parts.sums)} outside those probed, {sorted(groups)}")
        for group in groups:  # every micro-batch carries every normaliser, even at zero
            parts.sums.setdefault(group, tf.constant(0.0))
            if group != TOTAL:
                parts.counts.setdefault(group, tf.constant(0.0))
        return parts

    def regularization(self):
        """The weight regularizers' sum (counted once per update), or None."""
        if not self.regularized:
            return None
        return tf.add_n([tf.cast(tf.reduce_sum(v.regularizer(v)), tf.float32) for v in self.regularized])
