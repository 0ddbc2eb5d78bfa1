"""`accum-train export`: a run's model as a standard Keras file.

Every kind of model (TL built-ins with BatchNorm, GroupNorm or none; keras_file
models with BatchNorm, logits or a softmax, nested) is trained briefly and
exported; the file holds only built-in Keras layers, gives the trained model's
outputs to 1e-5, and, loaded by a fresh Python that cannot import accum_train,
reproduces summary.json's test accuracy. Bad arguments: one exact line, exit 2,
nothing written.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.cli.main import main
from accum_train.config import load_config
from accum_train.datasets import load
from accum_train.export import export_run
from accum_train.from_config.lifecycle import train
from accum_train.reload import load_run
from click.testing import CliRunner

SHAPE = (28, 28, 1)


def keras_sequential_softmax():
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Conv2D(4, 3, strides=2, use_bias=False),
            keras.layers.BatchNormalization(momentum=0.8),
            keras.layers.ReLU(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
            keras.layers.Softmax(),
        ]
    )


def keras_nested_softmax():
    keras.utils.set_random_seed(2)
    block = keras.Sequential(
        [keras.Input((14, 14, 4)), keras.layers.BatchNormalization(momentum=0.5), keras.layers.ReLU()], name="block"
    )
    inputs = keras.Input(SHAPE)
    x = block(keras.layers.Conv2D(4, 3, strides=2, padding="same")(inputs))
    x = keras.layers.Dropout(0.2)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))


RUNS = {  # name: (config overrides, keras model to save first or None)
    "seed_batchnorm": (["model.width=0.0625"], None),
    "seed_groupnorm": (["model.width=0.0625", "model.norm=groupnorm"], None),
    "seed_none": (["model.width=0.0625", "model.norm=none"], None),
    "mlp_batchnorm": (["model.name=mlp", "model.hidden=32"], None),
    "keras_softmax": (["model.from_logits=false"], keras_sequential_softmax),
    "keras_nested": (["model.from_logits=false"], keras_nested_softmax),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    """Each kind trained for 2 epochs of 4 updates (k=4, a short last batch) and exported to RUN/model.keras;
    with the trained model's outputs on the test split (logits, or the softmax of a from_logits=false file)."""
    folder = tmp_path_factory.mktemp("export")
    common = [
        "batch_size=64",
        "subdivisions=4",
        "epochs=2",
        "data.train_limit=200",
        "data.test_limit=200",
        f"data.dir={data_dir}",
        "optimizer.learning_rate=0.01",
    ]
    out = {}
    for name, (sets, make) in RUNS.items():
        model = []
        if make is not None:
            path = folder / f"{name}.keras"
            make().save(path)
            model = [f"model={{name: keras_file, path: {path}}}"]
        cfg = load_config(None, [*common, *model, *sets])
        run_dir = folder / name
        summary = train(cfg, run_dir)
        written = export_run(run_dir)
        assert written == run_dir / "model.keras"
        trained = load_run(run_dir).model
        x, _ = load(cfg.data).test.take(np.arange(200))
        logits = trained.forward(x, False)
        expected = logits if cfg.model.from_logits else tf.nn.softmax(logits)
        weights = {k: v.numpy() for k, v in trained.named_weights().items()}
        out[name] = run_dir, summary, expected.numpy(), weights
    return out


@pytest.fixture(scope="module")
def test_data(runs, data_dir, tmp_path_factory):
    """The runs' test split (the same for all) as arrays, for a process without accum_train."""
    data = load(load_config(None, [f"data.dir={data_dir}", "data.test_limit=200"]).data)
    x, y = data.test.take(np.arange(len(data.test)))
    path = tmp_path_factory.mktemp("arrays") / "test.npz"
    np.savez(path, x=x.numpy(), y=y.numpy())
    return x.numpy(), y.numpy(), path


@pytest.mark.parametrize("name", list(RUNS))
def test_exported_model_gives_the_trained_outputs(runs, test_data, name):
    run_dir, _, expected, _ = runs[name]
    x, _, _ = test_data
    exported = keras.models.load_model(run_dir / "model.keras")
    for layer in _leaves(exported):
        assert type(layer).__module__.startswith("keras."), type(layer)
    # measured: 0 (GroupNorm: 9e-8, Keras computes it in another order)
    np.testing.assert_allclose(exported(x, training=False).numpy(), expected, rtol=0, atol=1e-5)


def _leaves(model):
    found = []
    for layer in model.layers:
        found += _leaves(layer) if isinstance(layer, keras.Model) else [layer]
    return found


@pytest.mark.parametrize(
    "name, norm_class, count, momentum",
    [
        ("seed_batchnorm", keras.layers.BatchNormalization, 5, 0.9),
        ("mlp_batchnorm", keras.layers.BatchNormalization, 1, 0.9),
        ("seed_groupnorm", keras.layers.GroupNormalization, 5, None),
        ("seed_none", keras.layers.BatchNormalization, 0, None),
        ("keras_softmax", keras.layers.BatchNormalization, 1, 0.8),
        ("keras_nested", keras.layers.BatchNormalization, 1, 0.5),
    ],
)
def test_norm_layers_come_out_as_keras_layers_with_the_trained_statistics(runs, name, norm_class, count, momentum):
    run_dir, _, _, trained = runs[name]
    exported = _leaves(keras.models.load_model(run_dir / "model.keras"))
    norms = [layer for layer in exported if type(layer) is norm_class]
    assert len(norms) == count
    for layer in norms:
        assert (layer.momentum if momentum else None) == momentum
        if norm_class is keras.layers.BatchNormalization:
            key = next(k for k in trained if k.endswith(f"{layer.name}/moving_mean"))
            np.testing.assert_array_equal(layer.moving_mean.numpy(), trained[key])
            assert float(np.max(np.abs(layer.moving_mean.numpy()))) > 1e-4  # the trained statistics, not the init
        else:
            assert layer.groups == 8 and layer.epsilon == 1e-5


def test_softmax_comes_back_and_activations_match_tensorflow(runs):
    softmax = _leaves(keras.models.load_model(runs["keras_softmax"][0] / "model.keras"))[-1]
    assert type(softmax) is keras.layers.Softmax
    nested = keras.models.load_model(runs["keras_nested"][0] / "model.keras").layers[-1]
    assert nested.activation is keras.activations.softmax
    seed = keras.models.load_model(runs["seed_batchnorm"][0] / "model.keras")
    slopes = {layer.negative_slope for layer in seed.layers if isinstance(layer, keras.layers.LeakyReLU)}
    assert slopes == {0.2}  # tf.nn.leaky_relu's default, not Keras' LeakyReLU default 0.3


FRESH_PYTHON = textwrap.dedent("""
    import importlib.abc, json, sys

    class NoAccumTrain(importlib.abc.MetaPathFinder):
        # as if accum-train were not installed: any attempt to import it fails
        def find_spec(self, name, path=None, target=None):
            if name == "accum_train" or name.startswith("accum_train."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NoAccumTrain())
    import keras, numpy as np

    arrays = np.load(sys.argv[1])
    result = {}
    for path in sys.argv[2:]:
        model = keras.models.load_model(path)
        outputs = model.predict(arrays["x"], batch_size=100, verbose=0)
        result[path] = {"accuracy": float(np.mean(np.argmax(outputs, 1) == arrays["y"])),
                        "outputs": outputs.tolist()}
    assert not [m for m in sys.modules if m.startswith("accum_train")]
    print(json.dumps(result))
""")


def test_a_python_without_accum_train_reproduces_the_test_accuracy(runs, test_data, tmp_path):
    _, _, arrays = test_data
    script = tmp_path / "evaluate.py"
    script.write_text(FRESH_PYTHON)
    paths = [str(runs[name][0] / "model.keras") for name in RUNS]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, str(script), str(arrays), *paths],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for name in RUNS:
        run_dir, summary, expected, _ = runs[name]
        got = result[str(run_dir / "model.keras")]
        assert got["accuracy"] == pytest.approx(summary["test_accuracy"], abs=1e-3)
        np.testing.assert_allclose(np.array(got["outputs"]), expected, rtol=0, atol=1e-5)
    assert len({round(result[p]["accuracy"], 4) for p in paths}) > 1  # the models differ, the check can fail


# ----------------------------------------------------------------------------
# The command


def test_cli_writes_the_file_and_prints_its_path(runs, tmp_path):
    run_dir = runs["mlp_batchnorm"][0]
    out = tmp_path / "mlp.keras"
    result = CliRunner().invoke(main, ["export", str(run_dir), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"written: {out}\n"
    first = out.stat().st_ino
    again = CliRunner().invoke(main, ["export", str(run_dir), "--output", str(out), "--overwrite"])
    assert again.exit_code == 0, again.output
    assert out.stat().st_ino != first  # replaced by a rename, never rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.keras"]  # no temporary file left behind
    assert keras.models.load_model(out).count_params() == 784 * 32 + 4 * 32 + 32 * 10 + 10


def test_cli_errors_in_one_line_and_nothing_written(runs, tmp_path):
    run_dir = runs["seed_none"][0]
    (tmp_path / "empty").mkdir()
    (tmp_path / "folder.keras").mkdir()
    cases = [
        (
            [str(tmp_path / "empty")],
            f"{tmp_path / 'empty'} is not a run directory (no config.yaml and checkpoints/): "
            f"pass a directory written by 'accum-train run'",
        ),
        (
            [str(run_dir)],
            f"{run_dir / 'model.keras'} exists: pass --overwrite to replace it, or --output another .keras file",
        ),
        (
            [str(run_dir), "--output", str(tmp_path / "model.h5")],
            f"--output {tmp_path / 'model.h5'} must end in .keras (Keras 3's model file format)",
        ),
        (
            [str(run_dir), "--output", str(tmp_path / "folder.keras")],
            f"--output {tmp_path / 'folder.keras'} is a directory: name a .keras file",
        ),
        (
            [str(run_dir), "--output", str(tmp_path / "missing" / "m.keras")],
            f"--output {tmp_path / 'missing' / 'm.keras'}: the folder {tmp_path / 'missing'} does not exist: "
            f"create it first",
        ),
    ]
    before = sorted(tmp_path.rglob("*")), sorted(run_dir.rglob("*")), (run_dir / "model.keras").stat().st_mtime_ns
    for args, message in cases:
        result = CliRunner().invoke(main, ["export", *args])
        assert (result.exit_code, result.stderr) == (2, f"error: {message}\n"), args
    assert (
        sorted(tmp_path.rglob("*")),
        sorted(run_dir.rglob("*")),
        (run_dir / "model.keras").stat().st_mtime_ns,
    ) == before
