"""``accum_train.fit``: ``model.fit`` with exact gradient accumulation, for any Keras 3 model, loss and data.

A compiled model trains with what ``compile()`` gave it (its loss, per output
with ``loss_weights``, its optimizer object with its schedule and clipping,
its metrics); an uncompiled one with sparse categorical cross-entropy and the
``optimizer``/``learning_rate`` keywords, as before. The model object itself
is trained (callbacks see it train; an interrupt leaves it at the last
update). Each update is the update of the whole batch (``batch_size``
examples), computed as ``subdivisions`` micro-batches per replica (or as many
as ``micro_batch_size`` needs), to 1e-5 of ``model.fit`` on the whole batch:
sample and class weights, masks and several outputs normalise over the whole
batch (keras_objective.py), the model's own losses count once. It trains on the
accumulator ``accum-train run`` trains on (engine.py).
"""

from __future__ import annotations

import contextlib
import weakref
from pathlib import Path

import keras

from .. import keras_private
from ..backends import active
from ..defaults import FIT, LOSS_SCALE_GROWTH_STEPS, LOSS_SCALE_INITIAL, PRECISIONS
from ..errors import Refused, UserError
from ..keras_private import all_layers
from ..models.precision import call_precision
from ..trainer.data.batching import Cut
from ..trainer.data.feed import STREAMED, kind
from ..trainer.data.sources import feed_for
from ..trainer.data.trim import check_trimmable, trim_multiple
from ..trainer.trainer import Trainer, build_engine
from . import checks
from .arguments import (
    WHERE,
    check_keywords,
    check_model,
    check_numbers,
    compile_if_needed,
    memory_limit_of,
    order_seed,
    schedule_of,
    strategy_of,
    train_spec,
)
from .fit_hooks import FitHooks
from .history import FitHistory
from .inputs import check_examples_are_batched, split_validation, validation_feed
from .pipeline import preprocesses, task_batches
from .rundir import FitRunDir


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
    given = {name: value for name, value in locals().items() if name != "model"}
    check_model(model)
    check_numbers(batch_size, subdivisions, micro_batch_size, epochs, initial_epoch, steps_per_epoch, max_bad_steps)
    check_keywords(seed, callbacks, validation_freq, validation_steps, validation_batch_size, output_dir)
    if active().NAME != "tensorflow":  # issue 76's first step: the JAX backend's own door, for the plain case
        return active().fit(model, given)
    strategy = strategy_of(model, strategy)
    seed = None if seed is None else int(seed)  # numpy's integers as Python's: Keras' seeding and run.json take these
    what = kind(x)  # what x is (arrays, a dataset, a generator...), asked once: the steps below are handed it
    # before a task's preprocessing makes them a stream: class labels held in memory are checked in one line
    labelled = checks.held_targets(what, y, validation_data)  # before the split too: y's tail is validated on
    if preprocesses(model):  # a KerasHub task: raw examples batched, then preprocessed, as task.fit does
        raw = (x, y, sample_weight, batch_size, validation_data, validation_split, batch_schedule)
        x, validation_data = task_batches(model, what, *raw)
        what, y, sample_weight, batch_size = "dataset", None, None, None  # x: preprocessed batches, a tf.data.Dataset
        validation_split = 0.0
    limit = memory_limit_of(memory_limit)
    schedule, rule = schedule_of(batch_schedule, batch_size, epochs, subdivisions, micro_batch_size)
    if schedule:
        batch_size = schedule[0][1]
    trim = trim_multiple(trim_padding, WHERE)
    if trim:
        check_trimmable(model, strategy.num_replicas_in_sync, WHERE)
    if precision is not None and precision not in PRECISIONS:
        raise UserError(f"{WHERE}: precision={precision!r} is not one of {', '.join(PRECISIONS)} (None: the model's)")
    if shuffle not in (True, False, "batch"):
        raise UserError(f"{WHERE}: shuffle={shuffle!r} must be True, False or 'batch'")
    if seed is not None:
        keras.utils.set_random_seed(seed)
    (x, y, sample_weight), validation_data = split_validation(
        x, y, sample_weight, validation_data, validation_split, what
    )
    seed = order_seed(seed, output_dir, strategy, bool(shuffle) and what not in STREAMED)
    compile_if_needed(model, strategy, optimizer, learning_rate, labelled)
    if class_weight is not None and len(model.outputs or [None]) > 1:
        raise Refused(
            "class-weight-outputs",
            f"{WHERE}: class_weight is only supported for a model with one output (this one has "
            f"{len(model.outputs)}): pass sample_weight per output instead",
        )
    checks.check_class_weight(class_weight, sample_weight)
    settings = dict(
        batch_size=batch_size, shuffle=shuffle, seed=seed, steps_per_epoch=steps_per_epoch, schedule=schedule
    )
    feed = feed_for(x, y, sample_weight, class_weight, trim=trim, **settings)
    replicas = strategy.num_replicas_in_sync
    nominal = feed.batch_size or int(keras.tree.flatten(feed.first_batch())[0].shape[0])  # a stream: its first batch
    smallest = min([size for _, size in schedule] or [feed.batch_size or 0])
    if subdivisions is not None and feed.batch_size is not None and subdivisions > smallest:
        raise UserError(
            f"{WHERE}: subdivisions={subdivisions} must be <= batch_size={smallest} "
            f"(a micro-batch holds at least one example)"
        )
    auto = micro_batch_size == "auto"  # the whole batch at first; twice the micro-batches each time it does not fit
    if auto and feed.once:
        raise Refused(
            "auto-generator",
            f"{WHERE}: micro_batch_size='auto' retries an update that runs out of memory from the same batch, which "
            f"a generator cannot give again: pass subdivisions or a micro_batch_size in examples",
        )
    validation = None
    if validation_data is not None:
        if type(model).test_step is not keras.Model.test_step:
            raise Refused(
                "own-test-step",
                f"{WHERE}: model {model.name!r} overrides test_step, which accum_train.fit's validation does not "
                f"call (it evaluates the compiled loss and metrics itself): leave validation out and call "
                f"model.evaluate, or train with model.fit",
            )
        validation = validation_feed(validation_data, validation_batch_size or feed.batch_size, trim)

    spec = train_spec(subdivisions, micro_batch_size, limit, max_bad_steps)

    def k_for(size):  # subdivisions as given, or what keeps micro_batch_size (the trainer's one rule)
        return spec.micro.k_for(size, replicas)

    k = 1 if auto else k_for(nominal)
    cut = Cut(k, replicas, tuple(active().local_replica_ids(strategy)))
    check_examples_are_batched(model, feed, batch_size, what)
    with contextlib.ExitStack() as restore:
        if getattr(model, "run_eagerly", False):  # as model.fit honours it: to debug with print and pdb
            restore.enter_context(active().eagerly())
        restore.enter_context(call_precision(model, precision))
        names = checks.DATA_NAMES["x" if what in STREAMED else "y"]  # the arguments the messages name
        checks.check_input_kinds(keras_private.built_structures(model)[0], model.name, feed, validation, names)
        with strategy.scope():  # built, and what fit reads of the model built (its checks, its run directory)
            specs = feed.element_spec
            inputs = checks.inputs_of(specs)
            facts = checks.as_user_error(model, specs, names, keras_private.built, model, inputs, specs)
        checks.check_labels(model.name, facts, class_weight, labelled)
        key = (*_engine_key(model, strategy, "auto" if auto else k, nominal, precision, feed, validation), limit)
        built = _ENGINES.get(model, {}).get(key)
        if built is None:  # built and traced once, then reused by later calls as Keras reuses its train function
            adapters = restore.enter_context(active().pooled(model, strategy, where=f"{WHERE}: model {model.name!r}"))
            built = _engine(model, adapters, spec, nominal, strategy, feed, validation, names, cut if trim else None)
            _ENGINES[model] = {key: built}
            if verbose:  # what training holds beyond the model, said once per built engine
                print(f"{WHERE}: {active().cache_line(built[0], len(model.non_trainable_weights))}")
        else:
            restore.enter_context(active().pooled(model, strategy, built[0].norm_layers))
            built[0].hold()
        engine, evaluation = built
        engine.set_subdivisions(k)
        restore.callback(engine.release)
        say = print if verbose else (lambda line: None)
        loop = FitHooks(model, engine, evaluation, feed, cut, validation, nominal, auto=auto, say=say)
        if schedule:  # k for each batch in force
            loop.k_for, loop.rule, loop.micro_batch_size = k_for, rule, micro_batch_size
        loop.trainer = Trainer(spec, engine, model, loop.noise, nominal, say)
        directory = None
        if output_dir is not None:
            described = dict(
                batch_size=feed.batch_size, k="auto" if auto else k, seed=seed, shuffle=shuffle, steps=steps_per_epoch
            )
            if getattr(feed, "examples", None) is not None:  # arrays: the order and the epoch's updates follow them
                described["examples"] = feed.examples
            if schedule:  # a directory of a call without one records no such key
                described["batch_schedule"] = (
                    {"max_batch_size": rule.max_batch_size, "every_epochs": rule.every_epochs}
                    if rule
                    else [[e + 1, size] for e, size in schedule]
                )
            directory = FitRunDir(Path(output_dir), model, facts, engine, loop.noise, described, say, loop.rule_tracked)
            loop.checkpoints = directory
        history = FitHistory()

        def drive(stop):
            loop.stop = stop
            if directory is not None:
                loop.follow_restored_rule()
                history.earlier = directory.earlier_epochs()
            if auto:  # the k the probe chose, or a resume had come to
                loop.cut = Cut(engine.k, replicas, cut.local)
            loop.run(
                epochs=epochs,
                initial_epoch=initial_epoch,
                callbacks=[*(callbacks or []), history],  # last, as model.fit's: it sees what others add
                verbose=verbose,
                validation_freq=validation_freq,
                validation_steps=validation_steps,
                start=directory.start if directory is not None else (0, 0),
            )

        # memory.choose_subdivisions' take(m): the first batch's first m examples, as (x, y) (no sample weights: the
        # probe measures a micro-step's memory, not its loss)
        first = keras.utils.unpack_x_y_sample_weight(feed.first_batch())[:2]
        loop.trainer.run(directory, drive, lambda m: keras.tree.map_structure(lambda t: t[:m], first))
    return history


# model -> {what its engine was built for: the engine}; one entry per model, replaced when anything changes
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _engine_key(model, strategy, k, nominal, precision, feed, validation) -> tuple:
    """What a built engine depends on: a later call that matches all of it reuses the engine and its traced
    graphs (a compile() makes a new optimizer and loss, a trainable flag another variable list)."""
    return (
        id(strategy),
        id(model.optimizer),
        id(keras_private.compile_loss(model)),
        id(keras_private.compile_metrics(model)),
        k,
        nominal,
        precision,
        repr(feed.element_spec),
        feed.steps,  # trim_padding's uncut length, which the loss may divide by
        None if validation is None else (repr(validation.element_spec), validation.steps),
        tuple(id(v) for v in model.trainable_variables),
    )


def _engine(model, norm_layers, spec, nominal, strategy, feed, validation, names, cut):
    """(accumulator, evaluation or None) for ``model``, its compiled loss taken apart for ``feed`` and ``validation``
    (or None), as ``spec`` (trainer.TrainSpec) says for batches of ``nominal``; ``cut``: trim_padding's (or None)."""
    if keras_private.compile_loss(model) is None:  # the key of limitations.md's row, as the probe's below
        raise Refused(
            "no-compiled-loss",
            f"{WHERE}: model {model.name!r} is compiled without a loss (compile(loss=None); add_loss alone): "
            f"accum_train.fit divides the compiled loss into micro-batch sums; compile it with "
            f"compile(loss=...), or train with model.fit",
        )
    objective = active().KerasObjective(model, steps=feed.steps)
    # the validation data as its own uncut length counts (trim_padding): the same loss
    scored = objective if validation is None else objective.with_steps(validation.steps)
    sources = [(objective, feed, names, WHERE)]
    if validation is not None:
        sources.append((scored, validation, checks.DATA_NAMES["validation_data"], f"{WHERE}: validation_data"))
    groups = []  # each source's normalisers (Objective.probe); data that does not fit, in one line
    for taken, source, named, _ in sources:
        element_spec = source.element_spec
        groups.append(checks.as_user_error(model, element_spec, named, taken.probe, element_spec, strategy))
        if not groups[-1] and taken.regularization() is None:
            raise Refused(
                "no-compiled-loss", f"{WHERE}: model {model.name!r} has no loss: compile it with compile(loss=...)"
            )
    for (taken, source, _, where), found in zip(sources, groups) if cut is not None else ():  # validation's too
        first, element_spec = source.first_batch(), source.element_spec
        active().check_trim(taken, found, first, source.timed, element_spec, cut, strategy, where)
    groups, eval_groups = groups[0], (groups[1] if validation is not None else ())
    optimizer = model.optimizer
    loss_scale, growth = None, LOSS_SCALE_GROWTH_STEPS
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        loss_scale, growth = float(optimizer.initial_scale), int(optimizer.dynamic_growth_steps)
        optimizer = optimizer.inner_optimizer
    elif any(getattr(layer.dtype_policy, "compute_dtype", None) == "float16" for layer in all_layers(model)):
        loss_scale = LOSS_SCALE_INITIAL
    metrics = active().KerasMetrics(model, strategy)
    jit = bool(model.jit_compile)  # as compile() resolved it ("auto": on a GPU, when the model supports XLA)
    checks.warn_small_batchnorm(model.name, norm_layers, nominal, spec.micro, strategy.num_replicas_in_sync)
    engine = build_engine(
        spec,
        model,
        objective,
        optimizer,
        nominal,
        strategy,
        groups=groups,
        metrics=metrics,
        prepare=_unpacked,
        norm_layers=norm_layers,
        jit=jit,
        loss_scale=loss_scale,
        growth_steps=growth,
    )
    evaluation = active().Evaluation(scored, metrics, eval_groups, strategy, _unpacked, jit) if eval_groups else None
    return engine, evaluation


def _unpacked(element, n):
    """An element of accum_train.fit's pipeline (inputs.py: (data, where)) as (x, y, sample_weight)."""
    return keras.utils.unpack_x_y_sample_weight(element[0])
