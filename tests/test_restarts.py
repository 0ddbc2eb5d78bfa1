"""Faults under `run --workers N`, with real workers.

Restarts: at each of 3 moments drawn at random (the seed is printed) this
test kills -9 a worker drawn at random, by its pid, while watching
metrics.jsonl; with --max-restarts 3 the supervisor starts both again from
the last checkpoint each time (its restart line names the worker and
SIGKILL: the proof that each kill happened), and the run ends at the weights
of an uninterrupted one with every update once in metrics.jsonl.

Preemption: SIGTERM to worker 1 (or SIGINT to the supervisor) stops both
workers after the same update, with one checkpoint, and --resume continues
exactly.

Workers run on loopback inside a private network namespace and under
test_distribute's thread pools.
"""

import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import helpers
import pytest
from accum_train.trainer.store.checkpoints import checkpoint_numbers
from helpers import max_difference
from test_distribute import CLI, SMALL, private_network, run, same_thread_pools, weights  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.workers]

# 4 updates per epoch (test_distribute's small run, BN-free, SGD): 20 updates, a checkpoint after each
# second one, so a restart goes back at most one update.
ARGS = [*SMALL, "--set", "epochs=5", "--set", "optimizer.name=sgd", "--set", "checkpoint.every_steps=2"]
ARGS += ["--set", "strategy.worker_timeout_s=60"]
TOTAL = 20


def highest_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    steps = [0]
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the kill
            steps.append(record.get("step", 0))
    return max(steps)


def events(run_dir: Path) -> int:
    """How many starts and resumes history.jsonl records (complete lines only)."""
    path = run_dir / "history.jsonl"
    return sum(line.endswith("}") for line in path.read_text().splitlines()) if path.exists() else 0


def worker_pid(supervisor: int, index: int) -> int | None:
    """The pid of worker ``index`` among the supervisor's children, if it runs now."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == supervisor and f"ACCUM_TRAIN_WORKER={index}".encode() in environ:
            return int(entry.name)
    return None


@pytest.fixture(scope="module")
def whole(tmp_path_factory, repo_root):
    """An uninterrupted 2-worker run: what every test here must end at."""
    out = tmp_path_factory.mktemp("whole") / "run"
    done = run(
        private_network(
            [*CLI, str(repo_root / "configs" / "smoke.yaml"), *ARGS, "--workers", "2", "--output-dir", str(out)]
        )
    )
    assert done.returncode == 0, done.stderr
    return out


def test_workers_killed_at_three_random_moments_restart_to_the_uninterrupted_weights(tmp_path, repo_root, whole):
    smoke = str(repo_root / "configs" / "smoke.yaml")

    seed = random.randrange(2**32)
    print(f"kill seed {seed}")
    rng = random.Random(seed)
    moments = sorted(rng.sample(range(2, TOTAL - 2), 3))  # the highest step logged before each kill
    victims = [rng.randrange(2) for _ in moments]
    cut = tmp_path / "cut"
    command = [*CLI, smoke, *ARGS, "--workers", "2", "--max-restarts", "3", "--output-dir", str(cut)]
    supervisor = subprocess.Popen(private_network(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(supervisor.stdout), daemon=True)
    reader.start()
    killed = []
    try:
        for moment, victim in zip(moments, victims):
            deadline = time.monotonic() + 240
            # After a restart, wait until the new workers have resumed (the chief records the resume in
            # history.jsonl after cutting metrics.jsonl back): before that, the old metrics can already reach
            # the next moment, and the victim may not have been started yet.
            pid = None
            while pid is None:
                assert supervisor.poll() is None, supervisor.stderr.read()
                assert time.monotonic() < deadline, f"no progress to update {moment} (seed {seed})"
                if events(cut) > len(killed) and highest_step(cut) >= moment:
                    pid = worker_pid(supervisor.pid, victim)
                time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
            killed.append((victim, highest_step(cut)))
        supervisor.wait(timeout=300)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    reader.join(timeout=10)
    assert supervisor.returncode == 0, supervisor.stderr.read()
    restarts = [line.rstrip("\n") for line in lines if "restarting all" in line]
    assert restarts == [
        f"worker {victim} was killed by SIGKILL: restarting all 2 workers from the last checkpoint (restart {i} of 3)"
        for i, (victim, _) in enumerate(killed, start=1)
    ], f"seed {seed}, kills at {killed}"
    summary = json.loads((cut / "summary.json").read_text())
    assert (summary["restarts"], summary["steps"]) == (3, TOTAL)
    records = helpers.records(cut)
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, TOTAL + 1))  # every update once
    history = [json.loads(x)["event"] for x in (cut / "history.jsonl").read_text().splitlines()]
    assert history == ["start", "resume", "resume", "resume"]
    assert max_difference(weights(cut), weights(whole)) < 1e-6


@pytest.mark.parametrize(
    "target, sig",
    [("worker 1", signal.SIGTERM), ("the supervisor", signal.SIGINT)],
    ids=["sigterm-to-worker-1", "sigint-to-the-supervisor"],
)
def test_a_signal_to_one_process_stops_every_worker_after_the_same_update(tmp_path, repo_root, whole, target, sig):
    """The signal rides in the next update's all-reduce: both workers checkpoint after that same update and exit
    128 + n by themselves (the supervisor's line would name one that did not), and --resume continues exactly."""
    smoke = str(repo_root / "configs" / "smoke.yaml")
    cut = tmp_path / "cut"
    command = [*CLI, smoke, *ARGS, "--workers", "2", "--output-dir", str(cut)]
    supervisor = subprocess.Popen(private_network(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while highest_step(cut) < 5:
            assert supervisor.poll() is None, supervisor.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        pid = supervisor.pid if target == "the supervisor" else worker_pid(supervisor.pid, 1)
        os.kill(pid, sig)
        _, stderr = supervisor.communicate(timeout=240)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert supervisor.returncode == 128 + sig
    records = helpers.records(cut)
    steps = [r["step"] for r in records if "loss" in r]
    step = steps[-1]
    assert steps == list(range(1, step + 1)) and 5 <= step < TOTAL
    assert stderr.strip().splitlines()[-1] == (
        f"stopped by {sig.name} after update {step}; checkpoint saved. "
        f"Resume with: accum-train run --resume {cut} --workers 2"
    )
    assert checkpoint_numbers(cut / "checkpoints")[0] == step  # newest by number, not by name
    resumed = run(private_network([*CLI, "--resume", str(cut), "--workers", "2", "--quiet"]))
    assert resumed.returncode == 0, resumed.stderr
    assert max_difference(weights(cut), weights(whole)) < 1e-6
