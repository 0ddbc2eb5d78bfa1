"""How this process's TensorFlow runtime is set up before its first op: the thread pools that go with the
micro-steps in flight, and the tf.distribute strategy a config names (with who writes the run).

Both are fixed once the runtime starts: ``configure`` and ``make_strategy``
run before any other op (thread pools, MultiWorkerMirroredStrategy and
logical devices all require it). A process that has already started it (a
test, a notebook) keeps its threads; the run still works, only slower.
TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS, if set, are left to rule.

Threads, measured on the 2-core development machine (README, "Where the time
goes"): a micro-batch of 32 is too small for TensorFlow's intra-op threads to
pay for themselves, so k=8 with two threads per op costs ~1.4x the CPU time of
one pass. One thread per op, with two micro-steps in flight at once (the
engine's loop-carried accumulation, ``parallel_iterations``), keeps both cores
busy on useful work instead. With a GPU the device is the bottleneck and
memory is what accumulation is for, so micro-steps stay one at a time there.

The engine itself (accum/trainer/engine.py) is the same on every strategy.
"""

from __future__ import annotations

import contextlib
import json
import os

import tensorflow as tf

from ..config import Config, StrategyConfig

AUTO_PARALLEL = 2  # micro-steps in flight under auto on a CPU: the most measured to help (2 cores)


def cpu_cores() -> int:
    """The cores this process may run on (its affinity, which containers narrow), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_parallel(limit: int, memory_limited: bool = False, replicas: int = 1) -> int:
    """auto's choice of micro-steps in flight, for a run's CLI and for accum_train.fit: 1 with a GPU (the device
    is the bottleneck, memory what accumulation is for), under a memory limit (memory is what the run is short
    of) or over several local replicas (they already share the cores out); else as many as measured to help on
    a CPU with cores to share out, never more than ``limit``, the micro-batches of an update."""
    if memory_limited or replicas > 1 or tf.config.list_physical_devices("GPU"):
        return 1
    return max(1, min(AUTO_PARALLEL, cpu_cores(), limit))


def parallel_micro_steps(cfg: Config) -> int:
    """The configured number, or auto's choice (``auto_parallel``); never more than the micro-batches of an
    update."""
    if cfg.baseline:
        return 1
    if cfg.whole_set:  # the training set's size is not known yet: as if it were large
        limit = cfg.subdivisions if isinstance(cfg.subdivisions, int) else AUTO_PARALLEL
    elif cfg.auto_subdivisions:
        limit = max(cfg.batch_sizes)
    else:
        limit = max(cfg.subdivisions_for(b) for b in cfg.batch_sizes)
    if cfg.parallel_micro_steps != "auto":
        return min(cfg.parallel_micro_steps, limit)
    return auto_parallel(limit, cfg.memory_limit is not None, 2 if cfg.strategy.name == "mirrored" else 1)


ENV = {"intra": "TF_NUM_INTRAOP_THREADS", "inter": "TF_NUM_INTEROP_THREADS"}


def thread_pools(parallel: int) -> dict | None:
    """The pools for ``parallel`` micro-steps at once on this CPU, or None for TensorFlow's defaults.

    ``parallel`` micro-steps get ``cores // parallel`` threads each within an op and ``max(2, parallel)``
    ops side by side. One micro-step at a time keeps the defaults (0: as many as cores)."""
    if parallel <= 1:
        return None
    return {"intra": max(1, cpu_cores() // parallel), "inter": max(2, parallel)}


def child_environment(pools: dict | None) -> dict:
    """This process's environment for a child whose runtime should start with ``pools`` (None: the
    defaults), through the variables TensorFlow reads when its runtime starts."""
    env = {key: value for key, value in os.environ.items() if key not in ENV.values()}
    env.update({ENV[pool]: str(threads) for pool, threads in (pools or {}).items()})
    return env


def configure(cfg: Config) -> dict:
    """Set this process's thread pools for the run's micro-steps (before any op); what is in effect."""
    parallel = parallel_micro_steps(cfg)
    pools = None if tf.config.list_physical_devices("GPU") else thread_pools(parallel)
    for pool, threads in (pools or {}).items():
        if os.environ.get(ENV[pool]):
            continue
        setter = getattr(tf.config.threading, f"set_{pool}_op_parallelism_threads")
        with contextlib.suppress(RuntimeError):  # the runtime already started in this process: it keeps its pools
            setter(threads)
    return {"parallel_micro_steps": parallel, **{f"{pool}_op_threads": _in_effect(pool) for pool in ENV}}


def _in_effect(pool: str) -> int:
    """The threads of a pool as the runtime has them: set in this process, else TF_NUM_*'s value (which the
    runtime reads when nothing is set), else 0 (TensorFlow's default: as many as cores)."""
    configured = getattr(tf.config.threading, f"get_{pool}_op_parallelism_threads")()
    if configured:
        return configured
    value = os.environ.get(ENV[pool], "")
    return int(value) if value.isdigit() else 0


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
