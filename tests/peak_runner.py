"""Runs the accum-train CLI with fake allocator peaks, for the subdivisions=auto cases of test_distribute.py.

A micro-step probe of m examples peaks at m MiB, a whole update at k at 1.5 MiB per example of one
micro-batch of a replica's share; worker 1 of a multi-worker run (ACCUM_TRAIN_WORKER=1) needs twice
as much, so the workers must agree on a k and on a retry that only one of them needs.

``RUNNER worker ARGS`` runs the core's worker entry point (``accum_train.worker``) instead, as the
``--workers`` launcher starts one (tests/launch_runner.py).
"""

import math
import os
import sys

import accum_train.backends.tensorflow.backend as tf_backend
from accum_train import worker
from accum_train.backends.tensorflow.engine import Accumulator
from accum_train.cli.main import main

MiB = 2**20
SCALE = 2 if os.environ.get("ACCUM_TRAIN_WORKER") == "1" else 1
peak = [0]
real_accumulate, real_accumulate_from = Accumulator.accumulate, Accumulator.accumulate_from


def accumulate(self, x, y, batch_examples):
    peak[0] = SCALE * int(x.shape[0]) * MiB
    return real_accumulate(self, x, y, batch_examples)


def accumulate_from(self, iterator, n, pulls, size=None):
    share = math.ceil(int(n) / self.replicas)
    peak[0] = SCALE * 3 * math.ceil(share / int(self.subdivisions.numpy())) * MiB // 2
    return real_accumulate_from(self, iterator, n, pulls, size)


Accumulator.accumulate, Accumulator.accumulate_from = accumulate, accumulate_from
tf_backend.allocator_peak_bytes = lambda: peak[0]
if __name__ == "__main__":
    sys.exit(worker.main(sys.argv[2:]) if sys.argv[1] == "worker" else main(sys.argv[1:]))
