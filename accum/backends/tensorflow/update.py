"""The end of the accumulator's update (engine.py says what its one all-reduce carries): ``Finish`` reduces, combines
the caches and clears them; ``Update`` then makes the finite check, clipping and one apply (or a skip) in
cross-replica context, with the dynamic loss scale and the skip counters; and the small helpers that hand values to
and from the graphs of every strategy.

Norm, clipping and the finite check act on the reduced (global) values, the same on every replica; the
apply-or-skip decision is a ``tf.cond`` in cross-replica context (``merge_call``), whose apply branch goes back
to the replicas for ``apply_gradients`` (``call_for_each_replica``). Neither branch holds a collective, so the
replicas cannot disagree inside one. Keras' optimizer would all-reduce the gradients a second time inside
``apply_gradients``; ``hold`` turns that off (keras_private.hold_all_reduce, the one private Keras hook here,
guarded by a test that a double reduction fails).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from ... import keras_private
from ...defaults import LOSS_SCALE_GROWTH_STEPS
from . import noise
from .gradient_cache import dense
from .objective import combine, output_values

NAN = float("nan")
# A stop request is a small integer (0: none; the training loop sends a signal's number): every process learns
# the largest any process made, after the same update. The engine knows no signals, only the numbers' order.
STOP_REQUESTS = 65


def local_replica_ids(strategy: tf.distribute.Strategy) -> list:
    """The global ids of this process's replicas (all of them, except under multi-worker)."""
    ids = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(ctx.replica_id_in_sync_group))
    return [int(i) for i in strategy.experimental_local_results(ids)]


def _first(strategy, structure):
    """The value of replica 0 of this process (every replica computes the same one)."""
    return tf.nest.map_structure(lambda t: strategy.experimental_local_results(t)[0], structure)


def _size(n):
    """A count (the global batch, the pulls, a stop's signal) as the graphs take it (a tensor: a Python int would
    retrace per value)."""
    return tf.constant(int(n), tf.int32)


class Update:
    """After the all-reduce: one clipped apply per update, or a skip.

    ``norm_layers`` are objects with ``deferred``, ``pending`` (norm.py PendingStats), ``fold(values)``
    and ``discard()`` (AccumBatchNorm, PooledBatchNorm): their moving statistics are deferred and folded in once
    per applied update, from the sums of every micro-batch on every replica. ``strategy`` None is one device."""

    def __init__(
        self,
        variables: Sequence[tf.Variable],
        optimizer,
        *,
        clip_norm: float | None = None,
        norm_layers=(),
        strategy: tf.distribute.Strategy | None = None,
        loss_scale: float | None = None,
        growth_steps: int = LOSS_SCALE_GROWTH_STEPS,
        jit: bool = False,
        constraints=None,
    ):
        self.strategy = strategy or tf.distribute.get_strategy()
        self.variables = list(variables)
        # each variable's constraint (a Keras weight's kernel_constraint, ...) or None, applied after the optimizer's
        # step as Keras' own apply does: the optimizer sees the storage under a Keras variable, which has none
        self.constraints = list(constraints) if constraints is not None else [None] * len(self.variables)
        self.optimizer = optimizer
        self.clip_norm = clip_norm
        self.norm_layers = list(norm_layers)
        for layer in self.norm_layers:
            layer.deferred = True  # moving statistics move once per update, not per micro-batch
        self.replica_ids = local_replica_ids(self.strategy)
        # compile's jit_compile on one replica: the optimizer's apply is compiled too, as model.fit's XLA train step
        # compiles it (one fused cluster instead of a dozen small ops per variable); on several replicas Keras'
        # apply merges across them, which stays outside XLA
        self.jit_apply = bool(jit) and self.replicas == 1 and optimizer is not None
        self._applies = {}  # the compiled apply for each set of variables the loss reaches
        with self.strategy.scope():
            self.bad_updates_in_a_row = tf.Variable(0, dtype=tf.int64, trainable=False, name="bad_updates_in_a_row")
            self.skipped_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_updates")
            # Dynamic loss scaling (mixed_float16): ONE scale per update. Every micro-batch is scaled by
            # it, the accumulated gradient is unscaled once, and it changes only between updates.
            self.dynamic = loss_scale is not None
            self.growth_steps = int(growth_steps)
            self.loss_scale = tf.Variable(float(loss_scale or 1.0), trainable=False, name="loss_scale")
            self.good_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_updates")
        self.hold()

    def hold(self) -> None:
        """Keep the optimizer from all-reducing what apply_gradients gets: the gradients reaching it are already
        the global sum (the one all-reduce). ``release`` gives it back its own."""
        if self.optimizer is not None:
            if not keras_private.has_gradient_all_reduce(self.optimizer):
                raise RuntimeError(
                    "this Keras optimizer has no _all_reduce_sum_gradients: the engine cannot stop "
                    "it from reducing the gradients a second time; use Keras 3.x with TensorFlow"
                )
            keras_private.hold_all_reduce(self.optimizer)

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def release(self) -> None:
        """Give the optimizer back its own all-reduce (a caller's optimizer may train elsewhere after this)."""
        if self.optimizer is not None:
            keras_private.release_all_reduce(self.optimizer)

    @property
    def one_process(self) -> bool:
        """Every replica is in this process (one device, or mirrored): nothing to agree on with others."""
        return self.replicas == len(self.replica_ids)

    def largest_over_workers(self, value: int) -> int:
        """The largest ``value`` any worker holds (every worker must call this at the same point)."""
        if self.one_process:
            return int(value)

        def every():  # each replica puts its value at its own place: the SUM holds every replica's
            ctx = tf.distribute.get_replica_context()
            mine = tf.one_hot(ctx.replica_id_in_sync_group, self.replicas) * float(value)
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, mine)

        return int(tf.reduce_max(_first(self.strategy, tf.function(lambda: self.strategy.run(every))())))

    def learning_rate(self):
        """The rate the next apply_gradients uses (the schedule at optimizer.iterations)."""
        return tf.cast(self.optimizer.learning_rate, tf.float32)

    def _scaled(self, loss):
        """What a micro-batch differentiates: its loss share times the update's loss scale."""
        return loss * self.loss_scale if self.dynamic else loss

    def _settle(self, loss, grads, reduced: dict, used):
        """Replica context, after the all-reduce: the finite check, clipping, then apply once, skip (not
        finite) or drop (retry) in cross-replica context; the update's record. ``grads``: the global,
        unscaled gradients; ``reduced``: the payload as reduced (stats, retry, stop)."""
        ctx = tf.distribute.get_replica_context()
        stats, retried = reduced["stats"], reduced["retry"]
        # the largest request made (the loop's SIGTERM, 15, a platform preempting the machine, wins over SIGINT, 2)
        stop = tf.reduce_max(tf.where(reduced["stop"] > 0, tf.range(STOP_REQUESTS), 0))
        scale = self.loss_scale.read_value()
        retry = retried > 0  # any replica of any worker asked for it: all drop the update together
        finite = tf.math.is_finite(loss)
        for grad in grads:
            if grad is not None:
                finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))
        # An overflow of the scaled gradient (the loss itself finite): a smaller scale will fix it.
        overflow = (
            tf.logical_and(tf.logical_not(finite), tf.logical_and(tf.math.is_finite(loss), scale > 1.0))
            if self.dynamic
            else tf.constant(False)
        )
        applied = tf.logical_and(finite, tf.logical_not(retry))
        norm = tf.linalg.global_norm(grads)
        if self.clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=norm)
        rate = self.learning_rate()  # read before the apply advances optimizer.iterations
        ctx.merge_call(self._decide, args=(applied, retry, overflow, tuple(grads), tuple(stats), tuple(used)))
        for layer in self.norm_layers:
            layer.discard()
        nan = tf.constant(NAN)
        out = {
            "loss": loss,
            "grad_norm": tf.where(applied, norm, nan),
            "applied": applied,
            "learning_rate": tf.where(applied, rate, nan),
            "retry": retry,
            "stop": stop,
            # as the update left it: returned, the loop learns it with the record instead of by reading the
            # variable (an eager op) after every update
            "bad_updates_in_a_row": self.bad_updates_in_a_row.read_value(),
        }
        if self.dynamic:
            out.update(loss_scale=scale, overflow=overflow)
        return out

    def _decide(self, strategy, applied, retry, overflow, grads, stats, used):
        """Cross-replica context: every replica holds the same decision; the branches hold no collective."""

        def apply():
            def apply_local(*local):
                chosen = [(tf.cast(g, v.dtype), v) for g, v, u in zip(local, self.variables, used) if u]
                if self.jit_apply:
                    self._compiled_apply(tuple(used))(*[g for g, _ in chosen])
                else:
                    self._apply(chosen, used)

            strategy.extended.call_for_each_replica(apply_local, args=grads)
            for layer, sums in zip(self.norm_layers, stats):
                layer.fold(_first(strategy, sums))
            self.bad_updates_in_a_row.assign(0)
            if self.dynamic:  # grow after growth_steps applied updates in a row: counted in updates
                grow = self.good_updates + 1 >= self.growth_steps
                self.loss_scale.assign(tf.where(grow, self.loss_scale * 2.0, self.loss_scale))
                self.good_updates.assign(tf.where(grow, tf.constant(0, tf.int64), self.good_updates + 1))
            return tf.constant(True)

        def skip():  # weights, optimizer state and statistics stay as they were
            self.skipped_updates.assign_add(1)
            if not self.dynamic:
                self.bad_updates_in_a_row.assign_add(1)
                return tf.constant(False)
            # An overflow while the scale searches halves it, once for the whole update, and is not a
            # bad update; anything else (a non-finite loss, or still non-finite at scale 1) is.
            over = _first(strategy, overflow)
            self.bad_updates_in_a_row.assign_add(tf.where(over, tf.constant(0, tf.int64), tf.constant(1, tf.int64)))
            self.loss_scale.assign(tf.where(over, tf.maximum(self.loss_scale / 2.0, 1.0), self.loss_scale))
            self.good_updates.assign(0)
            return tf.constant(False)

        return tf.cond(
            _first(strategy, applied), apply, lambda: tf.cond(_first(strategy, retry), lambda: tf.constant(False), skip)
        )

    def _apply(self, chosen, used) -> None:
        """The optimizer's step on ``chosen`` (gradient, variable) pairs, then the constraints of those ``used``."""
        self.optimizer.apply_gradients(chosen)
        for variable, constraint, u in zip(self.variables, self.constraints, used):
            if u and constraint is not None:
                variable.assign(constraint(variable))

    def _compiled_apply(self, used: tuple):
        """``_apply`` to the variables ``used`` flags, as one XLA cluster (``jit_apply``), made once."""
        if used not in self._applies:
            chosen = [v for v, u in zip(self.variables, used) if u]
            apply = lambda *grads: self._apply(list(zip(grads, chosen)), used)  # noqa: E731
            self._applies[used] = tf.function(apply, jit_compile=True, autograph=False)
        return self._applies[used]

    def reset(self):
        """Forget a half-done update (pooled BatchNorm statistics)."""
        for layer in self.norm_layers:
            layer.discard()


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
        apply once, skip or drop (``_settle``); the caches and totals cleared. ``local``: the sums of a one-pass
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
        if self.dynamic:  # the loss scale taken out once, for the whole update
            scale = self.loss_scale.read_value()
            grads = [g * (1.0 / scale) for g in grads]
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
