"""Micro-steps in flight at once (parallel_micro_steps) and the thread pools chosen for them.

The loop-carried path must add every sum in micro-batch order, as the cache
variables do one micro-step at a time: the weights, optimizer slots and
BatchNorm statistics after a few updates are asserted bit-identical, with
ragged micro-batches and a short last batch.
"""

import numpy as np
import pytest
import tensorflow as tf
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.backends.tensorflow.objective import sparse_softmax_loss
from accum_train.config import ModelConfig, OptimizerConfig, config_from_dict
from accum_train.from_config import build
from accum_train.from_config.optim import make_optimizer
from accum_train.models import build_model
from accum_train.trainer import runtime

RNG = np.random.default_rng(99)
X = RNG.random((70, 28, 28, 1), dtype=np.float32)
Y = RNG.integers(0, 10, 70).astype(np.int32)
BATCHES = [(0, 29), (29, 58), (58, 70)]  # 29 examples as 4 micro-batches of 7-8, then a short 12


def train(norm, parallel, k=4, optimizer="adam", loss_scale=None):
    model = build_model(ModelConfig(width=0.0625, norm=norm, groups=2), 3, (28, 28, 1), 10)
    opt = make_optimizer(OptimizerConfig(name=optimizer, learning_rate=0.003), 0.003, model.trainable_variables)
    engine = Accumulator(
        sparse_softmax_loss(model.forward),
        model.trainable_variables,
        opt,
        subdivisions=k,
        norm_layers=model.norm_layers,
        parallel=parallel,
        loss_scale=loss_scale,
    )
    losses = [float(engine.update(tf.constant(X[a:b]), tf.constant(Y[a:b]))["loss"]) for a, b in BATCHES]
    state = [v.numpy() for v in model.variables] + [v.numpy() for v in opt.variables]
    cache = [slot.numpy() for slot in engine.caches[0].slots]
    return losses, state, cache


@pytest.mark.parametrize(
    "norm, k, parallel, optimizer, loss_scale",
    [
        pytest.param("batchnorm", 4, 2, "adam", None, marks=pytest.mark.slow),  # the 1024.0 case, unscaled
        pytest.param("batchnorm", 4, 3, "sgd", None, marks=pytest.mark.slow),
        pytest.param("batchnorm", 29, 2, "adam", None, marks=pytest.mark.slow),  # one example per micro-batch
        pytest.param("groupnorm", 4, 2, "adam", None, marks=pytest.mark.slow),
        ("none", 5, 2, "momentum", None),
        ("batchnorm", 4, 2, "adam", 1024.0),  # one loss scale for the whole update, unscaled once
    ],
)
def test_micro_steps_in_parallel_equal_one_at_a_time_bit_for_bit(norm, k, parallel, optimizer, loss_scale):
    one_losses, one_state, _ = train(norm, 1, k, optimizer, loss_scale)
    losses, state, cache = train(norm, parallel, k, optimizer, loss_scale)
    assert losses == one_losses
    assert len(state) == len(one_state) > 10
    for a, b in zip(state, one_state):
        np.testing.assert_array_equal(a, b)
    assert all(not np.any(slot) for slot in cache)  # written once, applied, cleared


def test_batchnorm_statistics_move_in_parallel_as_one_at_a_time():
    # Not a weight the optimizer touches: the pooled statistics must still have been folded in.
    model_states = {}
    for parallel in (1, 2):
        model = build_model(ModelConfig(width=0.0625, norm="batchnorm"), 3, (28, 28, 1), 10)
        before = model.norm_layers[0].moving_mean.numpy().copy()
        opt = make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.01), 0.01, model.trainable_variables)
        engine = Accumulator(
            sparse_softmax_loss(model.forward),
            model.trainable_variables,
            opt,
            subdivisions=4,
            norm_layers=model.norm_layers,
            parallel=parallel,
        )
        engine.update(tf.constant(X[:29]), tf.constant(Y[:29]))
        moved = model.norm_layers[0].moving_mean.numpy()
        assert np.max(np.abs(moved - before)) > 1e-4
        assert not np.any(model.norm_layers[0].pending.sum.numpy())  # cleared after the fold
        model_states[parallel] = [layer.moving_var.numpy() for layer in model.norm_layers]
    for a, b in zip(model_states[1], model_states[2]):
        np.testing.assert_array_equal(a, b)


BASE = {"batch_size": 256, "subdivisions": 8}


@pytest.mark.parametrize(
    "changes, gpu, cores, expected",
    [
        ({}, False, 2, 2),
        ({}, False, 16, 2),
        ({}, False, 1, 1),  # one core: nothing to share out
        ({}, True, 2, 1),  # a GPU: one at a time, the least memory
        ({"subdivisions": 1}, False, 2, 1),
        ({"subdivisions": 3, "parallel_micro_steps": 8}, False, 2, 3),  # never more than the micro-batches
        ({"parallel_micro_steps": 4}, True, 2, 4),  # as configured, GPU or not
        ({"parallel_micro_steps": 1}, False, 2, 1),
        ({"baseline": True}, False, 2, 1),
        ({"strategy": {"name": "mirrored"}}, False, 2, 1),  # the replicas share the cores out already
        ({"subdivisions": "auto", "memory_limit": "1GiB"}, False, 2, 1),  # memory is what the run is short of
        ({"memory_limit": "1GiB"}, False, 2, 1),
        ({"memory_limit": "1GiB", "parallel_micro_steps": 2}, False, 2, 2),
    ],
)
def test_parallel_micro_steps_auto_and_configured(monkeypatch, changes, gpu, cores, expected):
    monkeypatch.setattr(runtime, "cpu_cores", lambda: cores)
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["gpu:0"] if gpu else [])
    assert build.parallel_micro_steps(config_from_dict({**BASE, **changes})) == expected


def test_configure_in_a_started_runtime_keeps_its_pools_and_says_so():
    tf.constant(1.0)  # the runtime has started in this process
    before = (
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
    )
    got = build.configure(config_from_dict(BASE))
    assert (got["intra_op_threads"], got["inter_op_threads"]) == before
    assert got["parallel_micro_steps"] == build.parallel_micro_steps(config_from_dict(BASE))


NOT_STARTED = """
import accum_train.cli.main, accum_train.worker, accum_train.bench
import accum_train.from_config.api, accum_train.from_config.lifecycle
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)  # RuntimeError once TensorFlow's runtime has started
"""


def test_what_a_run_imports_before_setting_its_pools_starts_no_tensorflow_runtime():
    """The thread pools are fixed when TensorFlow's runtime starts, which any op does (TensorLayer's import
    runs some): a module of the run's that imports one at module level would leave every run on the default
    pools, and two micro-steps in flight on other bits than the configured ones."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", NOT_STARTED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow  # a fresh process that trains
def test_a_run_sets_its_thread_pools_before_the_runtime_starts(tmp_path, data_dir):
    # A fresh process, as `accum-train run` is: the pools are set and the summary says which.
    import json
    import subprocess
    import sys

    cfg = config_from_dict(
        {
            "model": {"width": 0.0625},
            "batch_size": 64,
            "subdivisions": 4,
            "epochs": 1,
            "data": {"dir": str(data_dir), "train_limit": 128, "test_limit": 100},
        }
    )
    (tmp_path / "cfg.yaml").write_text(cfg.to_yaml())
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "accum_train.cli.main",
            "run",
            str(tmp_path / "cfg.yaml"),
            "--output-dir",
            str(tmp_path / "run"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    cores = runtime.cpu_cores()
    expected = (2, max(1, cores // 2), 2) if cores >= 2 else (1, 0, 0)
    assert (summary["parallel_micro_steps"], summary["intra_op_threads"], summary["inter_op_threads"]) == expected


CONFIGURE = """
import json
import tensorflow as tf
from accum_train.config import config_from_dict
from accum_train.from_config.build import configure
reported = configure(config_from_dict({"batch_size": 256, "subdivisions": 8}))
tf.constant(1.0)  # the runtime starts with what configure left for it
print(json.dumps({**reported, "set_in_process": [tf.config.threading.get_intra_op_parallelism_threads(),
                                                 tf.config.threading.get_inter_op_parallelism_threads()]}))
"""


@pytest.mark.parametrize("variables", [{}, {"TF_NUM_INTRAOP_THREADS": "2", "TF_NUM_INTEROP_THREADS": "3"}])
def test_tf_num_variables_rule_over_the_pools_and_the_summary_says_so(variables):
    import json
    import subprocess
    import sys

    env = {**runtime.child_environment(None), **variables}
    done = subprocess.run([sys.executable, "-c", CONFIGURE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if variables:  # left to the runtime, which reads them; the summary reports them
        assert (got["intra_op_threads"], got["inter_op_threads"], got["set_in_process"]) == (2, 3, [0, 0])
    else:
        pools = runtime.thread_pools(2)
        expected = [pools["intra"], pools["inter"]] if runtime.cpu_cores() >= 2 else [0, 0]
        assert [got["intra_op_threads"], got["inter_op_threads"]] == got["set_in_process"] == expected
