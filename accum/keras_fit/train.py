"""accum_train.fit's parts on TensorFlow, past its door (fit.py, which drives them): the arguments resolved into a feed
(trainer/data/, tf.data) and the compiled loss taken apart into an engine built once per model and setting."""

from __future__ import annotations

import contextlib
import weakref
from types import SimpleNamespace

import keras

from .. import keras_private
from ..backends import active
from ..defaults import LOSS_SCALE_GROWTH_STEPS, LOSS_SCALE_INITIAL
from ..errors import Refused
from ..keras_private import all_layers
from ..models.precision import call_precision
from ..trainer.data.arrays import check_cut
from ..trainer.data.batching import Cut
from ..trainer.data.conversion import STREAMED
from ..trainer.data.sources import feed_for
from ..trainer.trainer import build_engine
from . import checks
from .arguments import WHERE, compile_if_needed
from .inputs import check_examples_are_batched, validation_feed


def parts(model, given: dict, spec, held: contextlib.ExitStack, *, what, labelled, strategy, trim) -> SimpleNamespace:
    """What fit's door (fit.py ``_train``) drives through the one loop on TensorFlow, from fit's arguments by name
    (``given``, its prelude done: validation split off, seeds and schedule resolved) and the trainer's ``spec``: the
    feed and the validation's (trainer/data/, tf.data), the accumulator and its evaluation (built once per model and
    setting), the cut of a batch, the batch size in force (``nominal``) and what the run directory records of the
    model (``built``). The call's contexts (eager, precision, BatchNorm pooling) are entered on ``held``.
    ``what``: x's kind; ``labelled``: the class labels held in memory (checks.held_targets); ``trim``:
    trim_padding's multiple (0: none)."""
    compile_if_needed(model, strategy, given["optimizer"], given["learning_rate"], labelled)
    class_weight, verbose = given["class_weight"], given["verbose"]
    if class_weight is not None and len(model.outputs or [None]) > 1:
        raise Refused(
            "class-weight-outputs",
            f"{WHERE}: class_weight is only supported for a model with one output (this one has "
            f"{len(model.outputs)}): pass sample_weight per output instead",
        )
    settings = {name: given[name] for name in ("batch_size", "shuffle", "seed", "steps_per_epoch")}
    feed = feed_for(
        given["x"], given["y"], given["sample_weight"], class_weight, trim=trim, schedule=given["batch_schedule"],
        **settings,
    )  # fmt: skip
    replicas = strategy.num_replicas_in_sync
    nominal = feed.batch_size or int(keras.tree.flatten(feed.first_batch())[0].shape[0])  # a stream: its first batch
    auto = spec.micro.auto  # the whole batch at first; twice the micro-batches each time it does not fit
    check_cut(feed, given["subdivisions"], auto)
    validation = None
    if given["validation_data"] is not None:
        if type(model).test_step is not keras.Model.test_step:
            raise Refused(
                "own-test-step",
                f"{WHERE}: model {model.name!r} overrides test_step, which accum_train.fit's validation does not "
                f"call (it evaluates the compiled loss and metrics itself): leave validation out and call "
                f"model.evaluate, or train with model.fit",
            )
        validation = validation_feed(given["validation_data"], given["validation_batch_size"] or feed.batch_size, trim)
    k = 1 if auto else spec.micro.k_for(nominal, replicas)
    cut = Cut(k, replicas, tuple(active().local_replica_ids(strategy)))
    check_examples_are_batched(model, feed, given["batch_size"], what)
    if getattr(model, "run_eagerly", False):  # as model.fit honours it: to debug with print and pdb
        held.enter_context(active().eagerly())
    held.enter_context(call_precision(model, given["precision"]))
    names = checks.DATA_NAMES["x" if what in STREAMED else "y"]  # the arguments the messages name
    checks.check_input_kinds(keras_private.built_structures(model)[0], model.name, feed, validation, names)
    with strategy.scope():  # built, and what fit reads of the model built (its checks, its run directory)
        specs = feed.element_spec
        inputs = checks.inputs_of(specs)
        facts = checks.as_user_error(model, specs, names, keras_private.built, model, inputs, specs)
    checks.check_labels(model.name, facts, class_weight, labelled)
    # what a built engine depends on: a later call that matches all of it reuses the engine and its traced graphs
    # (keras_private.compiled_state: a compile() makes a new optimizer and loss, a trainable flag another variable list)
    key = (
        id(strategy),
        *facts.compiled,
        "auto" if auto else k,
        nominal,
        given["precision"],
        repr(feed.element_spec),
        feed.steps,  # trim_padding's uncut length, which the loss may divide by
        None if validation is None else (repr(validation.element_spec), validation.steps),
        spec.memory_limit,
    )
    built = _ENGINES.get(model, {}).get(key)
    if built is None:  # built and traced once, then reused by later calls as Keras reuses its train function
        adapters = held.enter_context(active().pooled(model, strategy, where=f"{WHERE}: model {model.name!r}"))
        built = _engine(model, adapters, spec, nominal, strategy, feed, validation, names, cut if trim else None)
        _ENGINES[model] = {key: built}
        if verbose:  # what training holds beyond the model, said once per built engine
            print(f"{WHERE}: {active().cache_line(built[0], len(model.non_trainable_weights))}")
    else:
        held.enter_context(active().pooled(model, strategy, built[0].norm_layers))
        built[0].hold()
    engine, evaluation = built
    engine.set_subdivisions(k)
    held.callback(engine.release)
    return SimpleNamespace(
        feed=feed, validation=validation, engine=engine, evaluation=evaluation, cut=cut, nominal=nominal, built=facts
    )


# model -> {what its engine was built for: the engine}; one entry per model, replaced when anything changes
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
