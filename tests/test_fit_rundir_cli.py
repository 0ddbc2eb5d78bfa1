"""`accum-train export`, `predict` and `evaluate --data` on a run directory of accum_train.fit(output_dir=...).

Fit saves its model as initial_model.keras before the first update; the readers take it with the newest
checkpoint's weights: exactly the trained model's weights, for a call that returned and for one a SIGINT stopped
after update 5 (which never wrote model.keras). export writes a file whose predictions are the trained model's,
predict writes model.predict's outputs, evaluate gives model.evaluate's loss and metrics on the arrays of --data
(to 1e-6); bad input is one line, exit 2, nothing written. `run --resume` still refuses such a directory
(tests/test_fit_rundir.py).
"""

import json
import shutil

import accum_train
import keras
import numpy as np
import pytest
from accum_train.cli.main import main
from accum_train.errors import Interrupted
from accum_train.reload import load_fit_run
from click.testing import CliRunner
from helpers import records, signal_after, small_regressor

N, BATCH, K, SEED, STOP_AT = 50, 16, 3, 5, 5
RNG = np.random.default_rng(7)
X = RNG.random((N, 6), dtype=np.float32)
Y = RNG.random((N, 1), dtype=np.float32)
W = RNG.random(N).astype(np.float32) + 0.5


def fit(built, run_dir, epochs=2, callbacks=None):
    order = {"batch_size": BATCH, "subdivisions": K, "seed": SEED, "verbose": 0}
    return accum_train.fit(built, X, Y, epochs=epochs, output_dir=run_dir, callbacks=callbacks, **order)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (run directory, the model object fit trained in it): a call that returned after 2 epochs (8
    updates), and one a SIGINT stopped after update 5, mid-epoch 2."""
    root = tmp_path_factory.mktemp("fit-runs")
    finished = small_regressor()
    fit(finished, root / "finished")
    stopped = small_regressor()
    with pytest.raises(Interrupted) as caught:
        fit(stopped, root / "interrupted", callbacks=[signal_after(STOP_AT)])
    assert caught.value.step == STOP_AT
    return {"finished": (root / "finished", finished), "interrupted": (root / "interrupted", stopped)}


KINDS = ["finished", "interrupted"]


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_fit_saves_its_model_as_the_run_begins_and_a_resume_keeps_it(runs, tmp_path):
    run_dir, _ = runs["interrupted"]
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == [
        "checkpoints",
        "history.jsonl",
        "initial_model.keras",
        "metrics.jsonl",
        "run.json",
        "tensorboard",
        "writer.lock",
    ]
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    first = (copy / "initial_model.keras").read_bytes()
    fit(small_regressor(), copy, epochs=3)  # resumes at update 5 and returns
    assert (copy / "initial_model.keras").read_bytes() == first
    assert json.loads((copy / "summary.json").read_text())["steps"] == 12


@pytest.mark.parametrize("kind", KINDS)
def test_the_reloaded_model_holds_the_trained_weights_exactly(runs, kind):
    run_dir, trained = runs[kind]
    reloaded = load_fit_run(run_dir)
    assert int(trained.optimizer.iterations.numpy()) == {"finished": 8, "interrupted": STOP_AT}[kind]
    assert len(reloaded.get_weights()) == len(trained.get_weights()) == 4
    for got, expected in zip(reloaded.get_weights(), trained.get_weights()):
        assert np.array_equal(got, expected)
    # the initial weights are not what came back: the checkpoint's were restored
    initial = keras.models.load_model(run_dir / "initial_model.keras")
    assert not np.array_equal(initial.get_weights()[0], trained.get_weights()[0])
    assert reloaded.loss == "mse" and reloaded.compiled  # compiled as fit trained it: evaluate needs it


@pytest.mark.parametrize("kind", KINDS)
def test_export_writes_a_keras_file_that_predicts_what_the_trained_model_does(runs, kind, tmp_path):
    run_dir, trained = runs[kind]
    out = tmp_path / "exported.keras"
    before = tree(run_dir)
    result = CliRunner().invoke(main, ["export", str(run_dir), "--output", str(out)])
    assert (result.exit_code, result.stdout) == (0, f"written: {out}\n"), result.stderr
    assert tree(run_dir) == before
    exported = keras.models.load_model(out)
    assert not exported.compiled  # the layers and weights; the optimizer's state stays in the checkpoint
    difference = np.abs(exported.predict(X, verbose=0) - trained.predict(X, verbose=0)).max()
    assert difference <= 1e-6


@pytest.mark.parametrize("kind", KINDS)
def test_export_writes_run_dir_export_keras_by_default_beside_fit_s_own_model_keras(runs, kind, tmp_path):
    """fit writes model.keras when a call returns (and again when a later call does): the export is a file of its
    own, on a finished directory and on an unfinished one alike."""
    run_dir, trained = runs[kind]
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    fit_s = (copy / "model.keras").read_bytes() if kind == "finished" else None
    result = CliRunner().invoke(main, ["export", str(copy)])
    assert (result.exit_code, result.stdout) == (0, f"written: {copy / 'export.keras'}\n"), result.stderr
    exported = keras.models.load_model(copy / "export.keras")
    assert np.abs(exported.predict(X, verbose=0) - trained.predict(X, verbose=0)).max() <= 1e-6
    assert (copy / "model.keras").read_bytes() == fit_s if kind == "finished" else not (copy / "model.keras").exists()


def test_a_directory_of_an_earlier_release_is_read_from_its_model_keras(runs, tmp_path):
    """Before initial_model.keras, a call that returned left model.keras alone: the readers take its layers."""
    run_dir, trained = runs["finished"]
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "initial_model.keras").unlink()
    for got, expected in zip(load_fit_run(copy).get_weights(), trained.get_weights()):
        assert np.array_equal(got, expected)


@pytest.mark.parametrize("kind", KINDS)
def test_predict_writes_the_outputs_of_model_predict(runs, kind, tmp_path):
    run_dir, trained = runs[kind]
    inputs, out = tmp_path / "inputs.npz", tmp_path / "outputs.npz"
    raw = (X[:7] * 255).astype(np.uint8)  # as fit and model.predict take arrays: not scaled (the CLI's runs scale)
    np.savez(inputs, x=raw)
    result = CliRunner().invoke(main, ["predict", str(run_dir), str(inputs), "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 8 and lines[0].split() == ["input", "outputs"]
    assert lines[1].split()[0] == f"{inputs}[0]"
    saved = np.load(out)
    assert list(saved["inputs"]) == [f"{inputs}[{i}]" for i in range(7)]
    assert saved["outputs"].shape == (7, 1)
    assert np.abs(saved["outputs"] - trained.predict(raw, verbose=0)).max() <= 1e-6
    assert float(lines[1].split()[1]) == pytest.approx(float(saved["outputs"][0, 0]), abs=5e-5)  # shown to 4 places
    # no classes to rank: --top is refused, not ignored, and nothing is written
    ranked = ["predict", str(run_dir), str(inputs), "--top", "2", "--output", str(tmp_path / "o2.npz")]
    ranked = CliRunner().invoke(main, ranked)
    assert (ranked.exit_code, ranked.stderr) == (
        2,
        f"error: --top 2: {run_dir} gives its model's outputs as they are, not class probabilities to rank: leave "
        "--top out\n",
    )
    assert not (tmp_path / "o2.npz").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_evaluate_with_data_gives_model_evaluate_s_loss_and_metrics(runs, kind, tmp_path):
    run_dir, trained = runs[kind]
    data, out = tmp_path / "held-out.npz", tmp_path / "eval"
    np.savez(data, x=X, y=Y, sample_weight=W)
    result = CliRunner().invoke(main, ["evaluate", str(run_dir), "--data", str(data), "--output-dir", str(out)])
    assert result.exit_code == 0, result.stderr
    expected = trained.evaluate(X, Y, sample_weight=W, batch_size=BATCH, verbose=0, return_dict=True)
    written = json.loads((out / "evaluate.json").read_text())
    assert sorted(written) == ["batch_size", "data", "run_dir", "test_examples", "test_loss", "test_mae"]
    assert abs(written["test_loss"] - expected["loss"]) <= 1e-6
    assert abs(written["test_mae"] - expected["mae"]) <= 1e-6
    assert (written["test_examples"], written["batch_size"]) == (N, BATCH)
    assert written["data"] == {"source": str(data.resolve())}
    assert result.stdout == (
        f"test loss {written['test_loss']:.4f}, test mae {written['test_mae']:.4f} on {N} examples\n"
        f"written: {out / 'evaluate.json'}\n"
    )


def test_evaluate_writes_into_run_dir_evaluate_by_default(runs, tmp_path):
    run_dir, trained = runs["finished"]
    copy, data = tmp_path / "run", tmp_path / "held-out.npz"
    shutil.copytree(run_dir, copy)
    np.savez(data, x=X[:20], y=Y[:20])
    result = CliRunner().invoke(main, ["evaluate", str(copy), "--data", str(data)])
    assert result.exit_code == 0, result.stderr
    written = json.loads((copy / "evaluate" / "evaluate.json").read_text())
    expected = trained.evaluate(X[:20], Y[:20], batch_size=BATCH, verbose=0, return_dict=True)
    assert abs(written["test_loss"] - expected["loss"]) <= 1e-6 and written["test_examples"] == 20


def two_ways():
    """Two inputs, one of them uint8 pixels the model scales itself; two outputs, each with its loss and metric."""
    keras.utils.set_random_seed(2)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b", dtype="uint8")
    pixels = keras.layers.Rescaling(1 / 255)(b)
    hidden = keras.layers.Dense(4, activation="tanh")(keras.layers.Concatenate()([a, pixels]))
    built = keras.Model([a, b], [keras.layers.Dense(1, name="price")(hidden), keras.layers.Dense(2, name="size")(a)])
    built.compile(optimizer="adam", loss={"price": "mse", "size": "mae"}, metrics={"price": ["mae"], "size": ["mse"]})
    return built


def test_a_model_with_two_inputs_and_two_outputs_takes_and_gives_them_by_name(tmp_path):
    run_dir = tmp_path / "run"
    x, y = {"a": X[:, :3], "b": (X[:, 3:5] * 255).astype(np.uint8)}, {"price": Y, "size": X[:, 4:6] * 2}
    trained = two_ways()
    accum_train.fit(trained, x, y, batch_size=BATCH, subdivisions=2, epochs=1, seed=SEED, verbose=0, output_dir=run_dir)
    np.savez(tmp_path / "data.npz", x_a=x["a"], x_b=x["b"], y_price=y["price"], y_size=y["size"])
    predicted = CliRunner().invoke(
        main, ["predict", str(run_dir), str(tmp_path / "data.npz"), "--output", str(tmp_path / "out.npz")]
    )
    assert predicted.exit_code == 0, predicted.stderr
    saved, expected = np.load(tmp_path / "out.npz"), trained.predict(x, verbose=0)
    assert sorted(saved) == ["inputs", "outputs_price", "outputs_size"]
    assert np.abs(saved["outputs_price"] - expected[0]).max() <= 1e-6
    assert np.abs(saved["outputs_size"] - expected[1]).max() <= 1e-6
    evaluated = CliRunner().invoke(main, ["evaluate", str(run_dir), "--data", str(tmp_path / "data.npz")])
    assert evaluated.exit_code == 0, evaluated.stderr
    written = json.loads((run_dir / "evaluate" / "evaluate.json").read_text())
    scores = trained.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert sorted(written) == sorted(
        ["batch_size", "data", "run_dir", "test_examples", *(f"test_{name}" for name in scores)]
    )
    for name, value in scores.items():
        assert abs(written[f"test_{name}"] - value) <= 1e-6, name


def bad_inputs(tmp):
    np.savez(tmp / "no-y.npz", x=X)
    np.savez(tmp / "short-y.npz", x=X, y=Y[:10])
    np.savez(tmp / "wide.npz", x=np.zeros((4, 5), np.float32))
    np.savez(tmp / "both-y.npz", x=X, y=Y, y_price=Y)
    (tmp / "notes.txt").write_text("x")
    (tmp / "notes.csv").write_text("x")


# (id; command and arguments after the run directory; the error line, {run} the run directory, {tmp} the folder)
ERRORS = [
    (
        "evaluate without --data",
        ["evaluate"],
        "{run} was written by accum_train.fit, which keeps no data: pass the data to evaluate on with --data "
        "FILE.npz, saved by numpy.savez(FILE, x=inputs, y=targets[, sample_weight=weights])",
    ),
    (
        "evaluate --set",
        ["evaluate", "--set", "data.test_limit=10"],
        "--set data.test_limit=10: {run} was written by accum_train.fit and keeps no config to change: pass the "
        "data to evaluate on with --data FILE.npz",
    ),
    (
        "evaluate a text file",
        ["evaluate", "--data", "{tmp}/notes.txt"],
        "{tmp}/notes.txt: the model of {run} has no preprocessor to read raw text with (a task built with "
        "preprocessor=None, or no KerasHub task): pass .npz files of the arrays it takes",
    ),
    (
        "evaluate a csv file",
        ["evaluate", "--data", "{tmp}/notes.csv"],
        "--data {tmp}/notes.csv is not an .npz, .txt or .jsonl file: save the data with numpy.savez(FILE, "
        "x=inputs, y=targets[, sample_weight=weights])",
    ),
    (
        "evaluate without y",
        ["evaluate", "--data", "{tmp}/no-y.npz"],
        "{tmp}/no-y.npz has no array 'y' (its arrays: x): save the data with numpy.savez(FILE, x=inputs, "
        "y=targets[, sample_weight=weights])",
    ),
    (
        "evaluate a short y",
        ["evaluate", "--data", "{tmp}/short-y.npz"],
        "{tmp}/short-y.npz: the inputs hold 50 examples but y 10: every array needs one row per example",
    ),
    (
        "evaluate y and y_price",
        ["evaluate", "--data", "{tmp}/both-y.npz"],
        "{tmp}/both-y.npz has y, y_price: give one array y, or one per output name (y_<name>), not both",
    ),
    (
        "predict inputs of another shape",
        ["predict", "{tmp}/wide.npz"],
        "{tmp}/wide.npz: 'x' holds float32 examples of shape 5, but the model takes float32 examples of shape 6",
    ),
    (
        "predict raw text of a model without a preprocessor",
        ["predict", "{tmp}/notes.txt"],
        "{tmp}/notes.txt: the model of {run} has no preprocessor to read raw text with (a task built with "
        "preprocessor=None, or no KerasHub task): pass .npz files of the arrays it takes",
    ),
    (
        "predict over an existing file",
        ["predict", "{tmp}/no-y.npz", "--output", "{tmp}/wide.npz"],
        "{tmp}/wide.npz exists: pass --overwrite to replace it, or --output another .npz file",
    ),
    (
        "predict over its own input",
        ["predict", "{tmp}/no-y.npz", "--output", "{tmp}/no-y.npz", "--overwrite"],
        "--output {tmp}/no-y.npz is one of the files to predict: name another file",
    ),
    (
        "predict over a file of the run",
        ["predict", "{tmp}/no-y.npz", "--output", "{run}/summary.npz", "--overwrite"],
        "--output {run}/summary.npz is a file of the run directory {run}: name another file",
    ),
    (
        "export over fit's model.keras",
        ["export", "--output", "{run}/model.keras"],
        "{run}/model.keras exists: pass --overwrite to replace it, or --output another .keras file",
    ),
]


@pytest.mark.parametrize(("args", "message"), [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS])
def test_bad_input_is_one_line_and_nothing_is_written(runs, tmp_path, args, message):
    run_dir, _ = runs["finished"]
    bad_inputs(tmp_path)
    mine = run_dir / "summary.npz"  # a file in the run directory, as the CLI's weights.npz; removed after
    np.savez(mine, mine=np.ones(3))
    try:
        before, run_before = tree(tmp_path), tree(run_dir)
        command, *rest = (a.format(tmp=tmp_path, run=run_dir) for a in args)
        result = CliRunner().invoke(main, [command, str(run_dir), *rest])
        assert (result.exit_code, result.stdout) == (2, "")
        assert result.stderr == "error: " + message.format(tmp=tmp_path, run=run_dir) + "\n"
        assert (tree(tmp_path), tree(run_dir)) == (before, run_before)
    finally:
        mine.unlink()


def test_a_run_directory_of_accum_train_run_takes_no_data_option(tmp_path):
    """What describe_run reads of a run of 'accum-train run' (its files need no content to reach the check)."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("")
    (run_dir / "dataset.json").write_text("{}")
    np.savez(tmp_path / "data.npz", x=X, y=Y)
    result = CliRunner().invoke(main, ["evaluate", str(run_dir), "--data", str(tmp_path / "data.npz")])
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: --data {tmp_path / 'data.npz'}: {run_dir} was written by 'accum-train run' and is evaluated on its "
        f"config's test data (change it with --set data.KEY=VALUE); --data is for a run directory of "
        f"accum_train.fit\n",
    )


def test_a_directory_without_its_model_file_or_checkpoint_says_what_to_do(runs, tmp_path):
    run_dir, _ = runs["interrupted"]
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "initial_model.keras").unlink()  # as an interrupted call of an earlier release left it
    result = CliRunner().invoke(main, ["export", str(copy), "--output", str(tmp_path / "x.keras")])
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: {copy} has neither initial_model.keras (saved as a fit run begins; earlier releases did not) nor "
        f"model.keras (saved when the call returns): call accum_train.fit(model, ..., output_dir={str(copy)!r}) "
        f"again, which saves it and goes on from the checkpoint\n",
    )
    shutil.copy(run_dir / "initial_model.keras", copy)
    shutil.rmtree(copy / "checkpoints")  # killed before its first checkpoint
    (copy / "checkpoints").mkdir()
    np.savez(tmp_path / "x.npz", x=X, y=Y)
    before = tree(copy)
    for command in (
        ["export", str(copy), "--output", str(tmp_path / "x.keras")],
        ["predict", str(copy), str(tmp_path / "x.npz")],
        ["evaluate", str(copy), "--data", str(tmp_path / "x.npz")],
    ):
        result = CliRunner().invoke(main, command)
        assert (result.exit_code, result.stderr) == (
            2,
            f"error: {copy}: no checkpoint in {copy / 'checkpoints'} yet (fit writes one when an epoch ends and when "
            f"a signal stops it): call accum_train.fit(model, ..., output_dir={str(copy)!r}) again, then read it\n",
        ), command[0]
    assert not (tmp_path / "x.keras").exists() and tree(copy) == before


def test_a_model_keras_cannot_rebuild_is_one_line(tmp_path):
    """A Lambda layer: Keras' safe mode refuses to load its code (the readers never run code from a file)."""
    run_dir = tmp_path / "run"
    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((6,)), keras.layers.Lambda(lambda t: t * 2.0), keras.layers.Dense(1)])
    built.compile(optimizer="sgd", loss="mse")
    accum_train.fit(built, X, Y, batch_size=BATCH, epochs=1, seed=SEED, verbose=0, output_dir=run_dir)
    result = CliRunner().invoke(main, ["export", str(run_dir), "--output", str(tmp_path / "x.keras")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: cannot rebuild the model of {run_dir} from initial_model.keras (")
    assert result.stderr.endswith(
        "): the command line knows Keras' own layers, losses and metrics; for your own, call "
        f"accum_train.reload.load_fit_run({str(run_dir)!r}) in Python where Keras finds them "
        "(keras.saving.register_keras_serializable; a Lambda layer's code after "
        "keras.config.enable_unsafe_deserialization())\n"
    )
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "x.keras").exists()


def test_describe_gives_the_batch_and_k_a_fit_run_came_to(tmp_path):
    """A batch schedule with a fixed micro-batch: run.json keeps the first batch and k, each update's record the
    batch and k it ran at, and describe those in force at the newest update."""
    run_dir = tmp_path / "run"
    schedule = [{"epoch": 2, "batch_size": 16}]
    keywords = dict(epochs=2, micro_batch_size=4, batch_schedule=schedule, seed=SEED, verbose=0)
    accum_train.fit(small_regressor(), X, Y, 8, output_dir=run_dir, **keywords)
    updates = [r for r in records(run_dir) if not r.get("epoch_end")]
    assert sorted({(r["epoch"], r["batch_size"], r["subdivisions"]) for r in updates}) == [(1, 8, 2), (2, 16, 4)]
    result = CliRunner().invoke(main, ["describe", str(run_dir), "--json"])
    described = json.loads(result.output)
    assert (described["batch_size"], described["subdivisions"]) == (8, 2)
    assert (described["batch_size_in_force"], described["subdivisions_in_force"]) == (16, 4)
    text = CliRunner().invoke(main, ["describe", str(run_dir)]).output
    assert "  batch      16 in 4 micro-batches, seed" in text


@pytest.mark.parametrize("kind", KINDS)
def test_describe_tells_a_fit_run_directory_as_it_stands(runs, kind):
    """The same command on fit's directory: run.json's batch, metrics.jsonl's updates, the checkpoints kept,
    and for the stopped call how to go on with it."""
    run_dir, _ = runs[kind]
    result = CliRunner().invoke(main, ["describe", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    described = json.loads(result.output)
    steps = {"finished": 8, "interrupted": STOP_AT}[kind]
    kept = sorted(int(p.name.split("-")[1].split(".")[0]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    updates = [r for r in records(run_dir) if not r.get("epoch_end")]
    assert described == {
        "run_dir": str(run_dir),
        "door": "accum_train.fit",
        "state": {"finished": "finished", "interrupted": "stopped"}[kind],
        "writer_pid": None,
        "model": "keras",
        "batch_size": BATCH,
        "subdivisions": K,
        "seed": SEED,
        "batch_size_in_force": BATCH,
        "subdivisions_in_force": K,
        "model_file": "initial_model.keras",
        "updates_logged": steps,
        "epochs_ended": {"finished": 2, "interrupted": 1}[kind],
        "last_loss": updates[-1]["loss"],
        # the newest update's estimate: null where an update had none (strict JSON's NaN)
        "noise_scale": next(r["noise_scale"] for r in reversed(updates) if r["noise_scale"] is not None),
        "checkpoints": kept,
        "summary": json.loads((run_dir / "summary.json").read_text()) if kind == "finished" else None,
        "next": None if kind == "finished" else f"call accum_train.fit(model, ..., output_dir={str(run_dir)!r}) again",
    }
    assert [r["step"] for r in updates] == list(range(1, steps + 1))
    assert kept and kept[-1] == steps
    epochs = {"finished": "2 epochs", "interrupted": "1 epoch"}[kind]  # counted, not "1 epochs"
    progress = f"  progress   {steps} updates logged, {epochs} ended, last loss "
    assert progress in CliRunner().invoke(main, ["describe", str(run_dir)]).output
