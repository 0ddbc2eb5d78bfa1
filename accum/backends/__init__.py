"""The seam between the trainer and the framework that runs an update: one folder per backend (tensorflow/, jax/),
each answering the same few calls (``Backend``), and ``active()``, the one Keras runs on.

Keras splits its own trainer so (keras/src/trainers/trainer.py, backend/tensorflow/trainer.py, backend/jax/
trainer.py): the base ``Trainer`` holds what every backend shares (compile, callbacks, the epoch loop, the data
adapters) and each backend adds only its step, ``TensorFlowTrainer`` a ``tf.function`` over the model's variables,
``JAXTrainer`` a jitted pure function over the state that ``stateless_call`` and ``optimizer.stateless_apply`` take
and return. Ours is split the same way: the Trainer, its loop and memory guard, the run directory and the front
ends name no framework and reach the update through ``active()``. A backend's accumulator (``accumulator_for``)
owns its state and answers the calls ``Engine`` lists: jax/'s keeps it as arrays, an update one jitted function
(so far for accum_train.fit's plain case, jax/backend.py's ``fit``). tf.data stays the data layer: Keras reads it.

This module imports no backend: ``active()`` imports the one in use when it is first asked.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..errors import Refused

# keras.config.backend()'s names of the backends that have a folder here (accum/backends/NAME/backend.py).
BACKENDS = ("tensorflow", "jax")


@runtime_checkable
class Engine(Protocol):
    """What the trainer (its loop, memory guard, probe and run directory) asks of a backend's accumulator: a
    batch's update, pulled from the feed's iterator in one call or accumulated and finished in two, its
    micro-batches, and the counters a run reports."""

    replicas: int  # the replicas an update spans, in every process
    replica_ids: list  # this process's replicas
    one_pass: bool  # the baseline: each replica's share in one micro-step, no cache
    norm_layers: list  # the pooled BatchNorm layers, whose statistics move once per update
    dynamic: bool  # a dynamic loss scale (mixed_float16)

    @property
    def k(self) -> int: ...  # the micro-batches of a replica's share

    @property
    def one_process(self) -> bool: ...

    def set_subdivisions(self, k: int) -> None: ...
    def update_from(self, iterator, n: int, pulls: int, stop=0, size=None, held=False) -> dict: ...
    def accumulate_from(self, iterator, n: int, pulls: int, size=None, held=False): ...
    def accumulate(self, x, y, n): ...
    def finish(self, retry=False, stop=0) -> dict: ...
    def reset(self) -> None: ...
    def retrace(self) -> None: ...
    def restored(self) -> None: ...
    def largest_over_workers(self, value: int) -> int: ...


@runtime_checkable
class Backend(Protocol):
    """What a backend's folder answers, in its module ``backend`` (tensorflow/backend.py). ``strategy``: the
    backend's distribution of the replicas (a tf.distribute strategy; None: the one in scope)."""

    NAME: str  # keras.config.backend()'s name for it
    MEASURES_PEAK: bool  # whether memory_limit's allocator peak is measured (the guard's peak_during)
    OUT_OF_MEMORY: type[Exception]  # an update ran out of device memory: the guard retries at twice the micro-batches
    OP_ERROR: type[Exception]  # any other failed op of an update (a broken file): the door's ``failed`` names it
    BAD_INPUT: type[Exception]  # an op refused the values or shapes given (the commands' data): they name the data
    STRATEGY: type  # what accum_train.fit's strategy= takes: the backend's distribution of the replicas
    KerasObjective: type  # a compiled Keras loss taken apart into sums and normalisers (else the built-in classifier)
    Evaluation: type  # the objective's loss and a model's metrics over data in inference mode, one all-reduce
    KerasMetrics: type  # a Keras model's compiled metrics and loss trackers, kept as model.fit keeps them
    Checkpoints: type  # a run directory's checkpoints/: what it tracks saved, the newest kept, restored
    NoiseScale: type  # the gradient noise scale's running estimate, its averages as a checkpoint holds them
    AccumBatchNorm: type  # the TensorLayer nets' BatchNorm, its statistics moved once per update (pooled)
    GroupNorm: type  # the TensorLayer nets' group normalisation
    Scorer: type  # a run's test and validation scores over its splits held in memory
    Augment: Callable[..., Any]  # Augment(flip, crop, seed): data.augment's draws inside the micro-step

    def accumulator_for(self, model, objective, optimizer, *, subdivisions: int, **options) -> Engine: ...
    def built_in(self, spec, input_shape, num_classes: int) -> Any: ...  # a BuiltInNet's TensorLayer net, as a Model
    def classifier(self, forward: Callable) -> Any: ...  # the built-in objective: cross-entropy of forward's logits
    # refuses trim_padding where the cut changes the update (its first batch's shortest micro-batch, whole and cut)
    def check_trim(self, objective, groups, first_batch, timed, spec, cut, strategy, where: str, unpack=None): ...
    def checkpoint_problem(self, prefix: str) -> str | None: ...  # why it cannot be restored; None: intact
    def combine(self, totals: dict, groups, n) -> tuple: ...  # (factor per normaliser, the loss) of summed parts
    def graph(self, function: Callable, **options) -> Callable: ...  # ``function`` compiled, traced per signature
    def dense(self, gradient) -> Any: ...  # a gradient as one dense array (an Embedding's come as slices)
    def cache_line(self, engine: Engine, frozen: int) -> str: ...  # what its gradient caches hold, as fit says it
    def pool(self, model, where: str, adapters=None) -> list: ...  # its BatchNormalization layers pooling
    def pooled(self, model, strategy=None, adapters=None, where: str = ...): ...  # ``pool`` within, Keras' own after
    def local_replica_ids(self, strategy) -> list: ...  # the global ids of this process's replicas
    def several_processes(self, strategy) -> bool: ...  # whether the replicas span processes (each reads its own)
    def engine_state(self, engine: Engine) -> dict: ...  # what a checkpoint holds of the engine, by name
    def state_variable(self, value, dtype: str, name: str) -> Any: ...  # a door's run state a checkpoint holds
    def elements(self, strategy, dataset, flagged: bool = False) -> Any: ...  # a feed's, as an update pulls it
    def eagerly(self): ...  # a context in which the engine's compiled functions run op by op (run_eagerly=True)
    def make_strategy(self, name: str, cpu_devices: int | None = None) -> Any: ...  # strategy.name's; None: default
    def strategy_in_scope(self, strategy=None) -> Any: ...  # ``strategy``, or (None) the one in scope
    def set_thread_pools(self, pools: dict) -> dict: ...  # before the runtime starts; the threads each pool has
    def replicas(self, strategy) -> int: ...
    def strategy_name(self, strategy) -> str: ...  # the config's name for it, as history.jsonl records it
    def is_chief(self, strategy) -> bool: ...  # whether this process writes the run directory
    def has_gpu(self) -> bool: ...
    def reset_allocator_peak(self) -> None: ...
    def allocator_peak_bytes(self) -> int | None: ...  # since start or the last reset; None if not kept
    def peak_during(self, work: Callable[[], Any]) -> tuple: ...  # (work's result, the peak while it ran)
    # the commands' (reload, loader, predict, compare): a checkpoint read back, outputs, a gradient
    def restore_weights(self, prefix: str, weights: list) -> None: ...  # its "weights" into these, nothing else
    def saved_value(self, prefix: str, name: str) -> Any: ...  # one of its variables' value; None: not held
    def saved_weight_shapes(self, prefix: str) -> list: ...  # the shapes of its "weights", in their order
    def outputs_in_batches(self, forward: Callable, x, batch_size: int) -> Any: ...  # inference, float32 numpy
    def gradients(self, loss: Callable[[], Any], variables: list) -> list: ...  # None where loss() does not reach
    def batch_spec(self, arrays) -> Any: ...  # a batch of any size of these, as fit's checks and Keras' build read


def configured() -> str:
    """keras.config.backend()'s name without importing Keras where it is not loaded yet (its import loads the backend:
    seconds, where a run directory's check needs none): KERAS_BACKEND, else the "backend" of keras.json in
    KERAS_HOME (default ~/.keras), else tensorflow, the order Keras reads them in."""
    if "keras" in sys.modules:
        return sys.modules["keras"].config.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as handle:
            return json.load(handle).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def active() -> Backend:
    """The backend Keras runs on (keras.config.backend(), which KERAS_BACKEND sets), imported on first use."""
    import keras

    name = keras.config.backend()
    if name not in BACKENDS:
        raise Refused(
            "backend",
            f"Keras runs on {name!r} (KERAS_BACKEND or ~/.keras/keras.json), which accum-train has no engine for: "
            f"set KERAS_BACKEND to one of {', '.join(BACKENDS)}",
        )
    return importlib.import_module(f".{name}.backend", __name__)


def tensorflow_only(command: str) -> None:
    """Refuse ``command`` (its words, e.g. "accum-train compare") in one line where Keras runs on another backend:
    plan, compare and bench measure TensorFlow's engine (``run`` and the readers take either backend)."""
    name = active().NAME
    if name != "tensorflow":
        raise Refused(
            "tensorflow-only-command",
            f"{command} works on TensorFlow's engine only, and Keras runs on {name} (KERAS_BACKEND): run it with "
            f"KERAS_BACKEND=tensorflow",
        )
