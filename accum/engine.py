"""The accumulation engine: a gradient cache and a one-graph-call update.

A batch of ``n`` examples is cut into ``k = min(subdivisions, n)`` contiguous
micro-batches whose sizes differ by at most one. Each micro-batch adds the
gradient of ``sum(per-example loss) / n`` to the cache, so the cache ends up
holding the gradient of the *mean loss over the whole batch*, whatever the
split: ragged micro-batches and a short last batch are weighted by their
example counts. (Dividing by ``subdivisions``, or averaging micro-batch means
as equals, is biased as soon as the sizes differ.)

The pieces are separately usable: ``GradientCache.clear``,
``AccumulatingUpdate.accumulate`` (one micro-batch) and
``AccumulatingUpdate.apply`` (clip, one ``apply_gradients``, commit the
BatchNorm statistics, clear). ``AccumulatingUpdate.update`` composes them
into ONE tf.function call per batch: the micro-batch loop is a ``tf.range``
loop inside the graph, so only one micro-batch of activations is alive at a
time and Python is entered once per update. Nothing here knows TensorLayer:
any list of variables and per-example loss function will do.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf


class GradientCache:
    """One zero-initialised tf.Variable per trainable variable, created once."""

    def __init__(self, variables: Sequence[tf.Variable]):
        self.variables = list(variables)
        self.slots = [
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                        name=f"grad_cache_{i}")
            for i, v in enumerate(self.variables)
        ]

    def clear(self):
        for slot in self.slots:
            slot.assign(tf.zeros_like(slot))

    def add(self, gradients):
        for slot, grad in zip(self.slots, gradients):
            if grad is not None:  # a variable the loss does not touch keeps a zero gradient
                slot.assign_add(tf.convert_to_tensor(grad))

    def gradients(self):
        return [slot.read_value() for slot in self.slots]


def micro_bounds(i, n, k):
    """[start, end) of micro-batch i of k over n examples: sizes differ by at most one."""
    return (i * n) // k, ((i + 1) * n) // k


class AccumulatingUpdate:
    """The subdivided update: accumulate k micro-batches, apply once.

    ``loss_fn(x, y)`` returns the per-example loss (a vector) of a micro-batch
    in training mode. ``norm_layers`` are objects with ``commit()`` and
    ``discard()`` (AccumBatchNorm with ``deferred=True``): their moving
    statistics are folded in once per applied update.
    """

    def __init__(self, loss_fn: Callable, variables: Sequence[tf.Variable], optimizer,
                 subdivisions: int, clip_norm: Optional[float] = None, norm_layers=(),
                 input_signature=None):
        self.loss_fn = loss_fn
        self.variables = list(variables)
        self.optimizer = optimizer
        self.clip_norm = clip_norm
        self.norm_layers = list(norm_layers)
        self.cache = GradientCache(self.variables)
        # A variable, not a Python int, so that changing k (subdivisions: auto,
        # retry after out-of-memory) never retraces the graph.
        self.subdivisions = tf.Variable(int(subdivisions), trainable=False, dtype=tf.int32,
                                        name="subdivisions")
        kwargs = {"input_signature": input_signature} if input_signature else {"reduce_retracing": True}
        self.update = tf.function(self._update, **kwargs)
        self.accumulate = tf.function(self._accumulate, reduce_retracing=True)

    def set_subdivisions(self, k: int) -> None:
        self.subdivisions.assign(int(k))

    def _accumulate(self, x, y, batch_examples):
        """Add the gradient of this micro-batch's share of the batch's mean loss."""
        with tf.GradientTape() as tape:
            losses = self.loss_fn(x, y)
            share = tf.reduce_sum(losses) / tf.cast(batch_examples, losses.dtype)
        self.cache.add(tape.gradient(share, self.variables))
        return share

    def apply(self):
        """Clip and apply the cached gradient once, fold BatchNorm stats, clear."""
        grads = self.cache.gradients()
        norm = tf.linalg.global_norm(grads)
        if self.clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=norm)
        self.optimizer.apply_gradients(zip(grads, self.variables))
        for layer in self.norm_layers:
            layer.commit()
        self.cache.clear()
        return norm

    def skip(self):
        """Drop a bad update: weights, optimizer state and statistics stay as they were."""
        for layer in self.norm_layers:
            layer.discard()
        self.cache.clear()
        return tf.constant(float("nan"))

    def _update(self, x, y):
        n = tf.shape(y)[0]
        k = tf.minimum(self.subdivisions, n)  # a short last batch may have fewer examples than k
        loss = tf.constant(0.0)
        for i in tf.range(k):
            start, end = micro_bounds(i, n, k)
            loss += self._accumulate(x[start:end], y[start:end], n)
        finite = tf.math.is_finite(loss)
        for grad in self.cache.gradients():
            finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))
        grad_norm = tf.cond(finite, self.apply, self.skip)
        return {"loss": loss, "grad_norm": grad_norm, "applied": finite}


class PlainUpdate:
    """The baseline: the whole batch in one pass, no cache (the seed's ``ori_optim_op``)."""

    def __init__(self, loss_fn: Callable, variables: Sequence[tf.Variable], optimizer,
                 clip_norm: Optional[float] = None, norm_layers=(), input_signature=None):
        self.loss_fn = loss_fn
        self.variables = list(variables)
        self.optimizer = optimizer
        self.clip_norm = clip_norm
        self.norm_layers = list(norm_layers)
        kwargs = {"input_signature": input_signature} if input_signature else {"reduce_retracing": True}
        self.update = tf.function(self._update, **kwargs)

    def _update(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(self.loss_fn(x, y))
        grads = tape.gradient(loss, self.variables)
        norm = tf.linalg.global_norm(grads)
        finite = tf.math.is_finite(loss) & tf.math.is_finite(norm)
        if self.clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=norm)

        def apply():
            self.optimizer.apply_gradients(zip(grads, self.variables))
            for layer in self.norm_layers:
                layer.commit()
            return norm

        def skip():
            for layer in self.norm_layers:
                layer.discard()
            return tf.constant(float("nan"))

        grad_norm = tf.cond(finite, apply, skip)
        return {"loss": loss, "grad_norm": grad_norm, "applied": finite}


def sparse_softmax_loss(forward: Callable) -> Callable:
    """Per-example cross-entropy of integer labels against logits in training mode."""
    def loss_fn(x, y):
        logits = forward(x, True)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.int32), logits=logits)
    return loss_fn
