"""``accum-train describe RUN_DIR``: what a run directory of either door holds, read from its files alone.

Which door wrote it (config.yaml: ``accum-train run``; fit.json: ``accum_train.fit``), its batch and
micro-batches, how far it got (the updates metrics.jsonl logged, the checkpoints kept, summary.json once it
finished), whether a process is writing it now (writer.lock), and the command that goes on with it. Nothing is
written, and neither TensorFlow nor the model is loaded: it answers at once, also while a run trains.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .errors import RunDirError
from .trainer.checkpoints import checkpoint_numbers
from .trainer.lock import lock_holder
from .trainer.metrics_log import is_epoch_record, read_metrics
from .trainer.rundir import FIT_RECORD, HISTORY, MODEL_COPY, is_fit_run_dir, is_run_dir, other_output


def describe(run_dir: Path) -> dict:
    """A run directory's state as one JSON-ready dict (see the module's docstring)."""
    run_dir = Path(run_dir)
    if is_fit_run_dir(run_dir):
        door, settings = "accum_train.fit", _fit_settings(run_dir)
        go_on = f"call accum_train.fit(model, ..., output_dir={str(run_dir)!r}) again"
    elif is_run_dir(run_dir):
        door, settings = "accum-train run", _run_settings(run_dir)
        started = (_records(run_dir, HISTORY) or [{}])[-1]  # the newest start or resume
        workers = f" --workers {started['workers']}" if started.get("launcher") else ""
        go_on = f"accum-train run --resume {run_dir}{workers}"
    else:
        raise RunDirError(
            other_output(run_dir)
            or f"{run_dir} is not a run directory (no config.yaml with checkpoints/, nor {FIT_RECORD}): pass a "
            f"directory written by 'accum-train run' or by accum_train.fit(output_dir=...)"
        )
    records = _records(run_dir, "metrics.jsonl")
    updates = [r for r in records if not is_epoch_record(r)]
    epochs = [r for r in records if is_epoch_record(r)]
    summary = _json(run_dir / "summary.json")
    holder = lock_holder(run_dir)
    state = "training" if holder is not None else "finished" if summary is not None else "stopped"
    last = updates[-1] if updates else {}
    return {
        "run_dir": str(run_dir),
        "door": door,
        "state": state,
        "writer_pid": int(holder) if holder is not None and holder.isdigit() else holder,
        **settings,
        # the batch and k the newest update ran at (auto's choice, a batch schedule's, another number of replicas')
        "batch_size_in_force": last.get("batch_size", settings["batch_size"]),
        "subdivisions_in_force": last.get("subdivisions", settings["subdivisions"]),
        "model_file": MODEL_COPY if (run_dir / MODEL_COPY).is_file() else None,
        "updates_logged": last.get("step", 0),
        "epochs_ended": epochs[-1]["epoch"] if epochs else 0,
        "last_loss": _finite(last.get("loss")),
        "noise_scale": next(
            (_finite(r["noise_scale"]) for r in reversed(updates) if _finite(r.get("noise_scale"))), None
        ),
        "checkpoints": sorted(checkpoint_numbers(run_dir / "checkpoints")),
        "summary": summary,
        "next": None if state != "stopped" else go_on,
    }


def _run_settings(run_dir: Path) -> dict:
    from .config import load_run_config

    cfg = load_run_config(run_dir)
    subdivisions = cfg.subdivisions_for(cfg.batch_size)  # "auto": the updates' records say what it chose
    return {"model": cfg.model.name, "batch_size": cfg.batch_size, "subdivisions": subdivisions, "seed": cfg.seed}


def _fit_settings(run_dir: Path) -> dict:
    record = _json(run_dir / FIT_RECORD) or {}
    return {
        "model": "keras",
        "batch_size": record.get("batch_size"),
        "subdivisions": record.get("k"),
        "seed": record.get("seed"),
    }


def _records(run_dir: Path, name: str) -> list:
    path = run_dir / name
    try:
        return read_metrics(path) if path.is_file() else []
    except json.JSONDecodeError:  # the last line cut by a kill -9: the lines before it
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines[:-1] if line.strip()]


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None
