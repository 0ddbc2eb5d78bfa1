"""Class probabilities from a trained run for new inputs (``accum-train predict``).

Inputs are image files (PNG, JPEG), decoded by the same function the
image_folder data pipeline uses, or .npz files whose array ``x`` holds images
[N,H,W] or [N,H,W,C], uint8 or float, converted as training converts them
(``datasets.base.to_inputs``). Every input is read and checked against the
model's input shape (from the run's dataset.json) before the model is
loaded, so a bad file is reported at once, in one line naming it.
Probabilities are the softmax of the run's logits at its latest checkpoint.

A run trained with a Keras loss, and a run directory of accum_train.fit, give
the model's outputs instead, for .npz files whose ``x`` (or ``x_<input
name>`` per input) holds examples of the shapes the model takes. A fit run
keeps no dataset.json: the shapes and dtypes are its model's inputs (read
from its Keras file first), and the arrays go to ``model.predict`` as they
are, as they went to fit. A KerasHub task's preprocessor is left out: the
arrays are what it made of raw data (token_ids, padding_mask, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .defaults import PREDICT_BATCH_SIZE
from .errors import DataError, RunDirError, UserError
from .text import shape_text, traced_error_line

NPZ_KEY = "x"


def read_npz(path: Path, input_shape) -> np.ndarray:
    """The images of an .npz's ``x`` as float32 [N,H,W,C], checked and converted as training's are."""
    from .datasets.base import to_inputs
    from .datasets.npz import check_images, open_npz, read_array

    how = f"numpy.savez('{path.name}', {NPZ_KEY}=images)"
    with open_npz(path, how) as archive:
        if NPZ_KEY not in archive.files:
            keys = ", ".join(archive.files) or "none"
            raise DataError(f"{path} has no array '{NPZ_KEY}' (its arrays: {keys}): save the images with {how}")
        images = read_array(archive, path, NPZ_KEY, how)
    check_images(path, NPZ_KEY, images)
    shape = images.shape[1:] if images.ndim == 4 else (*images.shape[1:], 1)
    if tuple(shape) != tuple(input_shape):
        raise DataError(
            f"{path}: '{NPZ_KEY}' holds images of {shape_text(shape)}, but the model takes {shape_text(input_shape)}"
        )
    x, _ = to_inputs(images, np.zeros(len(images), np.int32))
    return x.numpy()


def read_inputs(paths: Sequence[Path], input_shape) -> tuple[list[str], np.ndarray]:
    """(one name per input row, float32 images [N, *input_shape]) of image and .npz files."""
    from .datasets.image_folder import IMAGE_EXTENSIONS, read_image

    names, arrays = [], []
    for path in map(Path, paths):
        if not path.exists():
            raise DataError(f"{path} does not exist: pass image (.png, .jpg) or .npz files")
        if path.is_dir():
            raise DataError(f"{path} is a directory: pass image (.png, .jpg) or .npz files")
        suffix = path.suffix.lower()
        if suffix == ".npz":
            images = read_npz(path, input_shape)
            names += [f"{path}[{i}]" for i in range(len(images))]
            arrays.append(images)
        elif suffix in IMAGE_EXTENSIONS:
            names.append(str(path))
            arrays.append(np.asarray(read_image(path, tuple(input_shape)), np.float32)[np.newaxis])
        else:
            raise DataError(
                f"{path}: not an image or .npz file (suffix {path.suffix or 'none'}): pass "
                f"{', '.join(IMAGE_EXTENSIONS)} or .npz files"
            )
    return names, np.concatenate(arrays)


def probabilities(run, x: np.ndarray, batch_size: int = PREDICT_BATCH_SIZE) -> np.ndarray:
    """softmax(logits) of the run's model in inference mode, [N, classes] float32. A model trained with its own
    loss on class labels gives its outputs as they are when it ends in a softmax (they are probabilities)."""
    import tensorflow as tf

    from .models.keras_file import ends_in_softmax

    values = outputs(run, x, batch_size)
    return values if run.keras_loss and ends_in_softmax(run.model.network) else tf.nn.softmax(values).numpy()


def read_values(paths: Sequence[Path], stored: dict, convert=None) -> tuple[list[str], object]:
    """(one name per row, the inputs) of .npz files whose ``x`` (or ``x_<input name>`` for a model with several
    inputs) holds examples of the stored shapes (a dimension None: any size), of the stored dtypes, then
    ``convert``ed (default: as training converts them, a run trained with a Keras loss)."""
    from .datasets.base import to_values
    from .datasets.npz import open_npz, read_array

    convert = convert or (lambda x: to_values(x).numpy())
    wanted = stored["x"].get("arrays") or {None: stored["x"]}
    keys = {name: NPZ_KEY if name is None else f"{NPZ_KEY}_{name}" for name in wanted}
    names, parts = [], []
    for path in map(Path, paths):
        how = f"numpy.savez('{path.name}', {', '.join(f'{key}=inputs' for key in keys.values())})"
        if path.suffix.lower() != ".npz" or not path.is_file():
            raise DataError(f"{path}: not an .npz file: a run trained with a Keras loss predicts for {how}")
        with open_npz(path, how) as archive:
            missing = [key for key in keys.values() if key not in archive.files]
            if missing:
                found = ", ".join(archive.files) or "none"
                raise DataError(f"{path} has no array '{missing[0]}' (its arrays: {found}): save the inputs with {how}")
            arrays = {name: read_array(archive, path, key, how) for name, key in keys.items()}
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


def _fits(shape, wanted) -> bool:
    """Whether examples of ``shape`` (the batch axis first) are of shape ``wanted`` (None: any size)."""
    return len(shape) == len(wanted) + 1 and all(w is None or n == w for n, w in zip(shape[1:], wanted))


def model_inputs(model, run_dir: Path) -> dict:
    """What ``read_values`` checks inputs against (dataset.json's "stored" for a run of 'accum-train run'), from
    the inputs of a Keras model: their shapes and dtypes, by name where there are several."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise RunDirError(
            f"the model of {run_dir} ({type(model).__name__}) declares no inputs to read .npz files for: call "
            f"model.predict on accum_train.reload.load_fit_run({str(run_dir)!r}) in Python"
        )
    specs = {t.name: {"shape": list(t.shape[1:]), "dtype": str(t.dtype)} for t in inputs}
    return {"x": next(iter(specs.values())) if len(specs) == 1 else {"arrays": specs}}


def outputs(run, x: np.ndarray, batch_size: int = PREDICT_BATCH_SIZE) -> np.ndarray:
    """The run's model's outputs in inference mode (a Keras loss's run: the values the loss took)."""
    import tensorflow as tf

    spec = tf.nest.map_structure(lambda a: tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype)), x)

    from .backends.tensorflow.graphs import graph

    def batch_outputs(inputs):
        return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), run.model.forward(inputs, False))

    batch_outputs = graph(batch_outputs, input_signature=[spec])  # traced as training traces the model

    n = len(tf.nest.flatten(x)[0])
    batches = [
        batch_outputs(tf.nest.map_structure(lambda a, s=start: a[s : s + batch_size], x))
        for start in range(0, n, batch_size)
    ]
    return tf.nest.map_structure(lambda *parts: np.concatenate([p.numpy() for p in parts]), *batches)


def predict(run_dir: Path, paths: Sequence[Path]) -> list[dict]:
    """One {input, prediction, probabilities: {class: p}} per input row, in the order given; for a run trained
    with a Keras loss or by accum_train.fit, one {input, outputs: [...]} (the model's output values)."""
    from .from_config.build import output_names
    from .reload import describe_run, load_run
    from .trainer.rundir import is_fit_run_dir

    if is_fit_run_dir(run_dir):
        return predict_fit(run_dir, paths)
    info = describe_run(run_dir)  # refuses a directory that is not a run
    if info.get("task") == "keras_loss":
        names, x = read_values(paths, info["stored"])
        run = load_run(run_dir)
        return value_rows(names, outputs(run, x), output_names(run.model.network))
    names, x = read_inputs(paths, info["input_shape"])
    classes = info["class_names"]
    probs = probabilities(load_run(run_dir), x)
    return [
        {
            "input": name,
            "prediction": classes[int(np.argmax(p))],
            "probabilities": {c: float(v) for c, v in zip(classes, p)},
        }
        for name, p in zip(names, probs)
    ]


def predict_fit(run_dir: Path, paths: Sequence[Path]) -> list[dict]:
    """One {input, outputs} per input row of a run directory of accum_train.fit: what ``model.predict`` gives for
    the arrays as they are (fit took them as they are)."""
    import tensorflow as tf

    from .from_config.build import output_names
    from .reload import load_fit_run

    model = bare(load_fit_run(run_dir, compile=False))  # before the inputs: their shapes are the model's
    names, x = read_values(paths, model_inputs(model, run_dir), convert=np.asarray)
    try:
        values = model.predict(x, batch_size=PREDICT_BATCH_SIZE, verbose=0)
    except (ValueError, tf.errors.InvalidArgumentError) as err:  # what the stored shapes allow and the model not
        files = ", ".join(str(p) for p in paths)  # (a sequence longer than its position embedding)
        raise DataError(
            f"{files}: the model of {run_dir} cannot take these inputs ({traced_error_line(err)}): save them as it "
            "took its training inputs"
        ) from None
    return value_rows(names, values, output_names(model))


def bare(model):
    """``model`` without a KerasHub task's preprocessor: the .npz arrays the commands read are the model's inputs
    (model_inputs: token_ids, padding_mask, ...), which the task's predict and evaluate would send through its
    tokenizer again. A task whose preprocessor is None takes them as they are (keras_hub's Task)."""
    if getattr(model, "preprocessor", None) is not None:
        model.preprocessor = None
    return model


def value_rows(names: list, values, outputs: list) -> list[dict]:
    """One {input, outputs: [...]} per row; a model with several outputs gives {output name: [...]}."""
    if isinstance(values, (list, tuple)):  # several outputs: by the model's output names
        values = dict(zip(outputs, values))
    if isinstance(values, dict):
        return [
            {"input": name, "outputs": {k: v[i].tolist() for k, v in values.items()}} for i, name in enumerate(names)
        ]
    return [{"input": name, "outputs": row.tolist()} for name, row in zip(names, values)]


def top_k(probabilities: dict, k: int) -> list[tuple[str, float]]:
    """The k most probable (class, p), most probable first; ties keep class order."""
    return sorted(probabilities.items(), key=lambda item: -item[1])[:k]


def check_output(output: Path, overwrite: bool, run_dir, files) -> None:
    """predict's --output: a new .npz file, or with --overwrite one that is neither an input nor a file of the
    run directory (a slip of the name would lose the data or the run's weights.npz)."""
    from .files import check_output_file

    check_output_file(output, overwrite, ".npz")
    if any(Path(file).resolve() == output.resolve() for file in files):
        raise UserError(f"--output {output} is one of the files to predict: name another file")
    if output.exists() and Path(run_dir).resolve() in output.resolve().parents:
        raise UserError(f"--output {output} is a file of the run directory {run_dir}: name another file")
