"""The readers' one loader (accum/loader.py): describe, evaluate, predict and export hold no test of which door
wrote a run directory, and ``read_run`` gives one interface for a directory of either door, whose answers agree:
the same small regressor trained by `accum-train run` (a keras_file with its compiled mse) and by accum_train.fit
gives outputs equal to its exported model's, and a test loss equal to the mean squared error of those outputs (to
1e-5). Reading a directory for describe loads neither TensorFlow nor Keras."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import accum_train
import numpy as np
import pytest
from accum_train.loader import read_run
from helpers import max_difference, run_keras_file, small_regressor
from test_layers import PACKAGE, imports, sources

READERS = ("describe", "evaluate", "predict", "export")
# What tells the doors apart, and the loaders of each door: the readers name none of them.
DOOR_WORDS = (
    "is_fit_run_dir",
    "is_run_dir",
    "FIT_RECORD",
    "fit.json",
    "config.yaml",
    "dataset.json",
    "load_run",
    "load_fit_run",
    "describe_run",
    "require_run_dir",
)
# The interface both doors' objects have: the members the readers use.
INTERFACE = {
    "run_dir",
    "record",
    "door",
    "export_name",
    "class_names",
    "input_shape",
    "convert",
    "preprocessor",
    "raw_inputs",
    "settings",
    "go_on",
    "model",
    "keras_model",
    "input_spec",
    "outputs",
    "output_names",
    "test_source",
    "test",
}

RNG = np.random.default_rng(3)
X = RNG.random((50, 6), dtype=np.float32)
Y = RNG.random((50, 1), dtype=np.float32)
TRAIN, BATCH, K, SEED = 40, 8, 2, 5


@pytest.mark.parametrize("reader", READERS)
def test_a_reader_names_no_door_and_calls_the_one_loader(repo_root, reader):
    source = (repo_root / "accum" / f"{reader}.py").read_text()
    assert [word for word in DOOR_WORDS if word in source] == []
    modules = sources()
    found = imports(modules[f"{PACKAGE}.{reader}"], f"{PACKAGE}.{reader}", modules)
    assert f"{PACKAGE}.loader" in found and f"{PACKAGE}.reload" not in found
    calls = [
        node.func.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "read_run"
    ]
    assert calls == ["read_run"]  # once, at the reader's start


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """door -> (run directory, the .npz of its test examples): one regressor trained by each door."""
    root = tmp_path_factory.mktemp("doors")
    arrays = {"x_train": X[:TRAIN], "y_train": Y[:TRAIN], "x_test": X[TRAIN:], "y_test": Y[TRAIN:]}
    settings = f"batch_size: {BATCH}\nsubdivisions: {K}\nepochs: 1\nseed: {SEED}\n"
    (root / "cli").mkdir()
    cli = run_keras_file(root / "cli", small_regressor(), arrays, settings, data=", shuffle: false")
    order = {"batch_size": BATCH, "subdivisions": K, "seed": SEED, "shuffle": False, "verbose": 0}
    accum_train.fit(small_regressor(), X[:TRAIN], Y[:TRAIN], epochs=1, output_dir=root / "fit", **order)
    np.savez(root / "test.npz", x=X[TRAIN:], y=Y[TRAIN:])
    return {"accum-train run": (cli, None), "accum_train.fit": (root / "fit", root / "test.npz")}


def members(run) -> set:
    return {name for name in dir(run) if not name.startswith("_")}


def test_both_doors_have_the_same_interface(runs):
    cli, fit = (read_run(runs[door][0]) for door in ("accum-train run", "accum_train.fit"))
    assert members(cli) == members(fit) == INTERFACE


@pytest.mark.parametrize("door", ["accum-train run", "accum_train.fit"])
def test_each_door_answers_through_it(runs, door):
    run_dir, data_file = runs[door]
    run = read_run(run_dir)
    expected = {
        "accum-train run": ("model.keras", "keras_file", f"accum-train run --resume {run_dir}"),
        "accum_train.fit": (
            "export.keras",
            "keras",
            f"call accum_train.fit(model, ..., output_dir={str(run_dir)!r}) again",
        ),
    }[door]
    settings = {"model": expected[1], "batch_size": BATCH, "subdivisions": K, "seed": SEED}
    assert (run.door, run.export_name, run.settings(), run.go_on()) == (door, expected[0], settings, expected[2])
    assert run.class_names is None  # a regressor: values, no classes
    assert run.input_spec()["x"] == {"shape": [6], "dtype": "float32"}

    # the model the readers use is the one export writes, with the newest checkpoint's weights
    x = X[TRAIN:]
    predicted = run.keras_model().predict(x, verbose=0)
    assert max_difference([run.outputs(x, [])], [predicted]) < 1e-5
    assert len(run.output_names()) == 1

    test = run.test(run.test_source((), data_file))
    scores = test.scores()
    assert (test.examples, test.classes, sorted(scores)) == (len(x), None, ["loss", "mae"])
    assert scores["loss"] == pytest.approx(float(np.mean((predicted - Y[TRAIN:]) ** 2)), abs=1e-5)
    assert scores["mae"] == pytest.approx(float(np.mean(np.abs(predicted - Y[TRAIN:]))), abs=1e-5)


@pytest.mark.parametrize("door", ["accum-train run", "accum_train.fit"])
def test_describe_reads_either_door_without_tensorflow(runs, door):
    check = (
        "import json, sys; from accum_train.describe import describe; d = describe(sys.argv[1]); "
        "print(json.dumps([d['door'], 'tensorflow' in sys.modules, 'keras' in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, str(runs[door][0])], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [door, False, False]


def test_both_doors_record_the_run_in_one_run_json_of_one_shape(runs):
    """One record for either door (rundir.write_record): the door, the Keras backend, the TrainSpec's values, the data
    (the CLI's; fit keeps none), and fit's arguments, which its resume checks; the CLI's config stays in config.yaml."""
    cli, fit = (json.loads((runs[door][0] / "run.json").read_text()) for door in ("accum-train run", "accum_train.fit"))
    assert (sorted(cli), sorted(fit)) == (
        ["backend", "data", "door", "spec"],
        ["backend", "data", "door", "fit", "spec"],
    )
    assert cli["backend"] == fit["backend"] == "tensorflow"
    assert (cli["door"], fit["door"], fit["data"], cli["data"]["input_shape"]) == ("config", "fit", None, [6])
    assert (
        sorted(cli["spec"])
        == sorted(fit["spec"])
        == ["baseline", "checkpoints", "max_bad_steps", "memory_limit", "micro"]
    )
    assert cli["spec"]["micro"] == fit["spec"]["micro"] == {"count": K, "size": None, "auto": False}
    assert (fit["fit"]["batch_size"], fit["fit"]["k"], fit["fit"]["seed"]) == (BATCH, K, SEED)
    assert not any((runs[door][0] / name).exists() for door in runs for name in ("dataset.json", "fit.json"))


OLD = Path(__file__).resolve().parent / "data" / "old_runs"


# Run directories of earlier releases (tests/data/old_runs), recorded before run.json: fit.json, or config.yaml with
# dataset.json. The loader reads them as it reads run.json (rundir.read_record); test_old_run_dirs.py resumes them.
@pytest.mark.parametrize(
    ("name", "door", "recorded", "settings"),
    [
        ("cli-0.1.0", "accum-train run", "dataset.json", {"model": "mlp", "batch_size": 64, "subdivisions": 4}),
        ("cli-0.2.0", "accum-train run", "dataset.json", {"model": "mlp", "batch_size": 64, "subdivisions": 4}),
        ("fit-0.2.0", "accum_train.fit", "fit.json", {"model": "keras", "batch_size": 8, "subdivisions": 2}),
    ],
)
def test_a_run_directory_of_an_earlier_layout_is_read_as_today(name, door, recorded, settings):
    run = read_run(OLD / name)
    assert (run.door, run.settings()) == (door, {**settings, "seed": 0})
    assert run.record == json.loads((OLD / name / recorded).read_text())
