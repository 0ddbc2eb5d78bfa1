"""Runs the accum-train CLI with one fault armed, for test_kills.py.

ACCUM_FAULT=POINT:N picks where this process kills itself with SIGKILL (no
cleanup, no atexit, like a power cut or the OOM killer):
  update:N           during the Nth update's graph call
  oom:N              (not a kill) the Nth update raises ResourceExhaustedError, as a device out of memory
  checkpoint:N       during the Nth checkpoint save (TensorFlow is writing)
  partial:N          the Nth checkpoint save has left a half-written data file
  after_checkpoint:N right after the Nth checkpoint (e.g. between epochs)
  pause_checkpoint:N (not a kill) before the Nth checkpoint save, write $ACCUM_FAULT_MARK and wait 60 s
  metrics:N          halfway through the Nth metrics.jsonl line
  weights:1          while weights.npz is being written

``RUNNER worker ARGS`` runs the core's worker entry point (``accum_train.worker``) instead, as the
``--workers`` launcher starts one (tests/launch_runner.py).
"""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import tensorflow as tf
from accum_train import worker
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.cli.main import main


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def counter(n):
    seen = [0]

    def hit():
        seen[0] += 1
        return seen[0] == n

    return hit


def arm(point, n):
    hit = counter(n)
    if point in ("update", "oom"):
        original = Accumulator.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            real = self.update_from

            def update_from(iterator, n, pulls, stop=0, size=None):
                if hit():
                    if point == "oom":
                        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")
                    threading.Timer(0.002, die).start()
                return real(iterator, n, pulls, stop, size)

            self.update_from = update_from

        Accumulator.__init__ = init
    elif point == "pause_checkpoint":
        from accum_train.trainer.store.rundir import RunDirectory

        real_save = RunDirectory.save

        def save(self, step):
            if hit():  # say so, then wait (a signal's handler still runs) before the save
                Path(os.environ["ACCUM_FAULT_MARK"]).write_text(str(step))
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.01)
            return real_save(self, step)

        RunDirectory.save = save
    elif point in ("checkpoint", "partial", "after_checkpoint"):
        from accum_train.trainer.store.rundir import RunDirectory

        real_save = RunDirectory.save

        def save(self, step):
            if not hit():
                return real_save(self, step)
            if point == "checkpoint":
                threading.Timer(0.001, die).start()
                real_save(self, step)
                die()
            if point == "partial":
                target = self.local / "checkpoints" / f"ckpt-{step}.data-00000-of-00001"
                target.write_bytes(b"\0" * 1000)
                die()
            real_save(self, step)
            die()

        RunDirectory.save = save
    elif point == "metrics":
        from accum_train.trainer.store.metrics_log import MetricsLog

        real_write = MetricsLog.write

        def write(self, records):
            if hit():
                with open(self.path, "a") as handle:
                    handle.write('{"epoch": 1, "st')
                die()
            return real_write(self, records)

        MetricsLog.write = write
    elif point == "weights":
        import accum_train.trainer.store.rundir as rundir

        real_atomic_write = rundir.atomic_write

        def atomic_write(path, data):
            if path.name != "weights.npz":
                return real_atomic_write(path, data)
            # as if killed inside atomic_write: half of the temporary file written, nothing renamed
            (path.parent / f".{path.name}.half.tmp").write_bytes(data[: len(data) // 2])
            die()

        rundir.atomic_write = atomic_write
    else:
        raise SystemExit(f"unknown fault point {point!r}")


if __name__ == "__main__":
    point, _, count = os.environ["ACCUM_FAULT"].partition(":")
    arm(point, int(count or 1))
    tf.get_logger().setLevel("ERROR")
    sys.exit(worker.main(sys.argv[2:]) if sys.argv[1] == "worker" else main(sys.argv[1:]))
