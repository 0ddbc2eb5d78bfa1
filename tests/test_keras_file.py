"""model.name=keras_file: your own Keras 3 model, trained with exact accumulation.

1. Keras is the oracle: a BN-free model from a .keras file trained by
   accum-train (ragged micro-batches, a short last batch, SGD and Adam, logits
   or a softmax output) equals plain ``model.fit`` on whole batches in the
   same order, and k=5 equals k=1, to 1e-5.
2. BatchNormalization is swapped for the accumulating layer (Functional,
   Sequential, nested): same weights and inference; not deferred it moves as
   Keras does; deferred, one subdivided update moves the first BN layer's
   statistics as one Keras pass over the whole batch does.
3. A kill and --resume reaches the uninterrupted run's weights (BN and dropout).
4. Every file that cannot be used is refused in one exact line, before
   anything is written.
"""

import json
import runpy
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.backends.tensorflow.norm import PooledBatchNorm
from accum_train.backends.tensorflow.objective import sparse_softmax_loss
from accum_train.cli.main import main
from accum_train.config import ModelConfig, OptimizerConfig, load_config
from accum_train.datasets import load
from accum_train.errors import ConfigError, Interrupted, UserError
from accum_train.from_config.lifecycle import train
from accum_train.from_config.optim import make_optimizer
from accum_train.models import KerasModel, build_model
from accum_train.trainer.data.order import epoch_order
from click.testing import CliRunner
from helpers import InterruptAt, max_difference

SHAPE = (28, 28, 1)
N_TRAIN, BATCH, EPOCHS = 200, 64, 2  # 3 full batches and a short one of 8 per epoch


def save(model, path):
    model.save(path)
    return path


def small_convnet(softmax=False, seed=3):
    """BN-free: conv, pool, dense (about 8k weights)."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax" if softmax else None),
        ]
    )


def bn_functional():
    keras.utils.set_random_seed(4)
    inputs = keras.Input(SHAPE)
    x = keras.layers.Conv2D(6, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, name="bn_first")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(name="bn_second")(x)
    x = keras.layers.Dropout(0.3, name="dropout")(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def bn_sequential():
    keras.utils.set_random_seed(5)
    return keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Flatten(),
            keras.layers.Dense(12, use_bias=False),
            keras.layers.BatchNormalization(name="bn_first"),
            keras.layers.ReLU(),
            keras.layers.Dense(10),
            keras.layers.Softmax(),
        ]
    )


def bn_nested():
    keras.utils.set_random_seed(6)
    block = keras.Sequential(
        [keras.Input((14, 14, 6)), keras.layers.BatchNormalization(name="bn_first"), keras.layers.ReLU()], name="block"
    )
    inputs = keras.Input(SHAPE)
    x = block(keras.layers.Conv2D(6, 3, strides=2, padding="same")(inputs))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    return {
        name: save(make(), folder / f"{name}.keras")
        for name, make in [
            ("logits", small_convnet),
            ("softmax", lambda: small_convnet(softmax=True)),
            ("functional", bn_functional),
            ("sequential", bn_sequential),
            ("nested", bn_nested),
        ]
    }


def overrides(path, data_dir, *more):
    return [
        "model.name=keras_file",
        f"model.path={path}",
        f"batch_size={BATCH}",
        f"epochs={EPOCHS}",
        f"data.train_limit={N_TRAIN}",
        "data.test_limit=100",
        f"data.dir={data_dir}",
        "log_every=100",
        *more,
    ]


def keras_fit(path, cfg, from_logits=True):
    """Plain Keras: the same file, whole batches in accum-train's epoch order."""
    data = load(cfg.data)
    model = keras.models.load_model(path, compile=False)
    optimizer = {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam}[cfg.optimizer.name]
    model.compile(
        optimizer=optimizer(learning_rate=cfg.optimizer.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
    )
    for epoch in range(cfg.epochs):
        x, y = data.train.take(epoch_order(cfg.seed, epoch, len(data.train)))
        model.fit(x.numpy(), y.numpy(), batch_size=cfg.batch_size, epochs=1, shuffle=False, verbose=0)
    return {f"{layer.name}/{v.name}": v.numpy() for layer in model.layers for v in layer.weights}


ORACLE_CASES = [  # (file, optimizer, learning rate)
    ("logits", "sgd", 0.1),
    ("logits", "adam", 0.01),
    ("softmax", "adam", 0.01),  # from_logits=false: trained on the logits under the softmax
]


@pytest.fixture(scope="module")
def oracle_runs(files, tmp_path_factory, data_dir):
    """Each case trained by accum-train with k=1 and k=5, and by model.fit."""
    out = {}
    for name, opt, lr in ORACLE_CASES:
        extra = [f"optimizer.name={opt}", f"optimizer.learning_rate={lr}"]
        if name == "softmax":
            extra.append("model.from_logits=false")
        weights = {}
        for k in (1, 5):  # 64 = 12-13 x 5 (ragged); the short batch of 8 as 5 micro-batches of 1-2
            cfg = load_config(None, overrides(files[name], data_dir, *extra, f"subdivisions={k}"))
            run_dir = tmp_path_factory.mktemp("runs") / f"{name}-{opt}-{k}"
            train(cfg, run_dir)
            weights[k] = dict(np.load(run_dir / "weights.npz"))
        initial = keras.models.load_model(files[name], compile=False)
        out[name, opt] = (
            weights,
            keras_fit(files[name], cfg, from_logits=name != "softmax"),
            {f"{layer.name}/{v.name}": v.numpy() for layer in initial.layers for v in layer.weights},
        )
    return out


@pytest.mark.parametrize("name, opt, lr", ORACLE_CASES)
@pytest.mark.parametrize("k", [1, 5])
def test_equals_keras_fit_on_whole_batches(oracle_runs, name, opt, lr, k):
    ours, keras_weights, initial = oracle_runs[name, opt]
    # measured: k=1 exactly 0 (the same arithmetic as fit); k=5 6e-8 (SGD), 1.2e-7 (Adam)
    assert max_difference(ours[k], keras_weights) < 1e-5
    assert max_difference(ours[k], initial) > 1e-3  # it did train


@pytest.mark.parametrize("name, opt, lr", ORACLE_CASES)
def test_subdivided_equals_whole_batch(oracle_runs, name, opt, lr):
    ours, _, _ = oracle_runs[name, opt]
    assert max_difference(ours[5], ours[1]) < 1e-5


# ----------------------------------------------------------------------------
# BatchNormalization


@pytest.mark.parametrize(
    "name, bn_layers, softmax", [("functional", 2, False), ("sequential", 1, True), ("nested", 1, True)]
)
def test_batchnorm_pools_its_statistics_with_its_weights(files, name, bn_layers, softmax):
    original = keras.models.load_model(files[name], compile=False)
    model = build_model(ModelConfig(name="keras_file", path=str(files[name]), from_logits=not softmax), 0, SHAPE, 10)
    assert isinstance(model, KerasModel)
    assert len(model.norm_layers) == bn_layers
    # Keras' own layers (class, config, weights), each with its call pooling through an adapter
    assert all(type(layer) is PooledBatchNorm for layer in model.norm_layers)
    assert all(type(layer.layer) is keras.layers.BatchNormalization for layer in model.norm_layers)
    assert all("call" in vars(layer.layer) for layer in model.norm_layers)
    # moving statistics away from their init, so that inference shows whether they were copied
    for layer in model.norm_layers:
        layer.moving_mean.assign(tf.fill(layer.moving_mean.shape, 0.3))
        layer.moving_variance.assign(tf.fill(layer.moving_variance.shape, 2.0))
    named = model.named_weights()
    for layer in model.norm_layers:
        prefix = "block/" if name == "nested" else ""
        assert named[f"{prefix}{layer.name}/moving_mean"] is layer.moving_mean.value
    for layer in _bn_layers(original):
        layer.moving_mean.assign(tf.fill(layer.moving_mean.shape, 0.3))
        layer.moving_variance.assign(tf.fill(layer.moving_variance.shape, 2.0))
    x = tf.constant(np.random.default_rng(0).random((5, *SHAPE), dtype=np.float32))
    ours = model.forward(x, False)
    theirs = original(x, training=False)
    if softmax:  # from_logits=false: forward gives the logits under the file's softmax
        ours = tf.nn.softmax(ours)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-6)
    assert len(model.trainable_variables) == len(original.trainable_variables)
    assert all(isinstance(v, tf.Variable) for v in model.variables)


def _bn_layers(model):
    found = []
    for layer in model.layers:
        found += (
            _bn_layers(layer)
            if isinstance(layer, keras.Model)
            else [layer]
            if isinstance(layer, keras.layers.BatchNormalization)
            else []
        )
    return found


def test_not_deferred_it_moves_as_keras_does(files):
    model = build_model(ModelConfig(name="keras_file", path=str(files["functional"])), 0, SHAPE, 10)
    ref = keras.models.load_model(files["functional"], compile=False)
    for layer in ref.layers:  # no dropout in this comparison
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
    for layer in model.network.layers:
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = tf.constant(rng.random((16, *SHAPE), dtype=np.float32) * 2.0 + 0.5)
        np.testing.assert_allclose(model.forward(x, True).numpy(), ref(x, training=True).numpy(), atol=1e-5)
    for ours in model.norm_layers:
        theirs = ref.get_layer(ours.name)
        np.testing.assert_allclose(ours.moving_mean.numpy(), theirs.moving_mean.numpy(), atol=1e-6)
        np.testing.assert_allclose(ours.moving_variance.numpy(), theirs.moving_variance.numpy(), atol=1e-6)
    assert float(np.max(np.abs(model.norm_layers[0].moving_mean.numpy()))) > 0.01  # they did move


@pytest.mark.parametrize("name", ["functional", "sequential", "nested"])
def test_one_subdivided_update_moves_the_first_bn_as_one_whole_batch_pass(files, name):
    softmax = name != "functional"
    model = build_model(ModelConfig(name="keras_file", path=str(files[name]), from_logits=not softmax), 0, SHAPE, 10)
    variables = model.trainable_variables
    opt = make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1), 0.1, variables)
    engine = Accumulator(
        sparse_softmax_loss(model.forward), variables, opt, subdivisions=4, norm_layers=model.norm_layers
    )
    rng = np.random.default_rng(2)
    x = tf.constant(rng.random((30, *SHAPE), dtype=np.float32) * 3.0 + 1.0)  # 4 micro-batches of 7-8
    y = tf.constant(rng.integers(0, 10, 30).astype(np.int32))
    engine.update(x, y)
    ref = keras.models.load_model(files[name], compile=False)
    ref(x, training=True)  # one Keras pass over the whole batch moves every BatchNormalization once
    ours, theirs = model.norm_layers[0], _bn_layers(ref)[0]
    assert ours.name == theirs.name == "bn_first"
    # measured: <= 1.6e-7 (mean), <= 6e-8 (variance, of magnitude ~1)
    np.testing.assert_allclose(ours.moving_mean.numpy(), theirs.moving_mean.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(ours.moving_variance.numpy(), theirs.moving_variance.numpy(), rtol=0, atol=1e-6)
    assert float(np.max(np.abs(ours.moving_mean.numpy()))) > 0.01
    assert float(ours.pending.count.numpy()) == 0.0  # nothing left for the next update


# ----------------------------------------------------------------------------
# Resume


@pytest.fixture(scope="module")
def resumed(files, tmp_path_factory, data_dir):
    """The functional file (BatchNorm: deferred statistics, checkpointed; dropout: its seed state, checkpointed)
    from a copy of its own: trained uninterrupted ("full"), and interrupted in epoch 2 ("cut"), then the copy
    deleted (the user moves the file the run started from) and the cut run resumed. The two tests below read
    the same three runs."""
    import shutil

    folder = tmp_path_factory.mktemp("resume")
    own = folder / "mine.keras"
    shutil.copy(files["functional"], own)
    cfg = load_config(None, overrides(own, data_dir, "subdivisions=3", "log_every=1", "optimizer.learning_rate=0.01"))
    full = train(cfg, folder / "full")
    with pytest.raises(Interrupted) as stop:
        train(cfg, folder / "cut", progress=InterruptAt(6))  # in epoch 2
    original, kept = own.read_bytes(), (folder / "cut" / "initial_model.keras").read_bytes()
    own.unlink()
    return {
        "cfg": cfg,
        "own": own,
        "original": original,
        "kept": kept,
        "stopped_at": stop.value.step,
        "full_dir": folder / "full",
        "full": full,
        "cut_dir": folder / "cut",
        "resumed": train(cfg, folder / "cut", resume=True),
    }


def test_interrupt_then_resume_equals_an_uninterrupted_run(resumed):
    assert resumed["stopped_at"] == 6
    a, b = np.load(resumed["full_dir"] / "weights.npz"), np.load(resumed["cut_dir"] / "weights.npz")
    assert "bn_first/moving_variance" in a and "dropout/seed_generator_state" in a
    assert max_difference(dict(a), dict(b)) < 1e-6
    assert resumed["resumed"]["test_accuracy"] == pytest.approx(resumed["full"]["test_accuracy"], abs=1e-6)


def test_a_run_keeps_its_model_file_so_it_survives_the_original_moving(resumed, tmp_path):
    from accum_train.export import export_run

    full_dir, full = resumed["full_dir"], resumed["full"]
    assert resumed["kept"] == resumed["original"]  # the copy in the run directory, taken when the run started
    assert not resumed["own"].exists()  # the resume ran without the file the run started from
    a, b = np.load(full_dir / "weights.npz"), np.load(resumed["cut_dir"] / "weights.npz")
    assert max_difference(dict(a), dict(b)) < 1e-6
    assert export_run(full_dir).is_file()
    # evaluate and predict rebuild the model from the run's copy too
    evaluated = CliRunner().invoke(main, ["evaluate", str(full_dir)])
    assert evaluated.exit_code == 0, evaluated.output
    result = json.loads((full_dir / "evaluate" / "evaluate.json").read_text())
    assert result["test_accuracy"] == full["test_accuracy"]
    images = load(resumed["cfg"].data).test.images[:3]
    np.savez(tmp_path / "three.npz", x=images)
    predicted = CliRunner().invoke(main, ["predict", str(full_dir), str(tmp_path / "three.npz"), "--json"])
    assert predicted.exit_code == 0, predicted.output
    rows = json.loads(predicted.stdout)
    assert [row["input"] for row in rows] == [f"{tmp_path / 'three.npz'}[{i}]" for i in range(3)]
    exported = keras.models.load_model(full_dir / "model.keras")  # plain Keras, no accum-train
    expected = tf.nn.softmax(exported(images[..., np.newaxis].astype(np.float32) / 255.0)).numpy()
    np.testing.assert_allclose([list(row["probabilities"].values()) for row in rows], expected, atol=1e-6)


# ----------------------------------------------------------------------------
# Files that cannot be used


def lambda_model(path):
    save(
        keras.Sequential(
            [keras.Input(SHAPE), keras.layers.Lambda(lambda t: t * 2.0), keras.layers.Flatten(), keras.layers.Dense(10)]
        ),
        path,
    )


@keras.saving.register_keras_serializable(package="tests")
class Doubling(keras.layers.Layer):
    def call(self, x):
        return x * 2.0


def custom_model(path):
    save(keras.Sequential([keras.Input(SHAPE), Doubling(), keras.layers.Flatten(), keras.layers.Dense(10)]), path)


def doubled(t):
    return t * 2.0


def named_function_model(path):  # a Lambda of a named function, serialised by name
    save(
        keras.Sequential(
            [keras.Input(SHAPE), keras.layers.Lambda(doubled), keras.layers.Flatten(), keras.layers.Dense(10)]
        ),
        path,
    )


def truncated(path):
    small_convnet().save(path)
    path.write_bytes(path.read_bytes()[:400])


def zip_without_config(path):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "not a model")


def dense_model(shape, outputs=10, **kwargs):
    def make(path):
        save(
            keras.Sequential([keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(outputs, **kwargs)]), path
        )

    return make


def float8_model(path):
    model = keras.Sequential([keras.Input(SHAPE), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.quantize("float8")
    save(model, path)


def renorm_model(path):
    save(
        keras.Sequential(
            [
                keras.Input(SHAPE),
                keras.layers.BatchNormalization(renorm=True),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        ),
        path,
    )


def two_outputs(path):
    inputs = keras.Input(SHAPE)
    x = keras.layers.Flatten()(inputs)
    save(keras.Model(inputs, [keras.layers.Dense(10)(x), keras.layers.Dense(10)(x)]), path)


HINT = "save your model with model.save('my_model.keras') and give that file"
BAD_FILES = [
    (lambda p: None, [], f"does not exist: {HINT}"),
    (lambda p: p.mkdir(), [], f"is a directory: {HINT}"),
    (
        lambda p: p.write_text("x_train, y_train\n"),
        [],
        f"is not a .keras archive (truncated, corrupt or another format): {HINT}",
    ),
    (truncated, [], f"is not a .keras archive (truncated, corrupt or another format): {HINT}"),
    (zip_without_config, [], f"is a zip archive without config.json, not a Keras model: {HINT}"),
    (
        lambda_model,
        [],
        "holds Python code (a Lambda layer or a lambda), which loading with safe_mode=True refuses: "
        "rebuild the model from built-in Keras layers",
    ),
    (
        custom_model,
        [],
        "uses the custom class 'tests>Doubling', which is not part of Keras: accum-train loads "
        "only built-in Keras layers and functions (no custom code); rebuild the model from them",
    ),
    (
        named_function_model,
        [],
        "uses the Python function 'doubled', which is not part of Keras: accum-train loads "
        "only built-in Keras layers and functions (no custom code); rebuild the model from "
        "them",
    ),
    (
        dense_model((28, 28, 3)),
        [],
        "takes inputs of 28x28x3 but the dataset's images are 28x28x1 (height x width x channels): build the "
        "model on keras.Input(shape=(28, 28, 1))",
    ),
    (
        dense_model((784,)),
        [],
        "takes inputs of 784 but the dataset's images are 28x28x1 (height x width x channels): build the model "
        "on keras.Input(shape=(28, 28, 1))",
    ),
    (
        float8_model,
        [],
        "holds a model quantized for float8 training (quantize('float8')), whose scale variables take each step's "
        "new value in place of a gradient, which micro-batches cannot add up: save it before quantizing",
    ),
    (
        dense_model(SHAPE, outputs=5),
        [],
        "outputs 5 values per example but the dataset has 10 classes: end the model in a Dense(10) layer",
    ),
    (
        two_outputs,
        [],
        "has 1 inputs and 2 outputs: accum-train feeds one image tensor and reads one output of class scores",
    ),
    (
        dense_model(SHAPE),
        ["model.from_logits=false"],
        "ends in Dense 'dense', not a softmax, but model.from_logits=false says it outputs probabilities: remove "
        "model.from_logits if it outputs logits, or end it in activation='softmax'",
    ),
    (
        dense_model(SHAPE, activation="softmax"),
        [],
        "ends in a softmax (Dense 'dense'), but model.from_logits=true (the default) takes its outputs as logits: "
        "set model.from_logits=false (it then trains on the logits under it)",
    ),
    (
        renorm_model,
        [],
        "has BatchNormalization 'batch_normalization' with renorm=True, whose corrections cannot be "
        "pooled over micro-batches: use renorm=False",
    ),
]


@pytest.mark.parametrize("make, extra, problem", BAD_FILES)
def test_unusable_file_is_refused_in_one_line(tmp_path, make, extra, problem):
    keras.backend.clear_session()  # default layer names ('dense', 'batch_normalization') as in the messages
    path = tmp_path / "model.keras"
    make(path)
    cfg = load_config(None, ["model.name=keras_file", f"model.path={path}", *extra])
    with pytest.raises(UserError) as err:  # a ConfigError, or a Refused (renorm: limitations.md's row)
        build_model(cfg.model, 0, SHAPE, 10)
    assert str(err.value) == f"model.path={path} {problem}"


@pytest.mark.parametrize("make", [lambda_model, dense_model((28, 28, 3))])
def test_cli_refuses_the_file_before_writing_anything(tmp_path, data_dir, repo_root, make):
    keras.backend.clear_session()
    path = tmp_path / "bad.keras"
    make(path)
    before = sorted(tmp_path.rglob("*"))
    result = CliRunner().invoke(
        main,
        [
            "run",
            str(repo_root / "configs" / "smoke.yaml"),
            "--set",
            f"model={{name: keras_file, path: {path}}}",
            "--set",
            f"data.dir={data_dir}",
            "--output-dir",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: model.path={path} ")
    assert "Traceback" not in result.output
    assert sorted(tmp_path.rglob("*")) == before


def test_config_keys_of_the_other_kind_are_refused():
    cases = [
        (
            ["model.name=keras_file"],
            "--set: model.name=keras_file needs model.path (e.g. model: {name: keras_file, path: my_model.keras})",
        ),
        (
            ["model.name=keras_file", "model.path=m.h5"],
            "--set: model.path='m.h5' must name a .keras file (Keras 3's format, written by "
            "model.save('my_model.keras'))",
        ),
        (
            ["model.path=m.keras"],
            "--set: model.path is only for model.name=keras_file, not seed_convnet: remove it "
            "or set model.name=keras_file",
        ),
        (
            ["model.name=mlp", "model.from_logits=false"],
            "--set: model.from_logits is only for model.name=keras_file, not mlp: the built-in models output logits; "
            "remove it",
        ),
        (
            ["model.name=keras_file", "model.path=m.keras", "model.width=0.5"],
            "--set: model.width is only for the built-in models (seed_convnet, mlp), not keras_file, whose layers come "
            "from its file: remove it, or replace the whole model mapping: --set 'model={name: keras_file, "
            "path: m.keras}'",
        ),
    ]
    for sets, message in cases:
        with pytest.raises(ConfigError) as err:
            load_config(None, sets)
        assert str(err.value) == message
    # a whole mapping replaces the config file's model (which sets width and norm)
    cfg = load_config(None, ["model={name: mlp, width: 0.5}", "model={name: keras_file, path: m.keras}"])
    assert (cfg.model.name, cfg.model.path, cfg.model.width) == ("keras_file", "m.keras", 0.25)
    assert json.loads(json.dumps(cfg.to_dict()))["model"]["from_logits"] is True


def test_the_readme_example_model(tmp_path, repo_root, monkeypatch):
    paths = [tmp_path / "my_model.keras", tmp_path / "again.keras"]
    for path in paths:
        keras.utils.set_random_seed(len(str(path)))  # whatever the process drew before, the script seeds itself
        monkeypatch.setattr("sys.argv", ["make_keras_model.py", str(path)])
        runpy.run_path(str(repo_root / "scripts" / "make_keras_model.py"), run_name="__main__")
    model = build_model(ModelConfig(name="keras_file", path=str(paths[0])), 0, SHAPE, 10)
    assert len(model.norm_layers) == 1
    assert model.forward(tf.zeros((2, *SHAPE)), False).shape == (2, 10)
    # the same initial weights every time: the README's example gives the same figures on every machine
    first, again = (keras.models.load_model(path).get_weights() for path in paths)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))


def test_mixed_bfloat16_trains_a_file_in_16_bits_and_exports_it_in_float32(files, tmp_path, data_dir):
    from accum_train.export import export_run
    from accum_train.reload import load_run

    cfg = load_config(None, overrides(files["functional"], data_dir, "subdivisions=4", "precision=mixed_bfloat16"))
    summary = train(cfg, tmp_path / "run")
    assert summary["precision"] == "mixed_bfloat16" and summary["steps"] == 8
    run = load_run(tmp_path / "run")
    layers = {layer.name: layer for layer in _bn_layers(run.model.network)}
    assert layers["bn_first"].dtype_policy.name == "mixed_bfloat16"
    assert run.model.forward(tf.zeros([2, *SHAPE]), False).dtype == tf.float32
    exported = keras.models.load_model(export_run(tmp_path / "run"))
    assert {layer.dtype_policy.name for layer in exported.layers} == {"float32"}
    trained = np.load(tmp_path / "run" / "weights.npz")
    assert (
        float(
            np.max(np.abs(exported.get_layer("bn_first").moving_variance.numpy() - trained["bn_first/moving_variance"]))
        )
        == 0.0
    )
