"""The gradient cache: one replica-local float32 variable per trainable variable (and one for the loss), which
micro-batches add to and an update reads, reduces and clears (engine.py), and the finite check of what it holds.

Replica-local (``ON_READ``, ``SUM``): under a strategy each replica adds to its own, and no collective runs while
micro-batches accumulate; the engine's one all-reduce sums them per update."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

REPLICA_LOCAL = dict(synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM)


class GradientCache:
    """One zero-initialised, replica-local float32 tf.Variable per trainable variable, and one for the loss.

    float32 whatever the compute precision: k micro-batch gradients summed in 16 bits would lose what
    accumulation is for."""

    def __init__(self, variables: Sequence[tf.Variable]):
        self.variables = list(variables)
        self.slots = [
            tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=f"grad_cache_{i}", **REPLICA_LOCAL)
            for i, v in enumerate(self.variables)
        ]
        self.loss = tf.Variable(0.0, trainable=False, name="loss_cache", **REPLICA_LOCAL)
        # The gradient noise scale's sums over this replica's micro-batches (accum/noise.py): the squared norm of
        # each one's mean gradient, 1 / its examples, and how many there were (empty ones count nothing).
        self.noise = tf.Variable(tf.zeros([3]), trainable=False, name="noise_cache", **REPLICA_LOCAL)

    def clear(self):
        # tf.zeros of the shape, not zeros_like(slot): reading a replica-local variable in cross-replica
        # context would be a collective
        for slot in self.slots:
            slot.assign(tf.zeros(slot.shape, slot.dtype))
        self.loss.assign(0.0)
        self.noise.assign(tf.zeros([3]))

    def add(self, gradients, loss=0.0, noise=None):
        for slot, grad in zip(self.slots, gradients):
            if grad is not None:  # a variable the loss does not touch keeps a zero gradient
                slot.assign_add(tf.cast(grad, tf.float32))
        self.loss.assign_add(loss)
        if noise is not None:
            self.noise.assign_add(noise)

    def gradients(self):
        """This replica's sums (on one device: the cache); read on the host, the sum over replicas."""
        return [slot.read_value() for slot in self.slots]


def all_finite(loss, gradients):
    finite = tf.math.is_finite(loss)
    for grad in gradients:
        if grad is not None:
            finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))
    return finite
