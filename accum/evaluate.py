"""A trained run measured again on test data (``accum-train evaluate``).

``evaluate(run_dir, out_dir)`` takes what to measure from the one loader (accum/loader.py): the test data the run keeps
(a run of 'accum-train run': its config's test split, changed if asked in ``data.*`` keys only: the model and how it was
trained stay the run's), or where the directory keeps none (accum_train.fit's) the arrays of an .npz given with
``--data``, or raw .txt or .jsonl text read through a KerasHub task's own preprocessor; and the model at its latest
checkpoint that scores them as the run does. The loss and accuracy of the built-in objective are computed the way
training does (the same batches, the same sums, so an unchanged config reproduces summary.json), with a confusion
matrix: rows are the true class, columns the predicted one; evaluate.json and evaluate.png (the matrix, counts in the
cells) hold them, with per-class precision and recall. A model of values (a Keras loss's run; fit's, by
``model.evaluate`` compiled as fit trained it, so the numbers are Keras' own for those arrays) gives its loss and
metrics, in evaluate.json alone. Bad input is refused before anything is written into ``out_dir``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import RunDirError
from .loader import read_run
from .trainer.store.rundir import check_output_dir, pyplot, save_figure, write_json, write_result

# Past this many classes the cells are too small to print counts in (evaluate.json has them all),
# and the figure stops growing so that it stays an image one can open.
MAX_CLASSES_WITH_COUNTS = 40
MAX_FIGURE_INCHES = 24.0


def evaluation_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "evaluate"


def evaluate(
    run_dir: Path,
    out_dir: Path | None = None,
    overrides: Sequence[str] = (),
    data_file: Path | None = None,
    loading=lambda: None,
) -> dict:
    """Evaluate ``run_dir`` on its (possibly changed) test data, or on the .npz ``data_file`` where it keeps none;
    write evaluate.json (and for a classifier evaluate.png) into ``out_dir`` (default RUN_DIR/evaluate). Like every
    output directory of the tool, it must be new or empty: an earlier evaluation is never overwritten. ``loading``:
    called once the request is checked, before the model and the data load (the CLI imports Keras quietly then)."""
    run = read_run(run_dir)  # refuses a directory that is not a run
    source = run.test_source(overrides, data_file)
    if out_dir is None:
        out_dir = evaluation_dir(run.run_dir)
        if out_dir.is_dir() and any(out_dir.iterdir()):
            raise RunDirError(
                f"{out_dir} already holds an evaluation: pass --output-dir DIR for another one, or remove it"
            )
    out_dir = Path(out_dir)
    check_output_dir(out_dir)  # new or empty
    loading()  # nothing above imported TensorFlow: a bad request is refused at once
    test = run.test(source)
    if run.class_names is None:  # a model of values: its loss and metrics, no classes to confuse
        result = {f"test_{name}": value for name, value in test.scores().items()}
        result["test_examples"] = test.examples
    else:
        result = measure(test, run.class_names)
    result.update(run_dir=str(run.run_dir), **test.settings, data=test.data)
    out_dir.mkdir(parents=True, exist_ok=True)
    if run.class_names is None:
        write_json(out_dir / "evaluate.json", result)
    else:
        write_result(out_dir, "evaluate", result, plot_confusion)
    return result


def measure(test, class_names: Sequence[str]) -> dict:
    """Test loss, accuracy and confusion matrix of a classifier on its ``test`` (the loader's ``Evaluated``).

    The loss and accuracy are a training run's own (``Scorer.evaluate``: the same batches and sums), so they match
    summary.json's; the matrix counts the same predictions."""
    n, classes = test.examples, len(class_names)
    confusion = np.zeros((classes, classes), np.int64)
    for labels, predicted in test.classes():
        np.add.at(confusion, (labels, predicted), 1)
    scores = test.scores()
    correct = int(np.trace(confusion))
    return {
        "test_loss": scores["loss"],
        "test_accuracy": scores["accuracy"],
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
        fontsize = 7 if len(names) > 12 else 9
        for (row, col), count in np.ndenumerate(confusion):
            color = "white" if count > threshold else "black"
            ax.text(col, row, str(count), ha="center", va="center", fontsize=fontsize, color=color)
    ax.set_title(
        f"test accuracy {result['test_accuracy']:.4f} on {result['test_examples']} examples\n{result['run_dir']}",
        fontsize=9,
    )
    fig.tight_layout()
    save_figure(fig, path)
