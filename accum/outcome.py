"""What a training process says: one line per epoch, its last line, and how it ends.

The CLI and the core's own child processes (``accum.worker``: a ``--workers`` worker, a side of ``compare``) print
the same lines and end the same way, so that a supervisor reads a child as a user reads the CLI: ``ending`` turns the
exception a run ends with into one line on stderr and its exit code (see errors.py), and ``child.last_error`` finds
that line again. TensorFlow's own log lines stay off unless asked for (``quiet_tensorflow``): a first run should not
look like a failure.
"""

from __future__ import annotations

import contextlib
import os
import sys

from .errors import OUT_OF_MEMORY_LINE, Interrupted, OutOfMemory, TrainingStopped, UserError, WorkersInterrupted
from .progress import Progress


def quiet_tensorflow(verbose: bool, load: bool = True) -> None:
    """TF_CPP_MIN_LOG_LEVEL=3 silences TensorFlow's logging once it runs (grappler's 'remapper failed' among it);
    child processes (workers, compare's runs, bench) inherit it. It speaks to the backend and the data layer
    (tf.data) alike, so it is said before TensorFlow loads, in its environment variable: no import of TensorFlow
    here. The oneDNN and absl lines printed while TensorFlow loads ignore it, so Keras' import, which loads it, runs
    with stderr closed. A Python error in the import still shows, after stderr is back. ``load``: import them now (a
    ``--workers`` supervisor never does)."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if not load or "keras" in sys.modules:
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import keras  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def ending():
    """The one place where a run's end becomes an exit code and one line on stderr."""
    try:
        yield
    except (UserError, TrainingStopped) as err:
        die(f"error: {err}", err.exit_code)
    except OutOfMemory as err:
        die(f"{OUT_OF_MEMORY_LINE}{err}", err.exit_code)
    except Interrupted as stop:
        die(f"{stop.how}. Resume with: accum-train run --resume {stop.run_dir}", stop.exit_code)
    except WorkersInterrupted as stop:
        die(str(stop), stop.exit_code)


def die(line: str, code: int) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.exit(code)


def scores_text(record: dict, prefix: str) -> str:
    """ "test loss 0.3012, test accuracy 0.8950" of a record's ``prefix``_ scores (loss first, then the others:
    accuracy for the built-in loss, the compiled metrics for a Keras loss's run)."""
    keys = [
        key
        for key in record
        if key.startswith(prefix + "_")
        and not key.endswith("_examples")
        and (record[key] is None or isinstance(record[key], (int, float)))
    ]
    keys.sort(key=lambda key: key != f"{prefix}_loss")
    return ", ".join(f"{prefix} {key[len(prefix) + 1 :].replace('_', ' ')} {_score(record[key])}" for key in keys)


def _score(value) -> str:
    """A score to four places; null (how summary.json, read back from a --workers run, holds a NaN) as nan, the
    line a run in this process prints."""
    return "nan" if value is None else f"{value:.4f}"


def epoch_line(record: dict, epochs: int) -> str:
    """ "epoch 2/10: train loss 0.4123, test loss ..., 41.9 s, 1432 examples/s" from an epoch's record."""
    train_loss = f"{record['train_loss']:.4f}" if record["train_loss"] is not None else "n/a"
    scores = "".join(f"{text}, " for text in (scores_text(record, "validation"), scores_text(record, "test")) if text)
    return (
        f"epoch {record['epoch']}/{epochs}: train loss {train_loss}, {scores}"
        f"{record['elapsed_s']:.1f} s, {record['examples_per_s']:.0f} examples/s"
    )


def final_scores(summary: dict) -> str:
    """The run's last line opens with its test scores: "test accuracy A (test loss L)" for the built-in loss,
    "test loss L, test mae M" for a Keras loss's run."""
    if "test_accuracy" in summary:
        return f"test accuracy {_score(summary['test_accuracy'])} (test loss {_score(summary['test_loss'])})"
    return scores_text(summary, "test") or "no test examples"


def last_line(summary: dict, run_dir) -> str:
    return (
        f"{final_scores(summary)} after {summary['steps']} updates in {summary['wall_time_s']:.0f} s; "
        f"run directory: {run_dir}"
    )


class EpochLines(Progress):
    """One line per epoch and every message, on stdout as they come: no bar."""

    def epoch_start(self, epoch, epochs, micro_batches, done):
        self.epochs = epochs

    def epoch_end(self, record):
        print(epoch_line(record, self.epochs), flush=True)

    def message(self, text):
        print(text, flush=True)
