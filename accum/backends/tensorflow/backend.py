"""The TensorFlow backend as the trainer calls it: accum/backends/__init__.py's ``Backend``, answered.

The accumulator (engine.py, set up in engine_for.py) runs an update as one graph call on any tf.distribute
strategy (distribute.py makes one and answers the questions about it); augment.py draws data.augment's crops
and flips inside the micro-step. An update that runs out of memory raises
``tf.errors.ResourceExhaustedError``, a failed op (a broken file read inside the graph) ``tf.errors.OpError``, its
parent, which the loop catches second. A checkpoint holds the engine's counters as tf.Variables, by the names
``engine_state`` gives them, and a door's own run state as a ``state_variable``. The allocator's peak is read
here: ``peak_during`` is the one probe, which runs a piece of work and reads the peak over it (the memory guard,
``subdivisions: auto``'s probe, bench and summary.json use it; tests replace ``allocator_peak_bytes`` here to fake
a peak).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import tensorflow as tf

from .augment import Augment
from .distribute import has_gpu, is_chief, make_strategy, replicas, set_thread_pools, strategy_in_scope, strategy_name
from .engine_for import accumulator_for

# the Backend's names (accum/backends/__init__.py), which is all the trainer calls here
__all__ = [
    "NAME",
    "OP_ERROR",
    "OUT_OF_MEMORY",
    "Augment",
    "accumulator_for",
    "allocator_peak_bytes",
    "engine_state",
    "has_gpu",
    "is_chief",
    "make_strategy",
    "peak_during",
    "replicas",
    "reset_allocator_peak",
    "set_thread_pools",
    "state_variable",
    "strategy_in_scope",
    "strategy_name",
]

NAME = "tensorflow"
OUT_OF_MEMORY = tf.errors.ResourceExhaustedError
OP_ERROR = tf.errors.OpError


def engine_state(engine) -> dict:
    """The engine's variables a checkpoint holds, by name: the bad and skipped updates, and under a dynamic loss
    scale the scale and the applied updates since it last grew (the update count and the door's own variables
    are the run directory's and the door's)."""
    state = {"bad_updates_in_a_row": engine.bad_updates_in_a_row, "skipped_updates": engine.skipped_updates}
    if engine.dynamic:
        state.update(loss_scale=engine.loss_scale, good_updates=engine.good_updates)
    return state


def state_variable(value, dtype: str, name: str) -> tf.Variable:
    """A value of the run's state a checkpoint holds by ``name`` (a front end's, beside the engine's)."""
    return tf.Variable(value, dtype=dtype, trainable=False, name=name)


def memory_device() -> str:
    return "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"


def reset_allocator_peak() -> None:
    with contextlib.suppress(ValueError, RuntimeError):  # an allocator that keeps no statistics
        tf.config.experimental.reset_memory_stats(memory_device())


def allocator_peak_bytes() -> int | None:
    """TensorFlow's allocator peak since start (or the last reset); None if not kept."""
    try:
        return int(tf.config.experimental.get_memory_info(memory_device())["peak"])
    except (ValueError, RuntimeError):
        return None


def peak_during(work: Callable[[], tf.Tensor]):
    """(result, allocator peak while ``work`` ran, None if not kept)."""
    reset_allocator_peak()
    result = work()
    for tensor in tf.nest.flatten(result):
        tensor.numpy()  # wait for the work, then read its peak
    return result, allocator_peak_bytes()
