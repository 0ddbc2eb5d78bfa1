"""The CLI's run of a config: ``train(cfg, run_dir)`` resolves the config into what the trainer takes and hands
it over (lifecycle.py trains it to its summary).

Before anything is written, it sets up the runtime (thread pools, the backend's strategy), loads and
checks the data for the model the run builds (a resume's, and a worker's, from the run directory's copy),
checks the output directory and builds the run (build.build_run: the model and its objective, the
optimizer and the accumulator): bad input leaves nothing behind. ``resume=True`` continues the run directory.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..config import Config
from ..progress import Progress
from ..trainer.store.rundir import check_output_dir
from . import lifecycle
from .source import model_source


def train(
    cfg: Config,
    run_dir: Path | None,
    progress: Progress | None = None,
    resume: bool = False,
    data=None,
    strategy=None,
) -> dict:
    """Train as configured, leaving a complete run directory; returns summary.json's content.

    Under a multi-worker strategy every worker calls this; only the chief writes
    ``run_dir``, the others write their (required) checkpoints to a scratch folder
    (rundir.RunDirectory)."""
    from ..backends import active
    from .build import build_run, load_data
    from .startup import configure

    threads = configure(cfg)  # before any op: thread pools are fixed when the runtime starts
    if strategy is None and cfg.strategy.name != "default":
        strategy = active().make_strategy(cfg.strategy.name, cfg.strategy.cpu_devices)  # before any other op
    chief = active().is_chief(strategy)  # the process that writes the run directory (any process outside a cluster)
    progress = progress or Progress()
    if data is None or data.for_model is None:
        # the model file: a resume's copy of it, and a worker's beside the chief (the same bytes as the chief's)
        source = model_source(cfg, run_dir if resume or not chief else None)
        if data is None:
            # before anything is written: bad data leaves no trace
            data = load_data(cfg, run_dir if resume else None, source)
        else:
            data = dataclasses.replace(data, for_model=source)
    run_dir = Path(run_dir)
    if not chief:
        progress = Progress()  # the chief reports
    elif not resume:
        check_output_dir(run_dir)
    # (wall, CPU) time from here: the summary's times include building the model
    started = time.time(), time.process_time()
    run = build_run(cfg, data, strategy)  # before any write: a model that does not fit leaves no trace
    return lifecycle.train(run, run_dir, chief, progress, resume, threads, started)
