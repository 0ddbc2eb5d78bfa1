"""accum-train run with a Keras loss under tf.distribute and in 16 bits: each variant in its own process (a
strategy is set up before TensorFlow's runtime starts); the workers in a private network namespace. Run alone
(make test-slow's second part): workers have start-up deadlines that a loaded machine could miss."""

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import max_difference
from test_cli_exact import prepared, saved_weights
from test_distribute import private_network
from test_keras_loss import regression_arrays, write


@pytest.mark.slow  # three processes, one of them two workers joined over loopback
@pytest.mark.workers
def test_every_strategy_and_precision_runs_a_keras_loss(tmp_path):
    """2 mirrored replicas and 2 workers end where one device ends (the same per-example sums, one all-reduce);
    bfloat16 compute trains the same task in float32 weights."""
    import yaml

    config = {**write(tmp_path, regression_arrays(np.random.default_rng(0), True)), "epochs": 2}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    cli = [sys.executable, "-m", "accum_train.cli.main", "run", str(tmp_path / "run.yaml"), "--quiet"]
    variants = {
        "one": [],
        "mirrored": ["--set", "strategy.name=mirrored", "--set", "strategy.cpu_devices=2"],
        "bfloat16": ["--set", "precision=mixed_bfloat16"],
    }
    for name, extra in variants.items():
        done = subprocess.run([*cli, *extra, "--output-dir", str(tmp_path / name)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    command = [*cli, "--workers", "2", "--output-dir", str(tmp_path / "workers")]
    done = subprocess.run(private_network(command), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    def saved(name):
        arrays = np.load(tmp_path / name / "weights.npz")
        return [arrays[k] for k in arrays.files]

    assert max_difference(saved("mirrored"), saved("one")) < 1e-5
    assert max_difference(saved("workers"), saved("one")) < 1e-5
    # 16-bit compute: the same training within bfloat16's rounding, not bit for bit
    assert 1e-6 < max_difference(saved("bfloat16"), saved("one")) < 5e-2
    summaries = {name: json.loads((tmp_path / name / "summary.json").read_text()) for name in (*variants, "workers")}
    assert summaries["mirrored"]["replicas"] == summaries["workers"]["replicas"] == 2
    assert summaries["bfloat16"]["test_loss"] == pytest.approx(summaries["one"]["test_loss"], rel=0.05)


@pytest.mark.slow  # two processes, one of them two workers joined over loopback
@pytest.mark.workers
def test_a_masked_per_token_loss_is_exact_on_two_replicas_and_two_workers(tmp_path):
    """The masked tagger of test_cli_exact, its micro-batches' valid tokens summed over replicas and workers in the
    one all-reduce: 2 mirrored replicas and 2 workers end at model.fit's weights on whole batches."""
    import yaml

    config, oracle, _ = prepared(tmp_path, "masked-npz")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    cli = [sys.executable, "-m", "accum_train.cli.main", "run", str(tmp_path / "run.yaml"), "--quiet"]
    mirrored = [*cli, "--set", "strategy.name=mirrored", "--set", "strategy.cpu_devices=2"]
    done = subprocess.run([*mirrored, "--output-dir", str(tmp_path / "mirrored")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    command = [*cli, "--workers", "2", "--output-dir", str(tmp_path / "workers")]
    done = subprocess.run(private_network(command), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("mirrored", "workers"):
        assert max_difference(saved_weights(tmp_path / name, oracle), oracle.get_weights()) < 1e-5, name
        assert json.loads((tmp_path / name / "summary.json").read_text())["replicas"] == 2
