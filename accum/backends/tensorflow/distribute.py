"""tf.distribute as the trainer asks about it: the replicas an update spans, a strategy's name in the config's
words, who writes the run (the chief), whether there is a GPU; and ``CountingCrossDeviceOps``, which counts the
collectives traced into graphs (tests and benchmarks: one all-reduce per update)."""

from __future__ import annotations

import json
import os

import tensorflow as tf


def replicas(strategy: tf.distribute.Strategy | None) -> int:
    """The replicas an update spans under ``strategy`` (None: the one in scope)."""
    return (strategy or tf.distribute.get_strategy()).num_replicas_in_sync


def has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def strategy_name(strategy: tf.distribute.Strategy | None) -> str:
    """The config's name for a strategy (``strategy.name``), as history.jsonl records it; else its class's name."""
    for name, kind in (
        ("multi_worker", tf.distribute.MultiWorkerMirroredStrategy),
        ("mirrored", tf.distribute.MirroredStrategy),
    ):
        if isinstance(strategy, kind):
            return name
    # what tf.distribute.get_strategy() is outside any scope: TensorFlow's one-device default
    default = strategy is None or type(strategy).__name__ == "_DefaultDistributionStrategy"
    return "default" if default else type(strategy).__name__


def is_chief(strategy: tf.distribute.Strategy | None) -> bool:
    """The chief (task 'chief', or worker 0 when there is none) writes the run directory."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    if "chief" in config.get("cluster", {}):
        return task.get("type") == "chief"
    return int(task.get("index", 0)) == 0


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
