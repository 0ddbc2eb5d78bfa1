"""accum_train.fit's ``output_dir``: a run directory kept as training goes, and resumed by the next call.

docs/python.md lists its files. What is fit's is here: run.json's ``"fit"`` (what the data order depends on, which a
resume checks: k may change, it cuts the same batches; the layers LoRA is on; what the checkpoint ``holds``, which a
resume compares before it restores; earlier: fit.json), ``initial_model.keras`` (the model as the first call began
it, saved before its first update: with the newest checkpoint's weights, what ``accum-train export``, ``predict`` and
``evaluate`` read, also of a call that never returned: accum/reload.py), the epoch and update-in-epoch counters in
the checkpoints, metrics.jsonl's records of the callbacks' logs, ``model.keras`` and summary.json's epochs when the
call returns. The lock, the checkpoints, metrics.jsonl, history.jsonl and the workers' scratch folders are the
CLI's (trainer/store/rundir.RunDirectory).

A later call with the same ``output_dir`` restores the newest checkpoint that reads back whole and continues from its
update: the same model and data give the weights an uninterrupted call ends at (the data order is a function of the
seed and the update; a dataset must give the same batches each time it is read).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ..backends import active
from ..defaults import FLUSH_SECONDS
from ..errors import RunDirError
from ..files import atomic_write, keras_bytes
from ..trainer.store.checkpoints import checkpoint_numbers
from ..trainer.store.lock import LOCK
from ..trainer.store.metrics_log import update_figures
from ..trainer.store.rundir import (
    CONFIG_FILES,
    MODEL_COPY,
    RunDirectory,
    check_backend,
    check_place,
    read_record,
    write_record,
)


def fit_run_dir(output_dir, model, built, loop, k, seed, shuffle, steps, schedule=(), rule=None, summary=None):
    """The FitRunDir of a call of either backend (None without ``output_dir``): ``loop`` its hooks (fit_hooks.py),
    ``built`` what fit read of the model (keras_private.built). run.json records what its resume checks: what the
    data order depends on (the feed's batch size and examples, ``k`` or "auto", the order's ``seed``, ``shuffle``,
    ``steps`` per epoch) and its batch_schedule (its ``rule``'s settings, else its entries as [1-based epoch, batch
    size]). ``summary()``: more of summary.json's fields (the CLI's run on Keras)."""
    if output_dir is None:
        return None
    feed = loop.feed
    described = dict(batch_size=feed.batch_size, k="auto" if loop.auto else k, seed=seed, shuffle=shuffle, steps=steps)
    if getattr(feed, "examples", None) is not None:  # arrays: the order and the epoch's updates follow them
        described["examples"] = feed.examples
    if schedule:  # a directory of a call without one records no such key
        described["batch_schedule"] = (
            {"max_batch_size": rule.max_batch_size, "every_epochs": rule.every_epochs}
            if rule
            else [[e + 1, size] for e, size in schedule]
        )
    extra = {"rule_changes": loop.rule_changes} if loop.rule else {}  # the rule's changes, checkpointed
    return FitRunDir(Path(output_dir), model, built, loop.engine, loop.noise, described, loop.say, extra, summary)


class FitRunDir(RunDirectory):
    """The run directory of one accum_train.fit call, with what is fit's (trainer.Trainer.run keeps it): run.json's
    check, the epoch and update-in-epoch counters, the model's files, metrics.jsonl flushed every
    ``FLUSH_SECONDS``. A call resumes where the directory holds a checkpoint. ``built``: keras_private.Built (its
    variables, its LoRA layers); ``described``: what run.json records; ``noise``: the NoiseScale, checkpointed with
    it; ``extra``: more to checkpoint, by name; ``summary()``: more of summary.json's fields. ``start``: (epoch,
    update) to go on from; ``done``: updates so far."""

    def __init__(
        self, run_dir: Path, model, built, engine, noise, described: dict, say=print, extra=None, summary=None
    ):
        hint = f"call accum_train.fit again with output_dir={str(run_dir)!r}"
        super().__init__(run_dir, active().is_chief(engine.strategy), "output_dir ", hint)
        self.model, self.engine, self.noise, self.described, self.say = model, engine, noise, described, say
        self.lora = built.lora  # run.json records it
        counter = active().state_variable
        self.epoch, self.update_in_epoch = counter(0, "int64", "epoch"), counter(0, "int64", "update_in_epoch")
        self.pending, self.flushed_at = [], time.time()  # records not yet in metrics.jsonl
        self.start, self.done = (0, 0), 0
        self.before_k = None  # the k (or "auto") run.json recorded, which this call's may replace
        self.summary = summary
        self.tracked = {
            "weights": built.weights,
            "optimizer": engine.optimizer,
            "metrics": engine.metrics.variables,  # the storage of the model's metrics' variables
            "epoch": self.epoch,
            "update_in_epoch": self.update_in_epoch,
            **(extra or {}),
        }
        # k: what a run directory of 0.1.0 did not hold, restored when the checkpoint has it
        self.optional = {"subdivisions": engine.subdivisions}

    def resumes(self) -> bool:
        return bool(checkpoint_numbers(self.path / "checkpoints"))

    def begun(self) -> None:
        if self.writer:  # a call killed before its first checkpoint left records that this one writes again
            self.log.truncate_after(0, 0)

    def write_records(self, spec) -> None:
        if self.writer:  # with the layers LoRA is on, which the model file may not rebuild (accum/reload.py)
            write_record(self.path, "fit", spec, None, fit={**self.described, **self.lora, "holds": self.holds()})
        # the model before its first update, for the readers: a resume keeps the first (an older directory gains one)
        if self.writer and not (self.path / MODEL_COPY).is_file():
            self._save_model(MODEL_COPY)

    def started(self, trainer, resumed: bool) -> None:
        """history.jsonl's line for this call, once its k is chosen (``micro_batch_size="auto"``)."""
        engine = self.engine
        self.log_start(self.done, resumed, active().strategy_name(engine.strategy), engine.replicas, engine.k)

    def finish(self) -> tuple | None:
        if not self.writer:
            return None
        self._save_model("model.keras")
        return self.done, {"epochs": int(self.epoch.numpy()), **(self.summary() if self.summary else {})}

    def check(self) -> None:
        if not self.writer:
            return
        path, described = self.path, self.described
        check_place(path, "accum_train.fit: output_dir ")
        # the CLI's records alone: its run on JAX, begun (accum/on_keras.py) before fit wrote anything
        if not path.is_dir() or not any(p.name not in (LOCK, *CONFIG_FILES) for p in path.iterdir()):
            return
        record = read_record(path) or {}
        before = record.get("fit")
        if before is None:
            raise RunDirError(
                f"accum_train.fit: output_dir {path} is not empty and was not written by accum_train.fit: "
                f"choose an empty or new directory"
            )
        check_backend(
            record,
            f"accum_train.fit: output_dir {path}",
            "resume it with KERAS_BACKEND={backend}, or choose a new output_dir",
        )
        # examples: what a directory of 0.2.0 did not record (its resume is not checked for it); k: how the batch is
        # cut, which changes neither the batches nor the update (a resume after running out of memory takes more)
        changed = [
            k for k in described if k != "k" and before.get(k) != described[k] and (k in before or k != "examples")
        ]
        if not changed:
            self.before_k = before.get("k")
            if before.get("holds") is not None:  # a directory written before run.json held it: the restore says
                _check_holds(path, before["holds"], self.holds())
            return
        key = changed[0]
        if key == "examples":
            raise RunDirError(
                f"accum_train.fit: output_dir {path} was trained on {before[key]} examples, not {described[key]}: "
                f"a resume continues the same batches; pass the same data (after validation_split) or choose a new "
                f"output_dir"
            )
        was = f"{'steps_per_epoch' if key == 'steps' else key}={before.get(key)!r}"  # as fit's argument names it
        raise RunDirError(
            f"accum_train.fit: output_dir {path} was trained with {was}, not {described[key]!r}: a resume continues "
            f"the same batches; pass {was} or choose a new output_dir"
        )

    def holds(self) -> dict:
        """What the checkpoint holds, as run.json records it for a resume to compare before restoring: the
        optimizer's class, the metrics (by name, as their variables' paths begin) and the variables' paths and
        shapes."""
        metrics = dict.fromkeys(v.path.rsplit("/", 1)[0] for v in self.model.metrics_variables)
        return {
            "optimizer": type(self.engine.optimizer).__name__,
            "metrics": list(metrics),
            "variables": [[_path(v), list(v.shape)] for v in self.tracked["weights"]],
        }

    def restore(self, say, found=None) -> int:
        # another cut's k, not the checkpoint's: a resume may cut the same batches otherwise (``check``)
        wanted = self.engine.k
        try:
            step = super().restore(say, found)
        except (AssertionError, ValueError, active().OP_ERROR) as err:
            raise RunDirError(
                f"accum_train.fit: output_dir {self.path} holds a checkpoint of another model "
                f"({str(err).splitlines()[0][:160]}): pass the same model, or choose a new output_dir"
            ) from None
        # the same cut as before: the k the checkpoint restored (the k its batch_schedule's batch or auto had come to)
        if self.described["k"] != self.before_k:
            # auto after a fixed k: from one micro-batch up, as a start does
            self.engine.set_subdivisions(1 if self.described["k"] == "auto" else wanted)
        return step

    def restored(self, step: int, trainer) -> None:
        self.done = step
        self.start = int(self.epoch.numpy()), int(self.update_in_epoch.numpy())
        self.log.truncate_after(self.done, int(self.epoch.numpy()))
        if self.writer:
            self.say(f"accum_train.fit: resuming {self.path} at update {self.done}")

    def earlier_epochs(self) -> list:
        """(epoch, logs) of each epoch metrics.jsonl records as ended (what a resumed call's History starts
        with)."""
        if not self.writer:
            return []
        skip = ("step", "epoch", "epoch_end")
        # null is how the file holds a NaN (strict JSON): the History gets the NaN model.fit's logs would hold
        return [
            (r["epoch"] - 1, {k: math.nan if v is None else v for k, v in r.items() if k not in skip})
            for r in self.log.read()
            if r.get("epoch_end")
        ]

    def _save(self, epoch: int, update_in_epoch: int) -> None:
        self.flush()  # a checkpoint never counts an update that metrics.jsonl lacks
        self.epoch.assign(epoch)
        self.update_in_epoch.assign(update_in_epoch)
        self.save(self.done)

    def _write(self, record: dict) -> None:
        """One record for metrics.jsonl, written with those before it every ``FLUSH_SECONDS`` and before every
        checkpoint (a resume drops those after its checkpoint)."""
        self.pending.append(record)
        if time.time() - self.flushed_at >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.pending and self.log is not None:
            self.log.write(self.pending)
            self.pending = []
        self.flushed_at = time.time()

    def after_update(self, epoch: int, update_in_epoch: int, out: dict, logs: dict, signalled: int, batch_size) -> None:
        self.done += 1
        # the batch and k as the CLI's records have them: those in force (a schedule's, a retry's)
        record = {"step": self.done, "epoch": epoch + 1, "batch_size": batch_size, "subdivisions": self.engine.k}
        record.update(update_figures(out))
        self._write({**record, **_plain(logs)})
        if signalled or self.due(self.done):
            self._save(epoch, update_in_epoch)

    def after_epoch(self, epoch: int, logs: dict) -> None:
        self._write({"step": self.done, "epoch": epoch + 1, "epoch_end": True, **_plain(logs)})
        self._save(epoch + 1, 0)

    def _save_model(self, name: str) -> None:  # a reader or a resume never finds half a file
        atomic_write(self.path / name, keras_bytes(self.model, name, folder=self.path))


def _path(variable) -> str:
    """A variable's path in its model, without the model's name (which a process numbers) or TensorFlow's ":0"."""
    path = (getattr(variable, "path", None) or variable.name).split(":")[0]
    return path.split("/", 1)[-1]


def _shaped(variables: list) -> list:
    return [f"{path} {tuple(shape)}" for path, shape in variables] or ["none"]


def _check_holds(path: Path, before: dict, now: dict) -> None:
    """A resume of a model, optimizer or metrics other than the checkpoint's, refused in one line that names what
    differs (run.json's ``holds`` against this call's), before the restore's own error and warnings."""
    differences = []
    if before["optimizer"] != now["optimizer"]:
        differences.append(f"the optimizer was {before['optimizer']}, now {now['optimizer']}")
    # restored in order, not by name (a model built again in one process has other layer names): compared by shape
    was, is_now = before["variables"], now["variables"]
    if [shape for _, shape in was] != [shape for _, shape in is_now]:
        first = next((i for i, (a, b) in enumerate(zip(was, is_now)) if a[1] != b[1]), min(len(was), len(is_now)))
        differences.append(
            f"the checkpoint holds {len(was)} variables, the model {len(is_now)} (from variable {first + 1} on: "
            f"the checkpoint's {_few(_shaped(was[first:]))}; the model's {_few(_shaped(is_now[first:]))})"
        )
    if before["metrics"] != now["metrics"]:
        differences.append(f"the metrics were {_few(before['metrics'])}, now {_few(now['metrics'])}")
    if differences:
        raise RunDirError(
            f"accum_train.fit: output_dir {path} holds a checkpoint of another model: {'; '.join(differences)}: "
            f"pass the model, optimizer and metrics it was trained with, or choose a new output_dir"
        )


def _few(names: list, shown: int = 3) -> str:
    """The first ``shown`` of ``names``, then how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (", ".join(names[:shown]) or "none") + more


def _plain(logs: dict) -> dict:
    """Logs as JSON holds them: a metric of an array (F1Score(average=None): one value per class, one for a
    one-unit output) as a list, which float() refuses, a number as a float."""

    def plain(value):
        if isinstance(value, np.ndarray) and value.ndim > 0:
            return value.tolist()
        return float(value) if hasattr(value, "__float__") else value

    return {name: plain(value) for name, value in logs.items()}
