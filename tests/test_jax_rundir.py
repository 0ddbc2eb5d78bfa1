"""accum_train.fit(output_dir=...) on Keras' JAX backend (issue 76): the run directory of issue 75 written from JAX's
state (its checkpoints as numpy files: accum/backends/jax/checkpoints.py), read back by accum-train's commands under
JAX, and refused in one line by the other backend, which does not read its checkpoints. A kill -9 and a second call
ending at the uninterrupted weights are the fault suite's (test_kills.py, for both backends)."""

import json
import os
import subprocess
import sys

import accum_train
import keras
import numpy as np
import pytest
from accum_train.errors import RunDirError

pytest.importorskip("jax")
pytestmark = pytest.mark.slow  # processes of their own, seconds each

JAX = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
rng = np.random.default_rng(11)
X, Y = rng.random((50, 6), dtype=np.float32), rng.random((50, 1), dtype=np.float32)

TRAIN = r"""
import json, sys, numpy as np, keras, accum_train
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
data = np.load(sys.argv[2])
try:
    accum_train.fit(model, data["x"], data["y"], batch_size=16, subdivisions=3, epochs=2, seed=5, verbose=0,
                    output_dir=sys.argv[1])
except accum_train.UserError as err:
    print("REFUSED " + str(err))
    raise SystemExit(2)
np.savez(sys.argv[3], *model.get_weights())
scores = model.evaluate(data["x"], data["y"], batch_size=16, verbose=0, return_dict=True)
outputs = model.predict(data["x"], verbose=0)
json.dump({"scores": scores, "outputs": outputs[:, 0].tolist()}, open(sys.argv[4], "w"))
"""


def jax(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=JAX)


def command(env, *args):
    done = subprocess.run(
        [sys.executable, "-m", "accum_train.cli.main", *args], capture_output=True, text=True, timeout=300, env=env
    )
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("jax-run")
    np.savez(base / "data.npz", x=X, y=Y)
    done = jax("-c", TRAIN, str(base / "run"), str(base / "data.npz"), str(base / "weights.npz"), str(base / "in.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    return base


def test_a_jax_run_directory_holds_the_run_s_files_and_numpy_checkpoints(jax_run):
    run = jax_run / "run"
    assert {"run.json", "metrics.jsonl", "history.jsonl", "summary.json", "model.keras", "initial_model.keras"} <= {
        p.name for p in run.iterdir()
    }
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "ckpt-4.data",
        "ckpt-4.index",
        "ckpt-8.data",
        "ckpt-8.index",
    ]
    record = json.loads((run / "run.json").read_text())
    assert (record["door"], record["backend"], record["fit"]["k"], record["fit"]["seed"]) == ("fit", "jax", 3, 5)
    updates = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in updates if not r.get("epoch_end")] == list(range(1, 9))
    assert all(r["learning_rate"] == pytest.approx(0.01) and r["grad_norm"] > 0 for r in updates if "grad_norm" in r)
    assert json.loads((run / "summary.json").read_text())["steps"] == 8


def test_the_commands_read_a_jax_run_under_jax_as_the_call_left_its_model(jax_run, tmp_path):
    """export writes the trained weights; evaluate gives model.evaluate's scores; predict model.predict's outputs."""
    run, trained = jax_run / "run", np.load(jax_run / "weights.npz")
    exported = tmp_path / "model.keras"
    assert command(JAX, "export", str(run), "--output", str(exported))[0] == 0
    check = "import keras, numpy as np, sys; np.savez(sys.argv[2], *keras.models.load_model(sys.argv[1]).get_weights())"
    assert jax("-c", check, str(exported), str(tmp_path / "exported.npz")).returncode == 0
    exported_weights = np.load(tmp_path / "exported.npz")
    for name in trained:
        np.testing.assert_array_equal(exported_weights[name], trained[name])
    code, _, err = command(
        JAX, "evaluate", str(run), "--data", str(jax_run / "data.npz"), "--output-dir", str(tmp_path / "ev")
    )
    assert code == 0, err[-2000:]
    written, expected = (
        json.loads((tmp_path / "ev" / "evaluate.json").read_text()),
        json.loads((jax_run / "in.json").read_text()),
    )
    assert written["test_loss"] == pytest.approx(expected["scores"]["loss"], abs=1e-6)
    assert written["test_mae"] == pytest.approx(expected["scores"]["mae"], abs=1e-6)
    code, out, _ = command(JAX, "predict", str(run), str(jax_run / "data.npz"))
    predicted = [float(line.split()[-1]) for line in out.splitlines() if line.startswith(str(jax_run / "data.npz"))]
    np.testing.assert_allclose(predicted, expected["outputs"], atol=1e-4)  # as printed, to 4 decimals
    code, out, _ = command(JAX, "describe", str(run))
    assert code == 0 and out.splitlines()[0] == f"{run}: written by accum_train.fit, finished"


def test_tensorflow_refuses_to_resume_or_read_a_jax_run_in_one_line(jax_run):
    run = jax_run / "run"
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(RunDirError) as err:
        accum_train.fit(model, X, Y, batch_size=16, subdivisions=3, epochs=2, seed=5, verbose=0, output_dir=str(run))
    assert str(err.value) == (
        f"accum_train.fit: output_dir {run} was written on Keras' jax backend, whose checkpoints the tensorflow "
        f"backend does not read: resume it with KERAS_BACKEND=jax, or choose a new output_dir"
    )
    code, out, err = command({**os.environ, "KERAS_BACKEND": "tensorflow"}, "export", str(run), "--output", "x.keras")
    assert (code, out, "Traceback" in err) == (2, "", False)
    assert err.splitlines()[-1] == (
        f"error: {run} was written on Keras' jax backend, whose checkpoints the tensorflow backend does not read: "
        f"run this command with KERAS_BACKEND=jax"
    )


def test_jax_refuses_to_resume_a_tensorflow_run_in_one_line(tmp_path):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    accum_train.fit(model, X, Y, batch_size=16, subdivisions=3, epochs=1, seed=5, verbose=0, output_dir=tmp_path / "tf")
    np.savez(tmp_path / "data.npz", x=X, y=Y)
    done = jax("-c", TRAIN, str(tmp_path / "tf"), str(tmp_path / "data.npz"), "w.npz", "o.json")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == (
        f"REFUSED accum_train.fit: output_dir {tmp_path / 'tf'} was written on Keras' tensorflow backend, whose "
        f"checkpoints the jax backend does not read: resume it with KERAS_BACKEND=tensorflow, or choose a new "
        f"output_dir"
    )
