"""Kill -9 at many points, SIGTERM, then --resume: the final weights equal an
uninterrupted run's and the latest checkpoint is always readable. The same for
accum_train.fit's output_dir: killed, then called again.

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
from accum_train.cli.main import main
from click.testing import CliRunner
from helpers import max_difference, update_records

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("fault_runner.py")
CLI = [sys.executable, "-m", "accum_train.cli.main"]
# Two epochs of 47 updates; a checkpoint every 10 updates as well as at epoch ends.
ARGS = ["--set", "checkpoint.every_steps=10", "--set", "log_every=5", "--quiet"]
# TensorFlow's start-up lines on stderr (absl and oneDNN notes, CPU features)
TF_LOG_LINES = ("WARNING: All log messages", "I0000", "W0000", "E0000", "To enable the following instructions")


def run(cmd, env=None, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module", autouse=True)
def same_thread_pools():
    """Every process of a case, killed or not, under the thread pools of this one (tests/conftest.py: one
    intra-op thread, two inter-op), where the resumes run: the smoke net's BatchNorm rounds by the pools."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TF_NUM_INTRAOP_THREADS", "1")
        patch.setenv("TF_NUM_INTEROP_THREADS", "2")
        yield


def resume(out):
    """`accum-train run --resume OUT --quiet`, in this process: no second TensorFlow start per case."""
    result = CliRunner().invoke(main, ["run", "--resume", str(out), "--quiet"])
    assert result.exit_code == 0, f"{result.output}{result.exception!r}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("ref") / "run"
    done = run(CLI + ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)] + ARGS)
    assert done.returncode == 0, done.stderr
    return out


def assert_same_as_reference(run_dir, reference):
    a, b = np.load(reference / "weights.npz"), np.load(run_dir / "weights.npz")
    assert sorted(a) == sorted(b)
    assert max_difference(a, b) < 1e-6
    steps = [r["step"] for r in update_records(run_dir)]
    assert steps == list(range(1, 95))  # every update once: nothing lost, nothing twice
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 94


def latest_is_readable(run_dir):
    latest = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    assert latest is not None
    reader = tf.train.load_checkpoint(latest)
    return int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))


# A checkpoint every 3 updates while metrics are written every 10: the updates a
# checkpoint counts must already be in metrics.jsonl.
BUFFERED = ["--set", "checkpoint.every_steps=3", "--set", "log_every=10", "--quiet"]


@pytest.mark.parametrize(
    "fault, args",
    [
        ("update:7", ARGS),  # mid-update, epoch 1
        ("update:60", ARGS),  # mid-update, epoch 2
        ("checkpoint:3", ARGS),  # during the step-20 checkpoint write
        ("partial:4", ARGS),  # a half-written checkpoint file left behind
        ("after_checkpoint:6", ARGS),  # right after the epoch-1 checkpoint: between epochs
        ("metrics:4", ARGS),  # halfway through a metrics.jsonl line
        ("weights:1", ARGS),  # while weights.npz is written, after the last checkpoint
        ("after_checkpoint:2", BUFFERED),  # right after ckpt-3, with updates 1-3 not yet due for a metrics write
        ("update:9", BUFFERED),  # between ckpt-6 and the first metrics write of the run
    ],
)
def test_kill_then_resume_equals_uninterrupted(tmp_path, repo_root, reference, fault, args):
    out = tmp_path / "run"
    killed = run(
        [sys.executable, str(RUNNER), "run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)]
        + args,
        env={"ACCUM_FAULT": fault},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    latest_is_readable(out)
    resume(out)
    assert_same_as_reference(out, reference)


def metrics_lines(run_dir):
    try:
        return (run_dir / "metrics.jsonl").read_text().count("\n")
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_at_a_random_moment(tmp_path, repo_root, reference, seed):
    """Killed at a random point of its progress (a number of metrics lines), so surely before the end."""
    out = tmp_path / "run"
    lines = random.Random(seed).randint(1, 60)  # of 96 (94 updates, 2 epochs), written 5 at a time
    child = subprocess.Popen(
        CLI + ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)] + ARGS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while metrics_lines(out) < lines and child.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL  # died of the kill, not of finishing
    assert not (out / "summary.json").exists() and not (out / "weights.npz").exists()
    assert latest_is_readable(out) < 94
    resume(out)
    assert_same_as_reference(out, reference)


def test_a_second_interrupt_exits_at_once_in_one_line(tmp_path, repo_root, reference):
    """The second SIGINT lands while the first one's checkpoint is being saved (the fault runner holds the save
    and says when): the run stops at once, in one line naming the intact checkpoint before it."""
    out, mark = tmp_path / "run", tmp_path / "saving"
    runner = Path(__file__).with_name("fault_runner.py")
    child = subprocess.Popen(
        [sys.executable, str(runner), "run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)]
        + [*ARGS, "--set", "checkpoint.every_steps=0"],  # saves: update 0, then the signal's (before epoch 1 ends)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ACCUM_FAULT": "pause_checkpoint:2", "ACCUM_FAULT_MARK": str(mark)},
    )
    deadline = time.time() + 120
    while metrics_lines(out) < 10 and time.time() < deadline:
        time.sleep(0.005)
    child.send_signal(signal.SIGINT)  # the first: finish the update, then checkpoint (save number 2)
    while not mark.exists() and child.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    assert mark.exists(), "the first signal's checkpoint never began"
    child.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, stderr = child.communicate(timeout=120)
    assert time.monotonic() - sent < 10
    assert child.returncode == 130
    # the runner imports TensorFlow before the CLI hides its start-up lines: the tool's own lines are the rest
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(TF_LOG_LINES)]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert latest_is_readable(out) == 0  # ckpt-0, the run's first: the interrupted save never happened
    assert lines[0] == (
        f"stopped at once by a second SIGINT; the last checkpoint (update 0) is intact. "
        f"Resume with: accum-train run --resume {out}"
    )
    resume(out)
    assert_same_as_reference(out, reference)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_finishes_the_update_checkpoints_and_says_how_to_resume(tmp_path, repo_root, reference, sig, code):
    out = tmp_path / "run"
    child = subprocess.Popen(
        CLI + ["run", str(repo_root / "configs" / "smoke.yaml"), "--output-dir", str(out)] + ARGS,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.05)
    child.send_signal(sig)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == code
    step = latest_is_readable(out)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1] == (
        f"stopped by {signal.Signals(sig).name} after update {step}; checkpoint saved. "
        f"Resume with: accum-train run --resume {out}"
    )
    resume(out)
    assert_same_as_reference(out, reference)


# accum_train.fit(..., output_dir=...) killed with SIGKILL, then called again as it was: tests/fit_kill_runner.py,
# 3 epochs of 4 updates, a checkpoint after each epoch (none during one: CHECKPOINT_SECONDS is far off).
FIT_RUNNER = Path(__file__).with_name("fit_kill_runner.py")
FIT_UPDATES, FIT_EPOCHS = 12, 3


def on(backend):  # a child's environment: Keras on ``backend`` (JAX on its CPU)
    return {**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"}


def call_fit(run_dir, result, backend):
    return run([sys.executable, str(FIT_RUNNER), str(run_dir), str(result)], env=on(backend))


def fit_records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def saved_checkpoints(run_dir):
    return sorted(int(p.name[len("ckpt-") : -len(".index")]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))


@pytest.fixture(scope="module", params=["tensorflow", "jax"])
def fit_backend(request):
    """The backend each fit case runs on: the run directory, its checkpoints and the resume on either."""
    if request.param == "jax":
        pytest.importorskip("jax")
    return request.param


@pytest.fixture(scope="module")
def fit_reference(tmp_path_factory, fit_backend):
    base = tmp_path_factory.mktemp(f"fit-ref-{fit_backend}")
    done = call_fit(base / "run", base / "result", fit_backend)
    assert done.returncode == 0, done.stderr
    return base


def kill_fit_when_held(hold, base, backend):
    """Start the call, wait until it holds at ``hold`` (fit_kill_runner's ACCUM_FIT_HOLD), kill -9 it there."""
    mark = base / "held"
    child = subprocess.Popen(
        [sys.executable, str(FIT_RUNNER), str(base / "run"), str(base / "killed")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**on(backend), "ACCUM_FIT_HOLD": hold, "ACCUM_FIT_MARK": str(mark)},
    )
    try:
        deadline = time.time() + 180
        while not mark.exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert mark.exists(), f"the call never reached {hold}: {child.poll()=}"
        child.send_signal(signal.SIGKILL)
        _, stderr = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, stderr  # died of the kill, not of anything before it
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=60)


@pytest.fixture(scope="module")
def fit_killed_then_called_again(tmp_path_factory, fit_backend):
    """hold -> (run directory as the kill left it: last step logged, checkpoints; the base folder after the
    second call). Each case runs once for the tests that read it."""
    done = {}

    def case(hold):
        if hold not in done:
            base = tmp_path_factory.mktemp(f"fit-{fit_backend}-" + hold.replace(":", "-"))
            kill_fit_when_held(hold, base, fit_backend)
            records = fit_records(base / "run") if (base / "run" / "metrics.jsonl").exists() else []
            left = (records[-1]["step"] if records else 0, saved_checkpoints(base / "run"))
            again = call_fit(base / "run", base / "result", fit_backend)
            assert again.returncode == 0, again.stderr
            done[hold] = left, base
        return done[hold]

    return case


# (where the kill lands, the last update metrics.jsonl holds then, the checkpoints there are then)
FIT_KILLS = [
    ("update:6", 5, [4]),  # mid-epoch 2: update 5 logged after the epoch-1 checkpoint, lost with the process
    ("save:2", 8, [4]),  # epoch 2's records all written, its end included; its checkpoint not
    ("update:3", 2, []),  # mid-epoch 1, before the first checkpoint: the call starts again from nothing
    ("save:1", 4, []),  # epoch 1's records all written, the first checkpoint not
]


@pytest.mark.parametrize("hold, logged, checkpoints", FIT_KILLS, ids=[h for h, _, _ in FIT_KILLS])
def test_fit_killed_then_called_again_ends_at_the_uninterrupted_weights(
    fit_reference, fit_killed_then_called_again, hold, logged, checkpoints
):
    left, base = fit_killed_then_called_again(hold)
    assert left == (logged, checkpoints)  # the kill fell where the case says
    expected, got = np.load(fit_reference / "result.npz"), np.load(base / "result.npz")
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert json.loads((base / "run" / "summary.json").read_text())["steps"] == FIT_UPDATES


@pytest.mark.parametrize("hold", [h for h, _, _ in FIT_KILLS])
def test_fit_killed_then_called_again_logs_each_update_and_epoch_once_with_its_figures(
    fit_reference, fit_killed_then_called_again, hold
):
    _, base = fit_killed_then_called_again(hold)
    expected, got = fit_records(fit_reference / "run"), fit_records(base / "run")
    updates = [r for r in got if not r.get("epoch_end")]
    assert [r["step"] for r in updates] == list(range(1, FIT_UPDATES + 1))  # nothing lost, nothing twice
    ends = [(r["epoch"], r["step"]) for r in got if r.get("epoch_end")]
    assert ends == [(e + 1, (e + 1) * FIT_UPDATES // FIT_EPOCHS) for e in range(FIT_EPOCHS)]
    assert [sorted(r) for r in got] == [sorted(r) for r in expected]
    for name in ("loss", "mae"):  # each update's and epoch's logs are the uninterrupted call's
        np.testing.assert_allclose([r[name] for r in got], [r[name] for r in expected], rtol=0, atol=1e-6)
    history, reference = (
        json.loads((base / "result.json").read_text()),
        json.loads((fit_reference / "result.json").read_text()),
    )
    assert history["epoch"] == reference["epoch"] == list(range(FIT_EPOCHS))
    assert sorted(history["history"]) == sorted(reference["history"])
    for name, values in reference["history"].items():
        np.testing.assert_allclose(history["history"][name], values, rtol=0, atol=1e-6, err_msg=name)
