"""Kill -9 at many points, SIGTERM, then --resume: the final weights equal an
uninterrupted run's and the latest checkpoint is always readable.

Slow (a fresh process per run): `pytest -m slow`, run by .ci/run."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("fault_runner.py")
CLI = [sys.executable, "-m", "accum_train.cli.main"]
# Two epochs of 47 updates; a checkpoint every 10 updates as well as at epoch ends.
ARGS = ["--set", "checkpoint.every_steps=10", "--set", "log_every=5", "--quiet"]


def run(cmd, env=None, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def reference(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("ref") / "run"
    done = run(CLI + ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)] + ARGS)
    assert done.returncode == 0, done.stderr
    return out


def assert_same_as_reference(run_dir, reference):
    a, b = np.load(reference / "weights.npz"), np.load(run_dir / "weights.npz")
    assert sorted(a) == sorted(b)
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a) < 1e-6
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == list(range(1, 95))  # every update once: nothing lost, nothing twice
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 94


def latest_is_readable(run_dir):
    latest = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    assert latest is not None
    reader = tf.train.load_checkpoint(latest)
    return int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))


@pytest.mark.parametrize("fault", [
    "update:7",             # mid-update, epoch 1
    "update:60",            # mid-update, epoch 2
    "checkpoint:3",         # during the step-20 checkpoint write
    "partial:4",            # a half-written checkpoint file left behind
    "after_checkpoint:6",   # right after the epoch-1 checkpoint: between epochs
    "metrics:4",            # halfway through a metrics.jsonl line
    "weights:1",            # while weights.npz is written, after the last checkpoint
])
def test_kill_then_resume_equals_uninterrupted(tmp_path, repo_root, reference, fault):
    out = tmp_path / "run"
    killed = run([sys.executable, str(RUNNER), "run", str(repo_root / "configs" / "smoke.yaml"),
                  "--output-dir", str(out)] + ARGS, env={"ACCUM_FAULT": fault})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    latest_is_readable(out)
    resumed = run(CLI + ["run", "--resume", str(out), "--quiet"])
    assert resumed.returncode == 0, resumed.stderr
    assert_same_as_reference(out, reference)


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_at_a_random_moment(tmp_path, repo_root, reference, seed):
    out = tmp_path / "run"
    child = subprocess.Popen(CLI + ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)]
                             + ARGS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(random.Random(seed).uniform(0.0, 3.0))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    latest_is_readable(out)
    resumed = run(CLI + ["run", "--resume", str(out), "--quiet"])
    assert resumed.returncode == 0, resumed.stderr
    assert_same_as_reference(out, reference)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_finishes_the_update_checkpoints_and_says_how_to_resume(tmp_path, repo_root, reference, sig, code):
    out = tmp_path / "run"
    child = subprocess.Popen(CLI + ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)]
                             + ARGS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.05)
    child.send_signal(sig)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == code
    step = latest_is_readable(out)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1] == (f"stopped by {signal.Signals(sig).name} after update {step}; checkpoint saved. "
                         f"Resume with: accum-train run --resume {out}")
    resumed = run(CLI + ["run", "--resume", str(out), "--quiet"])
    assert resumed.returncode == 0, resumed.stderr
    assert_same_as_reference(out, reference)
