"""The arrays of an .npz as a model of values takes them (``accum-train predict`` and ``evaluate --data``).

``read_values`` reads the inputs: ``x``, or ``x_<input name>`` per input of a model with several, checked against
the shapes and dtypes the model takes (a run's run.json data "stored", or a Keras model's inputs) before they are
converted; ``read_targets`` the targets evaluate scores them against: ``y``, or ``y_<output name>`` per output, and
an optional ``sample_weight``, one row per example each. A bad file is one line naming it and how to save it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import DataError
from .text import shape_text

NPZ_KEY = "x"
# The arrays evaluate's --data reads, by model.evaluate's names (x_<input name> and y_<output name> for several).
DATA_HOW = "numpy.savez(FILE, x=inputs, y=targets[, sample_weight=weights])"


def read_values(paths: Sequence[Path], stored: dict, convert=None) -> tuple[list[str], object]:
    """(one name per row, the inputs) of .npz files whose ``x`` (or ``x_<input name>`` for a model with several
    inputs) holds examples of the stored shapes (a dimension None: any size), of the stored dtypes, then
    ``convert``ed (default: as training converts them, a run trained with a Keras loss)."""
    from .datasets.base import to_values
    from .datasets.npz import open_npz

    convert = convert or (lambda x: to_values(x).numpy())
    wanted = stored["x"].get("arrays") or {None: stored["x"]}
    keys = {name: NPZ_KEY if name is None else f"{NPZ_KEY}_{name}" for name in wanted}
    names, parts = [], []
    for path in map(Path, paths):
        how = f"numpy.savez('{path.name}', {', '.join(f'{key}=inputs' for key in keys.values())})"
        if path.suffix.lower() != ".npz" or not path.is_file():
            raise DataError(f"{path}: not an .npz file: a run trained with a Keras loss predicts for {how}")
        with open_npz(path, how) as archive:
            found = read_named(archive, path, keys.values(), "inputs", how)
        arrays = {name: found[key] for name, key in keys.items()}
        rows = {len(a) for a in arrays.values()}
        for name, x in arrays.items():
            spec = wanted[name]
            if not _fits(x.shape, spec["shape"]) or x.dtype.kind not in "biuf":
                raise DataError(
                    f"{path}: '{keys[name]}' holds {x.dtype} examples of shape {shape_text(x.shape[1:])}, but the "
                    f"model takes {spec['dtype']} examples of shape {shape_text(spec['shape'])}"
                )
        if len(rows) != 1:
            raise DataError(f"{path}: its arrays {', '.join(keys.values())} hold different numbers of examples")
        names += [f"{path}[{i}]" for i in range(rows.pop())]
        parts.append({name: convert(x.astype(wanted[name]["dtype"], copy=False)) for name, x in arrays.items()})
    joined = {name: np.concatenate([part[name] for part in parts]) for name in wanted}
    return names, joined.get(None, joined)


def read_named(archive, path: Path, keys, what: str, how: str) -> dict:
    """The arrays ``keys`` of the open .npz ``archive`` by key; the first one missing is refused in one line that
    names the arrays it holds and how to save the ``what``."""
    from .datasets.npz import read_array

    missing = [key for key in keys if key not in archive.files]
    if missing:
        found = ", ".join(archive.files) or "none"
        raise DataError(f"{path} has no array '{missing[0]}' (its arrays: {found}): save the {what} with {how}")
    return {key: read_array(archive, path, key, how) for key in keys}


def _fits(shape, wanted) -> bool:
    """Whether examples of ``shape`` (the batch axis first) are of shape ``wanted`` (None: any size)."""
    return len(shape) == len(wanted) + 1 and all(w is None or n == w for n, w in zip(shape[1:], wanted))


def read_targets(path: Path, n: int) -> tuple:
    """(y, or {output name: y} from y_<name>; sample_weight or None) of the .npz ``path``, ``n`` rows each."""
    from .datasets.npz import open_npz

    with open_npz(path, DATA_HOW) as archive:
        keys = [key for key in archive.files if key == "y" or key.startswith("y_")] or ["y"]  # none: 'y' missing
        if "y" in keys and len(keys) > 1:
            raise DataError(
                f"{path} has {', '.join(keys)}: give one array y, or one per output name (y_<name>), not both"
            )
        optional = [key for key in ("sample_weight",) if key in archive.files]
        arrays = read_named(archive, path, [*keys, *optional], "data", DATA_HOW)
    for key, array in arrays.items():
        if array.ndim == 0 or len(array) != n:
            raise DataError(
                f"{path}: the inputs hold {n} examples but {key} {len(array) if array.ndim else 0}: every array "
                f"needs one row per example"
            )
    weights = arrays.pop("sample_weight", None)
    y = arrays.pop("y", None)
    return (y if y is not None else {key[len("y_") :]: a for key, a in arrays.items()}), weights
