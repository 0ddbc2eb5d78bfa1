"""Class probabilities from a trained run for new inputs (``accum-train predict``).

Inputs are image files (PNG, JPEG), decoded by the same function the
image_folder data pipeline uses, or .npz files whose array ``x`` holds images
[N,H,W] or [N,H,W,C], uint8 or float, converted as training converts them
(``datasets.base.to_inputs``). Every input is read and checked against the
model's input shape (the loader's ``input_shape``) before the model is
loaded, so a bad file is reported at once, in one line naming it.
Probabilities are the softmax of the run's logits at its latest checkpoint.

A model of values (a run trained with a Keras loss, a run directory of accum_train.fit: the loader's
``class_names`` is None) gives its outputs instead, for .npz files whose ``x`` (or ``x_<input name>`` per input)
holds examples of the shapes and dtypes it takes (the loader's ``input_spec()``), converted as the loader says
(``convert``: as training converted them, or as they are where they went to model.fit as they are). A KerasHub
task's preprocessor is left out: the arrays are what it made of raw data (token_ids, padding_mask, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

<<<<<<< HEAD
from .defaults import PREDICT_BATCH_SIZE
from .errors import DataError, RunDirError, UserError
from .text import shape_text, traced_error_line

NPZ_KEY = "x"
=======
from .errors import DataError, UserError
from .loader import BATCH_SIZE, read_run
from .npz_values import NPZ_KEY, read_values
from .text import shape_text
>>>>>>> one-loader


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


<<<<<<< HEAD
def probabilities(run, x: np.ndarray, batch_size: int = PREDICT_BATCH_SIZE) -> np.ndarray:
    """softmax(logits) of the run's model in inference mode, [N, classes] float32. A model trained with its own
    loss on class labels gives its outputs as they are when it ends in a softmax (they are probabilities)."""
=======
def probabilities(run, x: np.ndarray, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """softmax(logits) of ``run``'s model (the loader's ``model``: reload.Trained) in inference mode, [N, classes]
    float32. A model trained with its own loss on class labels gives its outputs as they are when it ends in a
    softmax (they are probabilities)."""
>>>>>>> one-loader
    import tensorflow as tf

    from .models.keras_file import ends_in_softmax

    values = run.outputs(x, batch_size)
    return values if run.keras_loss and ends_in_softmax(run.model.network) else tf.nn.softmax(values).numpy()


<<<<<<< HEAD
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

    from .trainer.graphs import graph

    def batch_outputs(inputs):
        return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), run.model.forward(inputs, False))

    batch_outputs = graph(batch_outputs, input_signature=[spec])  # traced as training traces the model

    n = len(tf.nest.flatten(x)[0])
    batches = [
        batch_outputs(tf.nest.map_structure(lambda a, s=start: a[s : s + batch_size], x))
        for start in range(0, n, batch_size)
    ]
    return tf.nest.map_structure(lambda *parts: np.concatenate([p.numpy() for p in parts]), *batches)


=======
>>>>>>> one-loader
def predict(run_dir: Path, paths: Sequence[Path]) -> list[dict]:
    """One {input, prediction, probabilities: {class: p}} per input row, in the order given; for a model of
    values (trained with a Keras loss, or by accum_train.fit), one {input, outputs: [...]} (its output values)."""
    run = read_run(run_dir)  # refuses a directory that is not a run
    if run.class_names is None:  # a model of values: no classes to give probabilities over
        names, x = read_values(paths, run.input_spec(), convert=run.convert)
        return value_rows(names, run.outputs(x, paths), run.output_names())
    names, x = read_inputs(paths, run.input_shape)
    classes = run.class_names
    probs = probabilities(run.model, x)
    return [
        {
            "input": name,
            "prediction": classes[int(np.argmax(p))],
            "probabilities": {c: float(v) for c, v in zip(classes, p)},
        }
        for name, p in zip(names, probs)
    ]


<<<<<<< HEAD
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


=======
>>>>>>> one-loader
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
