"""tf.distribute as the trainer and a front end ask about it: a strategy by its config name (made, like the thread
pools, before any other op), the one in scope, the replicas an update spans, a strategy's name in the config's
words, who writes the run (the chief), whether there is a GPU; and ``CountingCrossDeviceOps``, which counts the
collectives traced into graphs (tests and benchmarks: one all-reduce per update)."""

from __future__ import annotations

import contextlib
import json
import os

import tensorflow as tf


def make_strategy(name: str, cpu_devices: int | None = None, cross_device_ops=None) -> tf.distribute.Strategy | None:
    """The strategy a config's strategy.name names (None for "default": the one in scope); ``cpu_devices``: a
    mirrored strategy over that many logical devices of the CPU."""
    if name == "default":
        return None
    if name == "mirrored":
        devices = [f"/cpu:{i}" for i in range(cpu_devices)] if cpu_devices else None
        if devices:
            split = [tf.config.LogicalDeviceConfiguration() for _ in devices]
            tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0], split)
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"unknown strategy {name!r}")  # the config module lets only known names through


def strategy_in_scope(strategy: tf.distribute.Strategy | None = None) -> tf.distribute.Strategy:
    """``strategy``, or (None) the one in scope: TensorFlow's one-device default outside any."""
    return strategy or tf.distribute.get_strategy()


def set_thread_pools(pools: dict) -> dict:
    """Set this process's op thread pools ({"intra": threads, "inter": threads}, each optional) unless its runtime
    has started (it then keeps its own); the threads each pool is set to, 0 where none is (as many as cores)."""
    for pool, threads in pools.items():
        with contextlib.suppress(RuntimeError):  # the runtime already started in this process
            getattr(tf.config.threading, f"set_{pool}_op_parallelism_threads")(threads)
    return {pool: getattr(tf.config.threading, f"get_{pool}_op_parallelism_threads")() for pool in ("intra", "inter")}


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
