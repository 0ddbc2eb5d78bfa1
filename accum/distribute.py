"""Accumulation on tf.distribute: replicas accumulate locally, gradients are
all-reduced once per update.

Each replica takes its contiguous share of the global batch, runs its k local
micro-batches in a ``tf.range`` loop, and adds ``sum(loss) / global_n`` to
replica-local accumulators (``ON_READ``/``SUM`` variables): no collective runs
inside the loop. One ``apply_gradients`` in replica context then all-reduces
the accumulated gradients (Keras sums them, once) and applies the result, so
the update equals single-device training on the whole batch.

Collectives must stay out of ``tf.cond`` (merge_call), so the skip of a
non-finite update is decided on the host: one graph call accumulates and
returns the loss and a non-finite count (one small reduction of two floats),
a second applies or clears.

``make_strategy`` must run before any other TensorFlow op in the process
(MultiWorkerMirroredStrategy and logical devices both require it).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional, Sequence

import tensorflow as tf

from .config import StrategyConfig
from .engine import NAN, GradientCache, Update, all_finite, micro_bounds


def make_strategy(cfg: StrategyConfig, cross_device_ops=None) -> Optional[tf.distribute.Strategy]:
    if cfg.name == "default":
        return None
    if cfg.name == "mirrored":
        if cfg.cpu_devices:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cfg.cpu_devices)])
            devices = [f"/cpu:{i}" for i in range(cfg.cpu_devices)]
            return tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
        return tf.distribute.MirroredStrategy(cross_device_ops=cross_device_ops)
    if cfg.name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"unknown strategy {cfg.name!r}")  # the config module lets only known names through


def is_chief(strategy: Optional[tf.distribute.Strategy]) -> bool:
    """The chief (task 'chief', or worker 0 when there is none) writes the run directory."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    if "chief" in config.get("cluster", {}):
        return task.get("type") == "chief"
    return int(task.get("index", 0)) == 0


class DistributedUpdate(Update):
    """The subdivided update across replicas; same interface as AccumulatingUpdate.update."""

    def __init__(self, strategy: tf.distribute.Strategy, loss_fn: Callable, variables: Sequence[tf.Variable],
                 optimizer, subdivisions: int):
        super().__init__(variables, optimizer)
        self.strategy = strategy
        self.loss_fn = loss_fn
        with strategy.scope():
            self.cache = GradientCache(self.variables, synchronization=tf.VariableSynchronization.ON_READ,
                                       aggregation=tf.VariableAggregation.SUM)
        self.subdivisions = tf.Variable(int(subdivisions), trainable=False, dtype=tf.int32, name="subdivisions")
        self._accumulate = tf.function(self._accumulate_all)
        self._apply = tf.function(lambda: strategy.run(self._apply_local))
        self._clear = tf.function(lambda: strategy.run(self.cache.clear))

    def set_subdivisions(self, k: int) -> None:
        self.subdivisions.assign(int(k))

    def _accumulate_local(self, x, y, n):
        local_n = tf.shape(y)[0]
        k = tf.minimum(self.subdivisions, local_n)  # a replica may hold fewer examples than k, even none
        loss = tf.constant(0.0)
        for i in tf.range(k):
            start, end = micro_bounds(i, local_n, k)
            with tf.GradientTape() as tape:
                share = tf.reduce_sum(self.loss_fn(x[start:end], y[start:end])) / tf.cast(n, tf.float32)
            self.cache.add(tape.gradient(share, self.variables))
            loss += share
        bad = tf.cast(tf.logical_not(all_finite(loss, self.cache.gradients())), tf.float32)
        return tf.stack([loss, bad])

    def _accumulate_all(self, x, y):
        n = tf.shape(y)[0]

        def share(ctx, tensor):
            start, end = micro_bounds(ctx.replica_id_in_sync_group, n, ctx.num_replicas_in_sync)
            return tensor[start:end]

        xs = self.strategy.experimental_distribute_values_from_function(lambda ctx: share(ctx, x))
        ys = self.strategy.experimental_distribute_values_from_function(lambda ctx: share(ctx, y))
        per_replica = self.strategy.run(self._accumulate_local, args=(xs, ys, n))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _apply_local(self):
        # In replica context Keras all-reduces (SUM) the gradients: the one gradient collective.
        self.optimizer.apply_gradients(zip(self.cache.gradients(), self.variables))
        self.cache.clear()

    def update(self, x, y):
        loss, bad = tf.unstack(self._accumulate(x, y))
        applied = float(bad) == 0.0  # the host decides: collectives cannot sit inside tf.cond
        rate = float(self.learning_rate()) if applied else NAN
        if applied:
            self._apply()
            self.bad_updates_in_a_row.assign(0)
        else:
            self._clear()
            self._skip()
        return {"loss": loss, "grad_norm": tf.constant(NAN), "applied": tf.constant(applied),
                "learning_rate": tf.constant(rate)}

    def reset(self):
        self._clear()


class CountingCrossDeviceOps(tf.distribute.ReductionToOneDevice):
    """Counts the collective reductions traced into graphs (tests and benchmarks).

    The public ``reduce``/``batch_reduce`` are counted: one call is one
    collective, however many tensors it carries."""

    def __init__(self):
        super().__init__()
        self.reduce_calls = 0
        self.batch_reduce_calls = 0

    def reduce(self, reduce_op, per_replica_value, destinations, options=None):
        self.reduce_calls += 1
        return super().reduce(reduce_op, per_replica_value, destinations, options)

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        self.batch_reduce_calls += 1
        return super().batch_reduce(reduce_op, value_destination_pairs, options)
