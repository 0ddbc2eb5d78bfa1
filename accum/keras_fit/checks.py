"""accum_train.fit's data checked against the model, each problem one line (``UserError``) that names the argument
at fault and what it may hold: inputs that do not fit the model's, class labels outside its output, class weights
of classes it does not have. model.fit meets these as an error that blames another thing (the compiled loss), as a
TensorFlow graph error of fifty lines, or, for labels out of range on a GPU, as a NaN loss.

Labels are checked where the data is held in memory (arrays, tensors): every value, once, before training.
Streams (datasets, generators, a PyDataset) are not read ahead for it: their labels meet TensorFlow's own check
as under model.fit, a graph error on a CPU; on a GPU a NaN loss, whose update is skipped as non-finite (and
``max_bad_steps`` stops the call).
"""

from __future__ import annotations

import re
import warnings

import keras
import numpy as np

from .. import keras_private
from ..backends import active
from ..defaults import MIN_BATCHNORM_MICRO_BATCH
from ..errors import UserError
from ..text import traced_error_line
from ..trainer.data.conversion import STREAMED, kind
from ..trainer.data.order import noisy_batchnorm
from .arguments import WHERE


def _keras_said(err: BaseException) -> str:
    """What Keras said of a call that failed, in one line: its frame lines ("Exception encountered when calling",
    "Arguments received", each argument's bullet) and terminal colours left out."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    frame = ("Exception encountered when calling", "Arguments received", "•", "in user code", "File ")
    said = [line for line in lines if not line.startswith(frame)]
    return (said or lines or [type(err).__name__])[0]


def _fits(given: tuple, wanted: tuple) -> bool:
    """Whether examples of shape ``given`` fit an input of ``wanted`` (neither with its batch axis), as a Keras
    functional model takes them: a rank one more with a trailing 1 is squeezed, one less expanded to a trailing
    1; then every axis the input fixes must match."""
    if len(given) == len(wanted) + 1 and given[-1] == 1:
        given = given[:-1]
    elif len(given) + 1 == len(wanted) and wanted[-1] == 1:
        given = (*given, 1)
    return len(given) == len(wanted) and all(w is None or g is None or g == w for g, w in zip(given, wanted))


def _names(keys) -> str:
    return ", ".join(repr(k) for k in keys)


def _pairs(structure, model_name: str, x, name: str):
    """(label, spec, the model's input) for each input ``x`` gives, paired as Keras pairs them with the model's
    input ``structure`` (keras_private.built_structures); or a message when the structure does not pair (a name
    missing, another number of inputs); or () when the model has no inputs to compare with (a subclassed model)."""
    if structure is None:
        return ()
    if isinstance(structure, dict) and isinstance(x, dict):
        missing = [key for key in structure if key not in x]
        if missing:
            return (
                f"{name} has no input {missing[0]!r} (it has {_names(x)}): model {model_name!r} takes "
                f"{_names(structure)}"
            )
        return [(f"{name}[{key!r}]", x[key], structure[key]) for key in structure]  # Keras ignores other keys
    given, wanted = keras.tree.flatten(x), keras.tree.flatten(structure)
    if len(given) != len(wanted):
        return f"{name} holds {len(given)} input arrays, and model {model_name!r} takes {len(wanted)}"
    labels = [name] if len(given) == 1 else [f"{name}[{i}]" for i in range(len(given))]
    return list(zip(labels, given, wanted))


def _shape(shape) -> str:
    return str(tuple(None if d is None else int(d) for d in shape))


def check_input_kinds(structure, model_name: str, feed, validation, names) -> None:
    """Text where the model (its inputs' ``structure``) takes numbers, or numbers where it takes text, in the inputs
    of the training ``feed`` (named ``names[0]``) or the ``validation`` one (or None): what TensorFlow would only
    meet when the first micro-step runs (a graph error of fifty lines)."""
    sources = [(feed, names[0])] + ([(validation, DATA_NAMES["validation_data"][0])] if validation is not None else [])
    for source, name in sources:
        pairs = _pairs(structure, model_name, inputs_of(source.element_spec), name)
        for label, spec, tensor in pairs if not isinstance(pairs, str) else ():
            wanted = keras.backend.standardize_dtype(tensor.dtype)
            if (spec.dtype.name == "string") != (wanted == "string"):
                raise UserError(
                    f"{WHERE}: {label} holds {spec.dtype.name} values, and model {model_name!r} takes {wanted}"
                )


def input_problem(model, x, name: str) -> str | None:
    """Why the inputs ``x`` (a batch's TensorSpecs) do not fit ``model``, in words that name ``name``; None when
    the model takes them (a failure to build or trace is then the targets'). Asked only once building or tracing
    failed: the model is called on symbolic inputs alone."""
    try:
        symbolic = keras_private.symbolic(x)
    except (ValueError, TypeError, AttributeError):
        return None  # inputs no KerasTensor describes (ragged, of unknown rank): nothing to tell them by
    try:
        keras_private.symbolic_call(model, symbolic)
        return None
    except Exception as err:  # whatever the call alone raises is the inputs' (or the model's own) failure
        said = _keras_said(err)
    pairs = _pairs(keras_private.built_structures(model)[0], model.name, x, name)
    if isinstance(pairs, str):
        return pairs
    for label, spec, tensor in pairs:
        if spec.shape.rank is None:
            continue
        given, wanted = tuple(spec.shape.as_list()[1:]), tuple(tensor.shape[1:])
        if not _fits(given, wanted):
            return (
                f"{label} holds examples of shape {_shape(given)}, and model {model.name!r} takes examples of shape "
                f"{_shape(wanted)}"
            )
    return f"{name} does not fit model {model.name!r}: {said}"


def _at(structure, path):
    """The leaf of ``structure`` at a compiled loss's ``path`` (keys and indexes), or None where it has none (an
    array where the path goes on: targets laid out otherwise than the outputs, which Keras matches its own way)."""
    for key in path:
        if not isinstance(structure, (dict, list, tuple)):
            return None
        try:
            structure = structure[key]
        except (KeyError, IndexError, TypeError):
            return None
    return structure


def _width(output) -> int | None:
    """The length of an output's last axis (its classes), None where the model leaves it open."""
    width = output.shape[-1] if output is not None and len(output.shape) else None
    return None if width is None else int(width)


def inputs_of(element_spec):
    """The inputs' part of a feed's element spec ((x,), (x, y) or (x, y, sample_weight); or x alone)."""
    if isinstance(element_spec, tuple) and 1 <= len(element_spec) <= 3:
        return element_spec[0]
    return element_spec


def check_labels(model_name: str, built, class_weight, labelled, where: str = WHERE) -> None:
    """Class weights and class labels against the outputs of model ``model_name`` as ``built`` (keras_private.Built)
    says. ``labelled``: (name, targets) of each set of targets held in memory (y, validation_data's y), read whole
    once: a label out of range ends in TensorFlow's graph error of fifty lines on a CPU, in a NaN loss on a GPU."""
    for name, targets in labelled if built.losses else ():  # a Keras loss casts them: a graph error of seventy lines
        if any(np.asarray(leaf).dtype.kind in "SU" for leaf in keras.tree.flatten(targets)):
            raise UserError(
                f"{where}: {name} holds strings, and the loss model {model_name!r} is compiled with takes numbers: "
                "turn them into numbers first (class ids, e.g. np.unique(labels, return_inverse=True)[1])"
            )
    if class_weight is None and not (built.sparse and labelled):
        return
    outputs = built.outputs()
    if class_weight:
        width = _width(keras.tree.flatten(outputs)[0])  # one output: fit refuses class_weight for more
        classes = None if width is None else max(width, 2)  # one unit: the two classes of a sigmoid
        unknown = [key for key in class_weight if classes is not None and key >= classes]
        if unknown:
            raise UserError(
                f"{WHERE}: class_weight names class {unknown[0]!r}, and model {model_name!r} outputs {classes} "
                f"classes: its keys are 0 to {classes - 1}"
            )
    for path, ignore in built.sparse:
        classes = _width(_at(outputs, path))
        for name, targets in labelled:
            labels = _at(targets, path)
            if classes is None or labels is None:
                continue
            if isinstance(labels, (list, tuple)) and labels and np.ndim(labels[0]) > 0:
                continue  # a structure where the loss takes one array: Keras' own matching decides
            try:
                labels = np.asarray(labels)
            except (ValueError, TypeError):
                continue  # not an array (ragged): TensorFlow's own check
            if labels.dtype.kind not in "iuf" or labels.size == 0:
                continue
            # what Keras' cast to an integer makes of them (a float label 2.7 is class 2)
            values = labels.astype(np.int64, copy=False).reshape(len(labels), -1)
            bad = (values < 0) | (values >= classes)
            if ignore is not None:
                bad &= values != ignore
            if bad.any():
                row = int(np.argmax(bad.any(axis=1)))
                value = int(values[row][bad[row]][0])
                label = name + "".join(f"[{key!r}]" for key in path)
                also = f" (or ignore_class={ignore})" if ignore is not None else ""
                raise UserError(
                    f"{where}: {label}[{row}] holds class {value}, and model {model_name!r} outputs {classes} "
                    f"classes: its sparse categorical cross-entropy takes labels 0 to {classes - 1}{also}"
                )


# (what the inputs, the targets and the sample weights are called) in the messages, by where the data came from:
# arrays and their y, a stream that gives them all (a dataset, a generator, a PyDataset), validation_data
DATA_NAMES = {
    "y": ("x", "y", "sample_weight"),
    "x": ("x", "the targets x gives", "the sample weights x gives"),
    "validation_data": ("validation_data's x", "validation_data's y", "validation_data's sample weights"),
}


def held_targets(what, y, validation_data) -> list:
    """(name, targets) of the targets held in memory, whose class labels check_labels reads: y given with arrays
    (``what``: x's kind), and validation_data's y given as arrays (not a stream's, read only as training goes)."""
    held = [("y", y)] if y is not None and what not in STREAMED else []
    tupled = isinstance(validation_data, (tuple, list)) and len(validation_data) in (2, 3)
    if tupled and kind(validation_data[0]) not in STREAMED:
        held.append(("validation_data's y", validation_data[1]))
    return held


def as_user_error(model, spec, names, function, *args):
    """``function(*args)``; what Keras raises for data (elements ``spec``) that does not fit ``model``, in one
    line that names the argument: the inputs (``names[0]``) where the model alone cannot take them, the sample
    weights (``names[2]``) where the loss takes the targets without them, else the targets (``names[1]``)."""
    try:
        return function(*args)
    except UserError:
        raise
    # AttributeError: a compiled metric that reads the targets' shape where there are none (y missing)
    except (ValueError, TypeError, KeyError, AttributeError, active().BAD_INPUT) as err:
        problem = input_problem(model, inputs_of(spec), names[0])
        if problem is None and not (isinstance(spec, tuple) and len(spec) > 1):  # inputs alone: no targets
            missing = "y is missing" if names[1] == "y" else f"{names[0]} gives no targets"
            problem = f"{missing}: model {model.name!r} is compiled with a loss, which takes them"
        if problem is None:
            what = _weights_or_targets(spec, names, function, args)
            problem = f"the compiled loss of model {model.name!r} cannot take {what} with its outputs: "
            problem += traced_error_line(err)
        raise UserError(f"{WHERE}: {problem}") from None


def _weights_or_targets(spec, names, function, args) -> str:
    """What the loss refused: the sample weights where it takes the data without them, else the targets."""
    if not (isinstance(spec, tuple) and len(spec) == 3):
        return names[1]
    try:
        function(*[spec[:2] if arg is spec else arg for arg in args])
    except (ValueError, TypeError, KeyError, active().BAD_INPUT):
        return names[1]
    return names[2]


def warn_small_batchnorm(name: str, norm_layers, batch_size: int, micro, replicas: int) -> None:
    """A warning (as plan's and the CLI's) where BatchNorm layers of model ``name`` normalise micro-batches of too
    few examples, each with its own statistics (docs/limitations.md). Not where ``micro`` (trainer.MicroBatches)
    gives k=1 (model.fit's own batches) or none (micro_batch_size='auto', whose k grows only where memory makes it)."""
    k = micro.k_for(batch_size, replicas)
    if not norm_layers or k is None or k == 1:
        return
    smallest = noisy_batchnorm(batch_size // replicas, k)
    if smallest:
        warnings.warn(
            f"{WHERE}: micro-batches of {smallest} examples (under {MIN_BATCHNORM_MICRO_BATCH}) give BatchNorm noisy "
            f"statistics: replace model {name!r}'s BatchNormalization layers (e.g. by GroupNormalization), "
            "or pass a larger micro_batch_size",
            stacklevel=7,  # the line that called accum_train.fit (through fit, _checked, _train, parts and _engine)
        )
