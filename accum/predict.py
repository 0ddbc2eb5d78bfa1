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
task's preprocessor is left out: the arrays are what it made of raw data (token_ids, padding_mask, ...). Raw
.txt and .jsonl files of a KerasHub task go through that preprocessor instead (accum/raw_text.py). A sequence
output [rows, steps, classes] (a causal LM's logits) is given per position: the most probable class (a token,
decoded by the task's tokenizer where it has one) and its probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .datasets.npz import NPZ_KEY, check_images, open_npz, read_named, read_values
from .defaults import PREDICT_BATCH_SIZE
from .errors import DataError, UserError
from .loader import read_run
from .raw_text import is_raw
from .text import shape_text


def read_npz(path: Path, input_shape) -> np.ndarray:
    """The images of an .npz's ``x`` as float32 [N,H,W,C], checked and converted as training's are."""
    from .datasets.base import to_inputs

    how = f"numpy.savez('{path.name}', {NPZ_KEY}=images)"
    with open_npz(path, how) as archive:
        images = read_named(archive, path, [NPZ_KEY], "images", how)[NPZ_KEY]
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
    """softmax(logits) of ``run``'s model (the loader's ``model``: reload.Trained) in inference mode, [N, classes]
    float32. A model trained with its own loss on class labels gives its outputs as they are when it ends in a
    softmax (they are probabilities)."""
    import keras

    from .models.keras_file import ends_in_softmax

    values = run.outputs(x, batch_size)
    if run.keras_loss and ends_in_softmax(run.model.network):
        return values
    return keras.ops.convert_to_numpy(keras.ops.softmax(values))


def predict(run_dir: Path, paths: Sequence[Path]) -> list[dict]:
    """One {input, prediction, probabilities: {class: p}} per input row, in the order given; for a model of
    values (trained with a Keras loss, or by accum_train.fit), one {input, outputs: [...]} (its output values)."""
    run = read_run(run_dir)  # refuses a directory that is not a run
    if run.class_names is None:  # a model of values: no classes to give probabilities over
        raw = [path for path in paths if is_raw(path)]
        if raw and len(raw) < len(paths):
            raise DataError(f"{raw[0]} is raw text and the other files are not: pass raw text or .npz files, not both")
        names, x = run.raw_inputs(paths) if raw else read_values(paths, run.input_spec(), convert=run.convert)
        values = run.outputs(x, paths)
        if isinstance(values, np.ndarray) and values.ndim == 3:  # a sequence's: per position, as a reader reads it
            mask = x.get("padding_mask") if isinstance(x, dict) else None
            return token_rows(names, values, mask, getattr(run.preprocessor, "tokenizer", None))
        return value_rows(names, values, run.output_names())
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


def value_rows(names: list, values, outputs: list) -> list[dict]:
    """One {input, outputs: [...]} per row; a model with several outputs gives {output name: [...]}."""
    if isinstance(values, (list, tuple)):  # several outputs: by the model's output names
        values = dict(zip(outputs, values))
    if isinstance(values, dict):
        return [
            {"input": name, "outputs": {k: v[i].tolist() for k, v in values.items()}} for i, name in enumerate(names)
        ]
    return [{"input": name, "outputs": row.tolist()} for name, row in zip(names, values)]


def token_rows(names: list, values: np.ndarray, mask, tokenizer) -> list[dict]:
    """One {input, tokens: [{position, id, token, probability}], outputs} per row of a sequence output [rows, steps,
    classes] (a causal LM's logits over its vocabulary, a tagger's over its tags): at each position, up to the
    padding where ``mask`` gives it, the most probable class id, ``tokenizer``'s text for it (where the run has one)
    and its probability. Values that are not already probabilities (each position's non-negative, summing to 1)
    are taken as logits: their softmax."""
    import keras

    summed = values.sum(-1)
    is_probability = values.min() >= 0 and np.allclose(summed, 1.0, atol=1e-3)
    probs = values if is_probability else keras.ops.convert_to_numpy(keras.ops.softmax(values))
    ids, best = probs.argmax(-1), probs.max(-1)
    texts = {}
    if tokenizer is not None:  # each id's text alone: GPT-2's " cat" for the id of "Ġcat"
        unique = np.unique(ids)
        texts = dict(zip(unique.tolist(), (_text(t) for t in tokenizer.detokenize(unique[:, np.newaxis]))))
    rows = []
    for i, name in enumerate(names):
        steps = range(ids.shape[1]) if mask is None else np.flatnonzero(mask[i]).tolist()
        tokens = [
            {
                "position": t,
                "id": int(ids[i, t]),
                **({"token": texts[int(ids[i, t])]} if texts else {}),
                "probability": float(best[i, t]),
            }
            for t in steps
        ]
        rows.append({"input": name, "tokens": tokens, "outputs": values[i]})
    return rows


def _text(token) -> str:
    return token.decode("utf-8", "replace") if isinstance(token, bytes) else str(token)


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
