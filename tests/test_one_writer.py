"""One writer per run directory: a second process that would write a live run
directory is refused at once (one line naming the writer's pid, exit 2,
nothing written); readers go on; a writer killed with -9 blocks no one.

The live writer is a real `accum-train run` process, stopped (SIGSTOP) once it
holds the lock so that it stays in the middle of its run; the other commands
run in this test's process, a second process as far as the kernel's lock
goes.
"""

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest
from accum_train.cli.main import main
from accum_train.errors import RunDirError
from accum_train.trainer.store.lock import LOCK, LOCK_HELD, lock_holder, writing
from click.testing import CliRunner

# The cases with a live writer (a real process and a whole run) are in the slow suite with the other kill and
# resume cases (make test-slow); the lock's own rules run in the default suite (milliseconds).

SETTINGS = ["data.train_limit=640", "data.test_limit=200", "epochs=2", "checkpoint.every_steps=2"]


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def snapshot(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def refusal(flag, run_dir, pid):
    return (
        f"error: {flag}{run_dir} is in use: process {pid} is writing it (one writer per run directory); "
        f"wait for it to end or stop it, then try again\n"
    )


@pytest.fixture
def live_writer(tmp_path, repo_root):
    """(run directory, pid) of an `accum-train run` stopped while it holds the run directory's lock."""
    run_dir = tmp_path / "run"
    sets = [item for s in SETTINGS for item in ("--set", s)]
    command = [sys.executable, "-m", "accum_train.cli.main", "run", str(repo_root / "configs" / "smoke.yaml")]
    process = subprocess.Popen(
        [*command, "--output-dir", str(run_dir), *sets, "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while lock_holder(run_dir) is None or not (run_dir / "checkpoints" / "checkpoint").is_file():
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "the run never took its lock"
            time.sleep(0.05)
        process.send_signal(signal.SIGSTOP)
        yield run_dir, process
    finally:
        process.kill()
        process.wait()
        process.stderr.close()


@pytest.mark.slow
def test_a_second_writer_is_refused_and_readers_go_on(live_writer, tmp_path, repo_root):
    run_dir, writer = live_writer
    assert lock_holder(run_dir) == str(writer.pid)
    before = snapshot(run_dir)
    # (command, the flag its message names)
    writers = [
        (["run", "--resume", run_dir], "--resume "),
        (["run", repo_root / "configs" / "smoke.yaml", "--output-dir", run_dir], "--output-dir "),
        (["compare", repo_root / "configs" / "smoke.yaml", "--output-dir", run_dir], "--output-dir "),
    ]
    for args, flag in writers:
        started = time.monotonic()
        result = cli(*args)
        assert (result.exit_code, result.stderr) == (2, refusal(flag, run_dir, writer.pid)), args
        assert time.monotonic() - started < 30  # at once, not after waiting for the writer
    assert snapshot(run_dir) == before
    # readers are not blocked
    assert cli("export", run_dir, "--output", tmp_path / "model.keras").exit_code == 0
    assert (tmp_path / "model.keras").stat().st_size > 0
    result = cli("evaluate", run_dir, "--output-dir", tmp_path / "evaluated")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "evaluated" / "evaluate.json").is_file()
    assert cli("plan", run_dir / "config.yaml").exit_code == 0


@pytest.mark.slow
def test_a_writer_killed_with_9_blocks_no_one(live_writer):
    run_dir, writer = live_writer
    writer.kill()
    writer.wait()
    assert (run_dir / LOCK).read_text() == f"{writer.pid}\n"  # the file stays; the kernel dropped the lock
    assert lock_holder(run_dir) is None
    result = cli("run", "--resume", run_dir)
    assert result.exit_code == 0, result.output
    assert (run_dir / "summary.json").is_file()
    assert (run_dir / LOCK).read_text() == f"{os.getpid()}\n"  # the last writer
    assert lock_holder(run_dir) is None  # released when the run ended


def test_the_lock_is_held_for_the_block_and_a_supervisor_holds_it_for_its_workers(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.delenv(LOCK_HELD, raising=False)
    with writing(run_dir, "--output-dir ", for_children=True):
        assert os.environ[LOCK_HELD] == str(run_dir.resolve())
        with writing(run_dir, "--resume "):  # a worker of this supervisor: it holds the lock for it
            pass
        monkeypatch.delenv(LOCK_HELD)
        with pytest.raises(RunDirError) as refused, writing(run_dir, "--resume "):
            pass
        assert str(refused.value) == refusal("--resume ", run_dir, os.getpid()).removeprefix("error: ").rstrip()
        monkeypatch.setenv(LOCK_HELD, str(run_dir.resolve()))
    assert LOCK_HELD not in os.environ
    with writing(run_dir):  # released: the next writer takes it
        assert lock_holder(run_dir) == str(os.getpid())  # flock is per open file: even this process sees it held
