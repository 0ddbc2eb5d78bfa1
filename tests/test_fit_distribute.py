"""accum_train.fit under tf.distribute: 2 replicas x k micro-batches end where one device with 2k ends, the masked
per-token model included (the global count of valid tokens normalises every replica), with one graph call and one
all-reduce per update. Each side of those runs in a fresh process (tests/fit_worker.py): a strategy is set up before
TensorFlow's runtime starts. The quick case runs 2 mirrored replicas in this process, on the two logical CPUs that
tests/conftest.py sets up before the runtime starts, against model.fit on whole batches."""

import json
import subprocess
import sys
from pathlib import Path

import accum_train
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import max_difference, records

HERE = Path(__file__).resolve().parent


def last_json(command, timeout=400):
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def private_network(command):
    """The command in a new user+network namespace with loopback up: TF's gRPC server listens on every
    interface without authentication, so workers never run on the host's network."""
    quoted = " ".join(f"'{part}'" for part in command)
    return ["unshare", "-rn", "sh", "-c", f"ip link set lo up && exec {quoted}"]


# The quick case: 50 examples in batches of 16 (three and a short one of 2), each replica's half of a batch cut in
# k=3 (8 as 2, 3, 3; the short batch's 1 as 0, 0, 1), sample weights: averaging micro-batch (or replica) means
# instead of summing is off here.
N, BATCH, K = 50, 16, 3
RNG = np.random.default_rng(21)
X = RNG.random((N, 6), dtype=np.float32)
Y = RNG.random((N, 2), dtype=np.float32)
WEIGHTS = RNG.random(N, dtype=np.float32) + 0.5


def regression():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss="mse", metrics=["mae"])
    return model


def test_two_mirrored_replicas_in_this_process_end_at_model_fit_s_weights_on_whole_batches():
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    assert len(devices) == 2, f"tests/conftest.py splits the CPU in two before TensorFlow starts; here: {devices}"
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        ours = regression()
    oracle = regression()
    start = [w.copy() for w in ours.get_weights()]
    same = dict(sample_weight=WEIGHTS, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    expected = oracle.fit(X, Y, **same)
    history = accum_train.fit(ours, X, Y, subdivisions=K, strategy=strategy, **same)
    assert strategy.num_replicas_in_sync == 2
    assert max_difference(ours.get_weights(), oracle.get_weights()) < 1e-5
    assert max_difference(ours.get_weights(), start) > 1e-2  # it trained
    for name in ("loss", "mae"):
        assert history.history[name] == pytest.approx(expected.history[name], rel=1e-5), name


@pytest.fixture(scope="module")
def one_device():
    return last_json([sys.executable, str(HERE / "fit_worker.py"), "single", "4"])


def check(result, reference):
    assert result["replicas"] == 2
    assert max_difference(result["weights"], reference["weights"]) < 1e-5
    # noise_scale is NaN on both (noise.NoiseScale has no estimate after these updates): NaN must meet NaN
    for name, values in reference["history"].items():
        assert result["history"][name] == pytest.approx(values, rel=1e-5, nan_ok=True), name
    # six updates (two epochs of 40 at batch 16): one graph call each
    assert [calls for calls, _ in result["per_update"]] == [1] * 6


@pytest.mark.slow  # two fresh processes, each starting TensorFlow
def test_two_mirrored_replicas_end_where_one_device_with_twice_the_micro_batches_ends(one_device):
    mirrored = last_json([sys.executable, str(HERE / "fit_worker.py"), "mirrored", "2"])
    check(mirrored, one_device)
    # the update's one batched all-reduce is traced with its first call; later updates reuse the graph
    assert [collectives for _, collectives in mirrored["per_update"]] == [1, 0, 0, 0, 0, 0]


@pytest.mark.slow  # three fresh processes, two of them workers joined over loopback
@pytest.mark.workers
def test_two_workers_end_where_one_device_with_twice_the_micro_batches_ends(one_device, tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, str(HERE / "fit_workers_runner.py"), "2", "2", str(run_dir)]
    workers = last_json(private_network(command))
    check(workers, one_device)
    assert workers["collective_ops"] == {"CollectiveReduceV2": 1}  # one all-reduce in the update's graph
    # the chief kept the run directory (the other worker its checkpoints in a scratch folder, gone)
    assert [r["step"] for r in records(run_dir) if not r.get("epoch_end")] == list(range(1, 7))
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6
    saved = keras_weights(run_dir / "model.keras")
    assert max_difference(saved, workers["weights"]) == 0.0


def keras_weights(path):
    import keras

    return keras.models.load_model(path).get_weights()
