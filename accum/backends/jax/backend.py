"""Keras' JAX backend as the trainer calls it: accum/backends/__init__.py's ``Backend``, answered so far for
accum_train.fit (issue 76).

``fit_parts`` gives fit's door what it drives through the one loop (keras_fit/fit_hooks.py), as it drives the
TensorFlow backend's: the feed (feed.py: arrays, generators, PyDatasets and tf.data.Datasets read in numpy, so that
no TensorFlow is needed unless the data is a tf.data.Dataset), the accumulator (engine.py, over the devices of a
keras.distribution.DataParallel: devices.py) for a compiled Keras model and its loss (objective.py: the
reductions, masks, sample weights and outputs Keras' compiled loss takes), and the validation's evaluation
(evaluation.py), and a run directory's checkpoints as numpy files (checkpoints.py). What the TensorFlow backend
answers beyond that (strategies, the commands) is not here yet: asking for any of it raises one line that says so,
rather than training something else.
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import jax
import keras
import numpy as np

from ... import keras_private
from ...defaults import ARRAY_BATCH_SIZE, FIT
from ...errors import Refused, UserError
from ...trainer.data.arrays import check_cut, check_schedule
from ...trainer.data.batching import Cut
from ...trainer.data.conversion import kind
from ...trainer.noise import Estimate
from .checkpoints import Checkpoints as Checkpoints  # the Backend's names: a run directory's checkpoints/
from .checkpoints import checkpoint_problem as checkpoint_problem
from .checkpoints import engine_state as engine_state
from .checkpoints import restore_weights as restore_weights  # the readers' (accum/reload.py)
from .checkpoints import saved_value as saved_value
from .checkpoints import saved_weight_shapes as saved_weight_shapes
from .devices import DataParallelAccumulator, mesh
from .engine import Accumulator, DeviceOutOfMemory
from .evaluation import Evaluation, KerasMetrics
from .feed import ArrayBatches, examples, stream_of
from .objective import LATER, KerasObjective, refused
from .trim import check_trim

NAME = "jax"
MEASURES_PEAK = False  # memory_limit refused: XLA keeps no allocator peak on a CPU, and a GPU's is untested here
OUT_OF_MEMORY = DeviceOutOfMemory  # XLA's RESOURCE_EXHAUSTED, as the engine raises it
OP_ERROR = jax.errors.JaxRuntimeError
BAD_INPUT = (TypeError, ValueError)
WHERE = "accum_train.fit"
# accum_train.fit's arguments this door takes; any other given unlike its default is refused in one line
TAKEN = (
    "x",
    "y",
    "batch_size",
    "epochs",
    "verbose",
    "shuffle",
    "sample_weight",
    "class_weight",
    "subdivisions",
    "micro_batch_size",
    "seed",
    "output_dir",  # the run directory (keras_fit/rundir.py) is fit's door's, its checkpoints checkpoints.py's
    "max_bad_steps",
    "precision",  # fit's door sets the layers' policies around the call (models/precision.py)
    "callbacks",
    "initial_epoch",
    "steps_per_epoch",
    "validation_split",  # split off by fit's door
    "validation_data",
    "validation_freq",
    "validation_steps",
    "validation_batch_size",
    "trim_padding",
    "batch_schedule",  # fit's door checked it (arguments.schedule_of): ((0-based epoch, batch size), ...)
)


class NoiseScale(Estimate):
    """The running estimate on the host (trainer/noise.py), its averages as a checkpoint holds them."""

    def held(self) -> tuple:
        return self._state()

    def hold(self, averages) -> None:
        self._host = tuple(float(v) for v in averages)


class State:
    """A door's run state a checkpoint holds by name (an epoch count, a rule's changes as JSON), on the host: its
    ``numpy()`` as a tf.Variable's (a string as bytes)."""

    def __init__(self, value, dtype: str, name: str):
        self.dtype, self.name = dtype, name
        self.assign(value)

    def assign(self, value) -> None:
        if self.dtype == "string":
            self.value = value if isinstance(value, bytes) else value.encode()
        else:
            self.value = np.asarray(value, self.dtype)

    def numpy(self):
        return self.value


def several_processes(strategy) -> bool:
    """Whether jax.distributed joined processes (each handed the same data, which they must read alike)."""
    return jax.process_count() > 1


def is_chief(strategy) -> bool:
    """Whether this process writes the run directory: the first of jax.distributed's processes."""
    return jax.process_index() == 0


def strategy_name(strategy) -> str:
    """history.jsonl's name for how the replicas are spread: the Keras distribution's, or the config's default."""
    return "default" if mesh(WHERE) is None else "data_parallel"


def batch_spec(arrays):
    """The spec of a batch of any size of ``arrays`` (a structure), as fit's checks and Keras' build read one."""
    return keras.tree.map_structure(lambda a: keras.KerasTensor((None, *a.shape[1:]), dtype=str(a.dtype)), arrays)


def allocator_peak_bytes() -> int | None:
    """The first local device's allocator peak since the process started (XLA keeps no statistics on a CPU: None)."""
    stats = jax.local_devices()[0].memory_stats()
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def state_variable(value, dtype: str, name: str) -> State:
    return State(value, dtype, name)


def elements(strategy, dataset, flagged: bool = False):
    """A feed's elements (feed.py's, a Python iterator) as an update pulls them; ``flagged``: each paired with True,
    then (None, False) for ever (the validation's: evaluation.Evaluation.step reads the flag)."""
    if not flagged:
        return iter(dataset)

    def paired():
        yield from ((element, True) for element in dataset)
        while True:
            yield None, False

    return paired()


def __getattr__(name: str):
    """The rest of ``Backend``'s names: not here yet, in one line (a module attribute that is absent otherwise)."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise Refused("jax-tensorflow-only", f"accum-train's {name!r} {LATER}")


def accumulator_for(model, objective, optimizer, *, subdivisions: int, **options) -> Accumulator:
    """The Accumulator training ``model`` (a compiled Keras model) on ``objective`` (objective.py's), over the
    devices of the Keras distribution in force (devices.py), else on one."""
    # ``metrics``: evaluation.KerasMetrics, model.fit's logs after each update; ``retried``: updates may be retried
    taken = {name: options.pop(name) for name in ("metrics", "retried") if name in options}
    if options:
        raise refused("jax-argument", f"the accumulator's {', '.join(sorted(options))}", WHERE)
    if (devices := mesh(WHERE)) is not None:
        return DataParallelAccumulator(model, objective, optimizer, subdivisions=subdivisions, mesh=devices, **taken)
    return Accumulator(model, objective, optimizer, subdivisions=subdivisions, **taken)


def built_in(spec, *_):
    """The CLI's built-in nets are TensorLayer's, which only TensorFlow runs: not a later step, never here."""
    tensorflow = "train it with KERAS_BACKEND=tensorflow"
    raise Refused(
        "jax-builtin-net", f"model.name={spec.name} is a TensorLayer net, which only TensorFlow runs: {tensorflow}"
    )


def check_fit_arguments(given: dict) -> None:
    """accum_train.fit's arguments by name (``given``) that this backend does not take yet, refused in one line
    before anything is read."""
    for name, value in given.items():
        if name not in TAKEN and not _default(value, FIT[name]):
            raise refused("jax-argument", f"{name}={value!r}", WHERE)


def fit_parts(model, given: dict, spec, trim: int) -> SimpleNamespace:
    """What accum_train.fit's door (fit.py) trains ``model`` with on JAX, from fit's arguments by name (``given``,
    its prelude done) and what the trainer takes of them (``spec``: trainer.TrainSpec): the feed and the
    validation's (feed.py, in numpy), the accumulator and its evaluation, the cut of a batch, the batch size in force
    (``nominal``) and what the run directory records of the model (``built``); ``trim``: trim_padding's multiple
    (0: none). The door drives them through the one loop (keras_fit/fit_hooks.py), as it drives TensorFlow's."""
    shuffle = given["shuffle"]  # checked by fit's door (arguments.check_keywords)
    seed = given["seed"]  # the data order's: fit's door's (inputs.order_seed), as on TensorFlow
    x, y, sample_weight, validation_data = given["x"], given["y"], given["sample_weight"], given["validation_data"]
    feed = _feed(model, kind(x), x, y, sample_weight, given, shuffle, seed, trim)
    first = feed.first_batch()
    nominal = feed.batch_size or examples(first)  # a stream's batches are its own: its first one's size
    replicas = getattr(mesh(WHERE), "size", 1)
    check_cut(feed, given["subdivisions"], spec.micro.auto)  # as on TensorFlow (train.py)
    k = spec.micro.k_for(nominal, replicas) or 1  # per device's share, as per replica; auto starts at one
    if keras_private.compile_loss(model) is not None:  # its loss, metrics and optimizer built, as model.fit builds
        keras_private.symbolic_build(model, first)
    devices = mesh(WHERE)
    key = (
        *keras_private.compiled_state(model),
        feed.steps,  # trim_padding's uncut length, which the loss may divide by
        spec.micro.auto,  # a retried update keeps its state: nothing donated
        given["precision"],
        None if devices is None else (devices.devices.shape, tuple(d.id for d in devices.devices.flat)),
    )
    built = _ENGINES.get(model, {}).get(key)
    if built is None:  # built once, then reused with its compiled updates by later calls, as Keras reuses its
        # train function: a call compiles only the shapes it has not run yet
        objective = KerasObjective(model, WHERE, steps=feed.steps)
        metrics = KerasMetrics(model)
        engine = accumulator_for(
            model, objective, model.optimizer, subdivisions=k, metrics=metrics, retried=spec.micro.auto
        )
        _ENGINES[model] = {key: (objective, metrics, engine)}
    else:
        objective, metrics, engine = built
        engine.set_subdivisions(k)
        engine.begin()
    if trim:  # refused in one line where the cut would change the update
        check_trim(objective, first, -(-nominal // (k * replicas)), WHERE)
    validation = evaluation = None
    if validation_data is not None:
        validation = _validation(validation_data, given["validation_batch_size"] or feed.batch_size or nominal, trim)
        # the validation data as its own uncut length counts (trim_padding): the same loss
        scored = objective if validation.steps == feed.steps else KerasObjective(model, WHERE, steps=validation.steps)
        evaluation = Evaluation(scored, metrics, engine.replicas)
    cut = Cut(k, engine.replicas, tuple(engine.replica_ids))
    # its variables and LoRA layers, for run.json and the checkpoints
    facts = keras_private.built(model, None) if given["output_dir"] is not None else None
    return SimpleNamespace(
        feed=feed, validation=validation, engine=engine, evaluation=evaluation, cut=cut, nominal=nominal, built=facts
    )


# model -> {what its engine was built for: (objective, metrics, accumulator)}; one entry per model, replaced when
# anything changes (keras_fit/train.py keeps TensorFlow's alike)
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _feed(model, what, x, y, sample_weight, given: dict, shuffle, seed, trim: int):
    """The feed of ``x`` of kind ``what`` (conversion.kind's): arrays laid out as on TensorFlow, else a stream."""
    class_weight, steps, schedule = given["class_weight"], given["steps_per_epoch"], given["batch_schedule"] or ()
    check_schedule(schedule, what, x, "x", steps, shuffle)
    if what == "arrays":
        if class_weight is not None and keras.tree.is_nested(y):  # as train.py
            raise Refused(
                "class-weight-outputs",
                f"{WHERE}: class_weight is only supported for a model with one output (this one has "
                f"{len(keras.tree.flatten(y))}): pass sample_weight per output instead",
            )
        batch_size = int(given["batch_size"] or ARRAY_BATCH_SIZE)
        settings = dict(batch_size=batch_size, shuffle=shuffle, seed=seed, steps_per_epoch=steps, schedule=schedule)
        return ArrayBatches(x, y, sample_weight, class_weight, trim=trim, **settings)
    if what not in ("dataset", "pydataset", "generator"):
        raise UserError(f"{WHERE}: x is missing: pass arrays, a generator or a keras.utils.PyDataset")
    task = keras_private.preprocesses(model)
    if class_weight is not None and task:
        raise refused(
            "jax-task-class-weight",
            f"class_weight for model {model.name!r}, which preprocesses its inputs in fit,",
            WHERE,
        )
    source = {"dataset": "x is a tf.data.Dataset", "pydataset": "x is a PyDataset, which gives its own batches"}
    for name in ("y", "sample_weight", "batch_size"):  # model.fit's rule: a source of batches holds them
        if given[name] is not None:  # TensorFlow's door's words (sources.fed)
            raise UserError(
                f"{WHERE}: {source.get(what, 'x is a generator, which gives its own batches')}: leave {name} out"
            )
    missing = f"model {model.name!r}'s preprocessor gives no targets for x: pass y" if task else None
    settings = dict(steps_per_epoch=steps, class_weight=class_weight, shuffle=shuffle, missing=missing, trim=trim)
    return stream_of(x, what, "x", **settings)


def _validation(validation_data, batch_size: int, trim: int):
    """model.fit's validation data as a feed: arrays in batches of ``batch_size``, in order; a dataset or a
    PyDataset as it batches itself."""
    what = kind(validation_data)  # a generator refused by fit's door (inputs.check_validation_source)
    if what in ("dataset", "pydataset"):
        settings = dict(steps_per_epoch=None, class_weight=None, shuffle=False, trim=trim)
        return stream_of(validation_data, what, "validation_data", **settings)
    x, y, weights = validation_data  # fit's door unpacked it (inputs.validation_arrays)
    names = ("validation_data's x", "validation_data's y", "validation_data's sample_weight")
    settings = dict(batch_size=batch_size, shuffle=False, seed=0, steps_per_epoch=None, names=names, trim=trim)
    return ArrayBatches(x, y, weights, None, **settings)


def _default(value, default) -> bool:
    """Whether an argument was left at its default (or given equal to it; an array never is)."""
    return value is default or (type(value) in (bool, int, float, str) and value == default)
