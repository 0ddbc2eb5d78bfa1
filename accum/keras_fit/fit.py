"""``accum_train.fit``: ``model.fit`` with exact gradient accumulation, for Keras 3 models, losses and data under
docs/limitations.md's conditions. This is its door, which imports no TensorFlow: on Keras' JAX backend ``fit`` runs
where TensorFlow is not installed.

A compiled model trains with what ``compile()`` gave it (its loss, per output with ``loss_weights``, its optimizer
object with its schedule and clipping, its metrics); an uncompiled one with sparse categorical cross-entropy and the
``optimizer``/``learning_rate`` keywords, as before. The model object itself is trained (callbacks see it train; an
interrupt leaves it at the last update). Each update is the update of the whole batch (``batch_size`` examples),
computed as ``subdivisions`` micro-batches per replica (or as many as ``micro_batch_size`` needs), to 1e-5 of
``model.fit`` on the whole batch: sample and class weights, masks and several outputs normalise over the whole batch
(keras_objective.py), the model's own losses count once. It trains on the accumulator ``accum-train run`` trains on,
through the Trainer: model.fit's course before training is taken here for both Keras backends, and each backend gives
the feed, the accumulator and the evaluation (train.py on TensorFlow, accum/backends/jax/backend.py on JAX).
"""

from __future__ import annotations

import contextlib

import keras

from .. import keras_private
from ..backends import active
from ..defaults import FIT, PRECISIONS
from ..errors import UserError
from ..models.precision import call_precision
from ..trainer.data.conversion import STREAMED, kind
from ..trainer.data.lengths import check_trimmable, trim_multiple
from . import checks
from .arguments import (
    WHERE,
    check_class_weight,
    check_keywords,
    check_model,
    check_numbers,
    memory_limit_of,
    schedule_of,
    strategy_of,
    train_spec,
)
from .fit_hooks import FitHooks
from .inputs import check_validation_source, order_seed, split_validation, task_batches, validation_arrays
from .rundir import fit_run_dir


def fit(
    model,
    x=FIT["x"],
    y=FIT["y"],
    batch_size=FIT["batch_size"],
    epochs=FIT["epochs"],
    verbose=FIT["verbose"],
    callbacks=FIT["callbacks"],
    validation_split=FIT["validation_split"],
    validation_data=FIT["validation_data"],
    shuffle=FIT["shuffle"],
    class_weight=FIT["class_weight"],
    sample_weight=FIT["sample_weight"],
    initial_epoch=FIT["initial_epoch"],
    steps_per_epoch=FIT["steps_per_epoch"],
    validation_steps=FIT["validation_steps"],
    validation_batch_size=FIT["validation_batch_size"],
    validation_freq=FIT["validation_freq"],
    *,
    subdivisions=FIT["subdivisions"],
    micro_batch_size=FIT["micro_batch_size"],
    trim_padding=FIT["trim_padding"],
    seed=FIT["seed"],
    precision=FIT["precision"],
    strategy=FIT["strategy"],
    output_dir=FIT["output_dir"],
    max_bad_steps=FIT["max_bad_steps"],
    memory_limit=FIT["memory_limit"],
    batch_schedule=FIT["batch_schedule"],
    optimizer=FIT["optimizer"],
    learning_rate=FIT["learning_rate"],
):
    """Train ``model`` as ``model.fit`` would on whole batches of ``batch_size``, a micro-batch at a time.

    The arguments up to ``validation_freq`` are model.fit's, in its order and with its meaning; the update is
    the whole batch's however it is split (to 1e-5 in float32; the conditions and every difference from model.fit
    are in docs/limitations.md). Added, keyword-only:

    - ``subdivisions``: micro-batches per replica and update.
    - ``micro_batch_size``: the fewest micro-batches that keep each within it instead. "auto", as the CLI's
      ``subdivisions: auto``: the fewest that fit, measured before training by one micro-step per candidate
      (1, 2, 4, ...) under ``memory_limit``, else starting at one; an update that runs out of memory is retried
      from the same data at twice the micro-batches. Neither: one pass per update.
    - ``trim_padding``: True orders each batch's sequences by length and cuts each micro-batch's time axis
      (axis 1 of x, and of y and sample weights that have it) after its longest sequence, rounded up to a
      multiple of 16 (an int: of that), so that micro-batches skip most of their padding. One replica; the
      model must take any length on axis 1, and padding (zeros after each sequence) must change neither its
      loss nor its gradients: checked on one micro-batch when the engine is built.
    - ``seed``: None (model.fit's way) draws the order arrays are shuffled in afresh and touches no global
      random state; an int fixes that order and Keras' random state (``keras.utils.set_random_seed``), so the
      call repeats exactly.
    - ``precision``: "float32", "mixed_float16" or "mixed_bfloat16" for this call (None: the model's own
      policy); float16 gets one dynamic loss scale per update.
    - ``strategy``: the tf.distribute strategy the model was created under (None: the model's own).
    - ``output_dir``: a run directory kept as training goes; a later call with the same ``output_dir``
      resumes from it.
    - ``max_bad_steps``: stop (``accum_train.errors.TrainingStopped``) at the update that makes this many in a row
      skipped for a non-finite loss or gradient; None (model.fit's way): never, each such update skipped.
    - ``memory_limit``: a size such as "2GiB": the first update is measured before it is applied, and one whose
      TensorFlow allocator peak is over it ends the call (``accum_train.errors.OutOfMemory``), or, with
      ``micro_batch_size="auto"`` (which measures under it first), is retried at twice the micro-batches. None: no
      limit.
    - ``batch_schedule``: batch sizes that change from epoch to epoch, as the CLI's key of that name: a list
      such as ``[{"epoch": 1, "batch_size": 32}, {"epoch": 4, "batch_size": 128}]`` (1-based epochs; before the
      first entry, ``batch_size``), checked by the CLI's rules for it. Arrays only; each epoch is one pass at the
      batch in force, and ``micro_batch_size``
      keeps the micro-batch (and the memory) as the batch grows; or the rule ``{"rule": "noise_scale",
      "max_batch_size": 4096}``, which grows the batch at epoch ends to the measured noise scale in whole
      micro-batches (``micro_batch_size`` needed). The optimizer's learning rate is as compiled.
    - ``optimizer``, ``learning_rate``: for an uncompiled model only.

    Returns model.fit's History (``history.history``; ``history["loss"]`` works too). Bad arguments raise
    ``accum_train.UserError`` with one line naming what is wrong and how to fix it, before anything trains."""
    return _checked(model, {name: value for name, value in locals().items() if name != "model"})


def fit_with_summary(model, summary, **arguments):
    """``fit(model, **arguments)`` for the CLI's run on Keras (on_keras.py): ``summary()`` gives the fields the CLI
    adds to summary.json (its test scores, its settings), which the run directory writes once, as the call ends."""
    unknown = sorted(set(arguments) - set(FIT))
    if unknown:  # as Python refuses it for fit itself
        raise TypeError(f"fit() got an unexpected keyword argument {unknown[0]!r}")
    return _checked(model, {**FIT, **arguments}, summary)


def _checked(model, given: dict, summary=None):
    """fit's arguments (``given``, by name) checked before anything trains, then trained (``_train``)."""
    check_model(model)
    numbers = ("batch_size", "subdivisions", "micro_batch_size", "epochs", "initial_epoch", "steps_per_epoch")
    check_numbers(*(given[name] for name in numbers), given["max_bad_steps"])
    keywords = ("seed", "shuffle", "callbacks", "validation_freq", "validation_steps", "validation_batch_size")
    check_keywords(*(given[name] for name in keywords), given["output_dir"])
    check_class_weight(given["class_weight"], given["sample_weight"])
    precision = given["precision"]
    if precision is not None and precision not in PRECISIONS:
        raise UserError(f"{WHERE}: precision={precision!r} is not one of {', '.join(PRECISIONS)} (None: the model's)")
    return _train(model, given, summary)


def _train(model, given: dict, summary=None):
    """accum_train.fit's checked arguments (``given``, by name) trained on ``model`` on the Keras backend in force:
    model.fit's course before training (a task's raw examples preprocessed, the random state seeded, validation split
    off, the data order's seed, the batch schedule) taken here once for both backends; the feed, the accumulator and
    the evaluation the backend's (``parts``); then the one loop (fit_hooks.FitHooks) in the run directory, whose
    summary.json ``summary()`` adds to."""
    if active().NAME == "tensorflow":
        # tf.data's (trainer/data/): loaded here, so that accum_train.fit imports, and runs on Keras' JAX backend,
        # where TensorFlow is not installed
        from .train import parts

        strategy = strategy_of(model, given["strategy"])
    else:  # no tf.distribute strategy: the JAX backend reads the keras.distribution in force
        active().check_fit_arguments(given)  # what it does not take yet, refused before anything is read
        parts, strategy = _jax_parts, None
    what = kind(given["x"])  # what x is (arrays, a dataset, a generator...), asked once: the steps below are handed it
    # before a task's preprocessing makes them a stream: class labels held in memory are checked in one line
    labelled = checks.held_targets(what, given["y"], given["validation_data"])
    if keras_private.preprocesses(model):  # a KerasHub task: raw examples batched, then preprocessed, as task.fit does
        raw = ("x", "y", "sample_weight", "batch_size", "validation_data", "validation_split", "batch_schedule")
        x, validation = task_batches(model, what, *(given[name] for name in raw))
        given.update(x=x, y=None, sample_weight=None, batch_size=None, validation_data=validation, validation_split=0.0)
        what = "dataset"  # x: preprocessed batches, a tf.data.Dataset
    limit = memory_limit_of(given["memory_limit"])
    micro_batch_size = given["micro_batch_size"]
    schedule, rule = schedule_of(
        given["batch_schedule"], given["batch_size"], given["epochs"], given["subdivisions"], micro_batch_size
    )
    if schedule:  # each epoch one pass over the arrays at the batch in force
        given["batch_size"] = schedule[0][1]
    trim = trim_multiple(given["trim_padding"], WHERE)
    if trim:  # on JAX one device's: several devices would cut alike, to one shape
        check_trimmable(model, strategy.num_replicas_in_sync if strategy is not None else 1, WHERE)
    seed = None if given["seed"] is None else int(given["seed"])  # numpy's integers as Python's, for Keras and run.json
    if seed is not None:  # Keras' random state; the data order's seed below
        keras.utils.set_random_seed(seed)
    data = (given[name] for name in ("x", "y", "sample_weight", "validation_data", "validation_split"))
    (x, y, sample_weight), validation = split_validation(*data, what)
    seed = order_seed(seed, given["output_dir"], strategy, bool(given["shuffle"]) and what not in STREAMED)
    given.update(
        x=x, y=y, sample_weight=sample_weight, validation_data=validation, validation_split=0.0, seed=seed,
        batch_schedule=schedule,
    )  # fmt: skip
    spec = train_spec(given["subdivisions"], micro_batch_size, limit, given["max_bad_steps"])
    with contextlib.ExitStack() as held:
        made = parts(model, given, spec, held, what=what, labelled=labelled, strategy=strategy, trim=trim)
        loop = FitHooks(
            model, made.engine, made.evaluation, made.feed, made.cut, made.validation, made.nominal,
            auto=spec.micro.auto, verbose=given["verbose"],
        )  # fmt: skip
        if schedule:  # k for each batch in force, and the noise-scale rule's
            loop.k_for = lambda size: spec.micro.k_for(size, made.cut.replicas)
            loop.rule, loop.micro_batch_size = rule, micro_batch_size
        order = (seed, given["shuffle"], given["steps_per_epoch"], schedule, rule)
        directory = fit_run_dir(given["output_dir"], model, made.built, loop, made.cut.k, *order, summary=summary)
        names = ("epochs", "initial_epoch", "callbacks", "verbose", "validation_freq", "validation_steps")
        return loop.call(spec, directory, **{name: given[name] for name in names})


def _jax_parts(model, given: dict, spec, held: contextlib.ExitStack, *, what, labelled, strategy, trim):
    """train.parts on Keras' JAX backend: the layers' policies for the call (as on TensorFlow), validation arrays
    unpacked, then the backend's feed (in numpy), accumulator and evaluation (jax/backend.py ``fit_parts``)."""
    held.enter_context(call_precision(model, given["precision"]))
    if check_validation_source(given["validation_data"]) == "arrays":
        given["validation_data"] = validation_arrays(given["validation_data"])
    return active().fit_parts(model, given, spec, trim)
