"""The Python API: ``accum_train.fit`` against Keras' own ``model.fit`` as the oracle, and
``accum_train.run`` as the CLI's one code path."""

import json
import os
import subprocess
import sys
from pathlib import Path

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train import UserError

RNG = np.random.default_rng(7)
X = RNG.random((50, 6, 6, 1), dtype=np.float32)
Y = RNG.integers(0, 4, 50)
X_VAL, Y_VAL = RNG.random((12, 6, 6, 1), dtype=np.float32), RNG.integers(0, 4, 12)


def small_model(seed=1, batchnorm=False, softmax=False):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 1))
    h = keras.layers.Conv2D(3, 3, use_bias=not batchnorm)(inputs)
    if batchnorm:
        h = keras.layers.BatchNormalization(momentum=0.9)(h)
    h = keras.layers.ReLU()(keras.layers.Flatten()(h))
    outputs = keras.layers.Dense(4, activation="softmax" if softmax else None)(h)
    return keras.Model(inputs, outputs)


def keras_optimizer(name, rate):
    return {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam}[name](learning_rate=rate)


def oracle(model, optimizer, rate, batch_size, epochs, softmax=False):
    """Keras' own fit from the same weights, in the given order."""
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    twin.compile(
        optimizer=keras_optimizer(optimizer, rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax),
    )
    twin.fit(X, Y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return twin.get_weights()


def max_difference(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))


# 50 examples, batch 16: three full batches and a short one of 2; k=3 cuts 16 as 5, 5, 6 (ragged).
@pytest.mark.parametrize(
    ("optimizer", "rate", "softmax"),
    [("sgd", 0.1, False), ("adam", 0.01, False), ("adam", 0.01, True)],
)
def test_fit_equals_keras_fit_in_the_given_order(optimizer, rate, softmax):
    model = small_model(softmax=softmax)
    expected = oracle(model, optimizer, rate, 16, 2, softmax)
    start = model.get_weights()
    history = accum_train.fit(
        model, X, Y, batch_size=16, subdivisions=3, epochs=2, optimizer=optimizer, learning_rate=rate, shuffle=False
    )
    assert max_difference(model.get_weights(), expected) < 1e-5  # the object the caller holds was trained
    assert max_difference(model.get_weights(), start) > 1e-3
    assert set(history) == {"loss"} and len(history["loss"]) == 2
    assert model.layers[-1].get_config()["activation"] == ("softmax" if softmax else "linear")


def test_micro_batch_size_gives_the_same_update_as_subdivisions():
    a, b = small_model(), small_model()
    accum_train.fit(a, X, Y, batch_size=16, subdivisions=4, shuffle=False, optimizer="sgd", learning_rate=0.1)
    accum_train.fit(b, X, Y, batch_size=16, micro_batch_size=4, shuffle=False, optimizer="sgd", learning_rate=0.1)
    assert max_difference(a.get_weights(), b.get_weights()) == 0.0


def test_batchnorm_is_pooled_in_training_and_keras_own_after():
    """With one micro-batch per update the pooled statistics are the batch's: Keras' fit is the oracle
    for weights and moving statistics alike. Both run in this process, under its pinned thread pools
    (conftest), since oneDNN rounds BatchNorm's sums differently with other intra-op pool sizes."""
    model = small_model(batchnorm=True)
    expected = oracle(model, "sgd", 0.05, 16, 2)
    accum_train.fit(model, X, Y, batch_size=16, epochs=2, optimizer="sgd", learning_rate=0.05, shuffle=False)
    assert max_difference(model.get_weights(), expected) < 1e-5
    norm = model.layers[2]
    assert type(norm) is keras.layers.BatchNormalization  # the caller's layer, not the pooling one
    assert float(np.max(np.abs(norm.moving_variance.numpy() - 1.0))) > 1e-4  # the statistics moved


def test_validation_history_and_a_dataset_of_pairs_equal_arrays():
    a, b = small_model(), small_model()
    kwargs = dict(batch_size=16, subdivisions=2, epochs=2, validation_data=(X_VAL, Y_VAL), seed=3)
    from_arrays = accum_train.fit(a, X, Y, **kwargs)
    from_dataset = accum_train.fit(b, tf.data.Dataset.from_tensor_slices((X, Y)), **kwargs)
    assert from_arrays == from_dataset
    assert set(from_arrays) == {"loss", "val_loss", "val_accuracy"}
    assert all(len(v) == 2 for v in from_arrays.values())
    # val_accuracy is the accuracy of the trained model on validation_data
    predicted = np.argmax(a.predict(X_VAL, verbose=0), axis=1)
    assert from_arrays["val_accuracy"][-1] == pytest.approx(np.mean(predicted == Y_VAL))


def test_fit_without_output_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    accum_train.fit(small_model(), X, Y, batch_size=16, subdivisions=2, validation_data=(X_VAL, Y_VAL))
    assert list(tmp_path.iterdir()) == []


def test_fit_with_output_dir_writes_a_run_directory_that_resumes_and_evaluates(tmp_path):
    from accum_train.evaluate import evaluate
    from accum_train.rundir import read_metrics

    model = small_model()
    run_dir = tmp_path / "run"
    accum_train.fit(model, X, Y, batch_size=16, subdivisions=2, validation_data=(X_VAL, Y_VAL), output_dir=run_dir)
    updates = [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in updates] == [1, 2, 3, 4]
    summary = json.loads((run_dir / "summary.json").read_text())
    result = evaluate(run_dir, tmp_path / "evaluation")
    assert result["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    assert result["test_accuracy"] == pytest.approx(np.mean(np.argmax(model.predict(X_VAL, verbose=0), 1) == Y_VAL))
    resumed = accum_train.run(resume=run_dir, overrides=["epochs=2"])
    assert resumed["steps"] == 8


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda m: accum_train.fit(m, X, Y, batch_size=16, subdivisions=2, micro_batch_size=4),
            "accum_train.fit: give subdivisions or micro_batch_size, not both (subdivisions=2, micro_batch_size=4)",
        ),
        (
            lambda m: accum_train.fit(m, X, np.eye(4)[Y], batch_size=16),
            "accum_train.fit: y has shape (50, 4) and dtype float64: labels must be [N] integer class indices "
            "(one-hot labels: y.argmax(axis=1))",
        ),
        (
            lambda m: accum_train.fit(m, X, Y + 1, batch_size=16),
            "accum_train.fit: y holds labels from 1 to 4 but the model outputs 4 classes: labels must be 0..3",
        ),
        (
            lambda m: accum_train.fit(m, X, Y[:10], batch_size=16),
            "accum_train.fit: x holds 50 examples but its labels 10",
        ),
        (
            lambda m: accum_train.fit(m, X, Y, batch_size=16, subdivisions=17),
            "accum_train.fit: subdivisions=17 must be <= batch_size=16 (a micro-batch holds at least one example)",
        ),
        (
            lambda m: accum_train.fit(m, X, Y, batch_size=16, optimizer="adamw"),
            "accum_train.fit: optimizer.name='adamw' is not one of adam, sgd, momentum, rmsprop, lars, lamb; "
            "did you mean 'adam'?",
        ),
        (
            lambda m: accum_train.fit(m, tf.data.Dataset.from_tensor_slices((X, Y)).batch(8), batch_size=16),
            "accum_train.fit: x gives labels of shape (None,) per element: it looks batched; pass dataset.unbatch()",
        ),
        (
            lambda m: accum_train.fit(m, X, Y, batch_size=16, output_dir="unused"),
            "accum_train.fit: output_dir needs validation_data: a run directory is scored on it "
            "(evaluate, predict and --resume read it as its test split)",
        ),
        (
            lambda m: accum_train.fit("model.keras", X, Y, batch_size=16),
            "accum_train.fit: model is a str, not a keras.Model: pass a Keras 3 model",
        ),
    ],
)
def test_fit_bad_input_raises_user_error_with_one_line(call, message):
    model = small_model()
    before = model.get_weights()
    with pytest.raises(UserError) as caught:
        call(model)
    assert str(caught.value) == message
    assert max_difference(model.get_weights(), before) == 0.0


def test_run_raises_user_error_and_never_exits(tmp_path):
    with pytest.raises(UserError) as caught:
        accum_train.run({"batch_size": 0}, output_dir=tmp_path / "x")
    assert str(caught.value) == "config: batch_size=0 must be >= 1 and <= 1000000"
    with pytest.raises(UserError) as caught:
        accum_train.run()
    assert str(caught.value) == (
        "missing CONFIG: pass a YAML file, e.g. 'accum-train run configs/fmnist.yaml', or --resume RUN_DIR"
    )
    assert not (tmp_path / "x").exists()


def test_the_public_names():
    assert sorted(accum_train.__all__) == ["Progress", "UserError", "__version__", "fit", "run"]


SMOKE = {
    "model": {"name": "mlp", "hidden": 16},
    "batch_size": 64,
    "subdivisions": 3,
    "epochs": 1,
    "data": {"train_limit": 256, "test_limit": 100},
}


@pytest.mark.slow  # two fresh processes of ~15 s each
def test_run_from_a_dict_ends_at_the_bits_of_the_cli(tmp_path, repo_root, data_dir):
    """Both in fresh processes of the same environment (thread pools included)."""
    env = {**os.environ, "ACCUM_TRAIN_DATA": str(data_dir), "TF_NUM_INTRAOP_THREADS": "1"}
    config = tmp_path / "smoke.yaml"
    config.write_text(json.dumps(SMOKE))  # JSON is YAML
    cli = subprocess.run(
        [sys.executable, "-m", "accum_train.cli.main", "run", str(config), "--output-dir", str(tmp_path / "cli")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    script = (
        f"import sys, json, accum_train; accum_train.run(json.loads(sys.argv[1]), output_dir={str(tmp_path / 'api')!r})"
    )
    api = subprocess.run([sys.executable, "-c", script, json.dumps(SMOKE)], env=env, capture_output=True, text=True)
    assert api.returncode == 0, api.stderr
    a, b = np.load(tmp_path / "cli" / "weights.npz"), np.load(tmp_path / "api" / "weights.npz")
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    assert Path(tmp_path / "api" / "config.yaml").read_text() == Path(tmp_path / "cli" / "config.yaml").read_text()
