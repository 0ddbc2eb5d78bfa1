"""What the runtime is and is given, for either door: the micro-steps in flight ``auto`` chooses and the thread
pools that go with them, and the cluster this process is in; what only the framework knows (a GPU, a strategy's
kind and name, who writes the run) the backend says (accum/backends/). A config's own set-up of the
runtime (its pools, its strategy) is the CLI's: from_config/build.py and lifecycle.py, through the backend.

Threads, measured on the 2-core development machine (README, "Where the time
goes"): a micro-batch of 32 is too small for TensorFlow's intra-op threads to
pay for themselves, so k=8 with two threads per op costs ~1.4x the CPU time of
one pass. One thread per op, with two micro-steps in flight at once (the
engine's loop-carried accumulation, ``parallel_iterations``), keeps both cores
busy on useful work instead. With a GPU the device is the bottleneck and
memory is what accumulation is for, so micro-steps stay one at a time there.

The engine itself (accum/backends/tensorflow/engine.py) is the same on every strategy.
"""

from __future__ import annotations

import json
import os

from ..backends import active
from ..defaults import AUTO_PARALLEL


def cpu_cores() -> int:
    """The cores this process may run on (its affinity, which containers narrow), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_parallel(limit: int, memory_limited: bool = False, replicas: int = 1) -> int:
    """auto's choice of micro-steps in flight, for a run's CLI and for accum_train.fit: 1 with a GPU (the device
    is the bottleneck, memory what accumulation is for), under a memory limit (memory is what the run is short
    of) or over several local replicas (they already share the cores out); else as many as measured to help on
    a CPU with cores to share out, never more than ``limit``, the micro-batches of an update."""
    if memory_limited or replicas > 1 or active().has_gpu():
        return 1
    return max(1, min(AUTO_PARALLEL, cpu_cores(), limit))


ENV = {"intra": "TF_NUM_INTRAOP_THREADS", "inter": "TF_NUM_INTEROP_THREADS"}


def thread_pools(parallel: int) -> dict | None:
    """The pools for ``parallel`` micro-steps at once on this CPU, or None for TensorFlow's defaults.

    ``parallel`` micro-steps get ``cores // parallel`` threads each within an op and ``max(2, parallel)``
    ops side by side. One micro-step at a time keeps the defaults (0: as many as cores)."""
    if parallel <= 1:
        return None
    return {"intra": max(1, cpu_cores() // parallel), "inter": max(2, parallel)}


def child_environment(pools: dict | None) -> dict:
    """This process's environment for a child whose runtime should start with ``pools`` (None: the
    defaults), through the variables TensorFlow reads when its runtime starts."""
    env = {key: value for key, value in os.environ.items() if key not in ENV.values()}
    env.update({ENV[pool]: str(threads) for pool, threads in (pools or {}).items()})
    return env


def cluster_workers() -> int:
    """The workers of the cluster this process is in (TF_CONFIG), 1 without one."""
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    return max(1, sum(len(tasks) for role, tasks in cluster.items() if role in ("chief", "worker")))
