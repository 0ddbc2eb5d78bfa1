"""The end of the accumulator's update (engine.py): the one all-reduce of the caches, the totals, the BatchNorm
sums, the noise terms, the metrics, a retry flag and the stop request; each normaliser's cache times n / D, the
weight regularizers' gradient added once, then update.py's apply or skip; the caches and totals cleared. A
one-pass update (the baseline) sends its gradients straight to the same all-reduce."""

from __future__ import annotations

import tensorflow as tf

from . import noise
from .gradient_cache import dense
from .objective import combine, output_values
from .update import STOP_REQUESTS, Update


class Finish(Update):
    """An update's finish, in replica context, for the accumulator (engine.Accumulator), which holds what it
    reads: the caches, totals and noise terms, the objective and its groups, the metrics, the variables the loss
    reaches (``used``) and, for a one-pass update, the micro-step (``_gradients``)."""

    def _one_pass(self, inputs, n, stop):
        parts, shares, gradients = self._gradients(*inputs, n)
        grads = [
            [tf.zeros(v.shape) if g is None else dense(g) for g, v in zip(one, self.variables)] for one in gradients
        ]
        local = {"grads": grads, "totals": self.totals.plus(self.totals.zeros(), parts, shares)}
        return self._finish_replica(n, False, stop, local)

    def _finish_replica(self, n, retry, stop, local=None):
        """Replica context: the one all-reduce, each normaliser's cache times n / D, the regularizers once, then
        apply once, skip or drop (update.py); the caches and totals cleared. ``local``: the sums of a one-pass
        update (default: this replica's caches and totals)."""
        cached = local is None  # the sums are in the caches (a one-pass update's never are)
        if cached:
            local = {"grads": [cache.gradients() for cache in self.caches], "totals": self.totals.values()}
            local["terms"] = self.noise.read_value()
        payload = {
            **local,
            "stats": [layer.pending.values() for layer in self.norm_layers],  # [count, sum, sum of squares] each
            "retry": tf.cast(retry, tf.float32),
            "stop": tf.one_hot(tf.convert_to_tensor(stop, tf.int32), STOP_REQUESTS),  # which requests were made
            "metrics": self.metrics.local() if self.metrics is not None else [],
        }
        reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, payload)
        totals = reduced["totals"]
        factors, loss = combine(totals, self.groups, n)
        grads = [
            tf.add_n([f * cache[i] for f, cache in zip(factors, reduced["grads"])]) for i in range(len(self.variables))
        ]
        grads = self._unscaled(grads)
        data_grads = grads
        penalty, penalty_grads = self._regularization()
        grads = [g if p is None else g + dense(p) for g, p in zip(grads, penalty_grads)]
        used = [u or p is not None for u, p in zip(self.used, penalty_grads)]
        # an update that holds no example (a stream's end) changes nothing: dropped as a retry is
        reduced["retry"] = tf.where(totals["examples"] > 0, reduced["retry"], 1.0)
        out = self._settle(loss + penalty, grads, reduced, used)
        out["examples"] = totals["examples"]
        if "terms" in reduced:
            scale = self.loss_scale.read_value() if self.dynamic else tf.constant(1.0)
            out.update(noise.update_terms(reduced["terms"], factors, scale, data_grads))
        if self.metrics is not None:
            values = output_values(totals, self.objective.kinds)
            out["logs"] = self.metrics.results(reduced["metrics"], loss + penalty, totals, values)
        if cached:
            self._clear()
        return out

    def _regularization(self):
        """The weight regularizers' value and gradients (once per update, the same on every replica)."""
        with tf.GradientTape() as tape:
            value = self.objective.regularization()
        if value is None:
            return tf.constant(0.0), [None] * len(self.variables)
        return value, tape.gradient(value, self.variables)

    def _clear(self):
        for cache in self.caches:
            cache.clear()
        self.totals.clear()
        self.noise.assign(tf.zeros(self.noise.shape))

    def _reset_replica(self):
        if not self.one_pass:
            self._clear()
        super().reset()
