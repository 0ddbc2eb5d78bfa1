"""`accum-train evaluate` and `predict` on one trained smoke run.

evaluate: reproduces summary.json's test loss and accuracy, its confusion
matrix and per-class numbers equal ones computed here from the model's own
logits, data changed by --set data.* gives the numbers of that data (the same
images from Fashion-MNIST or from an .npz agree), and bad input is one line,
exit 2, nothing written. predict: PNG files, a uint8 .npz and a float .npz of
the same test images give the same probabilities as the run's forward pass;
the table's exact text; the bad-input messages. A second, small run of a
Keras file with BatchNormalization on a folder of PNGs checks both commands
for data and models of your own.
"""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from accum_train.cli.main import main
from accum_train.config import load_config
from accum_train.datasets import load
from accum_train.datasets.base import to_inputs
from accum_train.datasets.fashion_mnist import CLASS_NAMES
from accum_train.from_config.lifecycle import train
from accum_train.reload import load_run
from click.testing import CliRunner
from PIL import Image


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, repo_root):
    """One trained smoke run, its summary, its Run (latest weights) and its data."""
    run_dir = tmp_path_factory.mktemp("runs") / "smoke"
    cfg = load_config(repo_root / "configs" / "smoke.yaml")
    summary = train(cfg, run_dir)
    data = load(cfg.data)
    return run_dir, summary, load_run(run_dir, data), data


def logits_of(run, x) -> np.ndarray:
    return run.model.forward(tf.constant(x), False).numpy().astype(np.float64)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def expected_numbers(run, data, n):
    """Loss, confusion matrix, precision and recall of the first n test examples, from numpy."""
    x, y = data.test.take(np.arange(n))
    y = y.numpy()
    logits = logits_of(run, x)
    log_probs = logits - logits.max(axis=1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(axis=1, keepdims=True))
    predicted = logits.argmax(axis=1)
    confusion = np.zeros((10, 10), np.int64)
    for true, guess in zip(y, predicted):
        confusion[true, guess] += 1
    precision = [float(np.mean(y[predicted == c] == c)) if (predicted == c).any() else None for c in range(10)]
    recall = [float(np.mean(predicted[y == c] == c)) if (y == c).any() else None for c in range(10)]
    return -log_probs[np.arange(n), y].mean(), confusion, precision, recall


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_evaluate_reproduces_the_summary(smoke, tmp_path, monkeypatch):
    """... and builds no trainer: the model and its weights only (a Run would fail here)."""
    run_dir, summary, run, data = smoke
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)

    def no_trainer(*args, **kwargs):
        raise AssertionError("evaluate built a training Run")

    monkeypatch.setattr("accum_train.from_config.run_parts.Run.__init__", no_trainer)
    result = CliRunner().invoke(main, ["evaluate", str(copy)])
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    written = json.loads((copy / "evaluate" / "evaluate.json").read_text())
    assert written["test_loss"] == pytest.approx(summary["test_loss"], abs=1e-6)
    assert written["test_accuracy"] == summary["test_accuracy"]
    assert result.stdout == (
        f"test loss {summary['test_loss']:.4f}, test accuracy {summary['test_accuracy']:.4f} "
        f"({written['correct']}/500 correct)\n"
        f"written: {copy / 'evaluate' / 'evaluate.json'}, {copy / 'evaluate' / 'evaluate.png'}\n"
    )
    loss, confusion, precision, recall = expected_numbers(run, data, 500)
    assert written["test_loss"] == pytest.approx(loss, abs=1e-5)
    assert written["confusion"] == confusion.tolist()
    assert written["correct"] == int(np.trace(confusion)) == round(summary["test_accuracy"] * 500)
    assert written["class_names"] == list(CLASS_NAMES)
    assert [row["class"] for row in written["per_class"]] == list(CLASS_NAMES)
    assert [row["examples"] for row in written["per_class"]] == confusion.sum(axis=1).tolist()
    assert [row["predicted"] for row in written["per_class"]] == confusion.sum(axis=0).tolist()
    assert [row["precision"] for row in written["per_class"]] == pytest.approx(precision)
    assert [row["recall"] for row in written["per_class"]] == pytest.approx(recall)
    with Image.open(copy / "evaluate" / "evaluate.png") as image:
        assert image.format == "PNG" and min(image.size) >= 400

    # A second evaluation never overwrites the first.
    before = {path: path.read_bytes() for path in (copy / "evaluate").iterdir()}
    again = CliRunner().invoke(main, ["evaluate", str(copy)])
    assert (again.exit_code, again.stdout) == (2, "")
    assert again.stderr == (
        f"error: {copy / 'evaluate'} already holds an evaluation: pass --output-dir DIR for another one, or remove it\n"
    )
    assert {path: path.read_bytes() for path in (copy / "evaluate").iterdir()} == before


@pytest.fixture(scope="module")
def first_100_as_npz(smoke, tmp_path_factory):
    """The first 100 Fashion-MNIST test images (and 64 training ones) as an .npz with the class names."""
    _, _, _, data = smoke
    path = tmp_path_factory.mktemp("npz") / "first100.npz"
    np.savez(
        path,
        x_train=data.train.images[:64],
        y_train=data.train.labels[:64],
        x_test=data.test.images[:100],
        y_test=data.test.labels[:100],
        class_names=np.array(CLASS_NAMES),
    )
    return path


@pytest.mark.parametrize("how", ["test_limit", "npz"])
def test_evaluate_on_changed_data(smoke, first_100_as_npz, tmp_path, how):
    run_dir, _, run, data = smoke
    sets = (
        ["--set", "data.test_limit=100"]
        if how == "test_limit"
        else ["--set", "data.name=npz", "--set", f"data.path={first_100_as_npz}"]
    )
    before = tree(run_dir)
    result = CliRunner().invoke(main, ["evaluate", str(run_dir), *sets, "--output-dir", str(tmp_path / "e")])
    assert result.exit_code == 0, result.output
    assert tree(run_dir) == before  # --output-dir elsewhere: the run is untouched
    written = json.loads((tmp_path / "e" / "evaluate.json").read_text())
    loss, confusion, _, _ = expected_numbers(run, data, 100)
    assert written["test_examples"] == 100
    assert written["test_loss"] == pytest.approx(loss, abs=1e-5)
    assert written["confusion"] == confusion.tolist()
    assert written["data"]["name"] == ("fashion_mnist" if how == "test_limit" else "npz")


def npz_with(path, x, y, names=None):
    extra = {} if names is None else {"class_names": np.array(names)}
    np.savez(path, x_train=x, y_train=y, x_test=x, y_test=y, **extra)
    return path


EVALUATE_ERRORS = [
    # (arguments after RUN_DIR, with {tmp} and {run}; the message)
    (
        ["--set", "optimizer.learning_rate=0.1"],
        "--set optimizer.learning_rate=0.1: evaluate changes only data.* keys (e.g. --set data.test_limit=1000); "
        "optimizer.learning_rate is part of the trained run",
    ),
    (
        ["--set", "subdivisions=2"],
        "--set subdivisions=2: evaluate changes only data.* keys (e.g. --set data.test_limit=1000); "
        "subdivisions is part of the trained run",
    ),
    (
        ["--set", "data.train_limit=10"],
        "--set data.train_limit=10: evaluate reads only the test split, and data.train_limit changes only the "
        "training split: leave it out (e.g. --set data.test_limit=1000)",
    ),
    (
        ["--set", "data.augment.flip=true"],
        "--set data.augment.flip=true: evaluate reads only the test split, and data.augment.flip changes only the "
        "training split: leave it out (e.g. --set data.test_limit=1000)",
    ),
    (
        ["--set", "data={{test_limit: 50}}"],
        "--set data={{test_limit: 50}}: evaluate takes data's keys one at a time (e.g. --set data.test_limit=1000), "
        "not the whole section",
    ),
    (["--set", "data.test_limt=5"], "--set: unknown key 'data.test_limt' (did you mean 'data.test_limit'?)"),
    (
        ["--set", "data.dir=/nonexistent/fmnist"],
        "data.dir=/nonexistent/fmnist does not exist: install it with 'apt-get install dataset-fashion-mnist' or "
        "download the four .gz files from http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/ into a "
        "folder named by data.dir or $ACCUM_TRAIN_DATA",
    ),
    (["--output-dir", "{tmp}/full"], "--output-dir {tmp}/full is not empty: choose an empty or new directory"),
    (
        ["--set", "data.name=npz", "--set", "data.path={tmp}/rgb.npz"],
        "the data has inputs of 28x28x3, but the model of {run} takes 28x28x1: evaluate it on data like its "
        "training data",
    ),
    (
        ["--set", "data.name=npz", "--set", "data.path={tmp}/unnamed.npz"],
        "the data has classes [0, 1, 2, 3, ...] (10), but the model of {run} was trained on [T-shirt/top, Trouser, "
        "Pullover, Dress, ...] (10): labels would mean different classes",
    ),
]


@pytest.mark.parametrize("args, message", EVALUATE_ERRORS, ids=[f"case{i}" for i in range(len(EVALUATE_ERRORS))])
def test_evaluate_bad_input_is_one_line_exit_2_nothing_written(smoke, tmp_path, args, message):
    run_dir = smoke[0]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    labels = np.arange(20) % 10
    npz_with(tmp_path / "rgb.npz", np.zeros((20, 28, 28, 3), np.uint8), labels)
    npz_with(tmp_path / "unnamed.npz", np.zeros((20, 28, 28), np.uint8), labels)
    before, run_before = tree(tmp_path), tree(run_dir)
    result = CliRunner().invoke(main, ["evaluate", str(run_dir), *(a.format(tmp=tmp_path) for a in args)])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "error: " + message.format(tmp=tmp_path, run=run_dir) + "\n"
    assert (tree(tmp_path), tree(run_dir)) == (before, run_before)


def test_evaluate_needs_a_run_directory(tmp_path):
    result = CliRunner().invoke(main, ["evaluate", str(tmp_path)])
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: {tmp_path} is not a run directory (no config.yaml "
        f"and checkpoints/): pass a directory written by 'accum-train "
        f"run'\n",
    )
    assert tree(tmp_path) == []


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """A run of your own kind: a Keras file with BatchNormalization on a folder of 12x10 RGB PNGs."""
    import keras

    root = tmp_path_factory.mktemp("own")
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 10), ("test", 4)):
        for label, name in enumerate(("circle", "square", "zebra")):
            (root / "images" / split / name).mkdir(parents=True)
            for i in range(per_class):
                pixels = (rng.random((12, 10, 3)) * 80 + 80 * label).astype(np.uint8)
                (root / "images" / split / name / f"{i:02d}.png").write_bytes(tf.io.encode_png(pixels).numpy())
    keras.utils.set_random_seed(1)
    inputs = keras.Input((12, 10, 3))
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, padding="same")(inputs)))
    keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x))).save(root / "bn.keras")
    cfg = load_config(
        None,
        [
            "model.name=keras_file",
            f"model.path={root / 'bn.keras'}",
            "data.name=image_folder",
            f"data.path={root / 'images'}",
            "batch_size=16",
            "subdivisions=4",
            "epochs=2",
        ],
    )
    summary = train(cfg, root / "run")
    data = load(dataclasses.replace(cfg.data, keep_decoded=False))  # read from disk: the test files' paths
    return root / "run", summary, load_run(root / "run", data), data


def test_own_model_and_images_evaluate_and_predict(own_run, tmp_path):
    """keras_file + image_folder: evaluate reproduces the summary; predict on the test files is the forward pass."""
    run_dir, summary, run, data = own_run
    result = CliRunner().invoke(main, ["evaluate", str(run_dir), "--output-dir", str(tmp_path / "e")])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "e" / "evaluate.json").read_text())
    assert written["test_loss"] == pytest.approx(summary["test_loss"], abs=1e-6)
    assert written["test_accuracy"] == summary["test_accuracy"]
    assert written["class_names"] == ["circle", "square", "zebra"]
    assert np.sum(written["confusion"]) == 12

    files = [path.decode() for path in data.test.paths]
    result = CliRunner().invoke(main, ["predict", str(run_dir), *files, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [row["input"] for row in rows] == files
    expected = softmax(logits_of(run, data.test.take(np.arange(len(files)))[0]))
    probabilities = np.array([list(row["probabilities"].values()) for row in rows])
    np.testing.assert_allclose(probabilities, expected, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------
# predict


def write_png(path, image):
    path.write_bytes(tf.io.encode_png(image[..., np.newaxis]).numpy())
    return path


def test_predict_images_and_npz_agree_with_the_forward_pass(smoke, tmp_path):
    run_dir, _, run, data = smoke
    images = data.test.images[:6]  # uint8 [6, 28, 28], as the IDX files hold them
    pngs = [str(write_png(tmp_path / f"test{i}.png", image)) for i, image in enumerate(images)]
    np.savez(tmp_path / "uint8.npz", x=images)
    np.savez(tmp_path / "float.npz", x=(images[..., np.newaxis] / 255.0).astype(np.float32))
    result = CliRunner().invoke(
        main, ["predict", str(run_dir), *pngs, str(tmp_path / "uint8.npz"), str(tmp_path / "float.npz"), "--json"]
    )
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    rows = json.loads(result.stdout)
    assert [row["input"] for row in rows] == pngs + [
        f"{tmp_path / name}.npz[{i}]" for name in ("uint8", "float") for i in range(6)
    ]
    probabilities = np.array([[row["probabilities"][name] for name in CLASS_NAMES] for row in rows])
    expected = softmax(logits_of(run, to_inputs(images, np.zeros(6))[0]))
    for group in range(3):
        np.testing.assert_allclose(probabilities[6 * group : 6 * group + 6], expected, atol=1e-6, rtol=0)
    assert [row["prediction"] for row in rows] == [CLASS_NAMES[i] for i in expected.argmax(axis=1)] * 3
    assert all(list(row["probabilities"]) == list(CLASS_NAMES) for row in rows)


FIXED = np.array(
    [
        [0.05, 0.01, 0.02, 0.02, 0.1, 0.3, 0.1, 0.2, 0.1, 0.1],
        [0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0],
        [0.1] * 10,
    ],
    np.float32,
)

TABLES = {
    3: """\
input       prediction   probability  top 3
shoe.png    Sandal            0.3000  Sandal 0.3000, Sneaker 0.2000, Coat 0.1000
two.npz[0]  T-shirt/top       0.9000  T-shirt/top 0.9000, Shirt 0.1000, Trouser 0.0000
two.npz[1]  T-shirt/top       0.1000  T-shirt/top 0.1000, Trouser 0.1000, Pullover 0.1000
""",
    1: """\
input       prediction   probability  top 1
shoe.png    Sandal            0.3000  Sandal 0.3000
two.npz[0]  T-shirt/top       0.9000  T-shirt/top 0.9000
two.npz[1]  T-shirt/top       0.1000  T-shirt/top 0.1000
""",
}


@pytest.mark.parametrize("top", [3, 1])
def test_predict_table(smoke, tmp_path, monkeypatch, top):
    """The table's exact text, for probabilities fixed here (ties keep the class order)."""
    run_dir, _, _, data = smoke
    monkeypatch.chdir(tmp_path)
    write_png(tmp_path / "shoe.png", data.test.images[0])
    np.savez(tmp_path / "two.npz", x=data.test.images[1:3])
    monkeypatch.setattr("accum_train.predict.probabilities", lambda run, x: FIXED[: len(x)])
    result = CliRunner().invoke(main, ["predict", str(run_dir), "shoe.png", "two.npz", "--top", str(top)])
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    assert result.stdout == TABLES[top]


def test_predict_top_is_at_most_the_class_count(smoke, tmp_path, monkeypatch):
    run_dir, _, _, data = smoke
    monkeypatch.chdir(tmp_path)
    write_png(tmp_path / "shoe.png", data.test.images[0])
    monkeypatch.setattr("accum_train.predict.probabilities", lambda run, x: FIXED[: len(x)])
    result = CliRunner().invoke(main, ["predict", str(run_dir), "shoe.png", "--top", "20"])
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()
    assert header.endswith("top 10") and row.count(", ") == 9


def _npz(**arrays):
    return lambda path: np.savez(path, **arrays)


PREDICT_ERRORS = [
    # (file name, how to make it (None: leave it missing), the message with {p} for its path)
    ("nope.png", None, "{p} does not exist: pass image (.png, .jpg) or .npz files"),
    ("folder.png", lambda p: p.mkdir(), "{p} is a directory: pass image (.png, .jpg) or .npz files"),
    (
        "notes.txt",
        lambda p: p.write_text("hi"),
        "{p}: not an image or .npz file (suffix .txt): pass .png, .jpg, .jpeg or .npz files",
    ),
    (
        "corrupt.png",
        lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\nnot really"),
        "{p} is not a readable PNG or JPEG image (truncated or corrupt): pass a PNG or JPEG file",
    ),
    (
        "empty.jpg",
        lambda p: p.write_bytes(b""),
        "{p} is not a readable PNG or JPEG image (truncated or corrupt): pass a PNG or JPEG file",
    ),
    (
        "text.npz",
        lambda p: p.write_text("not an archive"),
        "{p} is not an .npz file (it starts with 6e6f7420, not the zip signature 504b0304): write it with "
        "numpy.savez('text.npz', x=images)",
    ),
    (
        "single.npz",
        lambda p: p.write_bytes(_npy_bytes(np.zeros((2, 28, 28), np.uint8))),
        "{p} is a single .npy array, not an .npz archive: write it with numpy.savez('single.npz', x=images)",
    ),
    (
        "other.npz",
        _npz(images=np.zeros((2, 28, 28), np.uint8)),
        "{p} has no array 'x' (its arrays: images): save the images with numpy.savez('other.npz', x=images)",
    ),
    (
        "object.npz",
        _npz(x=np.array([None, 1], dtype=object)),
        "{p}: x is an object array (pickled Python objects), which is never loaded (allow_pickle=False: loading "
        "it could run code); save plain numeric arrays, e.g. x=numpy.asarray(x, dtype='uint8')",
    ),
    (
        "flat.npz",
        _npz(x=np.zeros((28, 28), np.uint8)),
        "{p}: x has shape (28, 28) (2 dimensions): images must be [N, H, W] or [N, H, W, C]; reshape it, e.g. "
        "x.reshape(N, H, W)",
    ),
    (
        "ints.npz",
        _npz(x=np.zeros((2, 28, 28), np.int64)),
        "{p}: x has dtype int64: images must be uint8 (0..255, scaled by 1/255) or float (used as it is, e.g. in "
        "[0, 1]); convert it, e.g. x.astype('float32') / x.max()",
    ),
    (
        "none.npz",
        _npz(x=np.zeros((0, 28, 28), np.uint8)),
        "{p}: x has shape (0, 28, 28): it needs at least one image of at least 1x1 pixels",
    ),
    (
        "nan.npz",
        _npz(x=np.full((2, 28, 28), np.nan, np.float32)),
        "{p}: x[0] has NaN: float images must be finite; fix or drop that example",
    ),
    (
        "big.npz",
        _npz(x=np.zeros((2, 32, 32), np.uint8)),
        "{p}: 'x' holds images of 32x32x1, but the model takes 28x28x1",
    ),
    (
        "rgb.npz",
        _npz(x=np.zeros((2, 28, 28, 3), np.float32)),
        "{p}: 'x' holds images of 28x28x3, but the model takes 28x28x1",
    ),
]


def _npy_bytes(array):
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize("name, make, message", PREDICT_ERRORS, ids=[case[0] for case in PREDICT_ERRORS])
def test_predict_bad_input_is_one_line_exit_2(smoke, tmp_path, name, make, message):
    run_dir = smoke[0]
    good = write_png(tmp_path / "good.png", smoke[3].test.images[0])
    path = tmp_path / name
    if make:
        make(path)
    before = tree(tmp_path)
    result = CliRunner().invoke(main, ["predict", str(run_dir), str(good), str(path)])
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "error: " + message.format(p=path) + "\n"
    assert tree(tmp_path) == before


def test_predict_needs_a_run_directory(tmp_path):
    image = write_png(tmp_path / "a.png", np.zeros((28, 28), np.uint8))
    result = CliRunner().invoke(main, ["predict", str(tmp_path), str(image)])
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: {tmp_path} is not a run directory (no config.yaml "
        f"and checkpoints/): pass a directory written by 'accum-train "
        f"run'\n",
    )
