"""tf.distribute: 2 logical CPUs (mirrored) and 2 local workers equal single-device
training, with BatchNorm, clipping and subdivisions=auto; one all-reduce per update;
the launcher's watchdog; a killed worker, then resume.

Every case runs in fresh processes: logical devices and the multi-worker runtime
can only be set up before TensorFlow has run anything. Worker traffic stays on
loopback inside a private network namespace (unshare -rn) where available.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.slow  # fresh processes, about 5 minutes: `make test-slow`, run by CI

CLI = [sys.executable, "-m", "accum_train.cli.main", "run"]
HERE = Path(__file__).parent
# 200 examples / batch 64: three updates and a short one of 8; 3 micro-batches per replica are ragged.
SMALL = [
    "--set",
    "model.norm=none",
    "--set",
    "data.train_limit=200",
    "--set",
    "subdivisions=3",
    "--set",
    "epochs=2",
    "--quiet",
]


@pytest.fixture(scope="module", autouse=True)
def same_thread_pools():
    """Every run of this module, reference or distributed, under the same thread pools: the
    convolutions' rounding depends on how many threads split them, and BatchNorm on micro-batches of
    one or two examples amplifies it (measured: 3e-4 to 5e-3 apart after 8 updates between a
    one-device run with one thread per op and a mirrored run with TensorFlow's default pools)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TF_NUM_INTRAOP_THREADS", "1")
        patch.setenv("TF_NUM_INTEROP_THREADS", "2")
        yield


def private_network(command):
    """The command inside a new user+network namespace with loopback up, if this machine allows it."""
    if (
        shutil.which("unshare")
        and shutil.which("ip")
        and subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    ):
        quoted = " ".join(f"'{part}'" for part in command)
        return ["unshare", "-rn", "sh", "-c", f"ip link set lo up && exec {quoted}"]
    return command


def run(command, timeout=300):
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def weights(run_dir):
    return np.load(Path(run_dir) / "weights.npz")


def max_diff(a, b):
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


@pytest.fixture(scope="module")
def single(tmp_path_factory, repo_root):
    """Single-device references, SGD and Adam."""
    out = {}
    for optimizer in ("sgd", "adam"):
        d = tmp_path_factory.mktemp("single") / optimizer
        done = run(
            CLI
            + [
                str(repo_root / "configs" / "smoke.yaml"),
                "--output-dir",
                str(d),
                *SMALL,
                "--set",
                f"optimizer.name={optimizer}",
            ]
        )
        assert done.returncode == 0, done.stderr
        out[optimizer] = d
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mirrored_on_two_logical_cpus_equals_single_device(tmp_path, repo_root, single, optimizer):
    d = tmp_path / "mirrored"
    done = run(
        CLI
        + [
            str(repo_root / "configs" / "smoke.yaml"),
            "--output-dir",
            str(d),
            *SMALL,
            "--set",
            f"optimizer.name={optimizer}",
            "--set",
            "strategy.name=mirrored",
            "--set",
            "strategy.cpu_devices=2",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        "batch_size=64 over 2 replicas (32-32 examples each), each as 3 "
        "micro-batches of up to 11 examples; one gradient all-reduce per update"
    )
    assert max_diff(weights(d), weights(single[optimizer])) < 1e-5
    assert json.loads((d / "summary.json").read_text())["steps"] == 8


def test_two_workers_with_sgd_equal_single_device(tmp_path, repo_root, single):
    """SGD is not scale-invariant (Adam nearly is): a MEAN-for-SUM or 1/num_workers error shows here."""
    d = tmp_path / "workers"
    done = run(
        private_network(
            CLI
            + [
                str(repo_root / "configs" / "smoke.yaml"),
                "--output-dir",
                str(d),
                *SMALL,
                "--set",
                "optimizer.name=sgd",
                "--workers",
                "2",
            ]
        )
    )
    assert done.returncode == 0, done.stderr
    assert max_diff(weights(d), weights(single["sgd"])) < 1e-5


def test_two_workers_equal_single_device_and_only_the_chief_writes(tmp_path, repo_root, single):
    d = tmp_path / "workers"
    done = run(
        private_network(
            CLI
            + [
                str(repo_root / "configs" / "smoke.yaml"),
                "--output-dir",
                str(d),
                *SMALL,
                "--set",
                "optimizer.name=adam",
                "--workers",
                "2",
            ]
        )
    )
    assert done.returncode == 0, done.stderr
    assert max_diff(weights(d), weights(single["adam"])) < 1e-5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["workers"]
    assert sorted(p.name for p in d.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "dataset.json",
        "metrics.jsonl",
        "summary.json",
        "tensorboard",
        "weights.npz",
    ]
    records = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, 9))  # written once, by the chief
    assert done.stdout.splitlines()[-1].startswith("test accuracy ")
    # --resume of a distributed run: two more epochs on the same two workers
    more = run(private_network(CLI + ["--resume", str(d), "--set", "epochs=4", "--workers", "2", "--quiet"]))
    assert more.returncode == 0, more.stderr
    assert json.loads((d / "summary.json").read_text())["steps"] == 16


# BatchNorm on, clipping at 0.5 (active: the updates' norms are near 1). 200 examples in batches of 64:
# three full updates and a short one of 8. Global batch sizes are even, so 2 replicas x k micro-batches
# cut every batch exactly where 1 device x 2k does (micro-batches of 10-11, then 1-2).
BN_CLIP = ["--set", "epochs=2", "--set", "optimizer.clip_norm=0.5", "--quiet"]
# Replicas sum their halves, one device sums in sequence: the two differ by float rounding (1e-8), which
# BatchNorm on tiny micro-batches and large steps amplify. Measured at k=8 against 16: SGD at 0.2 and
# Adam at 0.01 end 1e-3 apart. With fused BatchNorm (rounding of its own), Adam at 0.003 ended 9.1e-5
# apart in the mirrored subdivisions=auto case, so Adam runs at 0.001 here (all cases under 1e-5).
LEARNING_RATE = {"sgd": "0.05", "adam": "0.001"}
# The subdivisions=auto cases take full batches only (192 examples): with the short batch cut into
# one-example micro-batches the same rounding grows to 6e-4 by the last update (SGD, k=8).
REFERENCES = [("sgd", 6, 200), ("adam", 6, 200), ("sgd", 4, 192), ("adam", 4, 192), ("sgd", 8, 192), ("adam", 8, 192)]


def bn_args(optimizer, examples):
    return [
        *BN_CLIP,
        "--set",
        f"data.train_limit={examples}",
        "--set",
        f"optimizer.name={optimizer}",
        "--set",
        f"optimizer.learning_rate={LEARNING_RATE[optimizer]}",
    ]


@pytest.fixture(scope="module")
def single_bn(tmp_path_factory, repo_root):
    """One device, BatchNorm and clipping, with the subdivisions 2 replicas x k cut the same way."""
    out = {}
    for optimizer, k, examples in REFERENCES:
        d = tmp_path_factory.mktemp("single_bn") / f"{optimizer}-{k}"
        done = run(
            CLI
            + [
                str(repo_root / "configs" / "smoke.yaml"),
                "--output-dir",
                str(d),
                *bn_args(optimizer, examples),
                "--set",
                f"subdivisions={k}",
            ]
        )
        assert done.returncode == 0, done.stderr
        out[optimizer, k] = d
    return out


def distributed(where, args, output_dir, env=None):
    """A run on 2 logical CPUs (mirrored) or 2 local workers; the finished process."""
    if where == "mirrored":
        command = CLI + [
            *args,
            "--output-dir",
            str(output_dir),
            "--set",
            "strategy.name=mirrored",
            "--set",
            "strategy.cpu_devices=2",
        ]
        runner = HERE / "peak_runner.py"
    else:
        command = CLI + [*args, "--output-dir", str(output_dir), "--workers", "2"]
        runner = HERE / "launch_runner.py"
    if env:
        command = [sys.executable, str(runner), *command[len(CLI) - 1 :]]
    return subprocess.run(
        private_network(command), capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize("where", ["mirrored", "workers"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_batchnorm_and_clipping_across_replicas_equal_one_device_with_twice_the_micro_batches(
    tmp_path, repo_root, single_bn, where, optimizer
):
    d = tmp_path / where
    done = distributed(
        where, [str(repo_root / "configs" / "smoke.yaml"), *bn_args(optimizer, 200), "--set", "subdivisions=3"], d
    )
    assert done.returncode == 0, done.stderr
    ours, reference = weights(d), weights(single_bn[optimizer, 6])
    # every weight and the moving statistics (weights.npz holds both), after 8 updates
    assert max_diff(ours, reference) < 1e-5
    assert float(np.max(np.abs(ours["bn1/moving_var"] - 1.0))) > 1e-3  # the statistics did move
    norms = [
        r["grad_norm"]
        for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
        if "grad_norm" in r and r["grad_norm"] is not None
    ]
    assert len(norms) == 8 and max(norms) > 0.5  # clipping acted


@pytest.mark.parametrize(
    "where, optimizer, lines, k",
    [
        # one process: the probe fits at k=1, the first whole update does not; retried at k=2
        (
            "mirrored",
            "sgd",
            [
                "subdivisions=auto: micro-batch of 32 -> 32 MiB (memory_limit=40MiB)",
                "subdivisions=auto chose 1",
                "update 1 peaked at 48 MiB of TensorFlow memory with subdivisions=1, over "
                "memory_limit=40MiB: retrying the same batch with subdivisions=2",
            ],
            2,
        ),
        # worker 1 needs twice the memory: both take its k=2, and both retry the first update at k=4
        (
            "workers",
            "adam",
            [
                "subdivisions=auto: micro-batch of 32 -> 32 MiB (memory_limit=40MiB)",
                "subdivisions=auto chose 2 (another worker needs it; 1 fits here)",
                "update 1 ran out of memory or over memory_limit on another worker with "
                "subdivisions=2: retrying the same batch with subdivisions=4",
            ],
            4,
        ),
        ("mirrored", "adam", None, 2),
        ("workers", "sgd", None, 4),
    ],
)
def test_auto_subdivisions_agree_on_every_replica_and_worker(
    tmp_path, repo_root, single_bn, where, optimizer, lines, k
):
    d = tmp_path / where
    done = distributed(
        where,
        [
            str(repo_root / "configs" / "smoke.yaml"),
            *bn_args(optimizer, 192),
            "--set",
            "subdivisions=auto",
            "--set",
            "memory_limit=40MiB",
        ],
        d,
        env={"ACCUM_LAUNCH_FAULT": "peaks"},
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    if lines:  # the probe and the choice, then (after the line on the split) the retry
        assert printed[: len(lines) - 1] == lines[:-1] and lines[-1] in printed
    assert json.loads((d / "summary.json").read_text())["subdivisions"] == k
    # the retried first update was applied once, at the agreed k: 1 device with 2k gives the same weights
    assert max_diff(weights(d), weights(single_bn[optimizer, 2 * k])) < 1e-5


COUNT_SCRIPT = """
import json, sys
import tensorflow as tf
from accum_train.config import StrategyConfig
from accum_train.distribute import CountingCrossDeviceOps, make_strategy
ops = CountingCrossDeviceOps()
strategy = make_strategy(StrategyConfig(name="mirrored", cpu_devices=2), cross_device_ops=ops)
from accum_train.config import ModelConfig, OptimizerConfig
from accum_train.engine import AccumulatingUpdate, sparse_softmax_loss
from accum_train.models import build_model
from accum_train.optim import make_optimizer
k = int(sys.argv[1])
with strategy.scope():
    model = build_model(ModelConfig(name="mlp", norm="batchnorm", hidden=16), 0, (28, 28, 1), 10)
    opt = make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1), 0.1, model.trainable_variables)
update = AccumulatingUpdate(sparse_softmax_loss(model.forward), model.trainable_variables, opt, k,
                            clip_norm=1.0, norm_layers=model.norm_layers, strategy=strategy)
x, y = tf.random.uniform([64, 28, 28, 1]), tf.zeros([64], tf.int32)
counts = []
for _ in range(3):
    before = (ops.batch_reduce_calls, ops.reduce_calls)
    update.update(x, y)
    counts.append([ops.batch_reduce_calls - before[0], ops.reduce_calls - before[1]])
print(json.dumps(counts))
"""


SKIP_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
from accum_train.config import StrategyConfig
from accum_train.distribute import make_strategy
strategy = make_strategy(StrategyConfig(name="mirrored", cpu_devices=2))
from accum_train.config import ModelConfig, OptimizerConfig
from accum_train.engine import AccumulatingUpdate, sparse_softmax_loss
from accum_train.models import build_model
from accum_train.optim import make_optimizer
with strategy.scope():
    model = build_model(ModelConfig(name="mlp", norm="batchnorm", hidden=16), 0, (28, 28, 1), 10)
    opt = make_optimizer(OptimizerConfig(name="adam", learning_rate=0.01), 0.01, model.trainable_variables)
update = AccumulatingUpdate(sparse_softmax_loss(model.forward), model.trainable_variables, opt, 3,
                            clip_norm=1.0, norm_layers=model.norm_layers, strategy=strategy)
x = np.random.default_rng(0).random((40, 28, 28, 1), dtype=np.float32)
y = np.arange(40, dtype=np.int32) % 10
bad = x.copy()
bad[30, 5, 5, 0] = np.nan  # in replica 1's share (examples 20-39) only
before = [v.numpy().copy() for v in model.variables + opt.variables]
skipped = update.update(tf.constant(bad), tf.constant(y))
unchanged = all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables + opt.variables))
applied = update.update(tf.constant(x), tf.constant(y))
moved = not np.array_equal(before[0], model.variables[0].numpy())
print(json.dumps({"skipped": not bool(skipped["applied"]), "unchanged": unchanged, "applied": bool(applied["applied"]),
                  "moved": moved, "skipped_updates": int(update.skipped_updates.numpy()),
                  "bad_in_a_row": int(update.bad_updates_in_a_row.numpy()),
                  "iterations": int(opt.iterations.numpy())}))
"""


def test_a_nan_on_one_replica_skips_the_update_on_all_in_one_graph_call():
    """The finite check acts on the all-reduced values: one replica's NaN makes every replica skip."""
    done = run([sys.executable, "-c", SKIP_SCRIPT])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "skipped": True,
        "unchanged": True,
        "applied": True,
        "moved": True,
        "skipped_updates": 1,
        "bad_in_a_row": 0,
        "iterations": 1,
    }


@pytest.mark.parametrize("k", [1, 8])
def test_one_gradient_all_reduce_per_update(k):
    done = run([sys.executable, "-c", COUNT_SCRIPT, str(k)])
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    # The first update traces its graph: one batched all-reduce of the gradients, the loss, the
    # retry flag and the BatchNorm sums, whatever k is; clipping and the skip decision add none.
    assert counts[0] == [1, 0]
    assert counts[1:] == [[0, 0], [0, 0]]  # later updates reuse the traced graphs: no new collectives


@pytest.mark.parametrize(
    "fault, message",
    [
        (
            "hang",
            "error: training did not start within 15 s: worker 0 was still waiting for its peers; "
            "stopped all 2 workers "
            "(the last checkpoint stays readable)",
        ),
        ("die:3", "error: worker 1 was killed by SIGKILL; stopped all 2 workers (the last checkpoint stays readable)"),
    ],
)
def test_launcher_stops_every_worker_when_one_fails(tmp_path, repo_root, fault, message):
    d = tmp_path / "run"
    started = time.monotonic()
    done = subprocess.run(
        private_network(
            [
                sys.executable,
                str(HERE / "launch_runner.py"),
                "run",
                str(repo_root / "configs" / "smoke.yaml"),
                "--output-dir",
                str(d),
                *SMALL,
                "--set",
                "strategy.worker_timeout_s=15",
                "--workers",
                "2",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "ACCUM_LAUNCH_FAULT": fault},
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == message
    assert time.monotonic() - started < 120  # bounded: nothing hangs
    if fault.startswith("die"):
        latest = tf.train.latest_checkpoint(str(d / "checkpoints"))
        assert latest is not None
        tf.train.load_checkpoint(latest).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")


def test_kill_one_worker_then_resume_reaches_the_uninterrupted_weights(tmp_path, repo_root):
    """kill -9 of worker 1 at its 6th update: the chief stops within worker_timeout_s with one line, and
    `--resume --workers 2` ends where an uninterrupted 2-worker run ends, to 1e-6."""
    args = [
        str(repo_root / "configs" / "smoke.yaml"),
        *SMALL,
        "--set",
        "optimizer.name=sgd",
        "--set",
        "checkpoint.every_steps=2",
        "--set",
        "strategy.worker_timeout_s=15",
        "--workers",
        "2",
    ]
    whole = run(private_network(CLI + args + ["--output-dir", str(tmp_path / "whole")]))
    assert whole.returncode == 0, whole.stderr
    cut = tmp_path / "cut"
    started = time.monotonic()
    killed = subprocess.run(
        private_network([sys.executable, str(HERE / "launch_runner.py"), "run", *args, "--output-dir", str(cut)]),
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "ACCUM_LAUNCH_FAULT": "die:6"},
    )
    assert killed.returncode == 1
    assert killed.stderr.strip().splitlines()[-1] == (
        "error: worker 1 was killed by SIGKILL; stopped all 2 workers (the last checkpoint stays readable)"
    )
    assert time.monotonic() - started < 15 + 60  # the start, then at most worker_timeout_s
    step = int(
        tf.train.load_checkpoint(tf.train.latest_checkpoint(str(cut / "checkpoints"))).get_tensor(
            "step/.ATTRIBUTES/VARIABLE_VALUE"
        )
    )
    assert 0 < step < 8 and not (cut / "weights.npz").exists()
    resumed = run(private_network(CLI + ["--resume", str(cut), "--workers", "2", "--quiet"]))
    assert resumed.returncode == 0, resumed.stderr
    assert max_diff(weights(cut), weights(tmp_path / "whole")) < 1e-6
    steps = [json.loads(x)["step"] for x in (cut / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(x)]
    assert steps == list(range(1, 9))  # every update once, written by the chief
