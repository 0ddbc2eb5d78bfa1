"""The gradient noise scale (accum/trainer/noise.py): the engine's sums against numpy, the estimate against a problem
whose gradient covariance is known, one device against two replicas, and a run's records of it."""

import json
import subprocess
import sys

import helpers
import keras
import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.backends.tensorflow.noise import NoiseScale
from accum_train.defaults import NOISE_DECAY
from accum_train.trainer.data.batching import micro_bounds
from accum_train.trainer.noise import grown_batch, one_update
from helpers import max_difference

IN, OUT = 5, 3


def linear_engine(k, parallel=1, loss_scale=None, strategy=None):
    """A linear model with per-example loss 0.5 |x W + b - y|^2 (its per-example gradients are known in closed
    form), and its engine; an optimizer at rate 0: the weights stay, only the records matter here."""
    scope = (strategy or tf.distribute.get_strategy()).scope()
    with scope:
        w = tf.Variable(np.random.default_rng(0).normal(size=(IN, OUT)).astype(np.float32))
        b = tf.Variable(np.full(OUT, 0.3, np.float32))
        optimizer = keras.optimizers.SGD(learning_rate=0.0)
        optimizer.build([w, b])

    def loss_fn(x, y):
        return 0.5 * tf.reduce_sum(tf.square(tf.matmul(x, w) + b - y), axis=1)

    engine = Accumulator(
        loss_fn, [w, b], optimizer, subdivisions=k, parallel=parallel, loss_scale=loss_scale, strategy=strategy
    )
    return engine, w.numpy(), b.numpy()


def per_example_gradients(x, y, w, b):
    """Each example's gradient of 0.5 |x W + b - y|^2, flattened: [x r^T, r] with r = x W + b - y."""
    r = x @ w + b - y
    return np.concatenate([(x[:, :, None] * r[:, None, :]).reshape(len(x), -1), r], axis=1).astype(np.float64)


def batch(n, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, IN)).astype(np.float32), rng.normal(size=(n, OUT)).astype(np.float32)


@pytest.mark.parametrize(
    "n, k, parallel, loss_scale",
    [
        (10, 3, 1, None),  # ragged: 3, 3, 4
        (10, 3, 2, None),  # the carried loop (micro-steps in flight) sums the same
        (10, 3, 1, 1024.0),  # a 16-bit loss scale: the sums are of the unscaled gradients
        (7, 7, 1, None),  # micro-batches of one example
    ],
)
def test_the_two_scalars_are_numpy_s_from_the_micro_batches_gradients(n, k, parallel, loss_scale):
    """sum |g_i|^2 (g_i: micro-batch i's mean gradient over its own examples), sum 1/b_i and k ride in the
    update's record, with |G_B|^2 (its gradient norm squared) and B; S_hat and G2_hat follow the formula, to
    float32."""
    engine, w, b = linear_engine(k, parallel, loss_scale)
    x, y = batch(n)
    out = engine.update(tf.constant(x), tf.constant(y))
    per_example = per_example_gradients(x, y, w, b)
    bounds = [micro_bounds(i, n, k) for i in range(k)]
    sizes = [end - start for start, end in bounds]
    squares = sum(np.sum(per_example[start:end].mean(axis=0) ** 2) for start, end in bounds)
    batch_squared = np.sum(per_example.mean(axis=0) ** 2)
    noise = out["noise"].numpy()
    assert noise[0] == pytest.approx(squares, rel=1e-5)
    assert noise[1] == pytest.approx(sum(1 / s for s in sizes), rel=1e-6)
    assert noise[2] == k
    assert float(out["grad_norm"]) ** 2 == pytest.approx(batch_squared, rel=1e-5)
    assert list(out["noise_batch"].numpy()) == [pytest.approx(batch_squared, rel=1e-5), n]

    m, h = squares / k, np.mean([1 / s for s in sizes])
    trace = (m - batch_squared) / (h - 1 / n)
    estimate = NoiseScale()
    estimate.add(out)
    assert estimate.averages() == pytest.approx((trace, batch_squared - trace / n), rel=1e-4)


def test_one_micro_batch_has_no_estimate():
    engine, _, _ = linear_engine(1)
    x, y = batch(8)
    out = engine.update(tf.constant(x), tf.constant(y))
    assert "noise" not in out  # the baseline's route: no terms, where one micro-batch could estimate nothing
    estimate = NoiseScale()
    assert estimate.add(out) is None and estimate.averages() is None


# A problem whose gradient covariance is known: per-example loss 0.5 |theta - x|^2 at theta = 0, x drawn from
# N(mu, diag(sigma^2)). Each example's gradient is -x: |G|^2 = |mu|^2 and tr(Sigma) = sum sigma^2.
DIM = 16
SIGMA2 = np.linspace(0.5, 1.5, DIM)  # tr(Sigma) = 16
MU = np.full(DIM, np.sqrt(0.32 / DIM))  # |G|^2 = 0.32: B_noise = 50


def test_the_estimate_is_within_its_statistical_error_of_the_known_noise_scale():
    """600 updates of 60 examples in 8 ragged micro-batches (8 and 7): the mean of each update's S_hat and G2_hat
    is within 4 standard errors of tr(Sigma) and |G|^2 (and those errors are small enough to tell: under 3% and
    8%), and the running estimate (the exponential average) is near B_noise = 50."""
    theta = tf.Variable(tf.zeros(DIM))
    optimizer = keras.optimizers.SGD(learning_rate=0.0)
    optimizer.build([theta])
    engine = Accumulator(
        lambda x, y: 0.5 * tf.reduce_sum(tf.square(theta - x), axis=1), [theta], optimizer, subdivisions=8
    )
    rng = np.random.default_rng(2026)
    n, updates = 60, 600
    estimate, traces, signals, ratios = NoiseScale(), [], [], []
    for _ in range(updates):
        x = (MU + np.sqrt(SIGMA2) * rng.standard_normal((n, DIM))).astype(np.float32)
        out = engine.update(tf.constant(x), tf.zeros([n, 1]))
        trace, signal = one_update(*(float(v) for v in out["noise"]), float(out["grad_norm"]) ** 2, n)
        traces.append(trace)
        signals.append(signal)
        ratios.append(estimate.add(out))
    error = lambda values: np.std(values, ddof=1) / np.sqrt(len(values))  # noqa: E731
    assert error(traces) < 0.03 * SIGMA2.sum() and error(signals) < 0.08 * MU @ MU
    assert abs(np.mean(traces) - SIGMA2.sum()) < 4 * error(traces)
    assert abs(np.mean(signals) - MU @ MU) < 4 * error(signals)
    # the exponential average weighs about the last 1 / (1 - NOISE_DECAY) = 20 updates: its spread is wider
    assert 30 < np.median(ratios[100:]) < 80


@pytest.mark.parametrize(
    "noise, batch, micro, largest, grown",
    [
        (None, 500, 100, 4000, 500),  # no estimate yet: the batch stays
        (1234.0, 500, 100, 4000, 1200),  # rounded to whole micro-batches
        (1260.0, 500, 100, 4000, 1300),
        (300.0, 500, 100, 4000, 500),  # never smaller than the batch in force
        (9000.0, 500, 100, 4000, 4000),  # at most max_batch_size
        (40.0, 64, 48, 4000, 64),  # under half a micro-batch: still at least the batch in force
        (float("inf"), 500, 100, 4000, 500),
    ],
)
def test_the_rule_s_batch(noise, batch, micro, largest, grown):
    assert grown_batch(noise, batch, micro, largest) == grown


def test_the_average_is_exponential_with_bias_correction():
    """Two updates' estimates (S, G2) = (10, 1) then (30, 3): the averages weigh them NOISE_DECAY : 1."""
    estimate = NoiseScale()
    for trace, signal in ((10.0, 1.0), (30.0, 3.0)):
        # an update of two micro-batches of 1 example over n = 2: S_hat = (m - G2B) / (1 - 1/2), G2_hat = G2B - S/2
        batch_squared = signal + trace / 2
        m = batch_squared + trace / 2
        estimate.add({"noise": [2 * m, 2.0, 2.0], "noise_batch": [batch_squared, 2.0], "applied": True})
    weights = np.array([NOISE_DECAY * (1 - NOISE_DECAY), 1 - NOISE_DECAY]) / (1 - NOISE_DECAY**2)
    averages = (weights @ [10, 30], weights @ [1, 3])
    assert estimate.averages() == pytest.approx(averages, rel=1e-9)
    assert estimate.value() == pytest.approx(averages[0] / averages[1], rel=1e-9)
    skipped = {"noise": [1e9, 2.0, 2.0], "noise_batch": [0.0, 2.0], "applied": False}
    # a skipped update counts nothing: the averages stay the two updates'
    assert estimate.add(skipped) == pytest.approx(averages[0] / averages[1], rel=1e-9)
    assert estimate.averages() == pytest.approx(averages, rel=1e-9)


def test_the_averages_reach_a_checkpoint_through_store_and_come_back_through_forget(tmp_path):
    """The averages live on the host between checkpoints: ``store`` writes them into the variables a checkpoint
    saves, ``forget`` reads them back after a restore, bit for bit."""
    estimate = NoiseScale()
    estimate.add({"noise": [7.0, 2.0, 2.0], "noise_batch": [1.5, 2.0], "applied": True})
    estimate.add({"noise": [9.0, 2.0, 2.0], "noise_batch": [2.5, 2.0], "applied": True})
    assert [float(v.numpy()) for v in estimate.variables().values()] == [0.0, 0.0, 0.0]  # not stored yet
    estimate.store()
    path = tf.train.Checkpoint(**estimate.variables()).write(str(tmp_path / "ckpt"))
    restored = NoiseScale()
    restored.add({"noise": [5.0, 2.0, 2.0], "noise_batch": [1.0, 2.0], "applied": True})  # to be replaced
    tf.train.Checkpoint(**restored.variables()).read(path).assert_consumed()
    restored.forget()
    assert restored.averages() == estimate.averages() and restored.value() == estimate.value()


TWO_REPLICAS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from test_noise_scale import batch, linear_engine
x, y = batch(23)
out = {}
for name, strategy, k in (("one", None, 4), ("two", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), 2)):
    engine, _, _ = linear_engine(k, strategy=strategy)
    record = engine.update(tf.constant(x), tf.constant(y))
    out[name] = [float(v) for v in [*record["noise"], *record["noise_batch"]]] + [float(record["grad_norm"])]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_one_device_and_two_replicas_measure_the_same():
    """23 examples: 4 micro-batches on one device, or each replica's share (12 and 11) in 2: the same micro-batches,
    the same sums (the replicas' ride in the update's one all-reduce), to float32's rounding."""
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-c", TWO_REPLICAS, str(Path(__file__).parent)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["two"] == pytest.approx(out["one"], rel=1e-5)
    assert out["one"][2] == 4


RULE = {"rule": "noise_scale", "max_batch_size": 4000}
BAD = [
    (
        {"micro_batch_size": 100, "batch_schedule": {"max_batch_size": 4000}},
        "config: batch_schedule as a mapping needs rule: noise_scale (e.g. {rule: noise_scale, max_batch_size: 16000})",
    ),
    (
        {"micro_batch_size": 100, "batch_schedule": {"rule": "noise"}},
        "config: batch_schedule.rule='noise' is not one of noise_scale; did you mean 'noise_scale'?",
    ),
    (
        {"micro_batch_size": 100, "batch_schedule": {"rule": "noise_scale"}},
        "config: batch_schedule rule noise_scale needs max_batch_size, the largest batch it may grow to "
        "(e.g. {rule: noise_scale, max_batch_size: 16000})",
    ),
    (
        {"micro_batch_size": 100, "batch_schedule": {**RULE, "max_batch_size": 0}},
        "config: batch_schedule.max_batch_size=0 must be >= 1 and <= 1000000",
    ),
    (
        {"micro_batch_size": 100, "batch_schedule": {**RULE, "every_epochs": 0}},
        "config: batch_schedule.every_epochs=0 must be >= 1 and <= 100000",
    ),
    (
        {"micro_batch_size": 100, "batch_schedule": {**RULE, "every_epoch": 2}},
        "config: unknown key 'batch_schedule.every_epoch' (did you mean 'batch_schedule.every_epochs'?)",
    ),
    (
        {"subdivisions": 8, "batch_schedule": RULE},
        "config: batch_schedule rule noise_scale grows the batch in whole micro-batches: give micro_batch_size "
        "(what fits in memory) instead of subdivisions",
    ),
    (
        {"micro_batch_size": 100, "batch_size": 500, "batch_schedule": {**RULE, "max_batch_size": 400}},
        "config: batch_schedule max_batch_size=400 is smaller than batch_size=500 (the rule never shrinks the "
        "batch): raise max_batch_size",
    ),
    (
        {"micro_batch_size": 100, "batch_size": "all", "batch_schedule": RULE},
        "config: batch_size=all is every training example in one batch, which no batch_schedule can grow: give "
        "batch_size a number, or remove batch_schedule",
    ),
    (
        {"micro_batch_size": 100, "epochs": 3, "batch_schedule": {**RULE, "every_epochs": 3}},
        "config: batch_schedule every_epochs=3 leaves no epoch for the batch to change at (epochs=3): lower "
        "every_epochs or raise epochs",
    ),
    (
        {"micro_batch_size": 100, "baseline": True, "batch_schedule": RULE},
        "config: batch_schedule rule noise_scale measures from the micro-batches of each update, and the baseline "
        "has none: set baseline=false or remove batch_schedule",
    ),
    (
        {"micro_batch_size": 100, "optimizer": {"schedule": {"name": "cosine"}}, "batch_schedule": RULE},
        "config: optimizer.schedule.name=cosine decays over the run's updates, which batch_schedule rule "
        "noise_scale does not know before it runs: give optimizer.schedule.decay_steps, or set "
        "optimizer.schedule.name=constant",
    ),
    (
        {"micro_batch_size": 100, "data": {"train_limit": 1000}, "batch_schedule": RULE},
        "config: data.train_limit=1000 is smaller than batch_schedule's batch_size=4000: raise it or lower that "
        "batch size",
    ),
    (
        {"micro_batch_size": 100, "batch_schedule": "noise_scale"},
        "config: batch_schedule='noise_scale' must be a list of changes, e.g. [{epoch: 6, batch_size: 2000}], or "
        "a rule, e.g. {rule: noise_scale, max_batch_size: 16000}",
    ),
]


@pytest.mark.parametrize("config, message", BAD)
def test_bad_rule_settings_get_one_line(config, message):
    from accum_train.config import ConfigError, as_config

    with pytest.raises(ConfigError) as caught:
        as_config({"optimizer": {"schedule": {"name": "constant"}}, **config})
    assert str(caught.value) == message


def test_the_rule_reads_back_from_config_yaml(tmp_path):
    from accum_train.config import BatchRule, as_config, load_config

    cfg = as_config({"micro_batch_size": 100, "batch_schedule": {**RULE, "every_epochs": 2}})
    assert cfg.batch_rule == BatchRule("noise_scale", 4000, 2) and cfg.batch_changes == ()
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    assert load_config(tmp_path / "c.yaml") == cfg


def small(data_dir, **keys):
    """A BN-free net on a few hundred examples, SGD with the linear rule from batch 64."""
    return {
        "model": {"name": "seed_convnet", "width": 0.0625, "norm": "none"},
        "data": {"train_limit": 384, "test_limit": 64, "dir": str(data_dir)},
        "batch_size": 32,
        "micro_batch_size": 16,
        "epochs": 4,
        "log_every": 1,
        "optimizer": {
            "name": "sgd",
            "learning_rate": 0.4,
            "scale_learning_rate": {"rule": "linear", "base_batch_size": 64},
        },
        **keys,
    }


def read_records(run_dir):
    records = helpers.records(run_dir)
    return [r for r in records if "loss" in r], [r for r in records if "elapsed_s" in r]


def test_the_rule_grows_the_batch_to_the_noise_scale_in_whole_micro_batches(data_dir, tmp_path):
    """Each epoch's batch is grown_batch of the estimate at the previous epoch's end (at most 192, in micro-batches
    of 16); k and the linearly scaled rate follow it; summary.json lists the batches as run."""
    from accum_train import run

    rule = {"rule": "noise_scale", "max_batch_size": 192}
    summary = run(small(data_dir, batch_schedule=rule), output_dir=tmp_path / "run")
    updates, epochs = read_records(tmp_path / "run")
    batches = [next(r["batch_size"] for r in updates if r["epoch"] == e) for e in range(1, 5)]
    assert len(set(batches)) > 1  # the premise: the batch grew
    for e in range(1, 4):
        assert batches[e] == grown_batch(epochs[e - 1]["noise_scale"], batches[e - 1], 16, 192)
    for r in updates:
        assert r["subdivisions"] == -(-r["batch_size"] // 16)
        assert r["learning_rate"] == pytest.approx(0.4 * r["batch_size"] / 64, rel=1e-6)
    starts = [r for i, r in enumerate(updates) if i == 0 or r["batch_size"] != updates[i - 1]["batch_size"]]
    assert summary["batch_schedule"] == [
        {"update": r["step"], "epoch": r["epoch"], "batch_size": r["batch_size"]} for r in starts
    ]
    assert summary["steps"] == len(updates) == sum(-(-384 // b) for b in batches)


@pytest.mark.slow
def test_killed_after_the_batch_grew_resumes_to_the_uninterrupted_weights(data_dir, tmp_path):
    """Killed (-9) in an update after a change, resumed from a checkpoint in the middle of an epoch: the restored
    estimate and changes lay the rest out as before, and the run ends at the uninterrupted weights and estimate."""
    import os
    import signal
    from pathlib import Path

    import yaml
    from accum_train.trainer.store.checkpoints import checkpoint_numbers

    path = tmp_path / "c.yaml"
    rule = {"rule": "noise_scale", "max_batch_size": 192}
    path.write_text(yaml.safe_dump(small(data_dir, batch_schedule=rule, checkpoint={"every_steps": 8})))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    cli = [sys.executable, "-m", "accum_train.cli.main", "run"]
    done = subprocess.run(cli + [str(path), "--output-dir", str(whole), "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    updates, _ = read_records(whole)
    grew = next(r["step"] for r in updates if r["batch_size"] != updates[0]["batch_size"])
    # a checkpoint every 8 updates: the first one after the change that is not at an epoch's end
    ends = {r["step"] for i, r in enumerate(updates) if i + 1 == len(updates) or updates[i + 1]["epoch"] != r["epoch"]}
    mid = next(s for s in range(8, len(updates), 8) if s >= grew and s not in ends)
    runner = Path(__file__).with_name("fault_runner.py")
    killed = subprocess.run(
        [sys.executable, str(runner), "run", str(path), "--output-dir", str(cut), "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, "ACCUM_FAULT": f"update:{mid + 1}"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert checkpoint_numbers(cut / "checkpoints")[0] == mid
    resumed = subprocess.run(cli + ["--resume", str(cut), "--quiet"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a, b = np.load(whole / "weights.npz"), np.load(cut / "weights.npz")
    assert max_difference(a, b) < 1e-6
    again = read_records(cut)[0]
    assert [(r["step"], r["batch_size"]) for r in again] == [(r["step"], r["batch_size"]) for r in updates]
    for key in ("loss", "noise_scale"):  # null (no estimate yet, or |G|^2's average not positive) read as NaN
        values = [[np.nan if r[key] is None else r[key] for r in records] for records in (again, updates)]
        assert values[0] == pytest.approx(values[1], rel=1e-5, nan_ok=True)
    first, again = (json.loads((d / "summary.json").read_text()) for d in (whole, cut))
    assert again["noise_scale"] == first["noise_scale"] and again["batch_schedule"] == first["batch_schedule"]
