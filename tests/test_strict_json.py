"""Every JSON file a run writes, through either door, and every --json output is strict JSON (RFC 8259): a number
that is not finite is written as null, never as Python's bare NaN or Infinity, which JavaScript's JSON.parse, jq
before 1.7 and Go's encoding/json refuse. The runs here are built so that their first update has no noise scale
(its micro-batches' gradients cancel: the batch's gradient is zero, so the estimate of |G|^2 is negative), and the
CLI's test loss overflows to inf; the package's own readers take the null back."""

import json
import math
import shutil

import accum_train
import keras
import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.compare import _curves
from accum_train.files import strict_json
from accum_train.outcome import final_scores, scores_text
from accum_train.trainer.store.metrics_log import is_epoch_record
from click.testing import CliRunner
from helpers import records, run_keras_file

# Two identical inputs with opposite targets per batch of 2, cut into 2 micro-batches of 1: from zero weights the
# two examples' gradients cancel, the update changes nothing, and every update's noise scale is undefined.
X = np.tile(np.array([[1.0, 0.0, 0.0]], np.float32), (4, 1))
Y = np.array([[1.0], [-1.0], [1.0], [-1.0]], np.float32)


def zero_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def strict(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as a strict reader does."""

    def refuse(word):
        raise ValueError(f"not strict JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def strict_documents(path) -> list:
    """Every JSON document of a .json (one) or a .jsonl (one per line) file, strictly parsed."""
    text = path.read_text()
    return [strict(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else [strict(text)]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """accum-train run on a keras_file model and an .npz: its test targets (1e30) make the test loss overflow."""
    test_y = np.full((2, 1), 1e30, np.float32)  # finite, as the data check wants; its square is not
    run_dir = run_keras_file(
        tmp_path_factory.mktemp("cli"),
        zero_model(),
        {"x_train": X, "y_train": Y, "x_test": X[:2], "y_test": test_y},
        "batch_size: 2\nsubdivisions: 2\nepochs: 1\noptimizer: {name: sgd, learning_rate: 0.1}\n",
        data=", shuffle: false",
    )
    return run_dir, None


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fit") / "run"
    history = accum_train.fit(
        zero_model(), X, Y, batch_size=2, subdivisions=2, shuffle=False, verbose=0, output_dir=run_dir
    )
    return run_dir, history


def first_update(rows):
    return next(r for r in rows if not is_epoch_record(r))


def epoch_end(rows):
    return next(r for r in rows if is_epoch_record(r))


# (door, the JSON files its run directory holds, [(file, which document, key)] that hold null where NaN or inf was)
DOORS = [
    (
        "cli_run",
        ["history.jsonl", "metrics.jsonl", "run.json", "summary.json"],
        [
            ("metrics.jsonl", first_update, "noise_scale"),
            ("metrics.jsonl", epoch_end, "noise_scale"),
            ("metrics.jsonl", epoch_end, "test_loss"),  # inf
            ("summary.json", lambda docs: docs[0], "test_loss"),
        ],
    ),
    (
        "fit_run",
        ["history.jsonl", "metrics.jsonl", "run.json", "summary.json"],
        [
            ("metrics.jsonl", first_update, "noise_scale"),
            ("metrics.jsonl", epoch_end, "noise_scale"),
        ],
    ),
]


@pytest.mark.parametrize(("door", "files", "nulls"), DOORS, ids=[d[0] for d in DOORS])
def test_every_json_file_of_a_run_is_strict_with_null_where_a_number_is_not_finite(door, files, nulls, request):
    run_dir, history = request.getfixturevalue(door)
    found = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.suffix in (".json", ".jsonl"))
    assert found == files
    documents = {name: strict_documents(run_dir / name) for name in found}
    for name, which, key in nulls:
        document = which(documents[name])
        assert key in document and document[key] is None, (name, key)
    assert documents["metrics.jsonl"] == records(run_dir)  # the strict reading is the package's reading
    if history is not None:  # fit's History holds model.fit's floats: the NaN that the file holds as null
        assert math.isnan(history.history["noise_scale"][0])
    described = CliRunner().invoke(main, ["describe", str(run_dir), "--json"])
    assert described.exit_code == 0, described.output
    assert strict(described.output)["noise_scale"] is None


def test_a_resumed_fit_history_reads_the_null_back_as_nan(fit_run, tmp_path):
    """The epochs a run directory holds start a resumed call's History: model.fit's NaN, not None."""
    run_dir = tmp_path / "run"
    shutil.copytree(fit_run[0], run_dir)  # one epoch done
    history = accum_train.fit(
        zero_model(), X, Y, batch_size=2, subdivisions=2, epochs=2, shuffle=False, verbose=0, output_dir=run_dir
    )
    assert len(history.history["noise_scale"]) == 2
    assert all(math.isnan(value) for value in history.history["noise_scale"])


def test_compare_and_the_last_line_read_null_as_nan(cli_run):
    """compare's curves (its table and plot) and a --workers run's last line (its summary.json read back)."""
    curves = _curves(cli_run[0])
    assert math.isnan(curves["test_loss"][0]) and curves["train_loss"] == [1.0]
    assert final_scores({"test_accuracy": 0.5, "test_loss": None}) == "test accuracy 0.5000 (test loss nan)"
    assert scores_text({"test_loss": None, "test_mae": 2.0}, "test") == "test loss nan, test mae 2.0000"


def test_a_metric_of_several_values_is_a_list_in_fit_s_metrics_jsonl(tmp_path):
    """F1Score(average=None) logs one value per class: metrics.jsonl holds them as a list (the call ended in a
    TypeError)."""
    labels = keras.utils.to_categorical([0, 1, 2, 0], 3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="categorical_crossentropy", metrics=[keras.metrics.F1Score(average=None)])
    history = accum_train.fit(
        model, X, labels, batch_size=2, subdivisions=2, shuffle=False, verbose=0, output_dir=tmp_path / "run"
    )
    rows = strict_documents(tmp_path / "run" / "metrics.jsonl")
    assert len(epoch_end(rows)["f1_score"]) == 3
    assert epoch_end(rows)["f1_score"] == pytest.approx(np.asarray(history.history["f1_score"][0]).tolist())


# (value, strict JSON of it)
VALUES = [
    (float("nan"), "null"),
    (float("inf"), "null"),
    (float("-inf"), "null"),
    (np.float64("nan"), "null"),
    (0.1, "0.1"),
    (np.float64(2.5), "2.5"),
    (3, "3"),
    (True, "true"),
    (None, "null"),
    ("NaN", '"NaN"'),
    (
        {"a": [1.0, float("nan"), (float("inf"), 2)], "b": {"c": float("-inf")}},
        '{"a": [1.0, null, [null, 2]], "b": {"c": null}}',
    ),
]


@pytest.mark.parametrize(("value", "text"), VALUES, ids=[repr(v) for v, _ in VALUES])
def test_strict_json_writes_null_for_what_is_not_a_finite_number(value, text):
    assert strict_json(value) == text
