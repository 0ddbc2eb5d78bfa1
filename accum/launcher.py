"""``accum-train run --workers N``: N local worker processes under a watchdog.

Each worker is ``accum-train run`` with ``strategy.name=multi_worker`` and a
TF_CONFIG naming N ports on 127.0.0.1 (worker 0 is the chief and writes the
run directory). The watchdog stops every worker, within a bounded time, as
soon as one fails or one has not started training within
``strategy.worker_timeout_s``: a missing peer would otherwise leave the others
blocked in a collective for minutes.

The supervisor checks everything once (config, output directory, data) and
hands every worker the same resolved config file; it never imports
TensorFlow, so it stays light and cannot disturb the workers' runtime.

TF's gRPC server listens on all interfaces without authentication, whatever
address TF_CONFIG names: run workers on a private network (the tests use a
private network namespace, ``unshare -rn``).
"""

from __future__ import annotations

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
from collections.abc import Callable, Sequence
from pathlib import Path

from .config import Config, config_from_dict
from .errors import DataError, UserError, WorkerFailed
from .rundir import atomic_write, check_output_dir

STARTED = "batch_size="  # the line the chief prints once every worker has joined and training begins


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


def worker_command(run_args: Sequence[str], index: int) -> list[str]:
    return [sys.executable, "-m", "accum_train.cli.main", "run", *run_args]


class _Worker:
    def __init__(self, index: int, command: list[str], env: dict, echo: Callable[[str], None]):
        self.index = index
        self.started = False
        self.last_error = ""
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, echo), daemon=True),
            threading.Thread(target=self._read_errors, args=(self.process.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, echo):
        for line in stream:
            if line.startswith(STARTED):
                self.started = True
            if self.index == 0:
                echo(line.rstrip("\n"))

    def _read_errors(self, stream):
        for line in stream:
            if line.startswith(("error: ", "stopped by ")):
                self.last_error = line.strip()
            elif (
                line.strip()
                and not line.startswith((" ", "I0000", "W0000", "WARNING", "To enable"))
                and not self.last_error.startswith("error: ")
            ):
                self.last_error = line.strip()  # e.g. the last line of a traceback

    def stop(self, sig=signal.SIGKILL):
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def finish(self):
        self.process.wait()
        for reader in self._readers:
            reader.join(timeout=5)


def launch(run_args: Sequence[str], workers: int, timeout_s: float, echo: Callable[[str], None]) -> tuple:
    """Run the workers to the end; (exit code, message or None)."""
    ports = free_ports(workers)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    pool = []
    for index in range(workers):
        command = worker_command(run_args, index)
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
            "ACCUM_TRAIN_WORKER": str(index),
        }
        pool.append(_Worker(index, command, env, echo))
    launched = time.monotonic()
    failure = None
    while failure is None:
        codes = [w.process.poll() for w in pool]
        if all(code == 0 for code in codes):
            break
        for worker, code in zip(pool, codes):
            if code not in (None, 0):
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                detail = f": {worker.last_error}" if worker.last_error else ""
                failure = f"worker {worker.index} {how}{detail}"
                break
        else:
            # The chief starts only once every worker has joined: its first line means all are up.
            if not pool[0].started and time.monotonic() - launched > timeout_s:
                failure = f"training did not start within {timeout_s:g} s: worker 0 was still waiting for its peers"
        time.sleep(0.1)
    if failure is not None:
        for worker in pool:
            worker.stop()
    for worker in pool:
        worker.finish()
    if failure is None:
        return 0, None
    return 1, f"{failure}; stopped all {workers} workers (the last checkpoint stays readable)"


def _check_data(config_path: Path) -> None:
    """Load and check the data in a child process (python -m accum_train.datasets): one line if bad."""
    child = subprocess.run(
        [sys.executable, "-m", "accum_train.datasets", str(config_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    if child.returncode == 2 and child.stderr.startswith("error: "):
        raise DataError(child.stderr.strip().splitlines()[-1][len("error: ") :])
    if child.returncode != 0:
        raise WorkerFailed(
            f"the data check failed with exit code {child.returncode}: "
            f"{(child.stderr.strip().splitlines() or ['no message'])[-1]}"
        )


def launch_workers(cfg: Config, run_dir: Path, resume: bool, workers: int, echo: Callable[[str], None]) -> dict:
    """``run --workers N``: check once, start N workers on one resolved config, supervise; the chief's summary."""
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
        _check_data(config_path)  # bad data is reported here, once, not by every worker
        args = [str(config_path), "--resume" if resume else "--output-dir", str(run_dir), "--quiet"]
        code, message = launch(args, workers, cfg.strategy.worker_timeout_s, echo)
    if code:
        raise WorkerFailed(message)
    return json.loads((Path(run_dir) / "summary.json").read_text())
