"""``trim_padding``'s policy, on any backend (the cut in tf.data's pipeline: feed.py; on JAX: jax/feed.py): which
steps of each example are padding, the multiple a cut length is rounded up to, and what the option asks of the model.
``where`` begins every refusal: the door's name for the option."""

from __future__ import annotations

import keras
import numpy as np

from ...defaults import TRIM_MULTIPLE
from ...errors import Refused, UserError


def sequence_lengths(arrays, where: str):
    """(each example's length, which arrays are cut on axis 1) for trim_padding: the length is one past
    the example's last step where any input is nonzero (padding is zeros after the sequence, what
    Embedding(mask_zero=True) and Masking() take as such); every x, y or sample weight array whose axis 1 has
    that size is cut."""
    leaves = keras.tree.flatten(arrays[0])
    steps = _time_steps([a.shape for a in leaves], [a.dtype.kind in "SU" for a in leaves], "x has no array", where)
    inputs = [a for a in leaves if a.ndim >= 2]
    lengths = np.zeros(len(inputs[0]), np.int64)
    for a in inputs:
        used = (a != 0).reshape(len(a), steps, -1).any(axis=2)
        lengths = np.maximum(lengths, np.where(used.any(axis=1), steps - np.argmax(used[:, ::-1], axis=1), 0))
    timed = keras.tree.map_structure(lambda a: a.ndim >= 2 and a.shape[1] == steps, arrays)
    return lengths, timed


def _time_steps(shapes, strings, missing: str, where: str):
    """The one length of axis 1 of x's inputs with two axes or more (``shapes``: every input's; ``strings``: which
    hold text), arrays' and streams' alike; refused in one line where there is none, several, or text."""
    inputs = [i for i, shape in enumerate(shapes) if len(shape) >= 2]
    if not inputs:
        raise Refused(
            "trim-no-time-axis",
            f"{where}: trim_padding cuts sequences along axis 1, and {missing} with one (shapes {shapes}): leave "
            f"trim_padding out",
        )
    steps = {shapes[i][1] for i in inputs}
    if len(steps) > 1:  # a stream's unknown length (None) last
        raise Refused(
            "trim-lengths",
            f"{where}: trim_padding needs every input of x to have the same length on axis 1, and they have "
            f"{sorted(steps, key=lambda d: (d is None, d or 0))}: pad them to one length, or leave trim_padding out",
        )
    if any(strings[i] for i in inputs):
        raise Refused(
            "trim-strings", f"{where}: trim_padding reads padding as zeros, and x holds strings: leave trim_padding out"
        )
    return steps.pop()


def trim_multiple(trim_padding, where: str) -> int:
    """trim_padding as the multiple each micro-batch's length is rounded up to (0: off), checked."""
    if trim_padding is None or trim_padding is False:
        return 0
    multiple = TRIM_MULTIPLE if trim_padding is True else trim_padding
    if isinstance(multiple, bool) or not isinstance(multiple, (int, np.integer)) or multiple < 1:
        raise UserError(
            f"{where}: trim_padding={trim_padding!r} must be True, False or a positive int (the multiple each "
            f"micro-batch's length is rounded up to)"
        )
    return int(multiple)


def check_trimmable(model, replicas: int, where: str) -> None:
    """Refuse trim_padding for what it cannot cut: several replicas, a model of fixed sequence length."""
    if replicas > 1:
        raise Refused(
            "trim-replicas",
            f"{where}: trim_padding runs on one replica, and the strategy has {replicas}: leave trim_padding out",
        )
    for tensor in model.inputs or []:
        if len(tensor.shape) >= 2 and tensor.shape[1] is not None:
            raise Refused(
                "trim-fixed-length",
                f"{where}: trim_padding gives micro-batches of several lengths, and model {model.name!r} takes "
                f"inputs of shape {tuple(tensor.shape)}: build it on keras.Input(shape=(None, ...)), or leave "
                f"trim_padding out",
            )


def uncut_steps(data, timed):
    """The length of the time axis before the cut (the arrays' axis 1, or a stream's static one), or None where a
    stream's batches may each have their own (padded_batch): what a loss that divides by every position, padding
    included (``sum_over_batch_size``), still divides by once its micro-batches are cut (keras_objective.py)."""
    steps = {leaf.shape[1] for leaf, cut in zip(keras.tree.flatten(data), keras.tree.flatten(timed)) if cut}
    return steps.pop() if len(steps) == 1 else None


def cut_length(longest: int, multiple: int, steps: int) -> int:
    """The length a batch whose longest sequence is ``longest`` is cut to: rounded up to ``multiple`` (at least one
    multiple, so that a model can run on it), never past the ``steps`` there are."""
    return min(max(-(-int(longest) // multiple), 1) * multiple, steps)


def judge_trim(named: list, divisor_changed: bool, name: str, time_steps: int, length: int, where: str) -> None:
    """Either backend's check_trim's verdict on one micro-batch measured whole and cut from ``time_steps`` to
    ``length`` steps (model ``name``'s): refused where the number of values its loss averages changed
    (``divisor_changed``: and the length before the cut is not fixed), or where any of ``named``, (what, whole, cut,
    floor), ``differ``s."""
    if divisor_changed:
        raise Refused(
            "trim-divisor",
            f"{where}: trim_padding changes the number of values the loss of model {name!r} averages (a "
            f"micro-batch cut from {time_steps} to {length} steps): it divides by every position, padding included "
            f"(reduction 'sum_over_batch_size'), and the batches' length before the cut is not fixed: pad every "
            f"batch to one length, or leave trim_padding out",
        )
    for what, whole_value, cut_value, floor in named:
        if differ(whole_value, cut_value, floor):
            raise Refused(
                "trim-changes-result",
                f"{where}: trim_padding changes {what} of model {name!r} (a micro-batch cut from "
                f"{time_steps} to {length} steps): padding must change nothing, so mask it "
                f"(Embedding(mask_zero=True), Masking) and keep layers that mix time steps masked, or leave "
                f"trim_padding out",
            )


def differ(whole, cut, floor: float = 0.0) -> bool:
    """Whether two values of one micro-batch differ by more than the rounding of a sum taken over other lengths:
    1e-4 of their own size, or of ``floor`` where that is larger (and of 1e-6 at least)."""
    whole, cut = np.asarray(whole, np.float64), np.asarray(cut, np.float64)
    size = max(np.max(np.abs(whole), initial=0.0), floor, 1e-6)
    return bool(np.max(np.abs(whole - cut), initial=0.0) > 1e-4 * size)
