"""A Keras 3 model file (model.name: keras_file) on 2 logical CPUs (mirrored) and on 2 local workers:
2 replicas x k micro-batches equal 1 device x 2k, BN-free and with BatchNormalization (weights and moving
statistics); how its variables come out when it is built in a strategy's scope; one all-reduce and one
graph call per update; 16-bit layer policies across replicas; and export after a distributed run.

Every run is a fresh process (logical devices and the multi-worker runtime exist only before TensorFlow
has run anything); workers stay on loopback inside a private network namespace (test_distribute.py's
private_network).
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import max_difference
from test_distribute import CLI, HERE, here, private_network, run, weights

pytestmark = pytest.mark.slow  # fresh processes: `make test-slow`; the worker cases one at a time (marker workers)

SHAPE = (28, 28, 1)


@pytest.fixture(scope="module", autouse=True)
def same_thread_pools():
    """Every run here, one device or several replicas, under one intra-op thread and two inter-op threads.
    oneDNN splits a convolution's sums by thread, so other intra-op pools round differently (TensorFlow's
    default pools against one thread moved the smoke net's BatchNorm weights by 9.2e-3 to 2.2e-2 after 16
    updates: test_batchnorm_at_a_high_rate_is_chaotic_but_repeatable). A BN-free net barely notices
    (under 1e-5), but BatchNorm divides by micro-batch statistics and at a high rate amplifies any such
    rounding chaotically: the BatchNorm cases are only comparable to 1e-5 under equal pools."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TF_NUM_INTRAOP_THREADS", "1")
        patch.setenv("TF_NUM_INTEROP_THREADS", "2")
        yield


def bn_free():
    """Conv, pool, dense: about 8k weights, nothing that depends on the batch."""
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )


def with_batchnorm():
    """Two BatchNormalization layers (momentum 0.9: the statistics move visibly in 8 updates), no dropout:
    one device and 2 replicas draw different dropout masks."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input(SHAPE)
    x = keras.layers.Conv2D(6, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, name="bn_first")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(momentum=0.9, name="bn_second")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    out = {}
    for name, make in (("bn_free", bn_free), ("batchnorm", with_batchnorm)):
        out[name] = folder / f"{name}.keras"
        make().save(out[name])
    return out


# 200 examples in batches of 64: three full updates and a short one of 8, two epochs. Global batch sizes
# are even, so 2 replicas x 3 micro-batches cut every batch where 1 device x 6 does: ragged micro-batches of
# 10-11, then 1-2 for the short batch.
EXAMPLES, K = 200, 3
# BN-free: rates that move the weights well away from the file's. BatchNorm: test_distribute.py's rates for
# its BatchNorm cases (chaotic amplification of rounding grows with the rate).
LEARNING_RATE = {("bn_free", "sgd"): "0.1", ("bn_free", "adam"): "0.01"}
LEARNING_RATE.update({("batchnorm", "sgd"): "0.05", ("batchnorm", "adam"): "0.001"})


def args(repo_root, path, optimizer, rate, *more):
    return [
        str(repo_root / "configs" / "smoke.yaml"),
        "--set",
        f"model={{name: keras_file, path: {path}}}",
        "--set",
        f"data.train_limit={EXAMPLES}",
        "--set",
        "epochs=2",
        "--set",
        f"optimizer.name={optimizer}",
        "--set",
        f"optimizer.learning_rate={rate}",
        "--quiet",
        *more,
    ]


def distributed(where, command_args, output_dir, runner=None, env=None):
    """`accum-train run` on 2 logical CPUs (mirrored) or 2 local workers, through ``runner`` if given."""
    if where == "mirrored":
        extra = ["--set", "strategy.name=mirrored", "--set", "strategy.cpu_devices=2"]
    else:
        extra = ["--workers", "2"]
    head = CLI if runner is None else [sys.executable, str(HERE / runner), "run"]
    command = head + [*command_args, "--output-dir", str(output_dir), *extra]
    env = None if env is None else {**os.environ, **env}
    return subprocess.run(private_network(command), capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def one_device(files, repo_root, tmp_path_factory):
    """One device with twice the micro-batches, each model and optimizer, run once when first asked for."""
    done = {}

    def get(model, optimizer):
        if (model, optimizer) not in done:
            d = tmp_path_factory.mktemp("one_device") / f"{model}-{optimizer}"
            rate = LEARNING_RATE[model, optimizer]
            command = args(repo_root, files[model], optimizer, rate, "--set", f"subdivisions={2 * K}")
            here(["run", *command, "--output-dir", str(d)])
            done[model, optimizer] = d
        return done[model, optimizer]

    return get


@pytest.fixture(scope="module")
def across_replicas(files, repo_root, tmp_path_factory):
    """2 replicas x K micro-batches, mirrored or on 2 workers, run once when first asked for."""
    done = {}

    def get(where, model, optimizer):
        if (where, model, optimizer) not in done:
            d = tmp_path_factory.mktemp(where) / f"{model}-{optimizer}"
            rate = LEARNING_RATE[model, optimizer]
            finished = distributed(
                where, args(repo_root, files[model], optimizer, rate, "--set", f"subdivisions={K}"), d
            )
            assert finished.returncode == 0, finished.stderr
            done[where, model, optimizer] = d, finished.stdout
        return done[where, model, optimizer]

    return get


# Every model and optimizer on mirrored replicas; two of the four on local workers, which take the same path through
# a cluster (each worker test runs alone in the slow suite: a few combinations cover it)
ACROSS = [("mirrored", m, o) for o in ("sgd", "adam") for m in ("bn_free", "batchnorm")] + [
    pytest.param("workers", "batchnorm", "sgd", marks=pytest.mark.workers),
    pytest.param("workers", "bn_free", "adam", marks=pytest.mark.workers),
]


@pytest.mark.parametrize(("where", "model", "optimizer"), ACROSS)
def test_keras_file_across_replicas_equals_one_device_with_twice_the_micro_batches(
    one_device, across_replicas, files, where, model, optimizer
):
    d, stdout = across_replicas(where, model, optimizer)
    assert stdout.splitlines()[0] == (
        "batch_size=64 over 2 replicas (32-32 examples each), each as 3 "
        "micro-batches of up to 11 examples; one gradient all-reduce per update"
    )
    ours, reference = weights(d), weights(one_device(model, optimizer))
    diff = max_difference(ours, reference)  # every weight, and with BatchNorm the moving statistics too
    print(f"keras_file {model} {where} {optimizer}: {diff:.2g} from one device")  # the README's figures
    assert diff < 1e-5
    initial = {
        f"{layer.name}/{v.name}": v.numpy()
        for layer in keras.models.load_model(files[model]).layers
        for v in layer.weights
    }
    assert sorted(initial) == sorted(ours)
    assert max_difference(ours, initial) > 1e-3  # it did train
    if model == "batchnorm":
        for name in ("bn_first", "bn_second"):  # the statistics moved, both of them
            assert float(np.max(np.abs(ours[f"{name}/moving_variance"] - 1.0))) > 1e-3
            assert float(np.max(np.abs(ours[f"{name}/moving_mean"]))) > 1e-3
    assert json.loads((Path(d) / "summary.json").read_text())["steps"] == 8


@pytest.mark.parametrize("where", ["mirrored", pytest.param("workers", marks=pytest.mark.workers)])
def test_export_after_a_distributed_run_is_a_plain_keras_file_that_predicts_as_evaluate(
    across_replicas, where, tmp_path
):
    """`accum-train export` of the BatchNorm run (Adam) from 2 replicas: BatchNormalization swapped back with
    the pooled moving statistics, loadable by keras.models.load_model, and its predictions on the test split
    give evaluate's (and summary.json's) loss and accuracy."""
    from accum_train.config import load_config
    from accum_train.datasets import load

    d, _ = across_replicas(where, "batchnorm", "adam")
    here(["export", str(d)])
    here(["evaluate", str(d), "--output-dir", str(tmp_path / "evaluate")])
    with zipfile.ZipFile(d / "model.keras") as archive:
        text = archive.read("config.json").decode()
    assert "accum" not in text.lower()  # nothing of accum-train: keras.layers only
    model = keras.models.load_model(d / "model.keras")
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds.count("BatchNormalization") == 2
    trained = weights(d)
    for name in ("bn_first", "bn_second"):  # the moving statistics the replicas pooled, as trained
        layer = model.get_layer(name)
        assert np.array_equal(layer.moving_mean.numpy(), trained[f"{name}/moving_mean"])
        assert np.array_equal(layer.moving_variance.numpy(), trained[f"{name}/moving_variance"])
    data = load(load_config(d / "config.yaml").data)
    x, y = data.test.take(np.arange(len(data.test)))
    logits = model.predict(x.numpy(), batch_size=100, verbose=0)
    loss = float(np.mean(keras.losses.sparse_categorical_crossentropy(y.numpy(), logits, from_logits=True)))
    accuracy = float(np.mean(np.argmax(logits, 1) == y.numpy()))
    result = json.loads((tmp_path / "evaluate" / "evaluate.json").read_text())
    summary = json.loads((d / "summary.json").read_text())
    assert accuracy == result["test_accuracy"] == summary["test_accuracy"]
    assert loss == pytest.approx(result["test_loss"], abs=1e-6)
    assert result["test_loss"] == pytest.approx(summary["test_loss"], abs=1e-6)


def test_mixed_bfloat16_layer_policies_across_replicas(one_device, across_replicas, files, repo_root, tmp_path):
    """Each layer's mixed_bfloat16 policy holds on every replica: 2 replicas x 3 equal one device x 6 in
    bfloat16 (measured 3e-8), while both are 1.6e-2 away from the same runs in float32."""
    rate, bf16 = LEARNING_RATE["batchnorm", "sgd"], ["--set", "precision=mixed_bfloat16"]
    single, d = tmp_path / "one_device", tmp_path / "mirrored"
    command = args(repo_root, files["batchnorm"], "sgd", rate, *bf16, "--set", f"subdivisions={2 * K}")
    here(["run", *command, "--output-dir", str(single)])
    done = distributed(
        "mirrored", args(repo_root, files["batchnorm"], "sgd", rate, *bf16, "--set", f"subdivisions={K}"), d
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((d / "summary.json").read_text())["precision"] == "mixed_bfloat16"
    diff = max_difference(weights(d), weights(single))
    print(f"keras_file batchnorm mirrored mixed_bfloat16 sgd: {diff:.2g} from one device")
    assert diff < 1e-5
    float32, _ = across_replicas("mirrored", "batchnorm", "sgd")
    assert max_difference(weights(d), weights(float32)) > 1e-3  # it did compute in bfloat16


@pytest.mark.workers
def test_resumed_on_two_workers_every_worker_reads_the_run_directory_s_copy_of_the_file(
    across_replicas, files, repo_root, tmp_path
):
    """A keras_file run keeps its model file (initial_model.keras); a resume must not need the user's file, which
    may have moved or changed since. Every worker, not only the chief (whose run directory it is), builds the
    model from the kept copy: one epoch on 2 workers, the user's file moved away, the second epoch on 2
    workers ends at the uninterrupted run's weights."""
    moved = tmp_path / "moved.keras"
    shutil.copy(files["bn_free"], moved)
    cut = tmp_path / "cut"
    rate = LEARNING_RATE["bn_free", "sgd"]
    command = args(repo_root, moved, "sgd", rate, "--set", f"subdivisions={K}", "--set", "epochs=1")
    done = distributed("workers", command, cut)
    assert done.returncode == 0, done.stderr
    moved.unlink()
    resumed = run(private_network(CLI + ["--resume", str(cut), "--set", "epochs=2", "--workers", "2", "--quiet"]))
    assert resumed.returncode == 0, resumed.stderr
    whole, _ = across_replicas("workers", "bn_free", "sgd")
    diff = max_difference(weights(cut), weights(whole))
    print(f"keras_file bn_free workers sgd, resumed without the user's file: {diff:.2g} from uninterrupted")
    assert diff < 1e-6


SCOPE_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
from accum_train.config import ModelConfig, OptimizerConfig
from accum_train.backends.tensorflow.distribute import CountingCrossDeviceOps, make_strategy
ops = CountingCrossDeviceOps()
strategy = make_strategy("mirrored", 2, cross_device_ops=ops)
import keras
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.backends.tensorflow.objective import sparse_softmax_loss
from accum_train.models import build_model
from accum_train.from_config.optim import make_optimizer
path, kind = sys.argv[1], sys.argv[2]
with strategy.scope():  # as Run builds it: load_model, clone_model and set_weights all inside the scope
    model = build_model(ModelConfig(name="keras_file", path=path), 0, (28, 28, 1), 10)
    opt = make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1), 0.1, model.trainable_variables)
in_file = {f"{layer.name}/{v.name}": v.numpy() for layer in keras.models.load_model(path).layers for v in layer.weights}
named = model.named_weights()
def copies(v):
    return [c.numpy() for c in strategy.experimental_local_results(v)]
result = {
    "variables": sorted({type(v).__name__ for v in model.variables}),
    "every_copy_is_the_files": sorted(named) == sorted(in_file)
    and all(np.array_equal(c, in_file[k]) for k, v in named.items() for c in copies(v)),
    "pending": sorted({f"{type(v).__name__} {v.synchronization.name} {v.aggregation.name}"
                       for layer in model.norm_layers for v in layer.pending.variables()}),
}
shared = dict(clip_norm=1.0, norm_layers=model.norm_layers, strategy=strategy)
loss_fn = sparse_softmax_loss(model.forward)
if kind == "baseline":
    engine = Accumulator(loss_fn, model.trainable_variables, opt, **shared, one_pass=True)
else:
    engine = Accumulator(loss_fn, model.trainable_variables, opt, subdivisions=3, **shared)
rng = np.random.default_rng(0)
x = tf.constant(rng.random((64, 28, 28, 1), dtype=np.float32) * 2.0 + 0.5)
y = tf.constant(rng.integers(0, 10, 64).astype(np.int32))
counts = []
for _ in range(3):
    before = (ops.batch_reduce_calls, ops.reduce_calls)
    engine.update(x, y)
    counts.append([ops.batch_reduce_calls - before[0], ops.reduce_calls - before[1]])
result["counts"] = counts
result["replicas_agree"] = all(np.array_equal(*copies(v)) for v in model.variables)
result["statistics_moved"] = all(float(np.max(np.abs(layer.moving_mean.numpy()))) > 1e-3 for layer in model.norm_layers)
result["nothing_pending"] = all(float(c.sum()) == 0.0 for layer in model.norm_layers
                                for v in layer.pending.variables() for c in copies(v))
print(json.dumps(result))
"""


@pytest.mark.parametrize("kind", ["subdivided", "baseline"])
def test_built_in_a_mirrored_scope_a_file_is_mirrored_and_pools_its_statistics_in_one_all_reduce(files, kind):
    """load_model, clone_model and set_weights inside MirroredStrategy's scope (where Run builds a model):
    every weight a MirroredVariable whose every copy holds the file's values; the swapped layers'
    pending statistics replica-local ON_READ/SUM variables. An update, subdivided or the baseline, makes
    one batched all-reduce, after which both replicas hold the same weights and moving statistics."""
    done = run([sys.executable, "-c", SCOPE_SCRIPT, str(files["batchnorm"]), kind])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "variables": ["MirroredVariable"],
        "every_copy_is_the_files": True,
        "pending": ["SyncOnReadVariable ON_READ SUM"],
        "counts": [[1, 0], [0, 0], [0, 0]],  # traced once: one batch_reduce; later updates reuse the graph
        "replicas_agree": True,
        "statistics_moved": True,
        "nothing_pending": True,
    }


@pytest.mark.workers
def test_one_graph_call_and_one_collective_per_update_on_two_workers(files, repo_root, tmp_path):
    """The keras_file update under --workers: one graph call per update (evaluation and checkpoints aside),
    and one collective op in its graph carrying the gradients, the loss, the retry flag and both
    BatchNormalization layers' sums."""
    rate = LEARNING_RATE["batchnorm", "sgd"]
    command = args(repo_root, files["batchnorm"], "sgd", rate, "--set", f"subdivisions={K}")
    done = distributed(
        "workers", command, tmp_path / "run", runner="launch_runner.py", env={"ACCUM_LAUNCH_FAULT": "count"}
    )
    assert done.returncode == 0, done.stderr
    counted = json.loads(done.stdout.strip().splitlines()[-1])
    assert counted["graph_calls"] == json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 8
    assert counted["collectives"] == {"CollectiveReduceV2": 1}
