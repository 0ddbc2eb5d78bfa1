"""``accum-train describe RUN_DIR``: what a run directory of either door holds, read from its files alone.

Which door wrote it (``accum-train run`` or ``accum_train.fit``), its batch and micro-batches, how far it got (the
updates metrics.jsonl logged, the checkpoints kept, summary.json once it finished), whether a process is writing it
now (writer.lock), and the command that goes on with it. The door's part comes from the one loader
(accum/loader.py) like every reader's. Nothing is written, and neither TensorFlow nor the model is loaded: it
answers at once, also while a run trains.
"""

from __future__ import annotations

import math
from pathlib import Path

from .loader import json_or_none, read_run, records
from .trainer.store.checkpoints import checkpoint_numbers
from .trainer.store.lock import lock_holder
from .trainer.store.metrics_log import is_epoch_record
from .trainer.store.rundir import HISTORY, MODEL_COPY


def describe(run_dir: Path) -> dict:
    """A run directory's state as one JSON-ready dict (see the module's docstring)."""
    run = read_run(run_dir, for_model=False)
    run_dir = run.run_dir
    settings, go_on = run.settings(), run.go_on()
    metrics = records(run_dir, "metrics.jsonl")
    updates = [r for r in metrics if not is_epoch_record(r)]
    epochs = [r for r in metrics if is_epoch_record(r)]
    summary = json_or_none(run_dir / "summary.json")
    holder = lock_holder(run_dir)
    state = "training" if holder is not None else "finished" if summary is not None else "stopped"
    last = updates[-1] if updates else {}
    return {
        "run_dir": str(run_dir),
        "door": run.door,
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
        "next": None if state != "stopped" else _after_out_of_memory(run_dir, go_on, last) or go_on,
    }


def _after_out_of_memory(run_dir: Path, go_on: str, last: dict) -> str | None:
    """Where the run's last stop ran out of memory (history.jsonl's last line): the resume with twice the
    micro-batches, which cuts the same batches (the update and the data order stay), while they fit in a batch."""
    stop = (records(run_dir, HISTORY) or [{}])[-1]
    if stop.get("event") != "out_of_memory" or 2 * stop["subdivisions"] > last.get("batch_size", 0):
        return None
    more = 2 * stop["subdivisions"]
    if go_on.endswith(") again"):  # accum_train.fit's
        return "resume with smaller micro-batches: " + go_on.replace(") again", f", subdivisions={more}) again")
    return f"resume with smaller micro-batches: {go_on} --set subdivisions={more}"


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None
