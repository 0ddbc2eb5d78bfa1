"""Run directories and the files in them.

Every file accum-train writes goes through ``files.atomic_write`` (write,
fsync, rename): a reader, or a run resumed after kill -9, sees the old file or
the new one, never half of one. ``RunDirectory`` is a run directory as either
door trains into it, ``StopFlag`` the stop a signal asks of it; its other parts
have rooms of their own: metrics_log.py (metrics.jsonl and TensorBoard),
checkpoints.py (damaged checkpoints passed over), lock.py (one writer).

TensorFlow is imported only where a function needs it, so that paths and
configs can be checked (and the ``--workers`` supervisor can run) without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ...backends import active, configured
from ...errors import Interrupted, OutOfMemory, RunDirError
from ...files import atomic_write, strict_json
from ...processes import STOP_SIGNALS
from .checkpoints import checkpoint_numbers, latest_intact
from .lock import LOCK, LOCK_HELD, in_use_error, lock_holder, writing
from .metrics_log import MetricsLog

# What a run directory of either door is (``write_record``; an earlier release's fit.json, or config.yaml and
# dataset.json: ``read_record``), and its record of its starts and resumes, one JSON line each.
RECORD, FIT_RECORD, HISTORY = "run.json", "fit.json", "history.jsonl"


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a run saves a checkpoint besides every epoch's end and a stop: every ``every_steps`` updates, after
    ``every_seconds`` of training since the last one (None: not by that measure), and before the first update
    (``at_start``); the newest ``keep`` are kept.
    Each door's default is in accum/defaults.py."""

    keep: int
    every_steps: int | None = None
    every_seconds: float | None = None
    at_start: bool = False  # a checkpoint before the first update, so that a run is resumable from its start

    def due(self, step: int, saved_at: float) -> bool:
        """Whether update ``step`` (1-based) checkpoints, the last checkpoint saved at ``saved_at`` (time.time())."""
        if self.every_steps and step % self.every_steps == 0:
            return True
        return self.every_seconds is not None and time.time() - saved_at >= self.every_seconds


class RunDirectory:
    """A run directory as a run of either door trains into it: one writer at a time (lock.writing), the one
    checkpoint manager (checkpoints.Checkpoints), the one metrics.jsonl writer (metrics_log.MetricsLog) and the
    stop a signal asks for (StopFlag). The door gives run.json its fields (``write_record``) and writes its
    files beside it (the CLI's config.yaml, fit's model files). Only the ``writer`` (the chief) writes ``path``;
    another worker writes the same files to a scratch folder (``local``), removed when it ends, and restores from
    ``path``, the chief's.
    ``flag`` starts the lines that name the directory ("--resume ", "output_dir "); ``resume_hint`` ends a
    failed save's line: how to go on.

    A door's run directory is a subclass: what it checkpoints (``tracked``, and ``optional``, what older
    checkpoints may lack) and the steps of a run's course that are its own, which trainer.Trainer.run calls in
    this order: ``check()`` before the lock and any write (refuse a start the door cannot make here);
    ``resumes()`` (whether this start goes on from a checkpoint); then ``restored(step, trainer)`` after the
    restore, or ``begun()``, before any record is written; ``write_records(spec)``: run.json (``write_record``) and
    the door's files beside it; ``started(trainer, resumed)`` after the probe or the restore, before the first
    update: the door's lines and history.jsonl's; ``flush()``; ``finish()``: the door's last files, and (updates
    done, summary.json's fields of the door) or None for no summary. The base class adds nothing at ``begun`` and
    ``flush``; a door defines the others."""

    def __init__(self, path: Path, writer: bool, flag: str, resume_hint: str):
        self.path, self.writer, self.flag, self.resume_hint = Path(path), writer, flag, resume_hint
        self.local = self.path  # where this process writes
        self.checkpoints = self.log = self.policy = None  # once ``keep`` knows what to checkpoint, and when
        self.step = 0  # the update of the newest checkpoint, saved or restored
        self.saved_at = time.time()
        self.tracked, self.optional = {}, None
        self.found = None  # the checkpoint ``check`` found to resume from, before the lock
        self.began = time.time(), time.process_time()  # (wall, CPU) time the run began at, for summary.json

    def begun(self) -> None:
        """A start from nothing, before any record is written."""

    def flush(self) -> None:
        """Records the door holds back, into metrics.jsonl (also when the run ends in an exception)."""

    def enter(self, held: contextlib.ExitStack) -> RunDirectory:
        """Hold the writer lock (the writer) or a scratch folder (another worker) until ``held`` closes. A
        directory this call begins (new, or empty) that ends in an error before anything trained (no checkpoint,
        no update logged: a probe out of memory, a first update that fails) is left as it was found, so the same
        command can run again in it."""
        if self.writer:
            begun = not self.path.is_dir() or all(p.name == LOCK for p in self.path.iterdir())
            held.enter_context(writing(self.path, self.flag))
            if begun:  # after the lock's entry: runs before its release, which removes a directory it made
                held.push(self._forget_if_failed)
            held.push(self._note_out_of_memory)
        else:
            self.local = Path(held.enter_context(tempfile.TemporaryDirectory(prefix="accum-train-worker-")))
        held.callback(lambda: self.log is not None and self.log.close())  # first of the exits: before any removal
        return self

    def _forget_if_failed(self, kind, error, trace) -> bool:
        logged = (self.path / "metrics.jsonl").is_file() and (self.path / "metrics.jsonl").stat().st_size > 0
        if kind is not None and not checkpoint_numbers(self.path / "checkpoints") and not logged:
            for entry in self.path.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry)
                elif entry.name != LOCK:
                    entry.unlink()
        return False  # the error goes on

    def _note_out_of_memory(self, kind, error, trace) -> bool:
        """history.jsonl's line for a run that ran out of memory, at the k it ran: what ``describe`` reads to
        suggest a resume with smaller micro-batches."""
        if kind is not None and issubclass(kind, OutOfMemory) and self.checkpoints is not None:
            self._history("out_of_memory", self.step, self.engine.replicas, self.engine.k)
        return False  # the error goes on

    def keep(self, tracked: dict, policy: CheckpointPolicy, engine, noise, optional=None) -> None:
        """Checkpoint ``tracked`` with what every run keeps (``Checkpoints``: ``engine``'s counters, ``noise``'s
        averages, ``optional`` where a checkpoint holds it) as ``policy`` says; and open metrics.jsonl."""
        self.policy, self.engine, self.noise = policy, engine, noise
        self.checkpoints = active().Checkpoints(
            tracked, self.local / "checkpoints", policy.keep, self.resume_hint, engine, noise, optional=optional
        )
        self.log = MetricsLog(self.local)

    def due(self, step: int) -> bool:
        """Whether update ``step`` checkpoints by the policy's count or time (``CheckpointPolicy.due``)."""
        return self.policy.due(step, self.saved_at)

    def restore(self, say, found=None) -> int:
        """Restore the newest intact checkpoint of ``path`` (``latest_intact``: the writer moves damaged newer ones
        aside); its update."""
        intact, damaged = latest_intact(self.path, say, self.writer, self.flag, found)
        self.step = self.checkpoints.restore_newest(intact, self.writer and bool(damaged))
        return self.step

    def save(self, step: int) -> None:
        """A checkpoint of the state as of ``step`` updates."""
        self.checkpoints.save(step)
        self.step, self.saved_at = step, time.time()

    def write_summary(self, steps: int, started: tuple, door: dict) -> dict:
        """summary.json, both doors' one writer: the ``steps`` done, what it says of every run (its time since
        ``started`` ((wall, CPU) seconds), memory peaks, skipped updates, loss scale (mixed_float16), last noise-scale
        estimate and how the batch was cut), and the ``door``'s own fields; what it wrote."""
        from ..memory import peak_rss_bytes

        engine = self.engine
        summary = {
            "steps": steps,
            "wall_time_s": time.time() - started[0],
            "cpu_time_s": time.process_time() - started[1],
            "peak_memory_bytes": active().allocator_peak_bytes(),
            "peak_rss_bytes": peak_rss_bytes(),
            "skipped_updates": int(engine.skipped_updates.numpy()),
            "loss_scale": float(engine.loss_scale.numpy()) if engine.dynamic else None,
            "noise_scale": self.noise.value(),
            "subdivisions": 1 if engine.one_pass else engine.k,
            "replicas": engine.replicas,
            **door,
        }
        write_json(self.local / "summary.json", summary)
        return summary

    def stop_flag(self) -> StopFlag:
        """The flag SIGINT and SIGTERM set; a second signal stops at once, at the newest checkpoint."""
        return StopFlag(lambda signum: self.interrupted(signum, forced=True))

    def interrupted(self, signum: int, forced: bool = False) -> Interrupted:
        """How a signal ends the run: at the newest checkpoint, saved after the update in hand (or, ``forced`` by
        a second signal, the one before), with the door's way to go on."""
        return Interrupted(signum, self.path, self.step, forced, self.resume_hint)

    def log_start(self, step: int, resume: bool, strategy: str, replicas: int, subdivisions: int) -> None:
        """history.jsonl's line for a start or a resume at ``step``: where, on which strategy and workers, how the
        batch is cut (informational; appended)."""
        self._history("resume" if resume else "start", step, replicas, subdivisions, strategy=strategy)

    def _history(self, event: str, step: int, replicas: int, subdivisions: int, **more) -> None:
        """A line of history.jsonl: ``event`` at ``step`` (the newest checkpoint's update after a stop)."""
        from ..runtime import cluster_workers

        entry = {
            "step": step,
            "event": event,
            **more,
            "workers": cluster_workers(),
            # started by 'accum-train run --workers' (its supervisor holds the lock): describe's way to go on
            "launcher": os.environ.get(LOCK_HELD) == str(self.path.resolve()),
            "replicas": replicas,
            "subdivisions": subdivisions,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        with open(self.local / HISTORY, "a") as handle:
            handle.write(strict_json(entry) + "\n")


class StopFlag:
    """SIGINT/SIGTERM set a flag: the loop finishes the update in hand, checkpoints, stops. Under several
    processes the flag goes into the next update's all-reduce, and every process stops after that same
    update. A second signal means it: ``forced(signum)`` is raised at once. Only the main thread can install signal
    handlers; elsewhere the flag stays 0 and Python's own handling applies. A signal the process ignores as it enters
    (``python train.py &`` ignores SIGINT) stays ignored."""

    def __init__(self, forced):
        self.signum = 0
        self.forced = forced
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                # a signal the process was started ignoring stays ignored (a background job's Ctrl-C is the shell's)
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum:
            raise self.forced(signum)
        self.signum = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def write_record(path: Path, door: str, spec, data: dict | None, **door_fields) -> None:
    """run.json, both doors' one writer, atomically (a reader or a resume never finds half of it): the ``door``
    ("config": 'accum-train run', whose config.yaml beside it holds the config; "fit": accum_train.fit), the Keras
    ``backend`` it ran on, the trainer.TrainSpec ``spec``'s values but its wording, the ``data`` description (None:
    the door keeps no data) and what the door's resume checks and its readers need (fit's ``fit``: its arguments and
    LoRA layers)."""
    values = {key: value for key, value in dataclasses.asdict(spec).items() if key != "words"}
    record = {"door": door, "backend": active().NAME, "spec": values, "data": data, **door_fields}
    write_json(Path(path) / RECORD, record)


def check_backend(record: dict | None, path: Path, how: str) -> None:
    """A run directory written on another Keras backend than the one running (run.json's ``backend``; none before
    JAX: TensorFlow) refused in one line: each backend writes its own checkpoints. ``how``: what to do, after "with
    KERAS_BACKEND=<its backend>"."""
    written, running = (record or {}).get("backend", "tensorflow"), configured()  # Keras not imported for it
    if written != running:
        raise RunDirError(
            f"{path} was written on Keras' {written} backend, whose checkpoints the {running} backend does not "
            f"read: {how.format(backend=written)}"
        )


def read_record(path: Path) -> dict | None:
    """run.json of ``path``, or in its shape what an earlier release recorded (``spec`` None); None: no run's."""
    path = Path(path)
    if (path / RECORD).is_file():
        return json.loads((path / RECORD).read_text())
    if (path / FIT_RECORD).is_file():
        return {"door": "fit", "spec": None, "data": None, "fit": json.loads((path / FIT_RECORD).read_text())}
    if is_run_dir(path):
        data = path / "dataset.json"  # written before the first update: without it, no complete run
        return {"door": "config", "spec": None, "data": json.loads(data.read_text()) if data.is_file() else None}
    return None


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file() and (Path(path) / "checkpoints").is_dir()


def other_output(path: Path) -> str | None:
    """What a directory that is no run holds where it is another command's output (compare's holds two runs),
    and what to pass instead; else None."""
    path = Path(path)
    if (path / "compare.json").is_file():
        return (
            f"{path} holds the two runs of 'accum-train compare', not one: pass {path / 'baseline'} or "
            f"{path / 'subdivided'}"
        )
    if (path / "bench.json").is_file():
        return f"{path} holds the timings of 'accum-train bench' (bench.json), not a run: it has no checkpoint"
    return None


def require_run_dir(path: Path, flag: str = "") -> Path:
    """``path``, if it is a directory written by 'accum-train run' (``flag``, e.g. '--resume', names it). One
    written by accum_train.fit is refused: only that call has the model's code and data to go on with it (the
    readers' one loader, accum/loader.py, tells it apart first: ``read_record``)."""
    path, lead = Path(path), f"{flag} " if flag else ""
    # a run of the CLI on JAX is fit's directory with the config beside it (accum/on_keras.py)
    if (read_record(path) or {}).get("door") == "fit" and not (path / "config.yaml").is_file():
        raise RunDirError(
            f"{lead}{path} was written by accum_train.fit: continue it by calling "
            f"accum_train.fit(model, ..., output_dir={str(path)!r}) again (the command line has neither the model's "
            f"code nor the data); accum-train export, predict and evaluate --data read it as it is"
        )
    if not path.exists():
        raise RunDirError(f"{lead}{path} does not exist: pass a directory written by 'accum-train run'")
    if not path.is_dir() or not is_run_dir(path):
        raise RunDirError(
            lead
            + (
                other_output(path)
                or f"{path} is not a run directory (no config.yaml and checkpoints/): pass a directory written by "
                "'accum-train run'"
            )
        )
    return path


def check_output_dir(path: Path) -> None:
    """Refuse a directory we would damage or cannot use, before anything is written."""
    path = Path(path)
    ours = os.environ.get(LOCK_HELD) == str(path.resolve())  # a --workers supervisor's chief: it holds the lock
    holder = None if ours else lock_holder(path)
    if holder is not None:
        raise in_use_error(path, holder, "--output-dir ")
    if path.is_dir() and any(p.name != LOCK for p in path.iterdir()):  # a lock alone: a run that wrote nothing
        hint = f"continue it with --resume {path}" if is_run_dir(path) else "choose an empty or new directory"
        raise RunDirError(f"--output-dir {path} is not empty: {hint}")
    check_place(path, "--output-dir ")


def check_place(path: Path, flag: str) -> None:
    """A run directory can be made at ``path`` or written in: it is no file, its nearest existing folder is one, and
    writable."""
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{flag}{path} is a file: name a directory")
    parent = path if path.is_dir() else next((p for p in path.absolute().parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise RunDirError(f"{flag}{path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"{flag}{path}: {parent} is not writable: choose another directory")


def write_json(path: Path, data) -> None:
    """An indented JSON file, strict (non-finite numbers as null), written atomically (summary.json, compare.json,
    bench.json)."""
    atomic_write(path, (strict_json(data, indent=2) + "\n").encode())


def write_result(out_dir: Path, name: str, result: dict, plot) -> None:
    """NAME.json and NAME.png (drawn by ``plot(result, path)``), both written atomically."""
    write_json(Path(out_dir) / f"{name}.json", result)
    plot(result, Path(out_dir) / f"{name}.png")


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Save a PNG atomically and free the figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    pyplot().close(fig)
    atomic_write(path, buffer.getvalue())


def save_weights(named_weights: dict, path: Path) -> None:
    """weights.npz: name -> array, from a model's explicitly named variables."""
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **{name: v.numpy() for name, v in named_weights.items()})
    atomic_write(path, buffer.getvalue())


# A keras_file run keeps a copy of the file it started from, and accum_train.fit
# saves its model there as a run starts: resume, export, evaluate and predict
# rebuild the model from it (the checkpoint holds the weights), so the run does
# not depend on model.path staying where it was, or on the call returning.
MODEL_COPY = "initial_model.keras"
# what the CLI's run on a backend other than TensorFlow keeps beside fit's files (accum/on_keras.py): its config,
# its data's description and the model file it began from, written before fit writes anything
CONFIG_FILES = ("config.yaml", "data.json", "model_file.keras")
