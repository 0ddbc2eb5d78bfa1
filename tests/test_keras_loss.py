"""accum-train run with a Keras loss: a keras_file's compile() (or the YAML's loss and metrics) on an .npz of any
task. Keras' own model.fit(shuffle=False) on whole batches is the oracle: 50 examples in batches of 16 (three
full and one of 2), k=3 (micro-batches of 5, 5, 6; the short batch 0, 1, 1), two epochs."""

import json
import runpy
import sys

import accum_train
import keras
import numpy as np
import pytest
from accum_train import UserError
from accum_train.evaluate import evaluate
from accum_train.export import export_run
from accum_train.predict import predict
from helpers import max_difference

N, BATCH, K, EPOCHS, RATE = 50, 16, 3, 2, 0.1


def regression_arrays(rng, weights: bool):
    x = rng.normal(size=(N, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 2)) + 0.1 * rng.normal(size=(N, 2))).astype(np.float32)
    x_test = rng.normal(size=(20, 6)).astype(np.float32)
    arrays = dict(x_train=x, y_train=y, x_test=x_test, y_test=x_test[:, :2].copy())
    if weights:
        arrays["w_train"] = rng.uniform(0.1, 3.0, N).astype(np.float32)
        arrays["w_test"] = rng.uniform(0.1, 3.0, 20).astype(np.float32)
    return arrays


def regression_model(compiled: bool):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.01), name="hidden")(
        inputs
    )
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))
    if compiled:
        model.compile(optimizer="adam", loss=keras.losses.Huber(), metrics=["mae"])
    return model


# (case, the file's compile(), the YAML's loss and metrics, sample weights, optimizer: config name, Keras class)
CASES = [
    ("file-huber", True, {}, False, ("sgd", keras.optimizers.SGD)),
    ("file-huber-weights-adam", True, {}, True, ("adam", keras.optimizers.Adam)),
    ("yaml-mse", False, {"loss": "mse", "metrics": ["mae", "mean_squared_error"]}, True, ("sgd", keras.optimizers.SGD)),
]


# make test runs this one (sample weights, the YAML's loss, and through it evaluate, predict and export); make
# test-slow all (the default suite's 4-minute budget)
DEFAULT = ("yaml-mse",)


@pytest.mark.parametrize(
    ("case", "compiled", "yaml", "weights", "optimizer"),
    [c if c[0] in DEFAULT else pytest.param(*c, marks=pytest.mark.slow) for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_a_keras_loss_run_ends_at_model_fit_s_weights_and_scores(tmp_path, case, compiled, yaml, weights, optimizer):
    arrays = regression_arrays(np.random.default_rng(0), weights)
    np.savez(tmp_path / "data.npz", **arrays)
    regression_model(compiled).save(tmp_path / "model.keras")
    config = {
        "model": {"name": "keras_file", "path": str(tmp_path / "model.keras")},
        "data": {"name": "npz", "path": str(tmp_path / "data.npz"), "shuffle": False},
        "batch_size": BATCH,
        "subdivisions": K,
        "epochs": EPOCHS,
        "optimizer": {"name": optimizer[0], "learning_rate": RATE},
        **yaml,
    }
    summary = accum_train.run(config, output_dir=tmp_path / "run")

    oracle = keras.models.load_model(tmp_path / "model.keras", compile=False)
    loss = keras.losses.Huber() if compiled else keras.losses.MeanSquaredError()
    metrics = ["mae"] if compiled else ["mae", "mean_squared_error"]
    oracle.compile(optimizer=optimizer[1](RATE), loss=loss, metrics=metrics)
    fit_weights = arrays.get("w_train")
    oracle.fit(
        arrays["x_train"],
        arrays["y_train"],
        sample_weight=fit_weights,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
    )
    saved = np.load(tmp_path / "run" / "weights.npz")
    assert list(saved.files) == ["hidden/kernel", "hidden/bias", "out/kernel", "out/bias"]
    assert max_difference([saved[k] for k in saved.files], oracle.get_weights()) < 1e-5

    scores = oracle.evaluate(
        arrays["x_test"],
        arrays["y_test"],
        sample_weight=arrays.get("w_test"),
        batch_size=BATCH,
        verbose=0,
        return_dict=True,
    )
    expected = {f"test_{name}": value for name, value in scores.items()}
    assert {key: summary[key] for key in expected} == pytest.approx(expected, rel=1e-5)
    assert "test_accuracy" not in summary
    # the run's evaluate gives the summary's scores again, from its checkpoint
    evaluated = evaluate(tmp_path / "run")
    assert {key: evaluated[key] for key in expected} == pytest.approx(expected, rel=1e-5)
    assert json.loads((tmp_path / "run" / "evaluate" / "evaluate.json").read_text())["test_examples"] == 20
    # the run's predict and its exported file give model.fit's model: its outputs, its weights
    np.savez(tmp_path / "new.npz", x=arrays["x_test"])
    rows = predict(tmp_path / "run", [tmp_path / "new.npz"])
    outputs = oracle.predict(arrays["x_test"], verbose=0)
    assert max_difference([row["outputs"] for row in rows], list(outputs)) < 1e-5
    exported = keras.models.load_model(export_run(tmp_path / "run"))
    assert max_difference(exported.get_weights(), oracle.get_weights()) < 1e-5


def write(tmp_path, arrays=None, model=None):
    arrays = arrays if arrays is not None else regression_arrays(np.random.default_rng(0), False)
    np.savez(tmp_path / "data.npz", **arrays)
    (model or regression_model(True)).save(tmp_path / "model.keras")
    return {
        "model": {"name": "keras_file", "path": str(tmp_path / "model.keras")},
        "data": {"name": "npz", "path": str(tmp_path / "data.npz")},
        "batch_size": BATCH,
        "subdivisions": K,
        "epochs": 1,
    }


# (case, change to the config, arrays (None: the regression's), model (None: the compiled regression), message)
BAD = [
    ("unknown loss", {"loss": "msee"}, None, None, "loss='msee' is not a Keras loss: did you mean 'mse'?"),
    (
        "unknown metric",
        {"metrics": ["maee"]},
        None,
        None,
        "metrics has 'maee', which is not a Keras metric: did you mean 'mae'?",
    ),
    (
        "float targets for class indices",
        {"loss": "sparse_categorical_crossentropy"},
        None,
        None,
        "the loss sparse_categorical_crossentropy takes integer class indices, but the targets (y_train) are "
        "float32: save them as integers (y_train.astype('int64')), or choose a loss for values, e.g. loss: mse",
    ),
    (
        "loss of a built-in",
        {"model": {"name": "mlp"}, "loss": "mse"},
        None,
        None,
        "config: loss is only for model.name=keras_file, not mlp (the built-in nets train with sparse cross-entropy "
        "on class labels): remove it",
    ),
    (
        "inputs that do not fit",
        {},
        {
            **regression_arrays(np.random.default_rng(0), False),
            "x_train": np.zeros((N, 5), np.float32),
            "x_test": np.zeros((20, 5), np.float32),
        },
        None,
        "model.path={model} takes inputs of shape 6 per example but x_train holds 5: build the model on "
        "keras.Input(shape=(5,)) or reshape x_train",
    ),
    (
        "targets the loss cannot take",
        {},
        {
            **regression_arrays(np.random.default_rng(0), False),
            "y_train": np.zeros((N, 3), np.float32),
            "y_test": np.zeros((20, 3), np.float32),
        },
        None,
        "the loss of model.path={model} cannot take the data's targets (y_train holds examples of 3, the model "
        "outputs 2 per example): Dimensions must be equal, but are 3 and 2 with input shapes: [?,3], [?,2].",
    ),
    (
        "weights of another length",
        {},
        {**regression_arrays(np.random.default_rng(0), False), "w_train": np.ones(N - 1, np.float32)},
        None,
        "{data}: x_train holds 50 examples but w_train 49: every array needs one row per example",
    ),
    (
        "negative weights",
        {},
        {**regression_arrays(np.random.default_rng(0), False), "w_train": -np.ones(N, np.float32)},
        None,
        "{data}: w_train has shape (50,) and its smallest value is -1: sample weights are one number >= 0 per "
        "example, shape (50,)",
    ),
    (
        "text targets",
        {},
        {**regression_arrays(np.random.default_rng(0), False), "y_train": np.array(["a"] * N)},
        None,
        "{data}: y_train has dtype <U1: arrays must hold numbers; convert it, e.g. y_train.astype('float32')",
    ),
]


@pytest.mark.parametrize(("case", "change", "arrays", "model", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, case, change, arrays, model, message):
    config = {**write(tmp_path, arrays, model() if model else None), **change}
    with pytest.raises(UserError) as caught:
        accum_train.run(config, output_dir=tmp_path / "run")
    expected = message.format(model=tmp_path / "model.keras", data=tmp_path / "data.npz")
    assert str(caught.value) == expected
    assert not (tmp_path / "run").exists()


def test_the_cli_says_it_in_one_line_with_exit_code_2(tmp_path):
    import yaml
    from accum_train.cli.main import main
    from click.testing import CliRunner

    config = {**write(tmp_path), "loss": "msee"}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(main, ["run", str(tmp_path / "bad.yaml"), "--output-dir", str(tmp_path / "run")])
    assert (result.exit_code, result.stderr) == (2, "error: loss='msee' is not a Keras loss: did you mean 'mse'?\n")
    assert not (tmp_path / "run").exists()


def test_plan_shows_the_loss_and_metrics_in_force(tmp_path):
    from accum_train.config import as_config
    from accum_train.from_config.build import load_data
    from accum_train.plan import plan

    # an array the loss does not read (class_names, as a classifier's .npz may hold) is left alone
    arrays = {**regression_arrays(np.random.default_rng(0), False), "class_names": np.array(["a", "b"])}
    cfg = as_config({**write(tmp_path, arrays), "metrics": ["mae", "mse"]})
    result = plan(cfg, load_data(cfg))
    assert result["loss"] == [{"output": "out", "loss": "huber_loss", "weight": None}]
    assert result["metrics"] == ["mae", "mse"]


def classifier_project(tmp_path, activations):
    """An .npz of class labels and an uncompiled keras_file of one output per activation (out_0, out_1, ...)."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(N, 6)).astype(np.float32), rng.integers(0, 3, N)
    names = [""] if len(activations) == 1 else [f"_out_{i}" for i in range(len(activations))]
    targets = {f"y_{split}{name}": y if split == "train" else y[:20] for name in names for split in ("train", "test")}
    np.savez(tmp_path / "data.npz", x_train=x, x_test=x[:20], **targets)
    keras.utils.set_random_seed(4)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    outputs = [keras.layers.Dense(3, activation=a, name=f"out_{i}")(hidden) for i, a in enumerate(activations)]
    keras.Model(inputs, outputs if len(outputs) > 1 else outputs[0]).save(tmp_path / "model.keras")
    return (
        x,
        y,
        {
            "model": {"name": "keras_file", "path": str(tmp_path / "model.keras")},
            "data": {"name": "npz", "path": str(tmp_path / "data.npz"), "shuffle": False},
            "batch_size": BATCH,
            "subdivisions": K,
            "epochs": EPOCHS,
            "optimizer": {"name": "sgd", "learning_rate": RATE},
        },
    )


def test_a_cross_entropy_named_in_the_yaml_takes_the_logits_of_an_output_without_activation(tmp_path):
    x, y, config = classifier_project(tmp_path, [None])
    accum_train.run({**config, "loss": "sparse_categorical_crossentropy"}, output_dir=tmp_path / "run")
    oracle = keras.models.load_model(tmp_path / "model.keras", compile=False)
    oracle.compile(optimizer=keras.optimizers.SGD(RATE), loss=keras.losses.SparseCategoricalCrossentropy(True))
    oracle.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    saved = np.load(tmp_path / "run" / "weights.npz")
    assert max_difference([saved[k] for k in saved.files], oracle.get_weights()) < 1e-5


# (the outputs' activations, the YAML's loss, the loss plan shows for each output)
NAMED_ON_LOGITS = [
    ([None], "sparse_categorical_crossentropy", ["sparse_categorical_crossentropy (on logits)"]),
    (["softmax"], "sparse_categorical_crossentropy", ["sparse_categorical_crossentropy"]),
    (
        [None, "softmax"],
        "sparse_categorical_crossentropy",
        ["sparse_categorical_crossentropy (on logits)", "sparse_categorical_crossentropy"],
    ),
    ([None], "SparseCategoricalCrossentropy", ["sparse_categorical_crossentropy (on logits)"]),
    ([None], "huber", ["huber"]),  # no from_logits: as Keras names it
    ([None], "my_losses:sparse_ce", ["sparse_ce"]),  # your own function, as it is
]


@pytest.mark.parametrize(("activations", "loss", "shown"), NAMED_ON_LOGITS)
def test_plan_shows_which_outputs_a_named_cross_entropy_takes_as_logits(tmp_path, activations, loss, shown):
    from accum_train.config import as_config
    from accum_train.from_config.build import load_data
    from accum_train.plan import plan

    (tmp_path / "my_losses.py").write_text(
        "import keras\n\n\ndef sparse_ce(y_true, y_pred, from_logits=False):\n"
        "    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=from_logits)\n"
    )
    _, _, config = classifier_project(tmp_path, activations)
    cfg = as_config({**config, "loss": str(tmp_path / "my_losses.py:sparse_ce") if ":" in loss else loss})
    assert [entry["loss"] for entry in plan(cfg, load_data(cfg))["loss"]] == shown


def test_predict_and_export_give_the_trained_model_s_outputs(tmp_path):
    config = {**write(tmp_path), "epochs": 2}
    accum_train.run(config, output_dir=tmp_path / "run")
    x = np.random.default_rng(5).normal(size=(7, 6)).astype(np.float32)
    np.savez(tmp_path / "new.npz", x=x)
    rows = predict(tmp_path / "run", [tmp_path / "new.npz"])
    assert [row["input"] for row in rows] == [f"{tmp_path / 'new.npz'}[{i}]" for i in range(7)]
    exported = keras.models.load_model(export_run(tmp_path / "run"))
    expected = exported.predict(x, verbose=0)
    assert max_difference([row["outputs"] for row in rows], list(expected)) < 1e-5
    # the exported model is the trained one: its weights are the run's
    saved = np.load(tmp_path / "run" / "weights.npz")
    assert max_difference([saved[k] for k in saved.files], exported.get_weights()) == 0.0
    np.savez(tmp_path / "wide.npz", x=np.zeros((2, 5), np.float32))
    with pytest.raises(UserError) as caught:
        predict(tmp_path / "run", [tmp_path / "wide.npz"])
    assert str(caught.value) == (
        f"{tmp_path / 'wide.npz'}: 'x' holds float32 examples of shape 5, but the model takes float32 examples "
        f"of shape 6"
    )


def regression_example(repo_root):
    """The commands of the regression example (docs/data-and-models.md), and the figures of its measured run
    (docs/results/keras-loss.md, which docs/keras-loss.md links)."""
    import re

    text = (repo_root / "docs" / "data-and-models.md").read_text()
    body = text.split("<!-- sh example: regression -->\n```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in body.splitlines() if line.strip()]
    docs = (repo_root / "docs" / "results" / "keras-loss.md").read_text().split("## The regression example", 1)[1]
    loss, mae = (
        float(v)
        for v in re.search(r"\| test loss[^|]*\| ([0-9.]+) \|.*?\| test mae \| ([0-9.]+) \|", docs, re.S).groups()
    )
    return commands, loss, mae


def run_example(repo_root, tmp_path, monkeypatch, extra):
    """The example as written in ``tmp_path`` (configs/ and scripts/ linked in), ``extra`` added to the run."""
    from accum_train.cli.main import main
    from click.testing import CliRunner

    commands, loss, mae = regression_example(repo_root)
    for name in ("configs", "scripts"):
        (tmp_path / name).symlink_to(repo_root / name)
    monkeypatch.chdir(tmp_path)
    printed = {}
    for command in commands:
        words = command.split()
        if words[0] == "python":  # the script as __main__, in this process: no second TensorFlow start
            monkeypatch.setattr(sys, "argv", words[1:])
            runpy.run_path(words[1], run_name="__main__")
        else:
            result = CliRunner().invoke(main, words[1:] + (extra if words[1] == "run" else []))
            assert result.exit_code == 0, f"{command}: {result.output}"
            printed[words[1]] = result.stdout
    return printed, loss, mae


def test_the_readme_regression_example_runs_as_written_for_two_epochs(repo_root, tmp_path, monkeypatch):
    printed, _, _ = run_example(repo_root, tmp_path, monkeypatch, ["--set", "epochs=2"])
    assert "loss           mean_squared_error\nmetrics        mae\n" in printed["plan"]
    assert "1024 = 8 x 128 (micro_batch_size=128: subdivisions=8)" in printed["plan"]
    summary = json.loads((tmp_path / "runs" / "regression" / "summary.json").read_text())
    assert summary["steps"] == 16 and summary["subdivisions"] == 8
    evaluated = json.loads((tmp_path / "runs" / "regression" / "evaluate" / "evaluate.json").read_text())
    assert (evaluated["test_loss"], evaluated["test_mae"]) == (summary["test_loss"], summary["test_mae"])
    assert printed["evaluate"].startswith(f"test loss {summary['test_loss']:.4f}, test mae {summary['test_mae']:.4f}")


@pytest.mark.slow  # 20 epochs
def test_the_readme_regression_example_as_written_ends_near_the_figures_it_states(repo_root, tmp_path, monkeypatch):
    run_example(repo_root, tmp_path, monkeypatch, [])
    summary = json.loads((tmp_path / "runs" / "regression" / "summary.json").read_text())
    _, loss, mae = regression_example(repo_root)
    # one run's figures; another CPU rounds differently, Adam follows
    assert summary["test_loss"] == pytest.approx(loss, rel=0.05)
    assert summary["test_mae"] == pytest.approx(mae, rel=0.05)


def two_by_two():
    """Two inputs, two outputs (a value and a class), loss weights: the file's compile()."""
    keras.utils.set_random_seed(4)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(keras.layers.Concatenate()([a, b]))
    model = keras.Model(
        [a, b], [keras.layers.Dense(1, name="price")(hidden), keras.layers.Dense(4, name="kind")(hidden)]
    )
    model.compile(
        loss={"price": "mse", "kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        loss_weights={"price": 1.0, "kind": 0.5},
        metrics={"price": ["mae"]},
    )
    return model


@pytest.mark.slow  # the one-input cases run in make test
def test_two_inputs_and_two_outputs_by_name_end_at_model_fit_s_weights(tmp_path):
    from accum_train.predict import predict

    rng = np.random.default_rng(2)
    x = {"a": rng.normal(size=(N + 20, 3)).astype(np.float32), "b": rng.normal(size=(N + 20, 2)).astype(np.float32)}
    y = {"price": rng.normal(size=(N + 20, 1)).astype(np.float32), "kind": rng.integers(0, 4, N + 20)}
    weights = rng.uniform(0.5, 2.0, N + 20).astype(np.float32)
    arrays = {
        **{f"x_train_{k}": v[:N] for k, v in x.items()},
        **{f"x_test_{k}": v[N:] for k, v in x.items()},
        **{f"y_train_{k}": v[:N] for k, v in y.items()},
        **{f"y_test_{k}": v[N:] for k, v in y.items()},
        "w_train": weights[:N],
        "w_test": weights[N:],
    }
    config = {
        **write(tmp_path, arrays, two_by_two()),
        "epochs": EPOCHS,
        "data": {"name": "npz", "path": str(tmp_path / "data.npz"), "shuffle": False},
        "optimizer": {"name": "sgd", "learning_rate": RATE},
    }
    summary = accum_train.run(config, output_dir=tmp_path / "run")

    oracle = two_by_two()
    oracle.compile(
        optimizer=keras.optimizers.SGD(RATE),
        loss={"price": "mse", "kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        loss_weights={"price": 1.0, "kind": 0.5},
        metrics={"price": ["mae"]},
    )
    # model.fit takes the targets in the outputs' order; w_train weighs every output (one array per output there)
    train = ({k: v[:N] for k, v in x.items()}, [y["price"][:N], y["kind"][:N]])
    each = [weights[:N], weights[:N]]
    oracle.fit(*train, sample_weight=each, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    saved = np.load(tmp_path / "run" / "weights.npz")
    assert max_difference([saved[k] for k in saved.files], oracle.get_weights()) < 1e-5
    scores = oracle.evaluate(
        {k: v[N:] for k, v in x.items()},
        [y["price"][N:], y["kind"][N:]],
        sample_weight=[weights[N:], weights[N:]],
        batch_size=BATCH,
        verbose=0,
        return_dict=True,
    )
    assert summary["test_loss"] == pytest.approx(scores["loss"], rel=1e-5)
    assert summary["test_price_mae"] == pytest.approx(scores["price_mae"], rel=1e-5)

    np.savez(tmp_path / "new.npz", x_a=x["a"][:3], x_b=x["b"][:3])
    rows = predict(tmp_path / "run", [tmp_path / "new.npz"])
    expected = oracle.predict({k: v[:3] for k, v in x.items()}, verbose=0)
    assert max_difference([[row["outputs"]["price"] for row in rows]], [expected[0]]) < 1e-5
    assert max_difference([[row["outputs"]["kind"] for row in rows]], [expected[1]]) < 1e-5

    del arrays["x_test_b"]
    np.savez(tmp_path / "data.npz", **arrays)
    with pytest.raises(UserError) as caught:
        accum_train.run(config, output_dir=tmp_path / "again")
    assert (
        str(caught.value) == f"{tmp_path / 'data.npz'} has x_train_b but no x_test_b: give both splits the same arrays"
    )


@pytest.mark.slow  # two runs, each in a fresh process
def test_compare_checks_the_gradient_and_plots_the_loss_and_the_first_metric(tmp_path):
    from accum_train.compare import compare
    from accum_train.config import as_config

    cfg = as_config({**write(tmp_path, regression_arrays(np.random.default_rng(0), True)), "epochs": 2})
    result = compare(cfg, tmp_path / "compare")
    check = result["gradient_check"]
    assert check["subdivisions"] == K and check["max_rel_diff"] < 1e-5
    base, sub = result["baseline"]["curves"], result["subdivided"]["curves"]
    assert set(sub) == {"epoch", "train_loss", "test_loss", "test_mae", "examples_per_s"}
    # the baseline's one pass and the subdivided update are the same update (to rounding)
    assert sub["test_loss"] == pytest.approx(base["test_loss"], rel=1e-4)
    assert (tmp_path / "compare" / "compare.png").stat().st_size > 10_000


@pytest.mark.slow  # an image folder checked, two epochs, an export
def test_a_compiled_classifier_on_an_image_folder_trains_with_its_loss_and_predicts_probabilities(tmp_path):
    """A file saved after compile(loss=sparse cross-entropy on a softmax): its own loss and accuracy metric;
    predict gives the softmax's outputs as the probabilities (not a softmax of them)."""
    from accum_train.export import export_run
    from accum_train.predict import predict
    from test_own_data import tiny_folder

    tiny_folder(tmp_path / "images")
    keras.utils.set_random_seed(6)
    inputs = keras.Input((6, 6, 1))
    outputs = keras.layers.Dense(3, activation="softmax", name="classes")(keras.layers.Flatten()(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.save(tmp_path / "model.keras")
    config = {
        "model": {"name": "keras_file", "path": str(tmp_path / "model.keras")},
        "data": {"name": "image_folder", "path": str(tmp_path / "images"), "channels": 1},
        "batch_size": 6,
        "subdivisions": 2,
        "epochs": 2,
    }
    summary = accum_train.run(config, output_dir=tmp_path / "run")
    assert {"test_loss", "test_accuracy"} <= set(summary)
    rows = predict(tmp_path / "run", [tmp_path / "images" / "test" / "b" / "00.png"])
    probabilities = list(rows[0]["probabilities"].values())
    trained = keras.models.load_model(export_run(tmp_path / "run"))
    image = np.full((1, 6, 6, 1), 10 * (3 * 0 + 1) + 5, np.float32) / 255.0
    assert max_difference([probabilities], trained.predict(image, verbose=0)) < 1e-5


def test_a_loss_given_as_a_function_is_imported_from_the_working_directory(tmp_path, monkeypatch):
    from accum_train.config import as_config
    from accum_train.from_config.build import load_data
    from accum_train.plan import plan

    (tmp_path / "my_losses.py").write_text(
        "import keras\n\n\ndef half_mse(y_true, y_pred):\n"
        "    return 0.5 * keras.losses.mean_squared_error(y_true, y_pred)\n"
    )
    monkeypatch.chdir(tmp_path)
    cfg = as_config({**write(tmp_path), "loss": "my_losses:half_mse"})
    assert plan(cfg, load_data(cfg))["loss"] == [{"output": "out", "loss": "half_mse", "weight": None}]
    with pytest.raises(UserError) as caught:
        plan(as_config({**write(tmp_path), "loss": "my_losses:halve"}), load_data(cfg))
    assert str(caught.value) == ("loss='my_losses:halve': my_losses has no function 'halve' (it has half_mse)")
    with pytest.raises(UserError) as caught:
        plan(as_config({**write(tmp_path), "loss": "their_losses:half_mse"}), load_data(cfg))
    assert str(caught.value) == (
        "loss='their_losses:half_mse': cannot import their_losses (ModuleNotFoundError: No module named "
        f"'their_losses'); looked for their_losses.py in {tmp_path}, and among the installed packages"
    )
