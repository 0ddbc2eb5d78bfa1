"""`KERAS_BACKEND=jax accum-train run` (issue 76, item 8): a config of a keras_file model on npz and factory data,
trained through accum_train.fit's JAX door (accum/on_keras.py), ends at the weights the same config reaches
under TensorFlow, resumes with --resume, and is read by describe and evaluate. What only TensorFlow runs is refused
in one line before anything is written. The JAX side runs in a process of its own: the backend is fixed per process."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from accum_train.cli.main import main
from click.testing import CliRunner
from helpers import max_difference

pytest.importorskip("jax")
pytestmark = pytest.mark.slow  # three runs under TensorFlow and a process of its own under JAX: about 17 s

PIPELINE = """
import numpy as np
import tensorflow as tf


def make(split, epoch, seed, path):
    arrays = np.load(path)
    return tf.data.Dataset.from_tensor_slices((arrays[f"x_{split}"], arrays[f"y_{split}"]))
"""

# (name, model file, data section, the config's other lines): each run under both backends
RUNS = {
    "regression": ("regressor", "{name: npz, path: DATA}", "loss: mse\nmetrics: [mae]\nsubdivisions: 4\n"),
    "classes": ("classifier", "{name: npz, path: CLASSES}", "micro_batch_size: 5\n"),
    "factory": ("regressor", "{name: python, factory: 'pipeline:make', path: DATA}", "loss: mse\nsubdivisions: 3\n"),
}
COMMON = "batch_size: 16\nepochs: 2\nlog_every: 1\noptimizer: {name: adam, learning_rate: 0.01}\n"

# what the JAX process does, in the folder it is given: each run, a resume of the first to 4 epochs beside a run of
# 4, describe and evaluate of it, and the refusals; the weights as .npz files, the rest in ``out``
JAX_SIDE = r"""
import json, os, sys, numpy as np, keras
from click.testing import CliRunner
from accum_train.cli.main import main
folder = sys.argv[1]
os.chdir(folder)
cli = lambda *args: CliRunner().invoke(main, [*args])
out = {}
def kept(name, run_dir):
    model = keras.models.load_model(f"{run_dir}/model.keras")
    np.savez(f"{name}.npz", *[np.asarray(w) for w in model.weights])
for name in RUNS:
    done = cli("run", f"{name}.yaml", "--output-dir", f"jax-{name}", "--quiet")
    out[name] = [done.exit_code, done.output.splitlines()]
    kept(f"jax-{name}", f"jax-{name}")
cli("run", "regression.yaml", "--output-dir", "jax-four", "--set", "epochs=4", "--quiet")
kept("jax-four", "jax-four")
done = cli("run", "--resume", "jax-regression", "--set", "epochs=4", "--quiet")
out["resumed"] = [done.exit_code, done.output.splitlines()[-1]]
kept("jax-resumed", "jax-regression")
logged = map(json.loads, open("jax-regression/metrics.jsonl"))
out["updates logged"] = [record["step"] for record in logged if not record.get("epoch_end")]
out["summary"] = json.load(open("jax-regression/summary.json"))
out["describe"] = cli("describe", "jax-regression").output.splitlines()
done = cli("evaluate", "jax-regression")
out["evaluate"] = [done.exit_code, json.load(open("jax-regression/evaluate/evaluate.json"))]
# a further epoch at half the micro-batches (fit's door on JAX: the config's k wins over the checkpoint's)
cli("run", "regression.yaml", "--output-dir", "jax-five", "--set", "epochs=5", "--quiet")
kept("jax-five", "jax-five")
done = cli("run", "--resume", "jax-regression", "--set", "epochs=5", "--set", "subdivisions=2", "--quiet")
history = [json.loads(line) for line in open("jax-regression/history.jsonl")]
out["recut"] = [done.exit_code, [(h["event"], h["step"], h["subdivisions"]) for h in history]]
kept("jax-recut", "jax-regression")
for case, (config, *sets) in REFUSED.items():
    done = cli("run", config, "--output-dir", f"refused-{case}", *sum((["--set", s] for s in sets), []))
    out[case] = [done.exit_code, done.output.strip(), os.path.exists(f"refused-{case}")]
for command in ("plan", "compare", "bench"):
    done = cli(command, "regression.yaml", *(["--output-dir", command] if command != "plan" else []))
    out[command] = [done.exit_code, done.output.strip(), os.path.exists(command)]
done = cli("run", "--resume", "tf-regression")
out["tensorflow's"] = [done.exit_code, done.output.strip()]
print("CASES " + json.dumps(out))
"""

REFUSED = {  # the config, --set's values
    "built-in net": ["smoke.yaml"],
    "strategy": ["regression.yaml", "strategy.name=mirrored"],
    "augment": ["regression.yaml", "data.augment.flip=true"],
    "memory_limit": ["regression.yaml", "memory_limit=1GB"],
    "every_steps": ["regression.yaml", "checkpoint.every_steps=2"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, repo_root):
    """Each run under TensorFlow (this process) and under JAX (a process of its own), in one folder."""
    folder = tmp_path_factory.mktemp("jax-cli")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(60, 6)).astype(np.float32)
    np.savez(folder / "data.npz", x_train=x[:48], y_train=x[:48] @ np.ones((6, 1), np.float32), x_test=x[48:],
             y_test=x[48:] @ np.ones((6, 1), np.float32))  # fmt: skip
    images = rng.integers(0, 256, size=(60, 4, 4), dtype=np.uint8)  # one channel, scaled by 1/255 on both
    labels = (images[:, 0, 0] > 85).astype(np.int64) + (images[:, 0, 0] > 170)
    np.savez(folder / "classes.npz", x_train=images[:48], y_train=labels[:48], x_test=images[48:], y_test=labels[48:])
    (folder / "pipeline.py").write_text(PIPELINE)
    (folder / "smoke.yaml").write_text((repo_root / "configs" / "smoke.yaml").read_text())
    keras.utils.set_random_seed(2)
    hidden = lambda: keras.layers.Dense(8, activation="tanh")  # noqa: E731
    keras.Sequential([keras.Input((6,)), hidden(), keras.layers.Dense(1)]).save(folder / "regressor.keras")
    image = [keras.Input((4, 4, 1)), keras.layers.Flatten()]
    keras.Sequential([*image, hidden(), keras.layers.Dense(3)]).save(folder / "classifier.keras")
    for name, (model, section, lines) in RUNS.items():
        data = section.replace("DATA", str(folder / "data.npz")).replace("CLASSES", str(folder / "classes.npz"))
        text = f"model: {{name: keras_file, path: {folder / model}.keras}}\ndata: {data}\n{lines}{COMMON}"
        (folder / f"{name}.yaml").write_text(text)
        command = ["run", str(folder / f"{name}.yaml"), "--output-dir", str(folder / f"tf-{name}")]
        done = CliRunner().invoke(main, command)
        assert done.exit_code == 0, done.output
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    code = f"RUNS = {list(RUNS)!r}\nREFUSED = {REFUSED!r}\n{JAX_SIDE}"
    command = [sys.executable, "-c", code, str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    line = next((line for line in done.stdout.splitlines() if line.startswith("CASES ")), None)
    assert line is not None, done.stderr[-3000:]
    return folder, json.loads(line.removeprefix("CASES "))


def weights(path):
    with np.load(path) as arrays:
        return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


@pytest.mark.parametrize("name", list(RUNS))
def test_a_config_trains_on_jax_to_the_weights_it_reaches_on_tensorflow(runs, name):
    """Two epochs of 3 updates each, shuffled, from the same file: the update is the whole batch's on both."""
    folder, out = runs
    assert out[name][0] == 0, out[name]
    with np.load(folder / f"tf-{name}" / "weights.npz") as tf_weights:
        expected = [tf_weights[key] for key in tf_weights.files]
    assert max_difference(weights(folder / f"jax-{name}.npz"), expected, relative=True) < 1e-5
    first = keras.models.load_model(folder / f"tf-{name}" / "initial_model.keras")
    assert max_difference(weights(folder / f"jax-{name}.npz"), first.get_weights()) > 1e-3  # it trained


def test_a_jax_run_of_the_cli_resumes_to_the_uninterrupted_weights_with_every_update_logged_once(runs):
    folder, out = runs
    assert out["resumed"][0] == 0 and out["resumed"][1].endswith("run directory: jax-regression")
    assert max_difference(weights(folder / "jax-resumed.npz"), weights(folder / "jax-four.npz")) == 0
    assert out["updates logged"] == list(range(1, 13))
    assert (out["summary"]["steps"], out["summary"]["subdivisions"], out["summary"]["backend"]) == (12, 4, "jax")


def test_a_jax_run_of_the_cli_resumes_with_other_subdivisions_to_the_uninterrupted_weights(runs):
    folder, out = runs
    assert out["recut"] == [0, [["start", 0, 4], ["resume", 6, 4], ["resume", 12, 2]]]
    assert max_difference(weights(folder / "jax-recut.npz"), weights(folder / "jax-five.npz")) < 1e-5


def test_describe_and_evaluate_read_a_jax_run_of_the_cli(runs):
    _, out = runs
    assert out["describe"][0] == "jax-regression: written by accum-train run, finished"
    assert out["describe"][1].split() == ["model", "keras_file", "(its", "file:", "initial_model.keras)"]
    code, evaluated = out["evaluate"]
    assert code == 0 and evaluated["test_examples"] == 12
    assert evaluated["test_loss"] == pytest.approx(out["summary"]["test_loss"], rel=1e-6)


ON = "which KERAS_BACKEND=jax does not run: train it with KERAS_BACKEND=tensorflow, or remove it"


@pytest.mark.parametrize(
    "case, message",
    [
        ("built-in net", "model.name=seed_convnet is a TensorLayer net, which only TensorFlow runs: train it with "
         "KERAS_BACKEND=tensorflow"),
        ("strategy", f"strategy.name=mirrored is a tf.distribute strategy, {ON}"),
        ("augment", f"data.augment draws inside TensorFlow's micro-step, {ON}"),
        ("memory_limit", f"memory_limit=1GB reads TensorFlow's allocator peak, {ON}"),
        ("every_steps", f"checkpoint.every_steps=2 is the TensorFlow door's (JAX: each epoch and each 300 s), {ON}"),
        *[
            (command, f"accum-train {command} works on TensorFlow's engine only, and Keras runs on jax "
             "(KERAS_BACKEND): run it with KERAS_BACKEND=tensorflow")
            for command in ("plan", "compare", "bench")
        ],
        ("tensorflow's", "--resume tf-regression was written on Keras' tensorflow backend, whose checkpoints the jax "
         "backend does not read: resume it with KERAS_BACKEND=tensorflow"),
    ],
)  # fmt: skip
def test_what_only_tensorflow_runs_is_refused_on_jax_in_one_line_before_anything_is_written(runs, case, message):
    code, said, *written = runs[1][case]
    assert (code, said, written) == (2, f"error: {message}", [False] if written else [])
