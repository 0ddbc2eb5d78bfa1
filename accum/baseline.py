"""The baseline update (``baseline: true``): each replica's share of the batch in one pass, no gradient cache,
then the same one all-reduce, apply-or-skip and counters as the subdivided update (engine.py), for
``accum-train compare`` and the figures that set accumulation against one pass."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from .update import Update, _first, _function, _signal, _size


class PlainUpdate(Update):
    """The baseline: the whole batch in one pass, no cache (the seed's ``ori_optim_op``).

    Under a strategy each replica takes its contiguous share of the global batch
    in one pass (no micro-batch loop) and differentiates ``sum(per-example
    loss) / n``, n the global batch size, so that the replicas' gradients sum
    to that of the global mean loss in the same one all-reduce as the
    subdivided update's. ``update`` takes what AccumulatingUpdate's does: this
    process's examples of the global batch and ``n``. ``shared`` are Update's
    keyword arguments."""

    def __init__(
        self, loss_fn: Callable, variables: Sequence[tf.Variable], optimizer, *, input_signature=None, **shared
    ):
        super().__init__(variables, optimizer, **shared)
        self.loss_fn = loss_fn
        signature = (
            (*input_signature, tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)) if input_signature else None
        )
        self._update = _function(self._update_all, signature)
        self._update_pulled = tf.function(self._update_from)

    def update(self, x, y, n=None, stop=0):
        """One update from a batch: one graph call; as AccumulatingUpdate.update."""
        return _first(self.strategy, self._update(x, y, _size(y, n), _signal(stop)))

    def update_from(self, iterator, n: int, pulls: int = 1, stop=0):
        """One update from a feed's one element per local replica (its share of the batch, in one pass)."""
        return _first(self.strategy, self._update_pulled(iterator, _size(None, n), _signal(stop)))

    def _update_from(self, iterator, n, stop):
        element = next(iterator)
        return self.strategy.run(lambda e: self._update_replica(*self.prepare(e, n), n, stop), args=(element,))

    def _update_all(self, x, y, n, stop):
        xs, ys = self._shares(x, y, n)
        return self.strategy.run(self._update_replica, args=(xs, ys, n, stop))

    def _update_replica(self, x, y, n, stop):
        with tf.GradientTape() as tape:
            losses = self.loss_fn(x, y)
            # sum / n, not reduce_mean: a replica's share is not the batch (on one device the same bits)
            loss = tf.reduce_sum(losses) / tf.cast(n, losses.dtype)
            scaled = self._scaled(loss)
        return self._conclude(loss, tape.gradient(scaled, self.variables), False, stop)
