"""accum_train.fit under tf.distribute: 2 replicas x k micro-batches end where one device with 2k ends, the masked
per-token model included (the global count of valid tokens normalises every replica), with one graph call and one
all-reduce per update. Each side runs in a fresh process (tests/fit_worker.py): a strategy is set up before
TensorFlow's runtime starts."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


@pytest.fixture(scope="module")
def one_device():
    return last_json([sys.executable, str(HERE / "fit_worker.py"), "single", "4"])


def max_difference(a, b):
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


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
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if not r.get("epoch_end")] == list(range(1, 7))
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6
    saved = keras_weights(run_dir / "model.keras")
    assert max_difference(saved, workers["weights"]) == 0.0


def keras_weights(path):
    import keras

    return keras.models.load_model(path).get_weights()
