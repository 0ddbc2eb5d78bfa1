"""A config's runtime, set up before the process's first op: the micro-steps in flight its keys ask for and the
thread pools that go with them (trainer/runtime.py has how many and why), which the backend sets.

The pools are fixed once the runtime starts: ``configure`` runs before any other op, the backend's ``make_strategy``
after it (lifecycle.train). A process that has already started it (a test, a notebook) keeps its threads; the
run still works, only slower. TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS, if set, are left to rule.
"""

from __future__ import annotations

import os

from ..backends import active
from ..config import Config
from ..defaults import AUTO_PARALLEL
from ..trainer.runtime import ENV, auto_parallel, thread_pools


def parallel_micro_steps(cfg: Config) -> int:
    """The configured number, or auto's choice (``auto_parallel``); never more than the micro-batches of an
    update."""
    if cfg.baseline:
        return 1
    if cfg.whole_set:  # the training set's size is not known yet: as if it were large
        limit = cfg.subdivisions if isinstance(cfg.subdivisions, int) else AUTO_PARALLEL
    elif cfg.auto_subdivisions:
        limit = max(cfg.batch_sizes)
    else:
        limit = max(cfg.subdivisions_for(b) for b in cfg.batch_sizes)
    if cfg.parallel_micro_steps != "auto":
        return min(cfg.parallel_micro_steps, limit)
    return auto_parallel(limit, cfg.memory_limit is not None, 2 if cfg.strategy.name == "mirrored" else 1)


def configure(cfg: Config) -> dict:
    """Set this process's thread pools for the run's micro-steps (before any op); what is in effect: the threads set
    in this process, else TF_NUM_*'s (which the runtime reads when nothing is set), else 0 (as many as cores)."""
    parallel = parallel_micro_steps(cfg)
    pools = None if active().has_gpu() else thread_pools(parallel)
    given = {pool: os.environ.get(name, "") for pool, name in ENV.items()}
    threads = active().set_thread_pools({pool: n for pool, n in (pools or {}).items() if not given[pool]})
    env = {pool: int(value) if value.isdigit() else 0 for pool, value in given.items()}
    return {"parallel_micro_steps": parallel, **{f"{pool}_op_threads": threads[pool] or env[pool] for pool in ENV}}
