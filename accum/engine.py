"""The accumulation engine: a gradient cache and a one-graph-call update.

A batch of ``n`` examples is cut into ``k = min(subdivisions, n)`` contiguous
micro-batches whose sizes differ by at most one. Each micro-batch adds the
gradient of ``sum(per-example loss) / n`` to the cache, so the cache ends up
holding the gradient of the *mean loss over the whole batch*, whatever the
split: ragged micro-batches and a short last batch are weighted by their
example counts. (Dividing by ``subdivisions``, or averaging micro-batch means
as equals, is biased as soon as the sizes differ.)

The pieces are separately usable: ``GradientCache.clear``,
``AccumulatingUpdate.accumulate`` (one micro-batch),
``AccumulatingUpdate.accumulate_batch`` (all k micro-batches of a batch) and
``AccumulatingUpdate.finish`` (apply the cache once, or skip it if anything in
it is not finite). ``AccumulatingUpdate.update`` composes them into ONE
tf.function call per batch: the micro-batch loop is a ``tf.range`` loop
inside the graph, so only one micro-batch of activations is alive at a time
and Python is entered once per update. Nothing here knows TensorLayer: any
list of variables and per-example loss function will do.

Every engine counts, inside its graph, the updates it skipped in all and in a
row; the training loop reads the counters after each update and checkpoints
them, so they are never stale.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

NAN = float("nan")


class GradientCache:
    """One zero-initialised tf.Variable per trainable variable, created once.

    ``variable_kwargs`` go to every slot, e.g. ``synchronization`` and
    ``aggregation`` for replica-local slots under tf.distribute."""

    def __init__(self, variables: Sequence[tf.Variable], **variable_kwargs):
        self.variables = list(variables)
        self.slots = [
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"grad_cache_{i}", **variable_kwargs)
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


def all_finite(loss, gradients):
    finite = tf.math.is_finite(loss)
    for grad in gradients:
        if grad is not None:
            finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))
    return finite


class Update:
    """What every engine shares: one clipped apply per update, or a skip.

    ``norm_layers`` are objects with ``deferred``, ``commit()`` and
    ``discard()`` (AccumBatchNorm): the engine defers their moving statistics
    and folds them in once per applied update.
    """

    def __init__(self, variables: Sequence[tf.Variable], optimizer, clip_norm: Optional[float] = None,
                 norm_layers=()):
        self.variables = list(variables)
        self.optimizer = optimizer
        self.clip_norm = clip_norm
        self.norm_layers = list(norm_layers)
        for layer in self.norm_layers:
            layer.deferred = True  # moving statistics move once per update, not per micro-batch
        self.bad_updates_in_a_row = tf.Variable(0, dtype=tf.int64, trainable=False, name="bad_updates_in_a_row")
        self.skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_updates")

    def learning_rate(self):
        """The rate the next apply_gradients uses (the schedule at optimizer.iterations)."""
        return tf.cast(self.optimizer.learning_rate, tf.float32)

    def _apply_gradients(self, gradients):
        """Clip, apply once, commit BatchNorm statistics; (global norm, learning rate used)."""
        norm = tf.linalg.global_norm(gradients)
        if self.clip_norm is not None:
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm, use_norm=norm)
        rate = self.learning_rate()  # read before the apply advances optimizer.iterations
        self.optimizer.apply_gradients([(g, v) for g, v in zip(gradients, self.variables) if g is not None])
        for layer in self.norm_layers:
            layer.commit()
        self.bad_updates_in_a_row.assign(0)
        return norm, rate

    def _skip(self):
        """Drop a bad update: weights, optimizer state and statistics stay as they were."""
        for layer in self.norm_layers:
            layer.discard()
        self.bad_updates_in_a_row.assign_add(1)
        self.skipped_updates.assign_add(1)
        return tf.constant(NAN), tf.constant(NAN)

    def _finish(self, loss, gradients):
        applied = all_finite(loss, gradients)
        grad_norm, rate = tf.cond(applied, lambda: self._apply_gradients(gradients), self._skip)
        return {"loss": loss, "grad_norm": grad_norm, "applied": applied, "learning_rate": rate}

    def reset(self):
        """Forget a half-done update (pooled BatchNorm statistics)."""
        for layer in self.norm_layers:
            layer.discard()


def _function(fn, input_signature):
    kwargs = {"input_signature": input_signature} if input_signature else {"reduce_retracing": True}
    return tf.function(fn, **kwargs)


class AccumulatingUpdate(Update):
    """The subdivided update: accumulate k micro-batches, apply once.

    ``loss_fn(x, y)`` returns the per-example loss (a vector) of a micro-batch
    in training mode.
    """

    def __init__(self, loss_fn: Callable, variables: Sequence[tf.Variable], optimizer,
                 subdivisions: int, clip_norm: Optional[float] = None, norm_layers=(),
                 input_signature=None):
        super().__init__(variables, optimizer, clip_norm, norm_layers)
        self.loss_fn = loss_fn
        self.cache = GradientCache(self.variables)
        # A variable, not a Python int, so that changing k (subdivisions: auto,
        # retry after out-of-memory) never retraces the graph.
        self.subdivisions = tf.Variable(int(subdivisions), trainable=False, dtype=tf.int32,
                                        name="subdivisions")
        self.update = _function(self._update, input_signature)
        self.accumulate_batch = _function(self._accumulate_batch, input_signature)
        self.accumulate = tf.function(self._accumulate, reduce_retracing=True)
        self.finish = tf.function(self._finish_cache)

    def set_subdivisions(self, k: int) -> None:
        self.subdivisions.assign(int(k))

    def _accumulate(self, x, y, batch_examples):
        """Add the gradient of this micro-batch's share of the batch's mean loss."""
        with tf.GradientTape() as tape:
            losses = self.loss_fn(x, y)
            share = tf.reduce_sum(losses) / tf.cast(batch_examples, losses.dtype)
        self.cache.add(tape.gradient(share, self.variables))
        return share

    def _accumulate_batch(self, x, y):
        """All k micro-batches of one batch into the cache; the batch's mean loss."""
        n = tf.shape(y)[0]
        k = tf.minimum(self.subdivisions, n)  # a short last batch may have fewer examples than k
        loss = tf.constant(0.0)
        for i in tf.range(k):
            start, end = micro_bounds(i, n, k)
            loss += self._accumulate(x[start:end], y[start:end], n)
        return loss

    def _finish_cache(self, loss):
        """Apply what the cache holds once (or skip it if anything is not finite), then clear it."""
        out = self._finish(loss, self.cache.gradients())
        self.cache.clear()
        return out

    def _update(self, x, y):
        return self._finish_cache(self._accumulate_batch(x, y))

    def apply(self):
        """Clip and apply the cached gradient once, fold BatchNorm statistics, clear; the global norm."""
        norm, _ = self._apply_gradients(self.cache.gradients())
        self.cache.clear()
        return norm

    def reset(self):
        self.cache.clear()
        super().reset()


class PlainUpdate(Update):
    """The baseline: the whole batch in one pass, no cache (the seed's ``ori_optim_op``)."""

    def __init__(self, loss_fn: Callable, variables: Sequence[tf.Variable], optimizer,
                 clip_norm: Optional[float] = None, norm_layers=(), input_signature=None):
        super().__init__(variables, optimizer, clip_norm, norm_layers)
        self.loss_fn = loss_fn
        self.update = _function(self._update, input_signature)

    def _update(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(self.loss_fn(x, y))
        return self._finish(loss, tape.gradient(loss, self.variables))


def sparse_softmax_loss(forward: Callable) -> Callable:
    """Per-example cross-entropy of integer labels against logits in training mode."""
    def loss_fn(x, y):
        logits = forward(x, True)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.int32), logits=logits)
    return loss_fn
