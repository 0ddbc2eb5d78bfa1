"""tf.distribute set-up: the strategy a config names, and who writes the run.

The engine itself (accum/engine.py) is the same on every strategy.
``make_strategy`` must run before any other TensorFlow op in the process
(MultiWorkerMirroredStrategy and logical devices both require it).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from .config import StrategyConfig


def make_strategy(cfg: StrategyConfig, cross_device_ops=None) -> tf.distribute.Strategy | None:
    if cfg.name == "default":
        return None
    if cfg.name == "mirrored":
        if cfg.cpu_devices:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cfg.cpu_devices)]
            )
            devices = [f"/cpu:{i}" for i in range(cfg.cpu_devices)]
            return tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
        return tf.distribute.MirroredStrategy(cross_device_ops=cross_device_ops)
    if cfg.name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"unknown strategy {cfg.name!r}")  # the config module lets only known names through


def cluster_workers() -> int:
    """The workers of the cluster this process is in (TF_CONFIG), 1 without one."""
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    return max(1, sum(len(tasks) for role, tasks in cluster.items() if role in ("chief", "worker")))


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
