"""``accum-train run --workers N``: N local worker processes under a watchdog.

Each worker is the core's own training process (``python -m accum_train.worker``)
with ``strategy.name=multi_worker`` and a TF_CONFIG naming N ports on 127.0.0.1
(worker 0 is the chief and writes the run directory). The watchdog stops every
worker, within a bounded time, as soon as one fails or one has not started
training within ``strategy.worker_timeout_s``: a missing peer would otherwise
leave the others blocked in a collective for minutes.

The supervisor checks everything once (config, output directory, data) and
hands every worker the same resolved config file; it never imports
TensorFlow, so it stays light and cannot disturb the workers' runtime.

TF's gRPC server listens on all interfaces without authentication, whatever
address TF_CONFIG names: run workers on a private network (the tests use a
private network namespace, ``unshare -rn``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..config import Config, config_from_dict
from ..errors import OUT_OF_MEMORY_LINE, DataError, OutOfMemory, UserError, WorkerFailed, WorkersInterrupted
from ..files import atomic_write
from ..processes import (
    INTERRUPTED_CODES,
    RESTARTS,
    STARTED_FILE,
    STOP_SIGNALS,
    error_message,
    last_error,
    run_child,
    training_process,
)
from ..trainer.store.checkpoints import checkpoint_numbers
from ..trainer.store.lock import writing
from ..trainer.store.rundir import check_output_dir

# stderr lines a worker keeps for its failure's one line (a traceback's last lines are what matter)
KEPT_ERROR_LINES = 200


def worker_command(run_args: list[str], index: int) -> list[str]:
    """Worker ``index``'s command line (the tests replace one worker through this)."""
    return training_process(*run_args)


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class _Worker:
    def __init__(self, index: int, command: list[str], env: dict, say: Callable[[str], None]):
        self.index = index
        self.started_file = Path(env[STARTED_FILE])
        self.errors = collections.deque(maxlen=KEPT_ERROR_LINES)
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, say), daemon=True),
            threading.Thread(target=self.errors.extend, args=(self.process.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, say):
        for line in stream:
            if self.index == 0:
                say(line.rstrip("\n"))

    def stop(self):
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def finish(self):
        self.process.wait()
        for reader in self._readers:
            reader.join(timeout=5)


def launch(
    run_args: list[str], workers: int, timeout_s: float, say: Callable[[str], None], env: dict | None = None
) -> tuple:
    """Run the workers to the end; (0, None), or the exit code of the run (OutOfMemory's if a worker ran out of
    memory, a worker's own 130 or 143 if a signal stopped it, else WorkerFailed's) and why it failed. ``env``:
    more variables for every worker."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(workers)]}
    with tempfile.TemporaryDirectory(prefix="accum-train-started-") as flags:
        pool = []
        for index in range(workers):
            command = worker_command(run_args, index)  # before the environment: a test's sets variables in it
            variables = {
                **os.environ,
                "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
                "ACCUM_TRAIN_WORKER": str(index),
                STARTED_FILE: str(Path(flags) / f"worker-{index}"),
                **(env or {}),
            }
            pool.append(_Worker(index, command, variables, say))
        with _forwarding_signals_to(pool[0]):
            return _watch(pool, timeout_s)


@contextlib.contextmanager
def _forwarding_signals_to(chief: _Worker):
    """SIGINT/SIGTERM to the supervisor go to the chief, which puts them into the next update's all-reduce:
    every worker then checkpoints and stops after that same update."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    forward = lambda signum, frame: chief.process.send_signal(signum)  # noqa: E731
    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _watch(pool: list, timeout_s: float) -> tuple:
    launched = time.monotonic()
    failure, exit_code = None, WorkerFailed.exit_code
    while failure is None:
        codes = [w.process.poll() for w in pool]
        if all(code == 0 for code in codes):
            break
        for worker, code in zip(pool, codes):
            if code not in (None, 0):
                why = last_error(worker.errors, default="")
                if code == OutOfMemory.exit_code and why.startswith(OUT_OF_MEMORY_LINE):
                    # the device is too small, not the run broken: the supervisor ends as the worker did
                    failure, exit_code = f"worker {worker.index}: {why[len(OUT_OF_MEMORY_LINE) :]}", code
                    break
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                failure = f"worker {worker.index} {how}" + (f": {why}" if why else "")
                if code in INTERRUPTED_CODES:  # stopped by a signal, checkpointed: not a fault to restart from
                    failure, exit_code = _stopped_together(pool, timeout_s), code
                break
        else:
            # The chief starts training only once every worker has joined.
            if not pool[0].started_file.exists() and time.monotonic() - launched > timeout_s:
                failure = f"training did not start within {timeout_s:g} s: worker 0 was still waiting for its peers"
        time.sleep(0.1)
    if failure is not None:
        for worker in pool:
            worker.stop()
    for worker in pool:
        worker.finish()
    return (0, None) if failure is None else (exit_code, failure)


def _stopped_together(pool: list, timeout_s: float) -> str:
    """After one worker stopped on a signal: the others stop after the same update (they learnt of it in
    its all-reduce) and checkpoint; wait for them (killed after ``timeout_s``), then the chief's line, which
    names the update and the run directory."""
    deadline = time.monotonic() + timeout_s
    while any(w.process.poll() is None for w in pool) and time.monotonic() < deadline:
        time.sleep(0.1)
    chief = pool[0]
    if chief.process.poll() is not None:
        chief.finish()  # its stderr read to the end
    line = last_error(chief.errors, default=f"worker 0 exited with code {chief.process.returncode}")
    # Every worker should have stopped by itself, checkpointed; say which did not.
    odd = []
    for worker in pool:
        code = worker.process.poll()
        if code is None:
            odd.append(f"worker {worker.index} did not stop within {timeout_s:g} s")
        elif code not in INTERRUPTED_CODES:
            odd.append(f"worker {worker.index} exited with code {code}")
    return "; ".join([line, *odd])


def launch_workers(
    cfg: Config, run_dir: Path, resume: bool, workers: int, say: Callable[[str], None], max_restarts: int, task: bool
) -> dict:
    """``run --workers N``: check once, start N workers on one resolved config, supervise; the chief's summary.
    ``task``: the run trains with a Keras loss (source.ModelSource.keras_loss), so its .npz holds its targets.

    A worker that fails (dies, exits non-zero, or does not start within
    strategy.worker_timeout_s) stops all of them; with ``max_restarts`` R all
    N start again from the last checkpoint (--resume), up to R times, each
    restart in one line. A worker stopped by SIGINT or SIGTERM (checkpointed,
    exit 130 or 143) is not restarted: the run ends with its code."""
    if cfg.strategy.name not in ("default", "multi_worker"):
        raise UserError(f"--workers needs strategy.name=multi_worker (or default), not {cfg.strategy.name}")
    resolved = config_from_dict(
        {**cfg.to_dict(), "strategy": {**cfg.to_dict()["strategy"], "name": "multi_worker"}}, "--workers"
    )  # the multi-worker limits, checked before any process starts
    if not resume:
        check_output_dir(run_dir)
    with tempfile.TemporaryDirectory(prefix="accum-train-workers-") as scratch:
        config_path = Path(scratch) / "config.yaml"
        atomic_write(config_path, resolved.to_yaml().encode())
        # bad data is reported here, once, not by every worker: loaded and checked in a child process (python -m
        # accum_train.datasets), ``--task`` where the run has a Keras loss (its .npz holds that loss's targets)
        child = run_child(
            [sys.executable, "-m", "accum_train.datasets", str(config_path), *(["--task"] if task else [])],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )
        if child.code == DataError.exit_code and child.error.startswith("error: "):
            raise DataError(error_message(child.error))
        if child.code != 0:
            raise WorkerFailed(f"the data check failed with exit code {child.code}: {child.error}")
        # The supervisor is the run directory's one writer, its chief writing under its lock.
        with writing(run_dir, "--resume " if resume else "--output-dir ", for_children=True):
            restarts = 0
            while True:
                args = [str(config_path), "--resume" if resume else "--output-dir", str(run_dir)]
                code, failure = launch(args, workers, cfg.strategy.worker_timeout_s, say, {RESTARTS: str(restarts)})
                if code in (0, OutOfMemory.exit_code, *INTERRUPTED_CODES) or restarts >= max_restarts:
                    break
                restarts += 1
                # A start that failed before its first checkpoint starts afresh (nothing of it is kept).
                resume = resume or bool(checkpoint_numbers(Path(run_dir) / "checkpoints"))
                say(
                    f"{failure}: restarting all {workers} workers from "
                    f"{'the last checkpoint' if resume else 'the start'} (restart {restarts} of {max_restarts})"
                )
    stopped = f"{failure}; stopped all {workers} workers"
    if code == OutOfMemory.exit_code:
        raise OutOfMemory(f"{stopped} (the last checkpoint stays readable)")
    if code in INTERRUPTED_CODES:  # the chief's line: the update every worker stopped after, how to resume
        line = error_message(failure)
        resumable = "Resume with: accum-train run --resume" in line  # with as many workers as it stopped
        raise WorkersInterrupted(line + (f" --workers {workers}" if resumable else f" (all {workers} workers)"), code)
    if code:
        after = f" after {restarts} restarts (--max-restarts {max_restarts})" if max_restarts else ""
        raise WorkerFailed(f"{stopped}{after} (the last checkpoint stays readable)")
    return json.loads((Path(run_dir) / "summary.json").read_text())
