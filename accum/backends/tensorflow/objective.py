"""A loss as what micro-batches add up: per normaliser a sum and a count, so that any cut of a batch adds up to
the batch's own loss.

A batch's loss is a sum over normalisers ``g`` of ``S_g / D_g``, plus what does not depend on the data (the
weight regularizers, once). ``S_g`` is a sum over the batch's examples of their weighted loss values, ``D_g``
its normaliser, also a sum over the examples: the examples themselves (``EXAMPLES``), the valid entries under
a mask, the sample weights; or none at all (``TOTAL``: a ``reduction="sum"`` loss). Both are sums over
micro-batches and replicas, so the accumulator (engine.py) differentiates each micro-batch's part of ``S_g``
into a gradient cache, adds up its part of ``D_g``, and divides once, after the update's one all-reduce.
Averaging micro-batch losses instead weighs a micro-batch with few examples (or valid tokens) as much as one
with many.

An objective gives, for a micro-batch, its ``Parts`` (``evaluate``), the ``groups`` (normalisers) every
micro-batch carries, and the ``regularization`` counted once per update. ``PerExample`` is the one-normaliser
case: a loss given per example, divided by the batch's examples (the built-in cross-entropy, and any
``loss_fn(x, y)``). A compiled Keras loss is taken apart by keras_objective.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import tensorflow as tf

from .gradient_cache import REPLICA_LOCAL

EXAMPLES, TOTAL = "examples", "total"


@dataclass
class Parts:
    """One micro-batch's share of the update's loss."""

    examples: tf.Tensor  # how many examples it holds
    sums: dict = field(default_factory=dict)  # normaliser -> the weighted sum S of the losses it divides
    counts: dict = field(default_factory=dict)  # normaliser -> this micro-batch's part of D (none for TOTAL)
    outputs: list = field(default_factory=list)  # per loss: [S, D] unweighted (D 0 for a sum loss)

    def flat(self) -> tuple:
        """Its fields as a tuple, the structure a tf.function (an XLA one) returns; ``Parts(*flat)`` again."""
        return (self.examples, self.sums, self.counts, self.outputs)


def cross_entropy(labels, logits):
    """Per-example cross-entropy of integer labels against logits: the built-in nets' loss."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32), logits=logits)


class PerExample:
    """A loss given per example and normalised by the batch's examples: one normaliser, ``EXAMPLES``.

    ``losses(x, y, training)`` gives the micro-batch's per-example losses (a vector) and its predictions (or
    None); sample weights, if any, weigh them."""

    groups = (EXAMPLES,)
    kinds = ("examples",)  # per loss: "sum", "examples" or "data" (keras_objective.py)
    steps = None  # the time axis' length before trim_padding's cut (a KerasObjective's): none here

    def __init__(self, losses: Callable):
        self.losses = losses

    def evaluate(self, x, y, sample_weight, training: bool, groups=None):
        """(Parts, predictions) of one micro-batch (its one normaliser, whatever ``groups`` asks)."""
        values, predictions = self.losses(x, y, training)
        if sample_weight is not None:
            values = values * tf.cast(tf.reshape(sample_weight, tf.shape(values)), values.dtype)
        total = tf.cast(tf.reduce_sum(values), tf.float32)
        examples = tf.cast(tf.shape(values)[0], tf.float32)
        parts = Parts(examples=examples, sums={EXAMPLES: total}, counts={EXAMPLES: examples})
        parts.outputs.append([total, examples])
        return parts, predictions

    @staticmethod
    def regularization():
        return None


def classifier(forward: Callable) -> PerExample:
    """The built-in objective: the cross-entropy of ``forward(x, training)``'s logits against integer labels."""

    def losses(x, y, training):
        logits = forward(x, training)
        return cross_entropy(y, logits), logits

    return PerExample(losses)


def sparse_softmax_loss(forward: Callable, training: bool = True) -> Callable:
    """``loss_fn(x, y)``: the built-in cross-entropy of ``forward``'s logits per example (the oracle's loss)."""
    return lambda x, y: cross_entropy(y, forward(x, training))


def as_objective(objective):
    """An objective, or a per-example ``loss_fn(x, y)`` (in training mode) made one."""
    return objective if hasattr(objective, "evaluate") else PerExample(lambda x, y, _: (objective(x, y), None))


def scale_of(group, n):
    """What a micro-batch's sum of ``group`` is divided by as it is added up: the batch ``n`` (the magnitude of
    a batch mean, what a 16-bit loss scale expects), or 1 for a sum that no normaliser divides."""
    return tf.constant(1.0) if group == TOTAL else tf.cast(n, tf.float32)


class Totals:
    """Replica-local sums of an update's (or an evaluation's) loss: per normaliser the sum (divided by its
    ``scale_of``) and the normaliser's total, per loss [sum, normaliser], and the examples."""

    def __init__(self, groups, outputs: int):
        self.groups = tuple(groups)
        self.sums = {g: tf.Variable(0.0, trainable=False, name=f"sum_{g}", **REPLICA_LOCAL) for g in groups}
        self.counts = {
            g: tf.Variable(0.0, trainable=False, name=f"count_{g}", **REPLICA_LOCAL) for g in groups if g != TOTAL
        }
        self.outputs = tf.Variable(tf.zeros([max(outputs, 1), 2]), trainable=False, name="outputs", **REPLICA_LOCAL)
        self.examples = tf.Variable(0.0, trainable=False, name="examples", **REPLICA_LOCAL)

    def zeros(self) -> dict:
        """No micro-batch yet, as ``plus`` and ``values`` give the totals."""
        return {
            "sums": [tf.constant(0.0) for _ in self.groups],
            "counts": [tf.constant(0.0) for _ in self.counts],
            "outputs": tf.zeros(self.outputs.shape),
            "examples": tf.constant(0.0),
        }

    def plus(self, totals: dict, parts: Parts, shares: dict) -> dict:
        """``totals`` with one micro-batch added: ``shares`` its sums as divided (``scale_of``), ``parts`` the
        rest."""
        outputs = totals["outputs"]
        if parts.outputs:
            outputs = outputs + tf.stack([tf.stack(pair) for pair in parts.outputs])
        return {
            "sums": [total + shares[g] for total, g in zip(totals["sums"], self.groups)],
            "counts": [total + parts.counts[g] for total, g in zip(totals["counts"], self.counts)],
            "outputs": outputs,
            "examples": totals["examples"] + parts.examples,
        }

    def add(self, totals: dict) -> None:
        """Sums (``plus``'s, or a loop's total of them) into the variables."""
        for variable, value in zip(self._variables(), [*totals["sums"], *totals["counts"]]):
            variable.assign_add(value)
        self.outputs.assign_add(totals["outputs"])
        self.examples.assign_add(totals["examples"])

    def values(self) -> dict:
        """This replica's totals, as ``plus`` gives them."""
        return {
            "sums": [self.sums[g].read_value() for g in self.groups],
            "counts": [count.read_value() for count in self.counts.values()],
            "outputs": self.outputs.read_value(),
            "examples": self.examples.read_value(),
        }

    def clear(self) -> None:
        for variable in [*self._variables(), self.examples]:
            variable.assign(0.0)
        self.outputs.assign(tf.zeros(self.outputs.shape))

    def _variables(self) -> list:
        return [*(self.sums[g] for g in self.groups), *self.counts.values()]


def combine(totals: dict, groups, n):
    """(factor per normaliser, the loss) of reduced ``totals``: each sum was divided by ``scale_of(g, n)``, and is
    multiplied by scale / D once (so with D the batch, the factor is exactly 1)."""
    counts = iter(totals["counts"])
    factors = [tf.constant(1.0) if g == TOTAL else tf.math.divide_no_nan(scale_of(g, n), next(counts)) for g in groups]
    loss = tf.add_n([f * s for f, s in zip(factors, totals["sums"])])
    return factors, loss


def output_values(totals: dict, kinds) -> list:
    """Each loss's unweighted value over the update: sum / normaliser (a sum loss: its sum)."""
    outputs = totals["outputs"]
    return [
        outputs[i, 0] if kind == "sum" else tf.math.divide_no_nan(outputs[i, 0], outputs[i, 1])
        for i, kind in enumerate(kinds)
    ]


def units(parts: Parts, groups):
    """A micro-batch's size as the gradient noise scale counts it (noise.py): its count of the one normaliser
    there is (examples, or valid tokens), else its examples."""
    if len(groups) == 1 and groups[0] != TOTAL:
        return parts.counts[groups[0]]
    return parts.examples
