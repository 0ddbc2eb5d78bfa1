"""The gradient cache: one replica-local float32 variable per trainable variable, which micro-batches add to and an
update reads, reduces and clears (engine.py: one cache per normaliser of the loss).

Replica-local (``ON_READ``, ``SUM``): under a strategy each replica adds to its own, and no collective runs while
micro-batches accumulate; the engine's one all-reduce sums them per update."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from ...text import size_text

REPLICA_LOCAL = dict(synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM)


class GradientCache:
    """One zero-initialised, replica-local float32 tf.Variable per trainable variable.

    float32 whatever the compute precision: k micro-batch gradients summed in 16 bits would lose what
    accumulation is for."""

    def __init__(self, variables: Sequence[tf.Variable]):
        self.variables = list(variables)
        self.slots = [
            tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=f"grad_cache_{i}", **REPLICA_LOCAL)
            for i, v in enumerate(self.variables)
        ]

    def clear(self):
        # tf.zeros of the shape, not zeros_like(slot): reading a replica-local variable in cross-replica
        # context would be a collective
        for slot in self.slots:
            slot.assign(tf.zeros(slot.shape, slot.dtype))

    def add(self, gradients):
        for slot, grad in zip(self.slots, gradients):
            if grad is not None:  # a variable the loss does not touch keeps a zero gradient
                slot.assign_add(dense(grad))

    def gradients(self):
        """This replica's sums (on one device: the cache); read on the host, the sum over replicas."""
        return [slot.read_value() for slot in self.slots]


def cache_line(engine, frozen: int) -> str:
    """What the gradient caches of ``engine`` hold, as the first line of a verbose fit says it: their size (float32
    whatever the weights' dtype), and the variables that are not held (frozen: LoRA's base weights, for one)."""
    caches = getattr(engine, "caches", [])
    size = sum(slot.shape.num_elements() * 4 for cache in caches for slot in cache.slots)
    variables = len(caches[0].slots) if caches else 0
    return (
        f"gradient cache: {size_text(size)} in float32, {variables} trainable variables x {len(caches)} "
        f"loss normaliser(s); {frozen} frozen variables not held"
    )


def dense(gradient) -> tf.Tensor:
    """A gradient as the cache adds it: dense (an Embedding's tf.IndexedSlices summed per row), float32."""
    return tf.cast(tf.convert_to_tensor(gradient), tf.float32)
