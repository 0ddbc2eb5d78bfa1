"""Every use of Keras' private modules and attributes, in one place (the engine's, the norm layers' and
accum_train.fit's).

``model.fit`` keeps its conventions in Keras' trainer internals: how a compiled
loss maps its losses onto the model's outputs (``CompileLoss``), how a loss
merges a mask and sample weights (``keras.src.losses.loss``), where the
compiled metrics and the loss trackers live, how the model, its metrics and
its optimizer are built before the first step (``Trainer._symbolic_build``),
how a ``PyDataset`` becomes a ``tf.data`` pipeline. accum_train.fit reuses
them rather than copying their rules, so that it follows ``model.fit``
exactly. They are not a public API: ``setup.cfg`` pins the Keras releases
they were tested on, and the exactness tests (tests/test_fit_exact.py) fail
if any of them changes meaning.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import keras
from keras.src.backend import compute_output_spec, get_keras_mask, set_keras_mask
from keras.src.losses import ALL_OBJECTS_DICT as LOSSES  # noqa: F401  (re-exported)
from keras.src.losses.loss import squeeze_or_expand_to_same_rank  # noqa: F401  (re-exported)
from keras.src.metrics import ALL_OBJECTS_DICT as METRICS  # noqa: F401  (re-exported)
from keras.src.trainers.compile_utils import CompileLoss
from keras.src.utils.python_utils import pythonify_logs  # noqa: F401  (re-exported)


def storage(variable):
    """The tf.Variable under a Keras 3 variable (outside autocast scopes, ``value`` is it): what an optimizer,
    a tf.train.Checkpoint and a strategy's scope see. On JAX, whose ``value`` is an immutable array, the variable."""
    if isinstance(variable, keras.Variable) and keras.config.backend() == "tensorflow":
        return variable.value
    return variable


def write(variables, values) -> None:
    """``values`` (a jitted update's outputs on JAX) into ``variables`` as ``Variable.assign`` writes them, less its
    conversion and checks where a value already has its variable's dtype and shape (about 35 µs a variable, 1.4 ms
    of each update's host time on the README's convnet)."""
    for variable, value in zip(variables, values):
        current = variable._value
        if getattr(value, "dtype", None) == current.dtype and getattr(value, "shape", None) == current.shape:
            variable._direct_assign(value)
        else:
            variable.assign(value)


def masks_of(outputs) -> list:
    """The Keras masks of a model's ``outputs`` (flattened; None where unmasked): a mask is an attribute of its
    tensor, lost where the tensor leaves a function compiled with XLA unless it leaves beside it."""
    return [get_keras_mask(t) for t in keras.tree.flatten(outputs)]


def masked(outputs, masks: list):
    """``outputs`` with the ``masks`` that ``masks_of`` took off them set again."""
    for tensor, mask in zip(keras.tree.flatten(outputs), masks):
        if mask is not None:
            set_keras_mask(tensor, mask)
    return outputs


def compile_loss(model) -> CompileLoss | None:
    """The loss ``compile()`` gave the model (None: compiled without one)."""
    return getattr(model, "_compile_loss", None)


def compile_metrics(model):
    """The metrics ``compile()`` gave the model (a CompileMetrics, or None)."""
    return getattr(model, "_compile_metrics", None)


def compiled_state(model) -> tuple:
    """What a ``compile()`` makes anew (the optimizer, the compiled loss and metrics) and a changed trainable flag
    (the trainable variables' list), by identity: an engine built for a model is reused while all of it stays."""
    return (
        id(model.optimizer),
        id(compile_loss(model)),
        id(compile_metrics(model)),
        tuple(id(v) for v in model.trainable_variables),
    )


def loss_tracker(model):
    """The ``loss`` Mean that model.fit's logs report (built by compile())."""
    return getattr(model, "_loss_tracker", None)


def output_loss_trackers(model) -> list:
    """One Mean per output (``<output>_loss``) when several outputs have a loss, as model.fit logs them."""
    loss = compile_loss(model)
    return [] if loss is None else list(loss.metrics)


def symbolic_build(model, data_batch) -> None:
    """Build the model, its compiled loss and metrics and its optimizer from one batch's shapes, as model.fit
    does before its first step (outside any tf.function: they create variables)."""
    model._symbolic_build(data_batch=data_batch)


def symbolic(specs):
    """A batch's TensorSpecs as the symbolic inputs (keras.KerasTensor) that ``symbolic_call`` takes."""
    return keras.tree.map_structure(lambda spec: keras.KerasTensor(tuple(spec.shape.as_list()), spec.dtype.name), specs)


def symbolic_call(model, x):
    """``model`` called on symbolic inputs ``x`` (keras.KerasTensor), nothing run: its outputs' specs, or the
    error a call on such a batch raises (what model.fit's build meets first)."""
    return compute_output_spec(model, x, training=False)


def built_structures(model) -> tuple:
    """(inputs, outputs): the structures of a functional (or Sequential) model's inputs and outputs as it was built (a
    dict by name, a list, one KerasTensor); (None, None) for a subclassed model, which has none until called."""
    functional = getattr(model, "_functional", None)  # a Sequential's, once it has its input
    built = functional if functional is not None else model
    return getattr(built, "_inputs_struct", None), getattr(built, "_outputs_struct", None)


@dataclass(frozen=True)
class Built:
    """What accum_train.fit reads of a built model (``built``), asked once and handed down in the model's place."""

    weights: list  # the storage of its variables: what a checkpoint holds
    lora: dict  # {"lora": [[layer path, rank, alpha], ...]} of the layers with LoRA enabled; {} for none
    losses: int  # the compiled loss's entries (0: compiled without one)
    sparse: list  # (path, ignore_class) of each entry that is a sparse categorical cross-entropy: takes class indices
    outputs: Callable  # () -> the outputs' structure of specs (a subclassed model's: a symbolic call, when asked)
    compiled: tuple  # compiled_state once built (the build makes the variables): what an engine for it depends on


def built(model, x, data_batch=None) -> Built:
    """What accum_train.fit reads of ``model`` (``x``: its inputs' specs), built first from ``data_batch`` if given."""
    if data_batch is not None:
        symbolic_build(model, data_batch)
    entries = flat_losses(model) if compile_loss(model) is not None else []
    sparse = [e for e in entries if getattr(e.loss, "fn", None) is keras.losses.sparse_categorical_crossentropy]
    lora = [layer for layer in all_layers(model) if getattr(layer, "lora_enabled", False)]
    structure = built_structures(model)[1]
    return Built(
        [storage(v) for v in model.variables],
        {"lora": [[layer.path, layer.lora_rank, layer.lora_alpha] for layer in lora]} if lora else {},
        len(entries),
        [(entry.path, getattr(entry.loss, "_fn_kwargs", {}).get("ignore_class")) for entry in sparse],
        lambda: symbolic_call(model, symbolic(x)) if structure is None else structure,
        compiled_state(model),
    )


def flat_losses(model) -> list:
    """The compiled loss's entries, one per output with a loss: (path, loss object, weight or None, name)."""
    return list(compile_loss(model)._flat_losses)


@contextlib.contextmanager
def each_output_loss(model, replace):
    """Within: the compiled loss calls ``replace(i, entry)(y_true, y_pred, sample_weight)`` for each of its
    entries, with the targets, outputs and sample weights Keras' own structure matching picked for that
    output, instead of the entry's loss, and leaves its per-output trackers alone.

    So accum_train.fit takes each output's loss apart (sums and normalisers) on exactly the tensors
    model.fit would give that loss."""
    loss = compile_loss(model)
    saved_losses, saved_metrics = loss._flat_losses, loss._metrics
    loss._flat_losses = [
        CompileLoss.Loss(entry.path, replace(i, entry), None, entry.name) for i, entry in enumerate(saved_losses)
    ]
    loss._metrics = [None] * len(saved_losses)  # falsy: Keras skips its tracker update
    try:
        yield loss
    finally:
        loss._flat_losses, loss._metrics = saved_losses, saved_metrics


def py_dataset_adapter(py_dataset, shuffle: bool):
    """Keras' own reader of a keras.utils.PyDataset, as model.fit reads one (its workers and multiprocessing settings
    included): ``get_tf_dataset``, ``get_numpy_iterator`` and ``on_epoch_end``, which goes after each epoch."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    return PyDatasetAdapter(py_dataset, shuffle=shuffle)


def restart_py_dataset_workers(adapter) -> None:
    """Stop a PyDataset's workers (if it has any) after a read that ended early (the look at its first batch), and
    drop what they fetched. Left running, they go on from where that read stopped, and the next reading waits
    forever for the batches it took; stopped alone, they keep what they fetched, and the next reading begins
    with those batches."""
    enqueuer = adapter.enqueuer
    if enqueuer is not None:
        enqueuer.stop()
        while not enqueuer.ready_queue.empty():
            enqueuer.ready_queue.get_nowait()


def takes_mask(layer) -> bool:
    """Whether a built functional graph hands ``layer`` a mask (a Keras mask on any input of its calls)."""
    nodes = getattr(layer, "_inbound_nodes", [])
    return any(getattr(t, "_keras_mask", None) is not None for node in nodes for t in node.input_tensors)


def all_layers(model) -> list:
    """Every layer of ``model``, nested ones too (a Bidirectional's, a sub-model's)."""
    return list(model._flatten_layers())


def rematerialise_activations(model) -> int:
    """Each layer of ``model`` with an activation recomputes it in the backward pass instead of keeping its
    intermediates (``keras.RematScope(mode="activations")``, which Keras reads when a layer is created, set on
    layers that exist: the next trace of a call uses it); how many layers that changed (0 once it is on). Only
    "activations" mode works in a TensorFlow graph (Keras 3.15: "full" gives wrong gradients there, the others fail
    to trace)."""
    layers = [
        layer
        for layer in all_layers(model)
        if getattr(layer, "activation", None) is not None and getattr(layer._remat_mode, "mode", None) != "activations"
    ]
    for layer in layers:
        layer._remat_mode = keras.RematScope(mode="activations")
    return len(layers)


def loops_over_time(model) -> bool:
    """Whether a layer of ``model`` (nested ones too: a Bidirectional's) loops over the steps of a sequence."""
    return any(isinstance(layer, keras.layers.RNN) for layer in all_layers(model))


def reduction_axes(layer) -> list:
    """The axes a keras BatchNormalization layer takes its moments over (all but its feature axes)."""
    return layer._reduction_axes


def has_gradient_all_reduce(optimizer) -> bool:
    """Whether ``optimizer`` all-reduces the gradients apply_gradients gets through the hook ``hold_all_reduce``
    replaces."""
    return hasattr(optimizer, "_all_reduce_sum_gradients")


def hold_all_reduce(optimizer) -> None:
    """Make ``optimizer``'s apply_gradients take the gradients as given, in replica context, without its own
    all-reduce (they are the global sum already); ``release_all_reduce`` gives it back."""
    optimizer._all_reduce_sum_gradients = list


def release_all_reduce(optimizer) -> None:
    if "_all_reduce_sum_gradients" in vars(optimizer):
        del optimizer._all_reduce_sum_gradients


def initial_epoch(model, given: int) -> int:
    """The epoch to start from after the callbacks' on_train_begin: BackupAndRestore sets model._initial_epoch to
    the epoch it restored, which model.fit then starts from (instead of its initial_epoch)."""
    return getattr(model, "_initial_epoch", None) or given


def seed_states(model) -> list:
    """The state variables of every SeedGenerator ``model``'s layers draw from (a Dropout's, a noise layer's)."""
    return [generator.state for layer in all_layers(model) for generator in getattr(layer, "_seed_generators", ())]


def each_compiled_metric(compiled, y, y_pred, sample_weight) -> list:
    """(metric, y_true, y_pred, sample_weight) for each metric of ``compiled`` (a CompileMetrics) as its
    update_state pairs them: an output's targets and predictions, the sample weights for ``weighted_metrics`` only
    (None for ``metrics``), one set repeated over the outputs where one is given."""
    if not compiled.built:
        compiled.build(y, y_pred)
    y, y_pred = compiled._flatten_y(y), compiled._flatten_y(y_pred)
    weights = [None] * len(y) if sample_weight is None else compiled._flatten_y(sample_weight)
    weights = weights if len(weights) >= len(y) else [weights[0]] * len(y)
    pairs = [(m, t, p, None) for m, t, p in zip(compiled._flat_metrics, y, y_pred) if m]
    return pairs + [(m, t, p, w) for m, t, p, w in zip(compiled._flat_weighted_metrics, y, y_pred, weights) if m]


def preprocesses(model) -> bool:
    """Whether ``model`` preprocesses its raw inputs in ``fit`` (a KerasHub task with a preprocessor)."""
    return getattr(model, "preprocessor", None) is not None and callable(getattr(model, "preprocess_samples", None))
