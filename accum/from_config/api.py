"""accum-train from Python: ``run`` does what ``accum-train run`` does (``accum_train.fit``, model.fit with
exact accumulation for a Keras model you hold, is in keras_fit/).

Bad input raises ``UserError`` with the one line the CLI prints (the CLI is a
thin layer over ``run``); nothing here calls ``sys.exit``. TensorFlow is
imported only once the input has been checked.
"""

from __future__ import annotations

from pathlib import Path

from ..config import as_config, with_overrides
from ..errors import UserError
from ..progress import Progress
from ..trainer.store.rundir import check_backend, read_record
from .source import default_output_dir, model_source, names_strategy, resume_config


def run(
    config: str | Path | dict | None = None,
    *,
    output_dir: str | Path | None = None,
    overrides=None,
    progress=None,
    resume: str | Path | None = None,
    workers: int | None = None,
    max_restarts: int | None = None,
) -> dict:
    """Train as ``accum-train run`` does and return the run's summary (what summary.json holds).

    - ``config``: a YAML path, or a dict in the YAML's shape.
    - ``overrides``: what ``--set`` takes: a list of "KEY=VALUE" strings, or a dict such as
      {"optimizer.learning_rate": 0.01}.
    - ``output_dir``: the run directory (default runs/NAME-DATE-TIME).
    - ``progress``: an ``accum_train.Progress`` whose methods the loop calls (default: silent).
    - ``resume``: a run directory to continue; ``config`` and ``overrides`` may then change what a resume may
      change.
    - ``workers``: N >= 2 local worker processes (MultiWorkerMirroredStrategy on 127.0.0.1), as ``--workers``.
    - ``max_restarts``: how many times the supervisor starts all the workers again from the last checkpoint
      when one fails, as ``--max-restarts``.

    Bad input raises ``accum_train.UserError`` (one line naming what is wrong and how to fix it; the CLI's
    exit code 2). A run that cannot finish raises one of the other errors of ``accum_train.errors``
    (out of memory, stopped, interrupted by a signal), each with its exit code and one line."""
    progress = progress or Progress()
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 2):
        raise UserError(f"workers={workers!r} must be an integer >= 2 (one device: leave it out)")
    if max_restarts is not None:
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise UserError(f"--max-restarts {max_restarts!r} must be an integer >= 0")
        if not workers:
            raise UserError(
                "--max-restarts needs --workers N: the supervisor of N workers restarts them; "
                "a single process goes on with 'accum-train run --resume RUN_DIR'"
            )
    overrides = overrides or ()
    if resume is not None:
        if output_dir is not None and Path(output_dir) != Path(resume):
            raise UserError(
                "--output-dir and --resume name different directories: "
                "a resumed run stays in its own directory; drop --output-dir"
            )
        cfg, run_dir = resumed(resume, config, overrides), Path(resume)
        if workers and not names_strategy(config, overrides) and cfg.strategy.name != "multi_worker":
            # the run goes on over workers, whatever the strategy it ran under before
            cfg = with_overrides(cfg, {"strategy.name": "multi_worker", "strategy.cpu_devices": None}, "--workers")
    else:
        if config is None:
            raise UserError(
                "missing CONFIG: pass a YAML file, e.g. 'accum-train run configs/fmnist.yaml', or --resume RUN_DIR"
            )
        cfg = as_config(config, overrides)
        run_dir = (
            Path(output_dir) if output_dir else default_output_dir(config if not isinstance(config, dict) else None)
        )
    if workers:
        from .launcher import launch_workers

        # whether the workers' data check takes targets for a Keras loss; a resume reads its copy of the model file
        task = model_source(cfg, run_dir if resume is not None else None).keras_loss
        return launch_workers(cfg, run_dir, resume is not None, workers, progress.message, max_restarts or 0, task)
    from ..backends import active

    if active().NAME != "tensorflow":  # the config as one call of accum_train.fit, whose door runs on the backend
        from ..on_keras import train as train_with_fit

        return train_with_fit(cfg, run_dir, progress, resume is not None)
    from .lifecycle import train

    return train(cfg, run_dir, progress=progress, resume=resume is not None)


def resumed(run_dir, config=None, overrides=()):
    """The config to resume ``run_dir`` with (source.resume_config), refused in one line where the directory was
    written on another Keras backend: its checkpoints are read by the backend that wrote them. Nothing here imports
    TensorFlow (the CLI checks a resume with it before TensorFlow loads)."""
    cfg = resume_config(run_dir, config, overrides)
    check_backend(read_record(Path(run_dir)), f"--resume {run_dir}", "resume it with KERAS_BACKEND={backend}")
    return cfg
