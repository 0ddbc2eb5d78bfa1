"""Your own arrays: one .npz file in the keras.datasets layout (``data.name: npz``); and the readers' .npz files.

The file holds ``x_train``, ``y_train``, ``x_test``, ``y_test`` and, if you
like, ``class_names`` (a 1-D array of strings). Images are ``[N, H, W]`` (one
channel) or ``[N, H, W, C]`` with channels last, any C; uint8 is scaled by
1/255, float16/32/64 is used as it is (float64 is kept as float32). Other
integer types are refused rather than guessed at (is uint16 0..65535 or
0..4095?). Labels are integers ``[N]`` (or ``[N, 1]``, as keras' cifar10
gives them) in ``[0, num_classes)``; ``data.num_classes`` defaults to the
length of ``class_names``, else to the largest label + 1.

The file is read with ``allow_pickle=False``: an .npz is data, and a pickled
object array could run code when loaded. Every array is checked before any
training starts, and every problem is one line naming the file, the key and
the fix. The arrays are held in memory; for a set larger than RAM use
``image_folder``, which streams from disk.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..text import first_line, shape_text
from .base import ArraySplit, Dataset, TaskSplit, each, first_array, to_values

REQUIRED_KEYS = ("x_train", "y_train", "x_test", "y_test")
HOW_TO_SAVE = "numpy.savez(FILE, x_train=..., y_train=..., x_test=..., y_test=...) (keras.datasets layout)"
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip with members, an empty zip
NPY_MAGIC = b"\x93NUMPY"


def load(data_config, task: bool = False) -> Dataset:
    """The verified arrays of data.path: for a model with a Keras loss (``task``: ``load_task``), else ``load_npz``."""
    path = Path(data_config.path)
    with _open(path) as archive:
        if task:  # the inputs, targets and weights; other arrays (class_names, say) are not the loss's
            keys = [key for key in archive.files if key.startswith(("x_train", "x_test", "y_train", "y_test", "w_"))]
        else:
            missing = [key for key in REQUIRED_KEYS if key not in archive.files]
            if missing:
                found = ", ".join(archive.files) or "no arrays"
                raise DataError(
                    f"{path} has no {', '.join(missing)} (it has {found}): data.name=npz needs "
                    f"x_train, y_train, x_test, y_test; save them with {HOW_TO_SAVE}"
                )
            keys = [*REQUIRED_KEYS, *(["class_names"] if "class_names" in archive.files else [])]
        arrays = {key: read_array(archive, path, key) for key in keys}
    return load_task(path, arrays) if task else load_npz(path, arrays, data_config.num_classes)


def load_task(path: Path, arrays: dict) -> Dataset:
    """The arrays of any task: ``x_*`` of any shape and numeric dtype (uint8 scaled by 1/255, float64 kept as
    float32, the rest as given), ``y_*`` whatever the loss takes, optional ``w_*`` sample weights [N]. A model
    with several inputs or outputs takes ``x_train_<input name>`` and ``y_train_<output name>`` (and the test
    split's alike) instead of ``x_train`` and ``y_train``."""
    for key, array in arrays.items():
        _check_values(path, key, array)
    splits, flats = {}, {}
    for split in ("train", "test"):
        x, y = (_named(path, arrays, f"{kind}_{split}") for kind in ("x", "y"))
        w = arrays.get(f"w_{split}")
        n = len(first_array(x))
        flat = flats[split] = _flat(split, x, y, w)
        for key, array in flat:
            if len(array) != n:
                first = flat[0][0]
                raise DataError(
                    f"{path}: {first} holds {n} examples but {key} {len(array)}: every array needs one row per example"
                )
        if w is not None and (w.ndim != 1 or (len(w) and w.min() < 0)):
            raise DataError(
                f"{path}: w_{split} has shape {w.shape} and its smallest value is {w.min() if w.size else 0:g}: "
                f"sample weights are one number >= 0 per example, shape ({n},)"
            )
        splits[split] = TaskSplit(each(_as32, x), each(_as32, y), _as32(w))
    if len(splits["train"]) == 0:
        raise DataError(f"{path}: x_train holds no examples: it needs at least one")
    train_arrays, test_arrays = dict(flats["train"]), dict(flats["test"])
    for key in sorted(set(train_arrays) ^ {k.replace("_test", "_train", 1) for k in test_arrays}):
        test_key = key.replace("_train", "_test", 1)
        there, missing = (key, test_key) if key in train_arrays else (test_key, key)
        raise DataError(f"{path} has {there} but no {missing}: give both splits the same arrays")
    for key, train in train_arrays.items():
        test_key = key.replace("_train", "_test", 1)
        test = test_arrays[test_key]
        if key != "w_train" and train.shape[1:] != test.shape[1:]:
            raise DataError(
                f"{path}: {test_key} holds examples of shape {test.shape[1:]} but {key} "
                f"{train.shape[1:]}: both splits need one shape per example"
            )
    return Dataset(
        train=splits["train"],
        test=splits["test"],
        input_shape=tuple(int(n) for n in first_array(splits["train"].x).shape[1:]),
        class_names=(),
        source=str(path.resolve()),
    )


def _named(path: Path, arrays: dict, key: str):
    """``key``'s array, or the dict {name: array} of its ``key_<name>`` arrays (several inputs or outputs)."""
    named = {k[len(key) + 1 :]: a for k, a in sorted(arrays.items()) if k.startswith(key + "_")}
    if key in arrays and named:
        raise DataError(
            f"{path} has {key} and {', '.join(f'{key}_{name}' for name in named)}: give one array {key}, or one "
            f"per input or output name ({key}_<name>), not both"
        )
    if key not in arrays and not named:
        found = ", ".join(sorted(arrays)) or "no arrays"
        raise DataError(
            f"{path} has no {key} (it has {found}): data.name=npz needs x_train, y_train, x_test, y_test (or "
            f"x_train_<input name>, y_train_<output name>, ...; and, if you like, w_train, w_test); save them with "
            f"{HOW_TO_SAVE}"
        )
    return arrays.get(key, named)


def _flat(split: str, x, y, w) -> list:
    """(key, array) of a split's arrays: inputs, targets (each an array or a dict by name), weights."""
    pairs = [
        (f"{kind}_{split}" if name is None else f"{kind}_{split}_{name}", a)
        for kind, named in (("x", x), ("y", y))
        for name, a in (named.items() if isinstance(named, dict) else [(None, named)])
    ]
    return pairs if w is None else [*pairs, (f"w_{split}", w)]


def _as32(array):
    """A float64 array as float32 (what the model takes: half the memory); others (and None) as they are."""
    return array.astype(np.float32) if array is not None and array.dtype == np.float64 else array


def first_non_finite(array: np.ndarray) -> int | None:
    """The index of the first example (row) of a float array holding a NaN or an infinity, or None."""
    finite = np.isfinite(array.reshape(len(array), -1)).all(axis=1)
    return None if finite.all() else int(np.argmin(finite))


def _check_values(path: Path, key: str, array: np.ndarray) -> None:
    """Numbers (bool, integers or finite floats) with an axis of examples."""
    if array.ndim == 0:
        raise DataError(f"{path}: {key} is a single number: it needs one row per example, e.g. shape (N,) or (N, 6)")
    if array.dtype.kind not in "biuf":
        raise DataError(
            f"{path}: {key} has dtype {array.dtype}: arrays must hold numbers; convert it, e.g. {key}.astype('float32')"
        )
    if array.dtype.kind == "f" and array.size:
        index = first_non_finite(array)
        if index is not None:
            raise DataError(f"{path}: {key}[{index}] is not finite (NaN or infinite): fix or drop that example")


def load_npz(path: Path, arrays: dict, num_classes: int | None) -> Dataset:
    """Images and class labels; ``num_classes`` is data.num_classes (None: from the file)."""
    shapes = {}
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        check_images(path, f"x_{split}", x)
        arrays[f"y_{split}"] = y = _check_labels(path, f"y_{split}", y)
        if len(x) != len(y):
            raise DataError(
                f"{path}: x_{split} holds {len(x)} images but y_{split} {len(y)} labels: "
                f"each image needs exactly one label"
            )
        shapes[split] = x.shape[1:] if x.ndim == 4 else (*x.shape[1:], 1)
    if shapes["test"] != shapes["train"]:
        raise DataError(
            f"{path}: x_test holds {shape_text(shapes['test'])} images but x_train "
            f"{shape_text(shapes['train'])}: both splits need one image shape"
        )
    return Dataset(
        train=ArraySplit(_as32(arrays["x_train"]), arrays["y_train"]),
        test=ArraySplit(_as32(arrays["x_test"]), arrays["y_test"]),
        input_shape=tuple(int(n) for n in shapes["train"]),
        class_names=_class_names(path, arrays.get("class_names"), num_classes, arrays["y_train"], arrays["y_test"]),
        source=str(path.resolve()),
    )


def _open(path: Path):
    if not path.exists():
        raise DataError(f"data.path={path} does not exist: give the .npz file, written with {HOW_TO_SAVE}")
    if path.is_dir():
        raise DataError(
            f"data.path={path} is a folder: data.name=npz reads one .npz file "
            f"(a folder of class folders of images is data.name=image_folder)"
        )
    return open_npz(path, HOW_TO_SAVE)


def open_npz(path: Path, how: str):
    """``numpy.load(path, allow_pickle=False)`` of a file that exists; anything else than an .npz archive as one
    line that ends in ``how`` (the numpy.savez call that writes the file right)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror}: check its permissions") from None
    if magic == NPY_MAGIC:
        raise DataError(f"{path} is a single .npy array, not an .npz archive: write it with {how}")
    if magic[:4] not in ZIP_MAGIC:
        raise DataError(
            f"{path} is not an .npz file (it starts with {magic[:4].hex() or 'nothing'}, not the "
            f"zip signature 504b0304): write it with {how}"
        )
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(
            f"{path} is not a readable .npz file ({first_line(err)}): it is truncated or "
            f"damaged; write it again with {how}"
        ) from None


def read_array(archive, path: Path, key: str, how: str = HOW_TO_SAVE) -> np.ndarray:
    """One array of an open .npz; a damaged member or an object array (never unpickled) as one line."""
    try:
        return archive[key]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        if isinstance(err, ValueError) and "allow_pickle" in str(err):  # numpy's refusal of an object array
            raise DataError(
                f"{path}: {key} is an object array (pickled Python objects), which is never "
                f"loaded (allow_pickle=False: loading it could run code); save plain numeric "
                f"arrays, e.g. {key}=numpy.asarray({key}, dtype='uint8')"
            ) from None
        raise DataError(
            f"{path}: cannot read {key} ({first_line(err)}): the file is truncated or damaged; "
            f"write it again with {how}"
        ) from None


def check_images(path: Path, key: str, x: np.ndarray) -> None:
    """Images [N, H, W] or [N, H, W, C] (channels last), uint8 or finite float, at least one; else one line."""
    if x.ndim not in (3, 4):
        raise DataError(
            f"{path}: {key} has shape {x.shape} ({x.ndim} dimensions): images must be "
            f"[N, H, W] or [N, H, W, C]; reshape it, e.g. {key}.reshape(N, H, W)"
        )
    if not (x.dtype == np.uint8 or x.dtype.kind == "f"):
        raise DataError(
            f"{path}: {key} has dtype {x.dtype}: images must be uint8 (0..255, scaled by 1/255) "
            f"or float (used as it is, e.g. in [0, 1]); convert it, e.g. "
            f"{key}.astype('float32') / {key}.max()"
        )
    if x.ndim == 4 and x.shape[1] in (1, 3) and x.shape[3] not in (1, 3, 4):
        raise DataError(
            f"{path}: {key} has shape {x.shape}, which looks channels-first: images must be "
            f"[N, H, W, C] (channels last); convert with numpy.moveaxis({key}, 1, -1)"
        )
    if len(x) == 0 or 0 in x.shape[1:]:
        raise DataError(f"{path}: {key} has shape {x.shape}: it needs at least one image of at least 1x1 pixels")
    if x.dtype.kind == "f":
        index = first_non_finite(x)
        if index is not None:
            what = "NaN" if np.isnan(x[index]).any() else "an infinite value"
            raise DataError(f"{path}: {key}[{index}] has {what}: float images must be finite; fix or drop that example")


def _check_labels(path: Path, key: str, y: np.ndarray) -> np.ndarray:
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]  # keras' cifar10 layout: [N, 1]
    if y.ndim != 1:
        raise DataError(
            f"{path}: {key} has shape {y.shape}: labels must be [N] class indices (not one-hot); "
            f"convert one-hot labels with {key}.argmax(axis=1)"
        )
    if y.dtype.kind not in "iu":
        raise DataError(
            f"{path}: {key} has dtype {y.dtype}: labels must be integers 0..K-1; convert with {key}.astype('int64')"
        )
    if len(y) and y.min() < 0:
        index = int(np.argmin(y))
        raise DataError(f"{path}: {key}[{index}] is {int(y[index])}: labels must be integers 0..K-1")
    return y


def _class_names(
    path: Path, names: np.ndarray | None, num_classes: int | None, y_train: np.ndarray, y_test: np.ndarray
) -> tuple[str, ...]:
    if names is not None:
        if names.dtype.kind != "U" or names.ndim != 1:
            raise DataError(
                f"{path}: class_names has dtype {names.dtype} and shape {names.shape}: it must be "
                f"a 1-D array of strings, e.g. numpy.array(['cat', 'dog'])"
            )
        if num_classes is not None and len(names) != num_classes:
            raise DataError(
                f"{path}: class_names lists {len(names)} names but data.num_classes={num_classes}: "
                f"give one name per class, or drop data.num_classes"
            )
        unique, counts = np.unique(names, return_counts=True)
        if counts.max(initial=0) > 1:
            raise DataError(
                f"{path}: class_names lists {str(unique[np.argmax(counts)])!r} more than once: "
                f"each class needs its own name"
            )
    # the class count the file or the config gives (None: neither, the labels' largest + 1)
    limit, because = (
        (len(names), f"class_names lists {len(names)} names")
        if names is not None
        else (num_classes, f"data.num_classes={num_classes}")
    )
    for key, y in (("y_train", y_train), ("y_test", y_test)):
        if limit is not None and len(y) and y.max() >= limit:
            index = int(np.argmax(y))
            fix = "add names to class_names" if names is not None else "raise data.num_classes"
            raise DataError(
                f"{path}: {key}[{index}] is {int(y[index])}, but {because}: labels must be "
                f"0..{limit - 1}; {fix} or fix the label"
            )
    count = limit if limit is not None else int(max(y_train.max(), y_test.max())) + 1
    if count < 2:
        raise DataError(
            f"{path}: every label is 0, so there is only one class: a classifier needs at least "
            f"two (set data.num_classes if a class has no examples)"
        )
    return tuple(names.tolist()) if names is not None else tuple(str(i) for i in range(count))


# ----------------------------------------------------------------------------
# The readers' .npz files: the inputs of a model of values (predict's, evaluate --data's) and evaluate's targets


NPZ_KEY = "x"
# The arrays evaluate's --data reads, by model.evaluate's names (x_<input name> and y_<output name> for several).
DATA_HOW = "numpy.savez(FILE, x=inputs, y=targets[, sample_weight=weights])"


def read_values(paths: Sequence[Path], stored: dict, convert=None) -> tuple[list[str], object]:
    """(one name per row, the inputs) of .npz files whose ``x`` (or ``x_<input name>`` for a model with several
    inputs) holds examples of the stored shapes (a dimension None: any size), of the stored dtypes, then
    ``convert``ed (default: as training converts them, a run trained with a Keras loss)."""
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
