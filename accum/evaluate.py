"""A trained run measured again on its test split (``accum-train evaluate``).

``evaluate(run_dir, out_dir)`` loads the run's own model at its latest
checkpoint, with the data its config.yaml names (changed, if asked, in
``data.*`` keys only: the model and how it was trained stay the run's), and
computes the test loss and accuracy the way training does (the same batches,
the same sums, so an unchanged config reproduces summary.json) plus a
confusion matrix: rows are the true class, columns the predicted one.
It writes evaluate.json (the numbers, per-class precision and recall) and
evaluate.png (the matrix, counts in the cells) into ``out_dir``; bad input is
refused before anything is written.

A run directory of accum_train.fit keeps neither a config nor data: it is
evaluated on the arrays of an .npz given with ``--data`` (``data_file``), by
``model.evaluate`` of its model at the latest checkpoint, compiled as fit
trained it, so the numbers are Keras' own for those arrays: evaluate.json
holds the loss and the compiled metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .config import load_run_config, override_key
from .errors import ConfigError, DataError, RunDirError
from .text import shape_text, traced_error_line
from .trainer.rundir import FIT_RECORD, check_output_dir, is_fit_run_dir, pyplot, save_figure, write_json, write_result

# Keys `evaluate --set` may change: which test data is read. The rest (model,
# optimizer, batch, ...) describes the trained run and is not the caller's to change.
CHANGEABLE_PREFIX = "data."
# data keys that only change how the training split is read: evaluate reads the test split alone
TRAINING_ONLY = ("train_limit", "validation", "shuffle", "shuffle_buffer", "augment", "trim_padding")
# Past this many classes the cells are too small to print counts in (evaluate.json has them all),
# and the figure stops growing so that it stays an image one can open.
MAX_CLASSES_WITH_COUNTS = 40
MAX_FIGURE_INCHES = 24.0


def evaluation_config(run_dir: Path, overrides: Sequence[str] = ()):
    """The run's config with ``--set data.KEY=VALUE`` overrides; any other key is refused."""
    for item in overrides:
        key = override_key(item)
        if key == "data":
            raise ConfigError(
                f"--set {item}: evaluate takes data's keys one at a time (e.g. --set data.test_limit=1000), not the "
                "whole section"
            )
        if key.startswith(CHANGEABLE_PREFIX) and key.split(".")[1] in TRAINING_ONLY:
            raise ConfigError(
                f"--set {item}: evaluate reads only the test split, and {key} changes only the training split: "
                "leave it out (e.g. --set data.test_limit=1000)"
            )
        if not key.startswith(CHANGEABLE_PREFIX):
            raise ConfigError(
                f"--set {item}: evaluate changes only data.* keys (e.g. --set data.test_limit=1000); "
                f"{key or 'the key'} is part of the trained run"
            )
    return load_run_config(run_dir, overrides)


def check_compatible(data, info: dict, run_dir: Path) -> None:
    """The data must be what the model was built for: the same input shape and classes."""
    shape, run_shape = tuple(data.input_shape), tuple(info["input_shape"])
    if shape != run_shape:
        raise DataError(
            f"the data has inputs of {shape_text(shape)}, but the model of {run_dir} takes "
            f"{shape_text(run_shape)}: evaluate it on data like its training data"
        )
    names, run_names = list(data.class_names), list(info["class_names"])
    if names != run_names:
        raise DataError(
            f"the data has classes {_names_text(names)}, but the model of {run_dir} was trained on "
            f"{_names_text(run_names)}: labels would mean different classes"
        )


def _names_text(names, shown: int = 4) -> str:
    text = ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")
    return f"[{text}] ({len(names)})"


def evaluation_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "evaluate"


def evaluate(
    run_dir: Path, out_dir: Path | None = None, overrides: Sequence[str] = (), data_file: Path | None = None
) -> dict:
    """Evaluate ``run_dir`` on its (possibly changed) test data; write evaluate.json and .png into ``out_dir``
    (default RUN_DIR/evaluate). Like every output directory of the tool, it must be new or empty: an
    earlier evaluation is never overwritten. A run directory of accum_train.fit is evaluated on the .npz
    ``data_file`` (``evaluate_fit``), which no other run takes."""
    from .reload import describe_run, load_run

    run_dir = Path(run_dir)
    if is_fit_run_dir(run_dir):
        return evaluate_fit(run_dir, out_dir, overrides, data_file)
    info = describe_run(run_dir)  # refuses a directory that is not a run
    if data_file is not None:
        raise DataError(
            f"--data {data_file}: {run_dir} was written by 'accum-train run' and is evaluated on its config's test "
            f"data (change it with --set data.KEY=VALUE); --data is for a run directory of accum_train.fit"
        )
    cfg = evaluation_config(run_dir, overrides)
    out_dir = _output_dir(run_dir, out_dir)
    from .from_config.build import load_data

    data = load_data(cfg, run_dir)  # the run's manifest of checked image files spares their decoding
    check_compatible(data, info, run_dir)
    if len(data.test) == 0:
        raise DataError("the test split is empty: nothing to evaluate")
    run = load_run(run_dir, data)
    if run.keras_loss:  # a Keras loss's run: its loss and metrics, no classes to confuse
        scores = {f"test_{name}": value for name, value in run.scorer.task_scores(data.test).items()}
        result = {**scores, "test_examples": len(data.test)}
        result["run_dir"], result["data"] = str(run_dir), {**dataclasses.asdict(cfg.data), "source": data.source}
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / "evaluate.json", result)
        return result
    result = measure(run, info["class_names"])
    result["run_dir"], result["data"] = str(run_dir), {**dataclasses.asdict(cfg.data), "source": data.source}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_result(out_dir, "evaluate", result, plot_confusion)
    return result


def _output_dir(run_dir: Path, out_dir: Path | None) -> Path:
    """``out_dir`` (default RUN_DIR/evaluate), checked to be new or empty."""
    if out_dir is None:
        out_dir = evaluation_dir(run_dir)
        if out_dir.is_dir() and any(out_dir.iterdir()):
            raise RunDirError(
                f"{out_dir} already holds an evaluation: pass --output-dir DIR for another one, or remove it"
            )
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    return out_dir


# The arrays --data reads, by model.evaluate's names (x_<input name> and y_<output name> for several).
FIT_DATA_HOW = "numpy.savez(FILE, x=inputs, y=targets[, sample_weight=weights])"


def evaluate_fit(run_dir: Path, out_dir: Path | None, overrides: Sequence[str], data_file: Path | None) -> dict:
    """Loss and compiled metrics of a run directory of accum_train.fit on the .npz ``data_file`` (arrays ``x``,
    ``y``, optionally ``sample_weight``): ``model.evaluate`` of its model at the latest checkpoint, at the batch
    size the run trained with (Keras' default where it had none); written to OUT_DIR/evaluate.json."""
    import json

    import tensorflow as tf

    from . import keras_private
    from .keras_fit.checks import check_targets
    from .predict import bare, model_inputs, read_values
    from .reload import load_fit_run

    if overrides:
        raise ConfigError(
            f"--set {overrides[0]}: {run_dir} was written by accum_train.fit and keeps no config to change: pass the "
            f"data to evaluate on with --data FILE.npz"
        )
    if data_file is None:
        raise DataError(
            f"{run_dir} was written by accum_train.fit, which keeps no data: pass the data to evaluate on with "
            f"--data FILE.npz, saved by {FIT_DATA_HOW}"
        )
    data_file = Path(data_file)
    if data_file.suffix.lower() != ".npz" or not data_file.is_file():
        raise DataError(f"--data {data_file} is not an .npz file: save the data with {FIT_DATA_HOW}")
    out_dir = _output_dir(run_dir, out_dir)
    model = bare(load_fit_run(run_dir, compile=True))  # the compiled loss and metrics are what is measured
    rows, x = read_values([data_file], model_inputs(model, run_dir), convert=np.asarray)
    y, weights = _targets(data_file, len(rows))
    batch_size = json.loads((run_dir / FIT_RECORD).read_text()).get("batch_size")
    spec = tf.nest.map_structure(lambda a: tf.TensorSpec((None, *a.shape[1:]), a.dtype), (x, y))
    try:
        keras_private.symbolic_build(model, spec)  # the compiled loss's entries, which the check reads
        # labels out of range in one line, as fit says it, where TensorFlow's graph error has fifty
        check_targets(model, spec[0], None, [("y", y)], where=f"--data {data_file}")
        scores = model.evaluate(x, y, sample_weight=weights, batch_size=batch_size, verbose=0, return_dict=True)
    except (ValueError, tf.errors.InvalidArgumentError) as err:  # targets that do not fit the outputs or the loss
        raise DataError(
            f"--data {data_file}: the model of {run_dir} cannot evaluate it ({traced_error_line(err)}): save x as "
            f"the model takes it and y as its loss takes it"
        ) from None
    result = {f"test_{name}": float(value) for name, value in scores.items()}
    result.update(test_examples=len(rows), run_dir=str(run_dir), batch_size=batch_size)
    result["data"] = {"source": str(data_file.resolve())}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "evaluate.json", result)
    return result


def _targets(path: Path, n: int) -> tuple:
    """(y, or {output name: y} from y_<name>; sample_weight or None) of the .npz ``path``, ``n`` rows each."""
    from .datasets.npz import open_npz, read_array

    with open_npz(path, FIT_DATA_HOW) as archive:
        keys = [key for key in archive.files if key == "y" or key.startswith("y_")]
        if not keys:
            found = ", ".join(archive.files) or "none"
            raise DataError(f"{path} has no array 'y' (its arrays: {found}): save the data with {FIT_DATA_HOW}")
        if "y" in keys and len(keys) > 1:
            raise DataError(
                f"{path} has {', '.join(keys)}: give one array y, or one per output name (y_<name>), not both"
            )
        arrays = {key: read_array(archive, path, key, FIT_DATA_HOW) for key in keys}
        if "sample_weight" in archive.files:
            arrays["sample_weight"] = read_array(archive, path, "sample_weight", FIT_DATA_HOW)
    for key, array in arrays.items():
        if array.ndim == 0 or len(array) != n:
            raise DataError(
                f"{path}: the inputs hold {n} examples but {key} {len(array) if array.ndim else 0}: every array "
                f"needs one row per example"
            )
    weights = arrays.pop("sample_weight", None)
    y = arrays.pop("y", None)
    return (y if y is not None else {key[len("y_") :]: a for key, a in arrays.items()}), weights


def measure(run, class_names: Sequence[str]) -> dict:
    """Test loss, accuracy and confusion matrix of ``run``'s model on its test split.

    The loss and accuracy are a training run's own (``Run.evaluate``: the same batches and sums), so they match
    summary.json's; the matrix counts the same predictions."""
    n, classes = len(run.data.test), len(class_names)
    confusion = np.zeros((classes, classes), np.int64)
    for labels, predicted in run.scorer.classes():
        np.add.at(confusion, (labels, predicted), 1)
    loss, accuracy = run.scorer.evaluate()
    correct = int(np.trace(confusion))
    return {
        "test_loss": loss,
        "test_accuracy": accuracy,
        "test_examples": n,
        "correct": correct,
        "class_names": list(class_names),
        "confusion": confusion.tolist(),
        "per_class": per_class(confusion, class_names),
    }


def per_class(confusion: np.ndarray, class_names: Sequence[str]) -> list:
    """Precision and recall of each class; null where undefined (nothing predicted, or no example of it)."""
    rows = []
    for i, name in enumerate(class_names):
        hits, predicted, actual = int(confusion[i, i]), int(confusion[:, i].sum()), int(confusion[i].sum())
        rows.append(
            {
                "class": name,
                "examples": actual,
                "predicted": predicted,
                "correct": hits,
                "precision": hits / predicted if predicted else None,
                "recall": hits / actual if actual else None,
            }
        )
    return rows


def plot_confusion(result: dict, path: Path) -> None:
    plt = pyplot()
    confusion = np.array(result["confusion"])
    names = result["class_names"]
    size = min(MAX_FIGURE_INCHES, max(4.0, 0.55 * len(names) + 2.5))
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    image = ax.imshow(confusion, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ticks = np.arange(len(names))
    ax.set_xticks(ticks, names, rotation=45, ha="right")
    ax.set_yticks(ticks, names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    # Dark text on light cells, light on dark, so every count stays readable.
    threshold = confusion.max() / 2 if confusion.size else 0
    if len(names) <= MAX_CLASSES_WITH_COUNTS:
        for (row, col), count in np.ndenumerate(confusion):
            ax.text(
                col,
                row,
                str(count),
                ha="center",
                va="center",
                fontsize=7 if len(names) > 12 else 9,
                color="white" if count > threshold else "black",
            )
    ax.set_title(
        f"test accuracy {result['test_accuracy']:.4f} on {result['test_examples']} examples\n{result['run_dir']}",
        fontsize=9,
    )
    fig.tight_layout()
    save_figure(fig, path)
