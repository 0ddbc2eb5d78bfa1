"""The TensorFlow backend as the trainer calls it: accum/backends/__init__.py's ``Backend``, answered.

The accumulator (engine.py, set up by its ``accumulator_for``) runs an update as one graph call on any tf.distribute
strategy (distribute.py makes one and answers the questions about it); ``Augment`` draws data.augment's crops and flips
inside the micro-step. An update that runs out of memory raises ``tf.errors.ResourceExhaustedError``, a failed op (a
broken file read inside the graph) ``tf.errors.OpError``, its parent, which the loop catches second; inputs a model
cannot take, ``tf.errors.InvalidArgumentError``. The commands' calls (a checkpoint read back, outputs in batches,
compare's gradient, the spec of a batch of any size that fit's checks read) are answered here; their checkpoint is
tf.train.Checkpoint's (a JAX backend answers them from the files its own saving writes). So is ``check_trim``, the
check that trim_padding's cut (accum/trainer/data/feed.py; the policy: lengths.py) changes nothing the update
computes. A checkpoint (checkpoints.py) holds the engine's counters as tf.Variables, by the names ``engine_state``
gives them, and a door's own run state as a ``state_variable``. The allocator's peak is read here: ``peak_during`` is
the one probe, which runs a piece of work and reads the peak over it (the memory guard, ``subdivisions: auto``'s
probe, bench and summary.json use it; tests replace ``allocator_peak_bytes`` here to fake a peak).
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from ...trainer.data.feed import by_length, cut_after, distribute, empty_like, endless
from ...trainer.data.lengths import differ, judge_trim
from .checkpoints import Checkpoints, checkpoint_problem, engine_state
from .distribute import has_gpu, is_chief, make_strategy, replicas, set_thread_pools, strategy_in_scope, strategy_name
from .engine import accumulator_for
from .gradient_cache import cache_line, dense
from .graphs import graph
from .keras_objective import KerasObjective
from .noise import NoiseScale
from .objective import classifier, combine
from .scoring import Evaluation, KerasMetrics, Scorer
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


def check_trim(objective, groups, first_batch, timed, spec, cut, strategy, where: str, unpack=None) -> None:
    """Refuse trim_padding where cutting the padding changes the update: compare the normalisers, loss sums and
    gradients of the first batch's shortest micro-batch, whole and cut right after its longest sequence (no
    padding left there, the strictest cut), in inference mode (dropout would draw differently for two shapes).
    ``first_batch`` is as the feed stores it, ``timed`` its leaves with the time axis, ``spec`` the feed's elements',
    ``cut`` (batching.Cut) how a batch becomes micro-batches; ``unpack`` makes (x, y, sample_weight) of it (Keras'
    own by default)."""
    model = objective.model
    variables = model.trainable_variables
    unpack = unpack or keras.utils.unpack_x_y_sample_weight
    rows, lengths = by_length(tf.nest.map_structure(tf.convert_to_tensor, first_batch))
    start, end = [b for b in cut.bounds(int(tf.shape(tf.nest.flatten(rows)[0])[0])) if b[1] > b[0]][-1]
    whole = tf.nest.map_structure(lambda t: t[start:end], rows)  # the shortest micro-batch of the first batch
    trimmed = cut_after(whole, timed, lengths[start:end], 1)  # right after its longest: the most it can lose

    def steps(data):
        return next(t.shape[1] for t, cut in zip(tf.nest.flatten(data), tf.nest.flatten(timed)) if cut)

    length, time_steps = steps(trimmed), steps(whole)
    if length == time_steps:
        return  # nothing cut here: nothing to compare

    def measure(data):
        x, y, sample_weight = unpack(data)
        with tf.GradientTape() as tape:
            parts, _ = objective.evaluate(x, y, sample_weight, training=False, groups=groups)
            total = tf.add_n([parts.sums[g] for g in groups])
        grads = tape.gradient(total, model.trainable_variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        return parts.sums, parts.counts, grads

    with strategy.scope():  # traced for the feed's elements, as the probe that found ``groups`` was
        measured = graph(measure).get_concrete_function(spec)
        (sums, counts, grads), (cut_sums, cut_counts, cut_grads) = measured(whole), measured(trimmed)
    named = [("the number of values the loss averages", counts[g], cut_counts[g], 0.0) for g in counts]
    named += [("the loss summed", sums[g], cut_sums[g], 0.0) for g in groups]
    # A gradient that is zero in exact arithmetic (a key bias under a softmax, which cancels it) is rounding noise
    # of the size of the others: each gradient is held to its own size or a thousandth of the largest, if more.
    largest = max((float(np.max(np.abs(g), initial=0.0)) for g in grads), default=0.0)
    named += [(f"the gradient of {v.path}", g, c, 1e-3 * largest) for v, g, c in zip(variables, grads, cut_grads)]
    divisor = any(differ(counts[g], cut_counts[g]) for g in counts)
    judge_trim(named, divisor and objective.steps is None, model.name, time_steps, length, where)


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


def restore_weights(prefix: str, weights: list) -> None:
    """The checkpoint ``prefix``'s "weights" (the run's and fit's alike hold the model's variables under it) into
    ``weights``, nothing else; a file that does not match raises (AssertionError, ValueError or an op's error)."""
    tf.train.Checkpoint(weights=weights).restore(prefix).expect_partial().assert_existing_objects_matched()


def saved_value(prefix: str, name: str):
    """The value the checkpoint ``prefix`` holds for its variable ``name`` (a top-level one), None if none."""
    reader, key = tf.train.load_checkpoint(prefix), f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
    return reader.get_tensor(key) if reader.has_tensor(key) else None


def saved_weight_shapes(prefix: str) -> list:
    """The shapes of the checkpoint ``prefix``'s "weights", in their order (model.variables')."""
    found = {}
    for name, shape in tf.train.list_variables(prefix):
        match = re.fullmatch(r"weights/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE", name)
        if match:
            found[int(match.group(1))] = tuple(shape)
    return [found[i] for i in sorted(found)]


def outputs_in_batches(forward, x, batch_size: int):
    """``forward(inputs, False)`` over ``x`` (arrays), ``batch_size`` examples at a time, as float32 numpy: one
    graph, traced as training traces the model."""
    spec = tf.nest.map_structure(lambda a: tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype)), x)
    batch_outputs = graph(
        lambda inputs: tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), forward(inputs, False)),
        input_signature=[spec],
    )
    n = len(tf.nest.flatten(x)[0])
    batches = [
        batch_outputs(tf.nest.map_structure(lambda a, s=start: a[s : s + batch_size], x))
        for start in range(0, n, batch_size)
    ]
    return tf.nest.map_structure(lambda *parts: np.concatenate([p.numpy() for p in parts]), *batches)


def gradients(loss, variables) -> list:
    """The gradient of ``loss()`` with respect to ``variables`` (None for one it does not reach)."""
    with tf.GradientTape() as tape:
        value = loss()
    return tape.gradient(value, variables)


def batch_spec(arrays):
    """The spec of a batch of any size of ``arrays`` (a structure), as fit's checks and Keras' build read one."""
    return tf.nest.map_structure(lambda a: tf.TensorSpec((None, *a.shape[1:]), a.dtype), arrays)


class Augment:
    """Random crops and flips of the training images (data.augment), reproducible, drawn inside the micro-step's
    graph (a JAX backend would draw them with jax.random inside its jitted step).

    Every draw is a stateless function of (seed, update, position in the global batch): a resumed run, a retried
    update (subdivisions: auto) and a worker that holds only its part of the batch all see exactly the images one
    uninterrupted single-device run sees. The draws are made for the whole global batch and each process keeps its
    own rows, so the split across workers changes nothing."""

    def __init__(self, flip: bool, crop: int, seed: int):
        self.flip, self.crop, self.seed = flip, crop, seed

    @property
    def active(self) -> bool:
        return self.flip or self.crop > 0

    def rows(self, x, step, n, begin=0):
        """``x``, rows [begin, begin + len(x)) of update ``step``'s global batch of ``n`` (in a graph: the
        micro-step's, or eagerly)."""
        step, n, begin, rows = tf.cast(step, tf.int64), tf.cast(n, tf.int32), tf.cast(begin, tf.int32), tf.shape(x)[0]
        seed = tf.stack([tf.constant(self.seed, tf.int64), step])
        if self.crop:
            pad, height, width = self.crop, x.shape[1], x.shape[2]
            # one (top, left) per example of the global batch: shifts of -crop..crop pixels
            corner = tf.random.stateless_uniform([n, 2], seed, 0, 2 * pad + 1, tf.int32)[begin : begin + rows]
            padded = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
            padded = tf.gather(padded, corner[:, :1] + tf.range(height)[None], axis=1, batch_dims=1)
            x = tf.gather(padded, corner[:, 1:] + tf.range(width)[None], axis=2, batch_dims=1)
        if self.flip:
            mirrored = tf.random.stateless_uniform([n], seed + [0, 1 << 40], 0, 2, tf.int32)[begin : begin + rows] > 0
            x = tf.where(mirrored[:, None, None, None], tf.reverse(x, [2]), x)
        return x
