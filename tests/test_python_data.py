"""data.name=python: your own tf.data pipeline from a factory function, streamed into the update.

The same arrays through a factory and through an .npz end at the same weights; with data.shuffle a stopped run
resumed with --resume ends at the uninterrupted weights (the factory re-creates the epoch, which is skipped to
where the checkpoint was); bad factories are one line each."""

import signal
import sys

import keras
import numpy as np
import pytest
from accum_train import UserError
from accum_train.config import as_config, load_config
from accum_train.datasets.python import import_factory
from accum_train.errors import Interrupted
from accum_train.from_config.lifecycle import train
from helpers import InterruptAt, iterated_autotuning, max_difference, update_records

N = 50

PIPELINE = """
import numpy as np
import tensorflow as tf


def make(split, epoch, seed, path, scale=1.0):
    arrays = np.load(path)
    x, y = arrays[f"x_{split}"] * scale, arrays[f"y_{split}"]
    return tf.data.Dataset.from_tensor_slices((x.astype("float32"), y))


def weighted(split, epoch, seed, path):
    arrays = np.load(path)
    weights = np.linspace(0.5, 2.0, len(arrays[f"y_{split}"]), dtype="float32")
    return tf.data.Dataset.from_tensor_slices((arrays[f"x_{split}"], arrays[f"y_{split}"], weights))


def not_a_dataset(split, epoch, seed, path):
    return [1, 2, 3]


def singles(split, epoch, seed, path):
    return tf.data.Dataset.from_tensor_slices(np.load(path)[f"x_{split}"])


def endless(split, epoch, seed, path):
    return make(split, epoch, seed, path).repeat()


def halved_when_large(split, epoch, seed, path):  # Python control flow on a tensor: tf.data converts it (AutoGraph)
    return make(split, epoch, seed, path).map(lambda x, y: (x / 2.0 if tf.reduce_max(tf.abs(x)) > 1.0 else x, y))
"""


@pytest.fixture
def project(tmp_path):
    """An .npz, the same arrays behind a factory module in the config's folder, a compiled regression model."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 2))).astype(np.float32)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y, x_test=x[:20], y_test=y[:20])
    (tmp_path / "pipeline.py").write_text(PIPELINE)
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))
    model.compile(loss="mse", metrics=["mae"])
    model.save(tmp_path / "model.keras")
    return tmp_path


def config(project, data, *sets):
    text = (
        f"model: {{name: keras_file, path: {project / 'model.keras'}}}\n"
        f"data: {data}\n"
        "batch_size: 16\nsubdivisions: 3\nepochs: 3\nlog_every: 1\n"
        "optimizer: {name: sgd, learning_rate: 0.1}\n"
    )
    (project / "run.yaml").write_text(text)
    return load_config(project / "run.yaml", list(sets))


def weights(run_dir):
    return np.load(run_dir / "weights.npz")


def test_a_factory_gives_the_weights_of_the_same_arrays_in_an_npz(project, monkeypatch, tmp_path_factory):
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))  # the module is found in the config's folder
    npz = config(project, f"{{name: npz, path: {project / 'data.npz'}, shuffle: false}}")
    train(npz, project / "npz")
    factory = config(
        project, f"{{name: python, factory: 'pipeline:make', path: {project / 'data.npz'}, shuffle: false}}"
    )
    assert factory.data.factory == f"{project / 'pipeline.py'}:make"  # recorded as the file the run imported
    assert factory.data.options == {"path": str(project / "data.npz")}
    summary = train(factory, project / "python")
    assert max_difference(weights(project / "python"), weights(project / "npz")) < 1e-6
    assert summary["steps"] == 12 and "test_mae" in summary


def test_a_factory_file_s_python_control_flow_on_tensors_runs_as_in_plain_python(project):
    make = import_factory(f"{project / 'pipeline.py'}:halved_when_large")
    got = np.stack([x for x, _ in make("train", 0, 0, path=str(project / "data.npz")).as_numpy_iterator()])
    x = np.load(project / "data.npz")["x_train"]
    expected = np.where(np.abs(x).max(axis=1, keepdims=True) > 1.0, x / 2.0, x)
    assert 0 < np.sum(got != x) < x.size  # some rows halved, some not
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_factory_file_imports_the_modules_beside_it_from_any_working_directory(
    project, monkeypatch, tmp_path_factory
):
    (project / "scales.py").write_text("FACTOR = 3.0\n")
    (project / "scaled.py").write_text(
        PIPELINE + "\n\nimport scales\n\n\ndef tripled(split, epoch, seed, path):\n"
        "    return make(split, epoch, seed, path, scale=scales.FACTOR)\n"
    )
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder the import adds goes with the test
    make = import_factory(f"{project / 'scaled.py'}:tripled")
    x = np.load(project / "data.npz")["x_train"]
    got = np.stack([a for a, _ in make("train", 0, 0, path=str(project / "data.npz")).as_numpy_iterator()])
    np.testing.assert_allclose(got, 3.0 * x, rtol=1e-6)


def test_a_factory_s_pipeline_is_iterated_with_autotuning_off(project, monkeypatch):
    # autotuning's thread can hold an iterator's teardown until its next wake-up (datasets.base.untuned)
    factory = config(project, f"{{name: python, factory: 'pipeline:make', path: {project / 'data.npz'}}}", "epochs=2")
    seen = iterated_autotuning(monkeypatch)
    assert train(factory, project / "python")["steps"] == 8
    assert seen == [False] * 5  # per epoch its feed and its scores, then the final scores


def test_a_shuffled_stream_resumed_mid_epoch_ends_at_the_uninterrupted_weights(project):
    cfg = config(
        project, f"{{name: python, factory: 'pipeline:weighted', path: {project / 'data.npz'}, shuffle_buffer: 20}}"
    )
    whole = train(cfg, project / "whole")
    with pytest.raises(Interrupted) as stop:
        train(cfg, project / "cut", progress=InterruptAt(6))  # the second update of epoch 2
    assert (stop.value.step, stop.value.signum) == (6, signal.SIGINT)
    resumed = train(cfg, project / "cut", resume=True)
    assert resumed["steps"] == whole["steps"] == 12
    assert max_difference(weights(project / "cut"), weights(project / "whole")) < 1e-6
    # the buffer shuffles: other weights than the stored order's
    unshuffled = train(as_config(cfg, {"data.shuffle": False}), project / "unshuffled")
    assert unshuffled["steps"] == 12
    assert max_difference(weights(project / "unshuffled"), weights(project / "whole")) > 1e-3


# (case, data mapping, message: {project} is the folder)
BAD = [
    (
        "no such module",
        "{{name: python, factory: 'nowhere:make'}}",
        "data.factory='nowhere:make': cannot import nowhere (ModuleNotFoundError: No module named 'nowhere'); "
        "looked for nowhere.py in {cwd} and the config file's folder, and among the installed packages",
    ),
    (
        "no such function",
        "{{name: python, factory: 'pipeline:maker', path: x}}",
        "data.factory='{project}/pipeline.py:maker': pipeline has no function 'maker' (it has endless, "
        "halved_when_large, make, not_a_dataset, singles, weighted)",
    ),
    (
        "not a dataset",
        "{{name: python, factory: 'pipeline:not_a_dataset', path: x}}",
        "data.factory='{project}/pipeline.py:not_a_dataset' returned list for split 'train': it must return an "
        "unbatched tf.data.Dataset of (x, y) or (x, y, sample_weight)",
    ),
    (
        "single tensors",
        "{{name: python, factory: 'pipeline:singles', path: {project}/data.npz}}",
        "data.factory='{project}/pipeline.py:singles' returned a dataset of single TensorSpecs for split 'train': "
        "its elements must be (x, y) or (x, y, sample_weight)",
    ),
    (
        "endless",
        "{{name: python, factory: 'pipeline:endless', path: {project}/data.npz}}",
        "data.factory='{project}/pipeline.py:endless' returned an infinite dataset for split 'train' (it repeats): "
        "return one epoch of examples; accum-train repeats it",
    ),
    (
        "a bad option",
        "{{name: python, factory: 'pipeline:make', path: {project}/data.npz, scales: 2}}",
        "data.factory='{project}/pipeline.py:make' failed for split 'train', epoch 0 (TypeError: make() got an "
        "unexpected keyword argument 'scales')",
    ),
    (
        "a buffer of none",
        "{{name: python, factory: 'pipeline:make', shuffle_buffer: 0}}",
        "{project}/run.yaml: data.shuffle_buffer=0 must be >= 1",
    ),
]


@pytest.mark.parametrize(("case", "data", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_factories_are_one_line_and_nothing_is_written(project, monkeypatch, case, data, message):
    monkeypatch.chdir(project / "..")
    with pytest.raises(UserError) as caught:
        train(config(project, data.format(project=project)), project / "run")
    assert str(caught.value) == message.format(project=project, cwd=project.parent)
    assert not (project / "run").exists()


def test_the_built_in_nets_need_images_with_class_labels(project):
    cfg = config(project, "{name: python, factory: 'pipeline:make'}", "model={name: mlp}")
    with pytest.raises(UserError) as caught:
        train(cfg, project / "run")
    assert str(caught.value) == (
        "data.name=python feeds a model that brings its own loss: model.name=keras_file with loss: in the YAML or "
        "a file saved after compile(loss=...) (the built-in nets need images with class labels)"
    )


@pytest.mark.slow  # three fresh processes
def test_a_stream_killed_mid_epoch_resumes_to_the_uninterrupted_weights(project, repo_root):
    """kill -9 (no cleanup) during an update of epoch 2, then --resume: the factory's epoch is made again and
    skipped to the last checkpoint (every 2 updates), every update once in metrics.jsonl."""
    import json
    import os
    import subprocess
    import sys

    data = f"{{name: python, factory: 'pipeline:weighted', path: {project / 'data.npz'}, shuffle_buffer: 20}}"
    config(project, data, "checkpoint.every_steps=2")
    cli = [sys.executable, "-m", "accum_train.cli.main", "run"]
    sets = ["--set", "checkpoint.every_steps=2", "--quiet"]
    whole = subprocess.run([*cli, str(project / "run.yaml"), "--output-dir", str(project / "whole"), *sets])
    assert whole.returncode == 0
    runner = [sys.executable, str(repo_root / "tests" / "fault_runner.py"), "run"]
    killed = subprocess.run(
        [*runner, str(project / "run.yaml"), "--output-dir", str(project / "cut"), *sets],
        env={**os.environ, "ACCUM_FAULT": "update:7"},  # epoch 2 holds updates 5-8; the last checkpoint is 6
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = subprocess.run([*cli, "--resume", str(project / "cut"), "--quiet"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert max_difference(weights(project / "cut"), weights(project / "whole")) < 1e-6
    assert [r["step"] for r in update_records(project / "cut")] == list(range(1, 13))
    history = [json.loads(line)["event"] for line in (project / "cut" / "history.jsonl").read_text().splitlines()]
    assert history == ["start", "resume"]


def test_the_documented_tfrecord_pipeline_runs_as_written(repo_root, tmp_path, monkeypatch):
    """docs/keras-loss.md's factory (a module of TFRecord files) and its YAML, as written but for the folder:
    a run trains on the records, every example once per epoch."""
    import json

    import tensorflow as tf
    import yaml
    from accum_train.cli.main import main
    from click.testing import CliRunner

    page = (repo_root / "docs" / "keras-loss.md").read_text()
    module = page.split("<!-- python example: pipeline -->\n```python\n", 1)[1].split("```", 1)[0]
    data = yaml.safe_load(page.split("## Your own tf.data pipeline\n\n```yaml\n", 1)[1].split("```", 1)[0])["data"]
    assert data["path"] == "/data/records"  # the premise: the page's block, its folder replaced below
    records = tmp_path / "records"
    records.mkdir()
    rng = np.random.default_rng(1)
    in_file_order = {}  # each split's examples as the files hold them, file after file
    for split, count, files in (("train", 300, 2), ("test", 60, 1)):
        images, labels = rng.random((count, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, count)
        order = np.concatenate([np.arange(part, count, files) for part in range(files)])
        in_file_order[f"x_{split}"], in_file_order[f"y_{split}"] = images[order], labels[order]
        for part in range(files):
            with tf.io.TFRecordWriter(str(records / f"{split}-{part}.tfrecord")) as writer:
                for i in range(part, count, files):
                    feature = {
                        "image": tf.train.Feature(float_list=tf.train.FloatList(value=images[i].ravel())),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[i]])),
                    }
                    writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    (tmp_path / "my_pipeline.py").write_text(module)
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.save(tmp_path / "model.keras")  # a pipeline's run brings its model and loss
    config = {"model": {"name": "keras_file", "path": "model.keras"}, "batch_size": 64, "subdivisions": 4, "epochs": 2}
    config["data"] = {**data, "path": str(records)}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "run.yaml", "--output-dir", "out", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["steps"], summary["examples_seen"]) == (10, 600)  # 300 records: 4 full batches, one of 44
    # Read in file order (no shuffle), the records train to the weights of the same examples in an .npz: each
    # record once per epoch, in order, decoded as stored
    np.savez(tmp_path / "records.npz", **in_file_order)
    sources = {"records": {**config["data"], "shuffle": False}, "npz": {"name": "npz", "path": "records.npz"}}
    sources["npz"]["shuffle"] = False
    for name, source in sources.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({**config, "data": source}))
        result = CliRunner().invoke(main, ["run", f"{name}.yaml", "--output-dir", f"from-{name}", "--quiet"])
        assert result.exit_code == 0, result.output
    trained = {name: np.load(tmp_path / f"from-{name}" / "weights.npz") for name in sources}
    assert max_difference(trained["records"], trained["npz"]) < 1e-6
