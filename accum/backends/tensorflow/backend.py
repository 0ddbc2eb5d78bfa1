"""The TensorFlow backend as the trainer calls it: accum/backends/__init__.py's ``Backend``, answered.

The accumulator (engine.py, set up in engine_for.py) runs an update as one graph call on any tf.distribute strategy
(distribute.py makes one and answers the questions about it); augment.py draws data.augment's crops and flips inside
the micro-step. An update that runs out of memory raises ``tf.errors.ResourceExhaustedError``, a failed op (a broken
file read inside the graph) ``tf.errors.OpError``, its parent, which the loop catches second; inputs a model cannot
take, ``tf.errors.InvalidArgumentError``. The commands' calls (a checkpoint read back, outputs in batches, compare's
gradient) are commands.py's. A checkpoint (checkpoints.py) holds the engine's counters as tf.Variables, by the names
``engine_state`` gives them, and a door's own run state as a ``state_variable``. The allocator's peak is read here:
``peak_during`` is the one probe, which runs a piece of work and reads the peak over it (the memory guard,
``subdivisions: auto``'s probe, bench and summary.json use it; tests replace ``allocator_peak_bytes`` here to fake a
peak).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable

import tensorflow as tf

from ...trainer.data.feed import distribute, empty_like, endless
from .augment import Augment
from .checkpoints import Checkpoints, checkpoint_problem, engine_state
from .commands import batch_spec, gradients, outputs_in_batches, restore_weights, saved_value, saved_weight_shapes
from .distribute import has_gpu, is_chief, make_strategy, replicas, set_thread_pools, strategy_in_scope, strategy_name
from .engine_for import accumulator_for
from .gradient_cache import cache_line, dense
from .graphs import graph
from .keras_objective import KerasObjective
from .noise import NoiseScale
from .objective import classifier, combine
from .scoring import Evaluation, KerasMetrics, Scorer
from .trim import check_trim
from .update import local_replica_ids

# the Backend's names (accum/backends/__init__.py), which is all the trainer calls here
__all__ = [
    "BAD_INPUT",
    "MEASURES_PEAK",
    "NAME",
    "OP_ERROR",
    "OUT_OF_MEMORY",
    "STRATEGY",
    "AccumBatchNorm",  # noqa: F822 (LATER)
    "Augment",
    "Checkpoints",
    "Evaluation",
    "GroupNorm",  # noqa: F822 (LATER)
    "KerasMetrics",
    "KerasObjective",
    "NoiseScale",
    "Scorer",
    "accumulator_for",
    "allocator_peak_bytes",
    "batch_spec",
    "built_in",  # noqa: F822 (LATER)
    "cache_line",
    "check_trim",
    "checkpoint_problem",
    "classifier",
    "combine",
    "dense",
    "eagerly",
    "elements",
    "engine_state",
    "gradients",
    "graph",
    "has_gpu",
    "is_chief",
    "local_replica_ids",
    "make_strategy",
    "outputs_in_batches",
    "peak_during",
    "pool",  # noqa: F822 (LATER)
    "pooled",  # noqa: F822 (LATER)
    "replicas",
    "reset_allocator_peak",
    "restore_weights",
    "saved_value",
    "saved_weight_shapes",
    "set_thread_pools",
    "several_processes",
    "state_variable",
    "strategy_in_scope",
    "strategy_name",
]

# norm.py and builtin.py import TensorLayer, which starts TensorFlow's runtime: once it runs, no strategy can split
# the CPU into devices (make_strategy, strategy.cpu_devices), so their names load when first asked for
LATER = {**dict.fromkeys(("AccumBatchNorm", "GroupNorm", "pool", "pooled"), ".norm"), "built_in": ".builtin"}


def __getattr__(name: str):
    if name in LATER:
        return getattr(importlib.import_module(LATER[name], __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


NAME = "tensorflow"
MEASURES_PEAK = True  # memory_limit's peak: TensorFlow's allocator keeps one on every device
OUT_OF_MEMORY = tf.errors.ResourceExhaustedError
OP_ERROR = tf.errors.OpError
BAD_INPUT = tf.errors.InvalidArgumentError
STRATEGY = tf.distribute.Strategy


def state_variable(value, dtype: str, name: str) -> tf.Variable:
    """Run state a checkpoint holds by ``name`` (an epoch count, a rule's changes as JSON), as it always has."""
    return tf.Variable(value, dtype=dtype, trainable=False, name=name)


def several_processes(strategy) -> bool:
    """Whether ``strategy``'s replicas span processes (workers), which must then agree on what each reads."""
    return len(local_replica_ids(strategy)) < strategy.num_replicas_in_sync


def elements(strategy, dataset: tf.data.Dataset, flagged: bool = False):
    """A feed's ``dataset`` as an update pulls it under ``strategy``; ``flagged``: each element paired with True, then
    unreal empty ones for ever, paired with False (the validation's: scoring.Evaluation.step reads the flag)."""
    if flagged:
        paired = dataset.map(lambda *element: (element if len(element) > 1 else element[0], True))
        dataset = endless(paired, (empty_like(dataset.element_spec), False))
    return distribute(strategy, dataset)


@contextlib.contextmanager
def eagerly():
    """Every graph of the engine run op by op for the while (compile(run_eagerly=True)), as it was after."""
    before = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    try:
        yield
    finally:
        tf.config.run_functions_eagerly(before)


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
