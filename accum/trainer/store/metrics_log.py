"""metrics.jsonl, a run's record of every update and every epoch (one strict JSON object per line: a number that
is not finite, such as an update's undefined noise scale, is null), and the same
scalars for TensorBoard: the one writer of both doors (the CLI's run_hooks.py, accum_train.fit's output_dir).
The one file appended to: a resumed run drops what follows its checkpoint
(``MetricsLog.truncate_after``), and every write is flushed to disk before the checkpoint that counts it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ...files import atomic_write, strict_json

# An epoch's record as TensorBoard scalars (epoch/KEY): these, and every test_ and validation_ score (a Keras
# loss's run has its metrics there).
EPOCH_SCALARS = ("train_loss", "examples_per_s", "noise_scale")
# An update's record as TensorBoard scalars: (key, tag)
UPDATE_SCALARS = (
    ("loss", "train/loss"),
    ("learning_rate", "train/learning_rate"),
    ("noise_scale", "train/noise_scale"),
)


def epoch_scalars(record: dict) -> list[str]:
    if record.get("epoch_end"):  # accum_train.fit's: the logs its callbacks got at the epoch's end
        return [key for key in record if key not in ("step", "epoch", "epoch_end")]
    return [*EPOCH_SCALARS, *(key for key in record if key.startswith(("test_", "validation_")))]


def is_epoch_record(record: dict) -> bool:
    """An epoch's line of metrics.jsonl: the CLI's has its time, accum_train.fit's says ``"epoch_end": true``."""
    return "elapsed_s" in record or bool(record.get("epoch_end"))


def update_figures(out: dict) -> dict:
    """What the engine's record of an update (engine.py) puts in that update's line of metrics.jsonl, in both
    doors: the rate applied and the global norm of its gradient before clipping (both null for a skipped update),
    whether it was skipped, and under mixed_float16 the loss scale it used and whether it overflowed."""
    applied = bool(out["applied"])
    figures = {
        "learning_rate": float(out["learning_rate"]) if applied else None,
        "grad_norm": float(out["grad_norm"]) if applied else None,
        "skipped": not applied,
    }
    if "loss_scale" in out:
        figures.update(loss_scale=float(out["loss_scale"]), overflow=bool(out["overflow"]))
    return figures


def read_metrics(path: Path) -> list:
    """The records of a JSON Lines file of a run (metrics.jsonl, history.jsonl): a last line cut by a kill -9 is
    left out, the lines before it read."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError:
        return [json.loads(line) for line in lines[:-1]]


class MetricsLog:
    """metrics.jsonl (one JSON object per line) plus the same scalars for TensorBoard."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.tensorboard, self._writer = Path(run_dir) / "tensorboard", None

    @property
    def writer(self):
        """TensorBoard's writer, made at the first write: a run refused before its first record (a resume of
        another model's checkpoint) leaves no events file behind. TensorBoard's own, in Python: tf.summary's
        would trace a graph per run directory (and warn of retracing after a few fit calls), or cost an eager
        call per scalar."""
        if self._writer is None:
            from tensorboard.summary import Writer

            self._writer = Writer(str(self.tensorboard))
        return self._writer

    def close(self) -> None:
        """Close TensorBoard's writer (its events file and its thread), if one was made."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def truncate_after(self, step: int, epochs_done: int) -> None:
        """Drop records a resumed run will write again (those after its checkpoint)."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            # written again: a line an older release wrote with NaN for null reads as strict JSON from now on
            if record["epoch"] <= epochs_done if is_epoch_record(record) else record.get("step", 0) <= step:
                keep.append(strict_json(record))
        atomic_write(self.path, "".join(line + "\n" for line in keep).encode())

    def write(self, records) -> None:
        with open(self.path, "a") as handle:
            for record in records:
                handle.write(strict_json(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())  # before the checkpoint that counts these updates as done
        for record in records:
            if is_epoch_record(record):
                scalars = [(f"epoch/{key}", record.get(key)) for key in epoch_scalars(record)]
            else:  # a skipped update has no loss, and no rate was applied
                scalars = [(tag, record.get(key)) for key, tag in UPDATE_SCALARS]
            for tag, value in scalars:
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(tag, value, record["step"])
        self.writer.flush()

    def write_updates(self, pending, timeline) -> tuple:
        """Records of buffered updates, (step, examples, engine output, batch size in force, k) each; (loss sum,
        examples) of the applied ones. ``timeline`` (accum.timeline.Timeline) places each update in its epoch."""
        records = []
        loss_sum, examples = 0.0, 0
        for step, n, out, batch_size, k in pending:
            loss = float(out["loss"])
            if bool(out["applied"]):
                loss_sum += loss * n
                examples += n
            record = {
                "epoch": timeline.epoch_of(step - 1) + 1,
                "step": step,
                "examples_seen": timeline.examples_seen(step),
                "batch_size": batch_size,
                "subdivisions": k,
                "loss": loss if math.isfinite(loss) else None,
                **update_figures(out),
            }
            if "noise_scale" in out:  # the gradient noise scale's running estimate after it (noise.py); or null
                record["noise_scale"] = out["noise_scale"]
            records.append(record)
        self.write(records)
        return loss_sum, examples

    def read(self):
        return read_metrics(self.path) if self.path.exists() else []

    def epoch_losses(self, epoch: int) -> tuple:
        """(loss sum, examples) of the applied updates logged so far in ``epoch``."""
        loss_sum, examples, seen = 0.0, 0, 0
        for record in self.read():
            if "loss" not in record:
                continue
            n, seen = record["examples_seen"] - seen, record["examples_seen"]  # records start at step 1
            if record["epoch"] == epoch and not record["skipped"]:
                loss_sum += record["loss"] * n
                examples += n
        return loss_sum, examples
