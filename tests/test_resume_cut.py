"""A resume may cut the same batches into other micro-batches (the way on after running out of memory), in both
doors, and ends within 1e-5 of the uninterrupted run; a resume of another model, optimizer or metrics is refused in
one line that names what differs."""

import json
import os
import subprocess
import sys
import warnings

import accum_train
import keras
import numpy as np
import pytest
from accum_train.describe import describe
from accum_train.errors import OutOfMemory, RunDirError
from accum_train.trainer.store.metrics_log import read_metrics
from helpers import max_difference, out_of_memory_at, small_regressor

N, BATCH, K, SEED = 48, 12, 2, 5
RNG = np.random.default_rng(7)
X = RNG.random((N, 6), dtype=np.float32)
Y = RNG.random((N, 1), dtype=np.float32)


def fit(built, epochs, output_dir=None, **cut):
    cut = cut or {"subdivisions": K}
    return accum_train.fit(
        built, X, Y, batch_size=BATCH, epochs=epochs, seed=SEED, verbose=0, output_dir=output_dir, **cut
    )


@pytest.fixture(scope="module")
def uninterrupted():
    built = small_regressor()
    fit(built, 3)
    return built.get_weights()


@pytest.mark.parametrize(
    "cut, k",
    [({"subdivisions": 4}, 4), ({"subdivisions": None, "micro_batch_size": 4}, 3), ({"subdivisions": 1}, 1)],
    ids=["more-subdivisions", "micro_batch_size", "fewer"],
)
def test_fit_resumes_with_other_micro_batches_at_the_uninterrupted_weights(tmp_path, uninterrupted, cut, k):
    run_dir = tmp_path / "run"
    fit(small_regressor(), 1, run_dir)
    resumed = small_regressor()
    fit(resumed, 3, run_dir, **cut)
    assert max_difference(resumed.get_weights(), uninterrupted) < 1e-5  # the sums are cut differently
    updates = [r for r in read_metrics(run_dir / "metrics.jsonl") if not r.get("epoch_end")]
    assert [r["step"] for r in updates] == list(range(1, 13))  # every update once
    assert [r["subdivisions"] for r in updates] == [K] * 4 + [k] * 8
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [(h["event"], h["step"], h["subdivisions"]) for h in history] == [("start", 0, K), ("resume", 4, k)]
    assert json.loads((run_dir / "run.json").read_text())["fit"]["k"] == k  # the next resume compares with it


def test_fit_resumes_a_fixed_cut_with_automatic_micro_batches(tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    fit(small_regressor(), 1, run_dir)
    resumed = small_regressor()
    fit(resumed, 3, run_dir, subdivisions=None, micro_batch_size="auto")
    assert max_difference(resumed.get_weights(), uninterrupted) < 1e-5
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert history[-1]["subdivisions"] == 1  # auto starts at one micro-batch (no memory measured on a CPU)


def other(layers=(8,), optimizer="adam", metrics=("mae",)):
    keras.utils.set_random_seed(1)
    built = keras.Sequential(
        [
            keras.Input((6,)),
            *[keras.layers.Dense(n, activation="tanh", name=f"hidden{i}") for i, n in enumerate(layers)],
            keras.layers.Dense(1, name="out"),
        ]
    )
    built.compile(optimizer=keras.optimizers.get(optimizer), loss="mse", metrics=list(metrics))
    return built


@pytest.mark.parametrize(
    "model, differs",
    [
        (lambda: other(optimizer="sgd"), "the optimizer was Adam, now SGD"),
        (
            lambda: other(metrics=("mse", "mae")),
            "the metrics were loss, mean_absolute_error, now loss, mean_squared_error, mean_absolute_error",
        ),
        (
            lambda: other(layers=(8, 3, 3)),
            "the checkpoint holds 4 variables, the model 8 (from variable 3 on: the checkpoint's out/kernel (8, 1), "
            "out/bias (1,); the model's hidden1/kernel (8, 3), hidden1/bias (3,), hidden2/kernel (3, 3) and 3 more)",
        ),
    ],
    ids=["optimizer", "metrics", "variables"],
)
def test_a_resume_of_another_model_optimizer_or_metrics_names_what_differs(tmp_path, model, differs, capfd):
    run_dir = tmp_path / "run"
    fit(other(), 1, run_dir)  # small_regressor's, with its layers named
    capfd.readouterr()
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    with warnings.catch_warnings(record=True) as caught_warnings, pytest.raises(RunDirError) as caught:
        warnings.simplefilter("always")
        fit(model(), 3, run_dir)
    assert str(caught.value) == (
        f"accum_train.fit: output_dir {run_dir} holds a checkpoint of another model: {differs}: pass the model, "
        f"optimizer and metrics it was trained with, or choose a new output_dir"
    )
    assert [str(w.message) for w in caught_warnings] == []
    assert capfd.readouterr().err == ""  # no TensorFlow text after the line
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before


JAX_RUNS = r"""
import json, sys, keras, numpy as np, accum_train
rng = np.random.default_rng(7)
x, y = rng.random((48, 6), dtype=np.float32), rng.random((48, 1), dtype=np.float32)

def model(optimizer="adam"):
    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    built.compile(optimizer=keras.optimizers.get(optimizer), loss="mse", metrics=["mae"])
    return built

def fit(built, epochs, output_dir=None, k=2):
    accum_train.fit(built, x, y, batch_size=12, subdivisions=k, epochs=epochs, seed=5, verbose=0, output_dir=output_dir)
    return built

full = fit(model(), 3)
fit(model(), 1, sys.argv[1])
resumed = fit(model(), 3, sys.argv[1], k=4)
difference = max(float(np.max(np.abs(a - b))) for a, b in zip(full.get_weights(), resumed.get_weights()))
try:
    fit(model("sgd"), 4, sys.argv[1])
    refused = None
except accum_train.UserError as err:
    refused = str(err)
print(json.dumps({"difference": difference, "refused": refused}))
"""


@pytest.mark.slow  # a process of its own under Keras' JAX backend, seconds
def test_fit_on_jax_resumes_with_other_micro_batches_and_names_another_optimizer(tmp_path):
    pytest.importorskip("jax")
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", JAX_RUNS, str(run_dir)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["difference"] < 1e-5
    assert result["refused"] == (
        f"accum_train.fit: output_dir {run_dir} holds a checkpoint of another model: the optimizer was Adam, now SGD: "
        f"pass the model, optimizer and metrics it was trained with, or choose a new output_dir"
    )
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [(h["event"], h["step"], h["subdivisions"]) for h in history] == [("start", 0, 2), ("resume", 4, 4)]


def test_after_fit_runs_out_of_memory_describe_says_how_to_resume_with_smaller_micro_batches(
    tmp_path, uninterrupted, monkeypatch
):
    """The call stops in its 7th update (k=2 out of memory); describe's way on doubles k, and that call ends at the
    uninterrupted weights."""
    out_of_memory_at(monkeypatch, 7)
    run_dir = tmp_path / "run"
    with pytest.raises(OutOfMemory):
        fit(small_regressor(), 3, run_dir)
    monkeypatch.undo()
    assert describe(run_dir)["next"] == (
        f"resume with smaller micro-batches: call accum_train.fit(model, ..., output_dir={str(run_dir)!r}, "
        f"subdivisions=4) again"
    )
    resumed = small_regressor()
    fit(resumed, 3, run_dir, subdivisions=4)
    assert max_difference(resumed.get_weights(), uninterrupted) < 1e-5
    updates = [r for r in read_metrics(run_dir / "metrics.jsonl") if not r.get("epoch_end")]
    assert [(r["step"], r["subdivisions"]) for r in updates] == [(s, 2 if s <= 4 else 4) for s in range(1, 13)]
