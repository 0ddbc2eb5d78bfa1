"""A config's runtime, set up before the process's first TensorFlow op: the micro-steps in flight its keys ask
for, the thread pools that go with them (trainer/runtime.py has how many and why), and the tf.distribute strategy
it names.

Both are fixed once the runtime starts: ``configure`` and ``make_strategy`` run before any other op (thread
pools, MultiWorkerMirroredStrategy and logical devices all require it). A process that has already started it (a
test, a notebook) keeps its threads; the run still works, only slower. TF_NUM_INTRAOP_THREADS /
TF_NUM_INTEROP_THREADS, if set, are left to rule.
"""

from __future__ import annotations

import contextlib
import os

import tensorflow as tf

from ..config import Config, StrategyConfig
from ..defaults import AUTO_PARALLEL
from ..trainer.runtime import ENV, auto_parallel, thread_pools


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
